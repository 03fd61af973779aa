package cmd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/withlock/withlock/internal/exec"
	"github.com/withlock/withlock/internal/lock"
)

const examples = `  # Deploy step: one host at a time runs the migration; the others wait.
  withlock --db postgres://deploy@db.internal/app dbmigration -- migrate up
  # Cron on several hosts: the first runs the job, the rest exit 0 quietly.
  */5 * * * * withlock -n --conflict-exit-code 0 --hold-at-least 1m report -- ./send-report
  # Kubernetes init container: wait up to 10 minutes, saying who holds it.
  withlock -v --timeout 10m schema-setup -- /app/setup-schema`

// runLong is the description and reference of withlock and withlock run:
// their man page, and the topics of withlock help.
const runLong = `withlock runs COMMAND while holding the lock NAME in a shared backend, so
that across every host, pod and cron daemon at most one copy runs at a time.

It waits for NAME (or gives up, with --no-wait or --timeout), runs COMMAND
while it holds NAME, keeps the lock while COMMAND runs, and releases it when
COMMAND exits. If the lock is lost, COMMAND is stopped; if withlock is
killed, COMMAND dies with it. Flags may stand before or after NAME;
everything after the first "--" is COMMAND, passed on verbatim. COMMAND gets
withlock's stdin, stdout and stderr untouched, and withlock exits with its
status. withlock says nothing when all goes well.

BACKENDS

The backend is a URL: --db, else $WITHLOCK_DB, else $PG_CONNECTION_STRING.
There is no default. A password in the URL never appears in any output.

- postgres://user:pass@host:5432/db, postgresql://...: a session advisory
  lock on a dedicated connection, on the keys the npm package advisory-lock
  uses. libpq's parameters (sslmode, sslrootcert, target_session_attrs...).
  A hot standby, or a pooler in transaction mode, is refused (69).
- mysql://user:pass@host:3306/db: GET_LOCK on a dedicated session, the lock
  the mysql client's GET_LOCK takes on the same key. Parameters: tls
  (true, skip-verify, preferred, false), cacert, cert, key. A read-only
  server, or a node of a Galera cluster of more than one node, is refused
  (69). No --shared.
- redis://user:pass@host:6379/db, rediss://...: a hash of leases judged by
  the server's clock, on one server or a Redis Cluster (one node's URL, or
  ?addr=host2:port2&addr=... for more). Parameters: wait_replicas=N; with
  rediss://, cacert, cert, key. A replica is refused (69).
- redis+sentinel://user:pass@host:26379/MASTER: the primary that these
  Sentinels name (more Sentinels: host:port,host:port; a database:
  ?db=N).
- mongodb://host/db, mongodb+srv://...: lease documents, written by insert
  only, in the collection locks of the URL's database (default withlock).
  The driver's parameters (tls, tlsCAFile, w...).
- etcd://host:port[,host:port...], etcds://...: the keys of etcdctl lock
  NAME, each on a lease. Parameters with etcds://: cacert, cert, key.
- k8s://[NAMESPACE][?context=NAME], kubernetes://...: a
  coordination.k8s.io/v1 Lease, with the pod's service account or the
  kubeconfig. No --shared.
- s3://[KEY:SECRET@]BUCKET[/PREFIX]: an object written only by
  conditional PUTs, judged by the store's clock, with the AWS credential
  chain or the keys given. Parameters: endpoint (an S3-compatible store),
  region, path_style=true, profile, cacert, cert, key. No --shared; run
  withlock check on a store first.
- file:///DIR: flock(2) on DIR/NAME.lock, the lock flock(1) takes; one host.

KEEPING THE LOCK

Every ttl/3 withlock renews its lease (Redis, MongoDB, etcd, Kubernetes, S3) or
checks its session (PostgreSQL, MySQL, file). When the lock is known lost,
withlock says so, sends TERM to COMMAND's process group, KILL after
--kill-after, and exits 70; with --on-lost ignore it only warns. When the
backend stops answering, TERM follows once no check has succeeded for ttl
minus kill-after, and KILL by ttl, counted on withlock's own clock, so that
COMMAND is gone before the backend lets anyone else in. Give every user of
NAME the same --ttl. --hold-at-least keeps NAME held after a short COMMAND.

--shared takes NAME in shared mode: any number of shared holders, none
beside an exclusive one. --max-holders N makes NAME a semaphore of N
holders; every holder of NAME gives the same N.

ENVIRONMENT

- WITHLOCK_DB: the backend URL when --db is not given.
- PG_CONNECTION_STRING: the backend URL when neither --db nor WITHLOCK_DB
  is given.
- PGPASSWORD: the PostgreSQL password when the URL has none.
- SSL_CERT_FILE, SSL_CERT_DIR: CA certificates to trust instead of the
  system's, for every backend.
- KUBECONFIG: the kubeconfig files for k8s://, colon-separated.
- HTTPS_PROXY, NO_PROXY: the proxy for k8s:// and s3://.
- AWS_REGION, AWS_PROFILE, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
  AWS_ENDPOINT_URL_S3 and the rest of the AWS SDK's settings: for s3://
  when the URL does not say.

COMMAND's environment is withlock's plus:

- WITHLOCK_NAME: NAME.
- WITHLOCK_TOKEN: a fencing token, an integer that grows with every
  acquisition of NAME (Redis, MongoDB, etcd, Kubernetes, S3).

SIGNALS

INT, TERM, HUP and QUIT while withlock waits stop the wait: COMMAND never
runs, nothing stays queued, and withlock exits 128+S. Once COMMAND runs,
INT, TERM, HUP, QUIT, USR1, USR2 and WINCH sent to withlock are forwarded
to it, once each. A supervisor should signal withlock alone (systemd:
KillMode=mixed). If withlock is killed, the kernel kills COMMAND too.

EXIT STATUS

- COMMAND's status: COMMAND ran; 128+S if it died of signal S.
- 64: usage: missing NAME or COMMAND, an unknown flag, a bad URL,
  duration or NAME, a mode the backend cannot do, another N than NAME's
  holders use.
- 69: the backend is unavailable: not reached within --connect-timeout,
  or it refused (authentication, permission, TLS), or it cannot hold a
  lock for everyone (a standby, a replica, a pooler in transaction mode, a
  Galera cluster), or it could not vouch within --connect-timeout that NAME
  is free (a Redis up for less than --ttl). withlock-check(1) finds these
  before anything depends on the backend.
- 70: the lock was lost while COMMAND ran, and COMMAND was stopped.
- 75: not acquired: held, with --no-wait, or --timeout passed
  (see --conflict-exit-code).
- 126, 127: COMMAND is not executable, or not found.
- 128+S: withlock was stopped by signal S while waiting; COMMAND never ran.

FILES

- DIR/NAME.lock: file:///DIR's lock file (NAME escaped as %XX), and beside
  it a semaphore's slots (NAME.lock.0...), shared holders' records and the
  writer mark (NAME.lock.writer). Never deleted.
- ~/.kube/config: the kubeconfig for k8s:// without $KUBECONFIG.
- /var/run/secrets/kubernetes.io/serviceaccount: the pod's service account
  for k8s://.
- ~/.pgpass: PostgreSQL passwords, as libpq reads them.
- ~/.aws/config, ~/.aws/credentials: AWS profiles, for s3://.`

