package cmd

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	osexec "os/exec"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"golang.org/x/sys/unix"

	"github.com/withlock/withlock/internal/lock"
)

// acquireFlags are the flags of withlock acquire, and of the keeper it
// starts.
type acquireFlags struct {
	runFlags
	maxHold    time.Duration
	untilPID   int
	handleFile string
	detach     string // keeper or lease
}

const acquireLong = `acquire takes NAME for the steps that follow, where no single command can
be wrapped: CI steps, a Makefile, a shell script. It waits for NAME as
withlock NAME -- COMMAND does, then prints a handle on stdout and exits 0,
while a keeper process, detached from the caller, holds NAME exactly as a
running withlock does.

Waiting is the run form's (--no-wait, --timeout, --shared, --max-holders,
the same exit statuses). Later steps pass the handle on:

  H=$(withlock acquire dbmigration --max-hold 30m)
  withlock status --handle "$H"     # exit 0 while NAME is still this handle's
  withlock release --handle "$H"    # exit 0: released; 70: not held by it

The keeper lets go of the caller's stdin, stdout and stderr, in a session of
its own, so that $(...) and CI runners do not wait for it. It releases NAME
and ends on release --handle, when --max-hold has passed since acquisition
(required: there is no "forever"), when the process --until-pid names ends,
on SIGTERM, or when the lock is lost. It runs on this host; release
--handle on another host releases a lease through the backend, and a
session lock (PostgreSQL, MySQL, file) not at all (exit 64).

What the run form does and this cannot: no command is there to stop when the
lock is lost. A step that must not run without the lock should check first
(withlock status --handle "$H" exits 70 once it is no longer held), and use
the fencing token (status --handle --json) where it writes. Where the steps
can be one script, withlock NAME -- ./all-steps.sh keeps the stronger
guarantee.

--detach lease leaves no process at all, for steps that run on other
machines or containers (separate CI jobs): on a lease backend (Redis,
MongoDB, etcd, Kubernetes, S3) the lease itself lasts --ttl from acquisition,
each renew --handle makes it last --ttl from then, and release --handle
ends it, from any host. A lease not renewed runs out by itself.

The handle holds no secret: give the backend URL (--db or $WITHLOCK_DB)
again in each step.

EXIT STATUS

- 0: NAME is held; the handle is printed.
- 64: usage, also --detach lease on a backend that holds locks in a
  session (PostgreSQL, MySQL, file).
- 69, 75, 128+S: as for withlock(1).`

func (f *acquireFlags) register(fs *pflag.FlagSet) {
	f.connFlags.register(fs)
	fs.BoolVarP(&f.noWait, "no-wait", "n", false, "make one attempt: if NAME is held, exit 75, naming the holder")
	fs.DurationVarP(&f.timeout, "timeout", "t", 0, "give up waiting after D and exit 75; 0: one attempt (default: no limit)")
	fs.IntVar(&f.conflictCode, "conflict-exit-code", exitNotAcquired, "exit status when NAME is not acquired")
	fs.DurationVar(&f.ttl, "ttl", lock.DefaultTTL, "lease length; give every user of NAME the same")
	fs.BoolVar(&f.shared, "shared", false, "take NAME shared: any number of shared holders, no exclusive one")
	fs.IntVar(&f.maxHolders, "max-holders", 0, "make NAME a semaphore of N holders; give every holder the same N")
	fs.DurationVar(&f.maxHold, "max-hold", 0, "release NAME this long after acquiring it, whatever happens (required)")
	fs.IntVar(&f.untilPID, "until-pid", 0, "release NAME when process PID ends (a script: $$)")
	fs.StringVar(&f.handleFile, "handle-file", "", "write the handle to F (mode 0600) instead of stdout")
	fs.StringVar(&f.detach, "detach", "keeper", "keeper: a process holds NAME; lease: no process, the lease lasts --ttl unless renewed")
	describeFlags(fs, runFlagDetail)
}

