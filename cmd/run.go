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

const examples = `  # Deploy step: run the migration on one host only; the others wait, then
  # run it too (migrations are idempotent) or skip with --no-wait.
  withlock --db postgres://deploy@db.internal/app dbmigration -- migrate up

  # Cron entry on several hosts: the first to start runs the job, the rest
  # exit quietly (status 0) instead of running it twice.
  */5 * * * * withlock -n --conflict-exit-code 0 --hold-at-least 1m report -- ./send-report

  # Kubernetes init container: wait up to 10 minutes for the lock.
  withlock --timeout 10m schema-setup -- /app/setup-schema

  # One host, no server: the file backend takes the same lock as flock(1).
  withlock --db file:///var/lock/withlock nightly -- ./nightly.sh`

// runFlags are the flags of the run form (and of the bare form).
type runFlags struct {
	connFlags
	noWait        bool
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
		Use:   use,
		Short: "Run COMMAND while holding the lock NAME",
		Long: `withlock runs one command under a named lock held in a shared database, so that
across every host, pod and cron daemon at most one copy of it runs at a time.

The backend is a URL: --db, else $WITHLOCK_DB, else $PG_CONNECTION_STRING.
Schemes: postgres://, postgresql://, mysql:// (MySQL and MariaDB: GET_LOCK,
interoperable with the mysql client's), redis://, rediss://, mongodb://,
mongodb+srv://, etcd://HOST:PORT[,HOST:PORT...], etcds:// (the keys of
etcdctl lock NAME), k8s://[NAMESPACE], kubernetes:// (a Lease; the pod's
service account, else the kubeconfig), file:///DIR. Everything after "--" is
the command, passed on verbatim. On lease backends (Redis, MongoDB, etcd,
Kubernetes) the command gets WITHLOCK_TOKEN, a fencing token.

Exit status: the command's; 64 usage; 69 backend unavailable; 70 lock lost
and command stopped; 75 not acquired (--conflict-exit-code); 126/127 command
not executable/not found; 128+S stopped by signal S while waiting.`,
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
			f.killAfterSet = c.Flags().Changed("kill-after")
			f.maxHoldersSet = c.Flags().Changed("max-holders")
			status, err := runLocked(env, f, name, argv)
			env.status = status
			return err
		},
	}
	fs := c.Flags()
	f.connFlags.register(fs)
	fs.BoolVarP(&f.noWait, "no-wait", "n", false, "make one attempt; if NAME is held elsewhere, exit 75")
	fs.DurationVarP(&f.timeout, "timeout", "t", 0, "give up waiting after this long and exit 75 (default: wait as long as it takes)")
	fs.IntVar(&f.conflictCode, "conflict-exit-code", exitNotAcquired, "exit status when the lock is not acquired (cron: 0)")
	fs.DurationVar(&f.ttl, "ttl", lock.DefaultTTL, "lease length; the lock is renewed or checked every ttl/3. Use the same --ttl for every user of NAME")
	fs.DurationVar(&f.killAfter, "kill-after", 0, "when the lock is lost, KILL the command this long after TERM (default 5s, or ttl/3 when shorter); must be shorter than --ttl")
	fs.StringVar(&f.onLost, "on-lost", "stop", "when the lock is lost: stop (TERM, KILL, exit 70) or ignore (warn, let the command finish)")
	fs.DurationVar(&f.holdAtLeast, "hold-at-least", 0, "keep NAME held until this long after acquisition, even if the command ends sooner")
	fs.BoolVar(&f.shared, "shared", false, "take NAME in shared mode: any number of shared holders at once, none while an exclusive holder holds it")
	fs.IntVar(&f.maxHolders, "max-holders", 0, "make NAME a semaphore: at most N holders at once (every holder of NAME must give the same N)")
	return c
}

// splitArgs takes NAME and COMMAND apart: exactly one argument before "--",
// at least one after it.
func splitArgs(args []string, dash int) (string, []string, error) {
	if dash < 0 {
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
	case f.ttl <= 0 || f.killAfter < 0 || f.killAfterSet && f.killAfter == 0:
		return usagef("--ttl and --kill-after must be positive")
	case f.killAfter >= f.ttl:
		return usagef("--kill-after (%s) must be shorter than --ttl (%s), so the command is gone before the lease can expire", f.killAfter, f.ttl)
	}
	return nil
}

// mode is the lock mode the flags ask for. A semaphore of 1 is an exclusive
// lock (SPEC §12), and is taken as one, so that it excludes and is excluded
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
	defer signal.Stop(sigs)

	opts := lock.Options{
		Mode:           f.mode(),
		MaxHolders:     f.semaphoreN(),
		NoWait:         f.noWait,
		ConnectTimeout: f.connectTimeout,
		TTL:            f.ttl,
		Grace:          f.killAfter,
		HoldAtLeast:    f.holdAtLeast,
		Holder:         lock.Holder{Host: lock.Hostname(), PID: os.Getpid(), Command: argv},
		Log:            log,
	}
	client, err := lock.Open(dbURL, opts)
	if err != nil {
		return 0, err
	}
	defer client.Close()

	var stopLine func()
	if env.terminal > 0 && env.logFormat == "text" && !env.verbose && !f.noWait {
		stopLine = startWaitLine(env.stderr, func() (*lock.Client, error) {
			return lock.Open(dbURL, lock.Options{ConnectTimeout: f.connectTimeout, Holder: opts.Holder, Log: quietLogger})
		}, name, env.terminal)
	}
	held, err := acquire(client, name, f.timeout, sigs)
	if stopLine != nil {
		stopLine()
	}
	if err != nil {
		return 0, err
	}
	defer held.Release(context.Background())

	proc, err := exec.Start(argv, commandEnv(name, held))
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
func acquire(c *lock.Client, name string, timeout time.Duration, sigs <-chan os.Signal) (*lock.Held, error) {
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
			switch noWait := c.Options().NoWait; {
			case errors.Is(r.err, lock.ErrUnsettled) && noWait:
				// Perhaps held, perhaps not: say what the backend knows.
				r.err = lock.Errorf(lock.ErrHeld, "%q not acquired: %v (--no-wait)", name, r.err)
			case errors.Is(r.err, lock.ErrHeld) && noWait:
				r.err = lock.Errorf(lock.ErrHeld, "%q is held elsewhere (--no-wait)", name)
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
	if err := held.Release(ctx); err != nil {
		log.Warn(fmt.Sprintf("%v; the lock ends with its session or lease", err))
	}
}