// runFlags are the flags of the run form (and of the bare form).
type runFlags struct {
	connFlags
	noWait        bool
	oneAttempt    string // the flag that asked for one attempt, for messages: "--no-wait" unless "--timeout 0"
	timeout       time.Duration
	conflictCode  int
	ttl           time.Duration
	killAfter     time.Duration // zero: lock's default, 5s or ttl/3 when shorter
	killAfterSet  bool
	maxHoldersSet bool
	onLost        string
	holdAtLeast   time.Duration
	shared        bool
	maxHolders    int
}

func newRunCmd(env *environment, use string) *cobra.Command {
	f := &runFlags{}
	c := &cobra.Command{
		Use:           use,
		Short:         "Run COMMAND while holding the lock NAME",
		Long:          runLong,
		Example:       examples,
		Args:          cobra.ArbitraryArgs,
		SilenceErrors: true,
		SilenceUsage:  true,
		// Flags may come before or after NAME; "--" ends them.
		RunE: func(c *cobra.Command, args []string) error {
			f.setEnv(env)
			env.conflictCode = f.conflictCode
			name, argv, err := splitArgs(args, c.ArgsLenAtDash())
			if err != nil {
				return err
			}
			if c.Flags().Changed("timeout") && f.timeout == 0 && !f.noWait {
				// One attempt, as flock -w 0 makes.
				f.noWait, f.oneAttempt = true, "--timeout 0"
			}
			f.killAfterSet = c.Flags().Changed("kill-after")
			f.maxHoldersSet = c.Flags().Changed("max-holders")
			status, err := runLocked(env, f, name, argv)
			env.status = status
			return err
		},
	}
	fs := c.Flags()
	f.connFlags.register(fs)
	completeFlags(c)
	fs.BoolVarP(&f.noWait, "no-wait", "n", false, "make one attempt: if NAME is held, exit 75, naming the holder")
	fs.DurationVarP(&f.timeout, "timeout", "t", 0, "give up waiting after D and exit 75; 0: one attempt (default: no limit)")
	fs.IntVar(&f.conflictCode, "conflict-exit-code", exitNotAcquired, "exit status when NAME is not acquired; cron: 0")
	fs.DurationVar(&f.ttl, "ttl", lock.DefaultTTL, "lease length; give every user of NAME the same")
	fs.DurationVar(&f.killAfter, "kill-after", 0, "on a lost lock, KILL this long after TERM (default 5s or ttl/3)")
	fs.StringVar(&f.onLost, "on-lost", "stop", "on a lost lock: stop COMMAND (exit 70), or ignore it")
	c.RegisterFlagCompletionFunc("on-lost", cobra.FixedCompletions([]string{"stop", "ignore"}, cobra.ShellCompDirectiveNoFileComp))
	fs.DurationVar(&f.holdAtLeast, "hold-at-least", 0, "keep NAME held this long after acquiring, even if COMMAND ends")
	fs.BoolVar(&f.shared, "shared", false, "take NAME shared: any number of shared holders, no exclusive one")
	fs.IntVar(&f.maxHolders, "max-holders", 0, "make NAME a semaphore of N holders; give every holder the same N")
	describeFlags(fs, runFlagDetail)
	return c
}