// prepare checks the flags, as a run form's are checked, and the ones of
// acquire's own.
func (f *acquireFlags) prepare(c *cobra.Command, env *environment) error {
	f.setEnv(env)
	env.conflictCode = f.conflictCode
	f.onLost = "stop"
	if c.Flags().Changed("timeout") && f.timeout == 0 && !f.noWait {
		f.noWait, f.oneAttempt = true, "--timeout 0"
	}
	f.maxHoldersSet = c.Flags().Changed("max-holders")
	if err := f.check(); err != nil {
		return err
	}
	switch {
	case f.maxHold <= 0:
		return usagef("acquire needs --max-hold D, the longest NAME may stay held: if no step releases it, the keeper does then")
	case f.untilPID < 0:
		return usagef("--until-pid must be a process id, not %d", f.untilPID)
	case f.untilPID > 0 && syscall.Kill(f.untilPID, 0) == syscall.ESRCH:
		return usagef("--until-pid %d: no such process", f.untilPID)
	case f.detach != "keeper" && f.detach != "lease":
		return usagef("--detach is keeper or lease, not %q", f.detach)
	case f.detach == "lease" && f.untilPID > 0:
		return usagef("--until-pid needs a keeper to watch the process; with --detach lease, release the handle when done")
	}
	return nil
}

func newAcquireCmd(env *environment) *cobra.Command {
	f := &acquireFlags{}
	c := &cobra.Command{
		Use:     "acquire [flags] NAME --max-hold D",
		Short:   "Take NAME for later steps; print a handle",
		Long:    acquireLong,
		Example: "  H=$(withlock acquire --db postgres://deploy@db/app dbmigration --max-hold 30m --until-pid $$)\n  ./migrate && ./deploy\n  withlock release --handle \"$H\"",
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usagef("acquire takes one NAME, not %d arguments: withlock acquire NAME --max-hold D", len(args))
			}
			return nil
		},
		SilenceErrors: true,
		SilenceUsage:  true,
		RunE: func(c *cobra.Command, args []string) error {
			if err := f.prepare(c, env); err != nil {
				return err
			}
			status, err := startKeeper(c, env, f, args[0])
			env.status = status
			return err
		},
	}
	f.register(c.Flags())
	completeFlags(c)
	return c
}

// keeperCommand is the hidden command that acquire runs as its keeper.
const keeperCommand = "__keeper"

func newKeeperCmd(env *environment) *cobra.Command {
	f := &acquireFlags{}
	c := &cobra.Command{
		Use:           keeperCommand + " NAME",
		Hidden:        true,
		Args:          cobra.ExactArgs(1),
		SilenceErrors: true,
		SilenceUsage:  true,
		RunE: func(c *cobra.Command, args []string) error {
			if err := f.prepare(c, env); err != nil {
				return err
			}
			return keep(env, f, args[0])
		},
	}
	f.register(c.Flags())
	return c
}