// splitArgs takes NAME and COMMAND apart: exactly one argument before "--",
// at least one after it.
func splitArgs(args []string, dash int) (string, []string, error) {
	if dash < 0 {
		if len(args) > 0 {
			if sub := nearCommand(args[0]); sub != "" {
				return "", nil, usagef("unknown command %q; did you mean %q? (a lock named %q takes -- COMMAND after it)", args[0], sub, args[0])
			}
		}
		switch len(args) {
		case 0:
			return "", nil, usagef("missing NAME and -- COMMAND")
		case 1:
			return "", nil, usagef("missing -- COMMAND after %q", args[0])
		default:
			return "", nil, usagef("put -- between NAME and the command: withlock %s -- %s", args[0], strings.Join(args[1:], " "))
		}
	}
	before, after := args[:dash], args[dash:]
	switch {
	case len(before) == 0:
		return "", nil, usagef("missing NAME before --")
	case len(before) > 1:
		return "", nil, usagef("one NAME expected before --, got %d: %q", len(before), before)
	case len(after) == 0:
		return "", nil, usagef("missing COMMAND after --")
	}
	return before[0], after, nil
}

// subcommands are withlock's commands, for nearCommand. Not help: it is
// two letters from "hello", a lock name as likely as any, and -h is the
// usual way to ask.
var subcommands = []string{"run", "status", "release", "check", "version", "completion"}

// nearCommand is the command that word, given without "--" where a NAME
// would be, was probably meant to be (one or two letters off: "stauts",
// "releas"), or "".
func nearCommand(word string) string {
	for _, c := range subcommands {
		if d := distance(word, c); d > 0 && d <= 2 && len(word) > 2 {
			return c
		}
	}
	return ""
}

// distance is the Levenshtein distance between a and b, in bytes.
func distance(a, b string) int {
	prev := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur := make([]int, len(b)+1)
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev = cur
	}
	return prev[len(b)]
}