// startKeeper checks what it can here (the name, the URL), then starts the
// keeper and relays its stderr until it holds NAME (and prints the handle)
// or gives up (and acquire exits with its status).
func startKeeper(c *cobra.Command, env *environment, f *acquireFlags, name string) (int, error) {
	if err := lock.CheckName(name); err != nil {
		return 0, err
	}
	dbURL, err := f.backendURL(env)
	if err != nil {
		return 0, err
	}
	// Open checks the URL and the mode without touching the network.
	client, err := lock.Open(dbURL, lock.Options{Mode: f.mode(), MaxHolders: f.semaphoreN(), TTL: f.ttl, Log: quietLogger})
	if err != nil {
		return 0, err
	}
	detachable := client.Detachable()
	client.Close()
	if f.detach == "lease" {
		if !detachable {
			return 0, usagef("--detach lease needs a backend that holds a lease (redis, mongodb, etcd, k8s, s3); %s holds its lock in a session, which cannot outlive the process that took it: use the keeper (the default)", backendName(dbURL))
		}
		return 0, acquireLease(env, f, dbURL, name)
	}
	self, err := os.Executable()
	if err != nil {
		return 0, fmt.Errorf("cannot find withlock's own executable to start the keeper: %v", err)
	}
	// The flags as given, but the URL goes by the environment: a keeper
	// lives long, and its arguments are visible to every user.
	args := []string{keeperCommand}
	c.Flags().Visit(func(fl *pflag.Flag) {
		if fl.Name != "db" && fl.Name != "handle-file" {
			args = append(args, "--"+fl.Name+"="+fl.Value.String())
		}
	})
	args = append(args, "--", name)
	handleR, handleW, err := os.Pipe()
	if err != nil {
		return 0, err
	}
	stderrR, stderrW, err := os.Pipe()
	if err != nil {
		return 0, err
	}
	keeper := osexec.Command(self, args...)
	keeper.Env = append(os.Environ(), "WITHLOCK_DB="+dbURL)
	keeper.Stderr = stderrW
	keeper.ExtraFiles = []*os.File{handleW} // fd 3
	keeper.SysProcAttr = keeperAttr()
	// Signals that stop a wait are passed on to the keeper while it waits.
	sigs, stop := catchStops()
	defer stop()
	closeInheritedOnExec()
	if err := keeper.Start(); err != nil {
		return 0, fmt.Errorf("cannot start the keeper: %v", err)
	}
	handleW.Close()
	stderrW.Close()
	relayed := make(chan struct{})
	go func() {
		io.Copy(env.stderr, stderrR)
		close(relayed)
	}()
	read := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(handleR).ReadString('\n')
		read <- strings.TrimSpace(line)
	}()
	var h string
	for waiting := true; waiting; {
		select {
		case sig := <-sigs:
			keeper.Process.Signal(sig)
		case h = <-read:
			waiting = false
		}
	}
	<-relayed
	if h == "" {
		// The keeper gave up, and said why on the stderr relayed.
		keeper.Wait()
		status := keeper.ProcessState.ExitCode()
		if ws, ok := keeper.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			status = 128 + int(ws.Signal())
		}
		return status, nil
	}
	keeper.Process.Release()
	if f.handleFile != "" {
		return 0, writeHandleFile(f.handleFile, h)
	}
	_, err = fmt.Fprintln(env.stdout, h)
	return 0, err
}

// writeHandleFile writes the handle to path, readable by its owner alone.
func writeHandleFile(path, h string) error {
	file, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("--handle-file: %v", err)
	}
	if _, err := fmt.Fprintln(file, h); err != nil {
		file.Close()
		return fmt.Errorf("--handle-file: %v", err)
	}
	return file.Close()
}

// keep is the keeper: it takes NAME as the run form does, hands the handle
// to acquire through fd 3, lets go of acquire's stderr, and keeps NAME until
// it is released, --max-hold passes, --until-pid ends, or it is lost.
func keep(env *environment, f *acquireFlags, name string) error {
	dbURL, err := f.backendURL(env)
	if err != nil {
		return err
	}
	log := env.logger()
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, stopSignals...)
	forwarding.Store(true)
	signal.Ignore(syscall.SIGPIPE)

	opts := f.options([]string{"withlock", "acquire", name}, log)
	// While it waits, the keeper watches acquire: if acquire dies (killed;
	// its stops are passed on as signals), nobody waits for the lock any
	// more, and the wait ends as if stopped by SIGTERM.
	waitSigs := make(chan os.Signal, 4)
	waiting := make(chan struct{})
	go func() {
		caller := os.Getppid()
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case sig := <-sigs:
				waitSigs <- sig
			case <-tick.C:
				if os.Getppid() != caller {
					waitSigs <- syscall.SIGTERM
					return
				}
			case <-waiting:
				return
			}
		}
	}()
	client, held, err := f.take(dbURL, name, opts, waitSigs)
	close(waiting)
	if err != nil {
		return err
	}
	defer client.Close()
	h := f.newHandle(dbURL, name, opts, held)
	h.Start, _ = processStart(os.Getpid())
	// On a lease backend, a step on another host can release the lease
	// through the backend; the keeper then finds it lost, and ends.
	h.Ticket, _ = client.Ticket(held)

	end := func(why, detail string) {
		writeRecord(h.ID, keeperRecord{Ended: time.Now(), Why: why, Detail: detail})
	}
	release := func(why string) error {
		err := held.Release(context.Background())
		if err != nil {
			end(whyLost, err.Error())
			return err
		}
		end(why, "")
		return nil
	}

	// From here on the keeper outlives acquire: it hands the handle over,
	// then lets go of acquire's stderr (fd 2) and of the handle's pipe.
	out := os.NewFile(3, "handle")
	_, werr := fmt.Fprintln(out, h.String())
	if devNull, err := os.OpenFile(os.DevNull, os.O_RDWR, 0); err == nil {
		unix.Dup2(int(devNull.Fd()), 2)
		devNull.Close()
	}
	out.Close()
	if werr != nil {
		// acquire is gone: nobody has the handle, so nobody would release it.
		return release(whyNoCaller)
	}

	maxHold := time.NewTimer(time.Until(held.AcquiredAt().Add(f.maxHold)))
	defer maxHold.Stop()
	var pidGone <-chan time.Time
	if f.untilPID > 0 {
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		pidGone = tick.C
	}
	for {
		select {
		case <-sigs:
			return release(whyReleased)
		case <-maxHold.C:
			return release(whyMaxHold)
		case <-pidGone:
			if syscall.Kill(f.untilPID, 0) == syscall.ESRCH {
				return release(whyUntilPID)
			}
		case <-held.Lost():
			end(whyLost, held.Err().Error())
			held.Release(context.Background())
			return reported{held.Err()}
		}
	}
}

// take opens the backend and waits for NAME as the run form does; the
// signals on sigs stop the wait.
func (f *acquireFlags) take(dbURL, name string, opts lock.Options, sigs <-chan os.Signal) (*lock.Client, *lock.Held, error) {
	client, err := lock.Open(dbURL, opts)
	if err != nil {
		return nil, nil, err
	}
	oneAttempt := f.oneAttempt
	if oneAttempt == "" {
		oneAttempt = "--no-wait"
	}
	held, err := acquire(client, name, f.timeout, oneAttempt, sigs)
	if err != nil {
		client.Close()
		return nil, nil, err
	}
	return client, held, nil
}

// newHandle is the handle of held, which this process took.
func (f *acquireFlags) newHandle(dbURL, name string, opts lock.Options, held *lock.Held) handle {
	h := handle{
		V: 1, ID: lock.NewToken(), Name: name, Backend: backendID(dbURL),
		Mode: opts.Mode, N: opts.MaxHolders, Host: opts.Holder.Host, PID: os.Getpid(),
		Acquired: held.AcquiredAt().UTC(), MaxHold: f.maxHold.String(),
	}
	h.Token, _ = held.Token()
	return h
}

// catchStops catches the signals that stop a wait (withlock's own
// handling, not a PID 1's default), until stop.
func catchStops() (sigs <-chan os.Signal, stop func()) {
	c := make(chan os.Signal, 4)
	signal.Notify(c, stopSignals...)
	forwarding.Store(true)
	return c, func() {
		forwarding.Store(false)
		signal.Stop(c)
	}
}

// acquireLease is acquire --detach lease: NAME is taken here, as the run
// form takes it, and its lease left to last --ttl from now; the handle
// carries the backend's ticket of it.
func acquireLease(env *environment, f *acquireFlags, dbURL, name string) error {
	sigs, stop := catchStops()
	defer stop()
	opts := f.options([]string{"withlock", "acquire", "--detach", "lease", name}, env.logger())
	client, held, err := f.take(dbURL, name, opts, sigs)
	if err != nil {
		return err
	}
	defer client.Close()
	h := f.newHandle(dbURL, name, opts, held)
	h.Lease, h.TTL = true, f.ttl.String()
	ctx, cancel := context.WithTimeout(context.Background(), f.connectTimeout)
	defer cancel()
	if h.Ticket, err = client.Detach(ctx, held, time.Now().Add(min(f.ttl, f.maxHold))); err != nil {
		held.Release(context.Background())
		return err
	}
	if f.handleFile != "" {
		return writeHandleFile(f.handleFile, h.String())
	}
	_, err = fmt.Fprintln(env.stdout, h.String())
	return err
}

// errNotHeld is the outcome of a step whose handle no longer holds NAME:
// exit 70, as a lost lock.
func notHeld(h handle, why string) error {
	return lock.Errorf(lock.ErrLost, "%q is no longer held by this handle: %s", h.Name, why)
}