// check validates the flags that cobra cannot.
func (f *runFlags) check() error {
	if err := f.connFlags.check(); err != nil {
		return err
	}
	switch {
	case f.onLost != "stop" && f.onLost != "ignore":
		return usagef("--on-lost is stop or ignore, not %q", f.onLost)
	case f.conflictCode < 0 || f.conflictCode > 255:
		return usagef("--conflict-exit-code must be 0-255")
	case f.shared && f.maxHolders != 0:
		return usagef("--shared and --max-holders cannot be combined: a lock is either shared or a semaphore")
	case f.maxHolders < 0 || f.maxHoldersSet && f.maxHolders == 0:
		return usagef("--max-holders must be at least 1, not %d", f.maxHolders)
	case f.timeout < 0 || f.holdAtLeast < 0:
		return usagef("durations cannot be negative")
	case f.ttl < minTTL:
		return usagef("--ttl must be at least %s, not %s: the lease is renewed every ttl/3, and a round trip to the backend must fit in that", minTTL, f.ttl)
	case f.killAfter < 0 || f.killAfterSet && f.killAfter == 0:
		return usagef("--kill-after must be positive")
	case f.killAfter >= f.ttl:
		return usagef("--kill-after (%s) must be shorter than --ttl (%s), so the command is gone before the lease can expire", f.killAfter, f.ttl)
	}
	return nil
}

// minTTL is the shortest --ttl: a renewal every ttl/3 must leave time for
// a round trip to a busy backend, and a process descheduled for a moment
// would otherwise seem to have been suspended.
const minTTL = 500 * time.Millisecond

// mode is the lock mode the flags ask for. A semaphore of 1 is an exclusive
// lock (docs/behaviour.md, Modes), and is taken as one, so that it excludes and is excluded
// by plain exclusive holders.
func (f *runFlags) mode() lock.Mode {
	switch {
	case f.shared:
		return lock.Shared
	case f.maxHolders > 1:
		return lock.Semaphore
	}
	return lock.Exclusive
}

// options are the lock's options the flags give, for this process
// running command.
func (f *runFlags) options(command []string, log *slog.Logger) lock.Options {
	return lock.Options{
		Mode:           f.mode(),
		MaxHolders:     f.semaphoreN(),
		NoWait:         f.noWait,
		ConnectTimeout: f.connectTimeout,
		TTL:            f.ttl,
		Grace:          f.killAfter,
		HoldAtLeast:    f.holdAtLeast,
		Holder:         lock.Holder{Host: lock.Hostname(), PID: os.Getpid(), Command: command},
		Log:            log,
	}
}

func (f *runFlags) semaphoreN() int {
	if f.mode() == lock.Semaphore {
		return f.maxHolders
	}
	return 0
}

// stopsWait reports whether sig, arriving while we wait for the lock, ends
// the wait. The others are ignored until there is a command to forward them
// to.
func stopsWait(sig os.Signal) bool {
	switch sig {
	case syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT:
		return true
	}
	return false
}