// handleFlags are the flags of the steps after acquire: renew, status
// --handle, release --handle.
type handleFlags struct {
	handle     string
	handleFile string
	renewTTL   time.Duration // renew --ttl; zero: the handle's
}

// ttl is the lease length a lease handle is renewed for.
func (f *handleFlags) ttl(h handle) time.Duration {
	if f.renewTTL > 0 {
		return f.renewTTL
	}
	if d, err := time.ParseDuration(h.TTL); err == nil && d > 0 {
		return d
	}
	return lock.DefaultTTL
}

func (f *handleFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&f.handle, "handle", "", "the handle withlock acquire printed")
	fs.StringVar(&f.handleFile, "handle-file", "", "read the handle from F (withlock acquire --handle-file)")
}

func (f *handleFlags) given() bool { return f.handle != "" || f.handleFile != "" }

// read returns the handle the flags give.
func (f *handleFlags) read() (handle, error) {
	s := f.handle
	switch {
	case s != "" && f.handleFile != "":
		return handle{}, usagef("give --handle or --handle-file, not both")
	case f.handleFile != "":
		b, err := os.ReadFile(f.handleFile)
		if err != nil {
			return handle{}, usagef("--handle-file: %v", err)
		}
		s = string(b)
	}
	return parseHandle(s)
}

// checkBackend refuses a handle of another backend than dbURL.
func (h handle) checkBackend(dbURL string) error {
	if id := backendID(dbURL); id != h.Backend {
		return usagef("this handle is for %q on %s, not %s: give the backend URL acquire was given", h.Name, h.Backend, id)
	}
	return nil
}

// held reports whether the handle still holds NAME, by the backend's
// account and, on the keeper's host, the keeper's being alive; if not, an
// error (exit 70) that says why. It also returns NAME's state.
func (h handle) held(ctx context.Context, client *lock.Client) (lock.State, error) {
	st, err := client.Inspect(ctx, h.Name)
	if err != nil {
		return st, err
	}
	if !h.Lease && h.local() && !h.keeperAlive() {
		return st, notHeld(h, h.ended())
	}
	for _, holder := range st.Holders {
		if h.matches(holder) {
			return st, nil
		}
	}
	if len(st.Holders) > 0 && h.local() && !h.Lease {
		return st, notHeld(h, fmt.Sprintf("it is %s (its keeper, pid %d, has not noticed yet)", heldText(st), h.PID))
	}
	if len(st.Holders) > 0 {
		return st, notHeld(h, "it is "+heldText(st))
	}
	return st, notHeld(h, h.ended())
}

// renewFlags are the flags of withlock renew.
type renewFlags struct {
	connFlags
	handleFlags
}

func newRenewCmd(env *environment) *cobra.Command {
	f := &renewFlags{}
	c := &cobra.Command{
		Use:   "renew --handle H [flags]",
		Short: "Confirm that the handle still holds its lock",
		Long: `renew confirms that the lock of a handle from withlock acquire is still the
handle's: its keeper runs and the backend lists it as the holder. The keeper
renews the lock itself; renew is the check a step makes before it relies on
the lock.

For a handle of acquire --detach lease, renew also extends the lease: it
lasts --ttl from now (default: acquire's --ttl), but never past
acquire's --max-hold. Once --max-hold has passed, renew releases the lease
and exits 70.

EXIT STATUS

- 0: the handle's lock is held.
- 64: usage: no handle, or a handle of another backend.
- 69: the backend is unavailable, or refused.
- 70: the handle no longer holds its lock (released, lost, run out, broken
  with release --force, or taken since by another); it says why.`,
		Example: `  withlock renew --handle "$H" && ./deploy`,
		Args:    noArgs("renew"),
		RunE: func(c *cobra.Command, args []string) error {
			if f.renewTTL < 0 || c.Flags().Changed("ttl") && f.renewTTL < minTTL {
				return usagef("--ttl must be at least %s", minTTL)
			}
			_, err := openHandle(env, &f.connFlags, &f.handleFlags, func(ctx context.Context, client *lock.Client, h handle) error {
				if _, err := h.held(ctx, client); err != nil || !h.Lease {
					return err
				}
				return renewLease(ctx, client, h, f.ttl(h))
			})
			return err
		},
		SilenceErrors: true,
		SilenceUsage:  true,
	}
	f.connFlags.register(c.Flags())
	f.handleFlags.register(c.Flags())
	c.Flags().DurationVar(&f.renewTTL, "ttl", 0, "with --detach lease: the lease lasts D from now (default: acquire's --ttl)")
	oneAttempt(c.Flags())
	completeFlags(c)
	return c
}