// runLocked takes the lock, runs the command, and releases the lock. It
// returns the command's exit status, or an error for exitCode.
func runLocked(env *environment, f *runFlags, name string, argv []string) (int, error) {
	if err := f.check(); err != nil {
		return 0, err
	}
	if err := lock.CheckName(name); err != nil {
		return 0, err
	}
	dbURL, err := f.backendURL(env)
	if err != nil {
		return 0, err
	}
	log := env.logger()

	// Signals are caught from here on: while waiting they end the wait,
	// once the command runs they are forwarded to it.
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, exec.Forwarded...)
	forwarding.Store(true)
	defer func() {
		forwarding.Store(false)
		signal.Stop(sigs)
	}()

	opts := f.options(argv, log)
	openQuiet := func() (*lock.Client, error) {
		return lock.Open(dbURL, lock.Options{ConnectTimeout: f.connectTimeout, Holder: opts.Holder, Log: quietLogger})
	}
	stopSaying := func() {}
	if env.verbose && !f.noWait {
		opts.OnWait, stopSaying = sayWhoHolds(log, openQuiet, name)
	}
	client, err := lock.Open(dbURL, opts)
	if err != nil {
		return 0, err
	}
	defer client.Close()

	var stopLine func()
	if env.terminal > 0 && env.logFormat == "text" && !env.verbose && !f.noWait {
		stopLine = startWaitLine(env.stderr, openQuiet, name, env.terminal)
	}
	// The command is looked up before the wait, so that the hand-off does
	// not pay for the search; one not found yet is looked up again once
	// the lock is held (it may have been installed meanwhile), and its
	// error is reported then.
	path, findErr := exec.Find(argv[0])
	oneAttempt := f.oneAttempt
	if oneAttempt == "" {
		oneAttempt = "--no-wait"
	}
	held, err := acquire(client, name, f.timeout, oneAttempt, sigs)
	stopSaying()
	if stopLine != nil {
		stopLine()
	}
	if err != nil {
		return 0, err
	}
	defer held.Release(context.Background())

	var proc *exec.Process
	if findErr == nil {
		proc, err = exec.StartFound(path, argv, commandEnv(name, held))
	} else {
		proc, err = exec.Start(argv, commandEnv(name, held))
	}
	if err != nil {
		releaseOrWarn(context.Background(), held, log)
		return 0, err
	}
	log.Debug("started", "command", argv[0], "pid", proc.Pid())

	lost := held.Lost()
	stopped := false
	for {
		select {
		case sig := <-sigs:
			proc.Signal(sig)
		case <-lost:
			lost = nil
			if f.onLost == "ignore" {
				log.Warn(fmt.Sprintf("lost the lock %q: %v; the command goes on (--on-lost=ignore)", name, held.Err()))
				continue
			}
			log.Error(fmt.Sprintf("lost the lock %q: %v; stopping the command", name, held.Err()))
			stopped = true
			go proc.Stop(client.Options().Grace)
		case <-proc.Done():
			status := proc.ExitCode()
			log.Debug("command exited", "status", status)
			if stopped {
				return 0, reported{held.Err()}
			}
			releaseCtx, cancel := context.WithCancel(context.Background())
			go func() {
				// A signal during --hold-at-least ends the hold early.
				for sig := range sigs {
					if stopsWait(sig) {
						cancel()
					}
				}
			}()
			releaseOrWarn(releaseCtx, held, log)
			cancel()
			return status, nil
		}
	}
}

// acquire waits for the lock, giving up at the timeout or at a signal.
func acquire(c *lock.Client, name string, timeout time.Duration, oneAttempt string, sigs <-chan os.Signal) (*lock.Held, error) {
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	if timeout > 0 {
		var stop context.CancelFunc
		ctx, stop = context.WithTimeoutCause(ctx, timeout, timeoutError{timeout, name})
		defer stop()
	}
	type result struct {
		held *lock.Held
		err  error
	}
	done := make(chan result, 1)
	go func() {
		h, err := c.Acquire(ctx, name)
		done <- result{h, err}
	}()
	for {
		select {
		case sig := <-sigs:
			if stopsWait(sig) {
				cancel(signalError{sig})
			}
		case r := <-done:
			if r.err == nil && ctx.Err() != nil {
				// Acquired just as we gave up: give it back.
				r.held.Release(context.Background())
				return nil, context.Cause(ctx)
			}
			var timedOut timeoutError
			switch {
			case errors.Is(r.err, lock.ErrHeld) && c.Options().NoWait:
				r.err = restated{fmt.Sprintf("%q is %s (%s)", name, heldBy(c, name), oneAttempt), r.err}
			case errors.Is(r.err, lock.ErrHeld) && errors.As(context.Cause(ctx), &timedOut):
				r.err = restated{fmt.Sprintf("%s, %s", timedOut, heldBy(c, name)), r.err}
			}
			return r.held, r.err
		}
	}
}

// commandEnv is withlock's environment plus WITHLOCK_NAME and, where the
// backend has one, WITHLOCK_TOKEN; values inherited from an outer withlock
// are replaced.
func commandEnv(name string, held *lock.Held) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "WITHLOCK_NAME=") && !strings.HasPrefix(kv, "WITHLOCK_TOKEN=") {
			env = append(env, kv)
		}
	}
	env = append(env, "WITHLOCK_NAME="+name)
	if token, ok := held.Token(); ok {
		env = append(env, "WITHLOCK_TOKEN="+strconv.FormatInt(token, 10))
	}
	return env
}

func releaseOrWarn(ctx context.Context, held *lock.Held, log *slog.Logger) {
	switch err := held.Release(ctx); {
	case errors.Is(err, lock.ErrNotOurs):
		log.Warn(fmt.Sprintf("%v; it was broken (withlock release --force) or ran out and was taken before this release", err))
	case err != nil:
		log.Warn(fmt.Sprintf("%v; the lock ends with its session or lease", err))
	}
}