// renewLease makes the handle's lease last ttl from now, but not past
// --max-hold: once that has passed, it releases the lease instead and
// fails (exit 70).
func renewLease(ctx context.Context, client *lock.Client, h handle, ttl time.Duration) error {
	lease, l, err := client.Resume(ctx, h.Name, h.Ticket)
	if err != nil {
		return leaseOutcome(h, err)
	}
	until := time.Now().Add(ttl)
	if end := h.maxHoldEnd(); !until.Before(end) {
		if time.Until(end) < time.Millisecond {
			l.Release(ctx)
			return notHeld(h, h.ended())
		}
		until = end
	}
	return leaseOutcome(h, lease.ReleaseAt(ctx, until))
}

// leaseOutcome is what a step says of err, from a lease taken up again:
// one no longer the handle's is exit 70.
func leaseOutcome(h handle, err error) error {
	if errors.Is(err, lock.ErrNotOurs) {
		return notHeld(h, h.ended())
	}
	return err
}

// openHandle reads the handle, opens its backend and calls do with both,
// within --connect-timeout.
func openHandle(env *environment, cf *connFlags, hf *handleFlags, do func(context.Context, *lock.Client, handle) error) (handle, error) {
	if err := cf.prepare(env); err != nil {
		return handle{}, err
	}
	h, err := hf.read()
	if err != nil {
		return h, err
	}
	// The lock's mode, as acquire took it: a lease taken up again is
	// written as its holder writes it.
	client, err := cf.openWith(env, lock.Options{Mode: h.Mode, MaxHolders: h.N, TTL: hf.ttl(h)})
	if err != nil {
		return h, err
	}
	defer client.Close()
	if err := h.checkBackend(cf.db); err != nil {
		return h, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), cf.connectTimeout)
	defer cancel()
	return h, do(ctx, client, h)
}

// releaseHandle ends the handle's keeper, which releases NAME, and waits
// for it to end, within timeout. It fails (exit 70) if NAME was no longer
// the handle's.
func releaseHandle(ctx context.Context, client *lock.Client, h handle, timeout time.Duration) error {
	if h.Lease || !h.local() {
		// A lease, released through the backend from any host. A
		// keeper's (on another host) finds it lost at its next renewal,
		// and ends.
		if h.Ticket == "" {
			return usagef("the keeper of this handle runs on %s and holds a session lock, which only it can release: run release --handle there", h.Host)
		}
		_, l, err := client.Resume(ctx, h.Name, h.Ticket)
		if err != nil {
			return leaseOutcome(h, err)
		}
		return leaseOutcome(h, l.Release(ctx))
	}
	if !h.keeperAlive() {
		return notHeld(h, h.ended())
	}
	if _, err := h.held(ctx, client); err != nil && !errors.Is(err, lock.ErrUnavailable) {
		// Lost or taken: the keeper will notice and end; say so now.
		syscall.Kill(h.PID, syscall.SIGTERM)
		return err
	}
	if err := syscall.Kill(h.PID, syscall.SIGTERM); err != nil {
		return fmt.Errorf("cannot signal the keeper (pid %d): %v", h.PID, err)
	}
	for deadline := time.Now().Add(timeout); h.keeperAlive(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			return lock.Errorf(errTimedOut, "the keeper (pid %d) did not end within %s of SIGTERM", h.PID, timeout)
		}
	}
	if r, ok := readRecord(h.ID); ok && r.Why != whyReleased {
		return notHeld(h, h.ended())
	}
	return nil
}
