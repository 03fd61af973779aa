// Package exec starts the user's command, forwards signals to it, stops it and
// reaps it. It knows nothing of locks: the caller decides when to start and
// when to stop, and turns the results into exit statuses.
//
// The package is Linux only: it relies on the parent-death signal, on
// waitid(2) with WNOWAIT and on /proc.
//
// When this process is PID 1 (a container's entrypoint), the package also
// reaps the orphans that the kernel hands to it, as an init does; see
// reap_linux.go. It never reaps a child in this process's own process group,
// so a program that the caller runs itself (os/exec) must stay in that group
// to keep its exit status.
package exec

import (
	"errors"
	"os"
	"sync"
	"syscall"
	"time"
)

// ErrNotFound means the command was not found: no such file, or no such name
// in any PATH directory. A shell exits 127 for it.
var ErrNotFound = errors.New("exec: command not found")

// ErrNotExecutable means the command was found but cannot be executed: it is
// a directory, lacks execute permission, or the kernel refused its format.
// A shell exits 126 for it.
var ErrNotExecutable = errors.New("exec: command not executable")

// Forwarded is the fixed list of signals a wrapper forwards to its command.
// It is deliberately not "every signal": SIGURG is sent to every Go program by
// its own runtime to preempt goroutines, and SIGCHLD, SIGPIPE or SIGTSTP mean
// something to the wrapper itself (docker/cli signals.go explains the SIGURG
// case). The caller must not modify it.
var Forwarded = []os.Signal{
	syscall.SIGINT,
	syscall.SIGTERM,
	syscall.SIGHUP,
	syscall.SIGQUIT,
	syscall.SIGUSR1,
	syscall.SIGUSR2,
	syscall.SIGWINCH,
}

// Process is a command started by Start. Its methods are safe for concurrent
// use. Exactly one goroutine waits for it; everyone else learns of its exit
// from Done.
type Process struct {
	pid int

	// exited is closed when the child has terminated but is not yet reaped:
	// a zombie still owns its pid and its process group id, so signalling
	// them cannot hit an unrelated process.
	exited chan struct{}
	// done is closed after the child has been reaped and code set.
	done chan struct{}
	code int

	// mu orders signalling against reaping: every kill(2) happens with mu
	// held and reaped false, so no signal can reach a recycled pid.
	mu       sync.Mutex
	reaped   bool
	stopping bool
	// stopped is closed by the first Stop once it no longer needs the
	// process group; until then the waiter keeps the child a zombie.
	stopped chan struct{}
}

// Pid returns the child's process id, which is also its process group id.
// The number means nothing once Done is closed.
func (p *Process) Pid() int { return p.pid }

// Done returns a channel that is closed once the child has exited and been
// reaped. It is never closed before that, whatever the child's descendants do.
func (p *Process) Done() <-chan struct{} { return p.done }

// ExitCode returns the child's exit status, or 128+S if it died of signal S.
// It is only meaningful after Done is closed; before that it returns -1, and
// so it does if the status was lost because something else in this process
// reaped the child (SIGCHLD ignored).
func (p *Process) ExitCode() int {
	select {
	case <-p.done:
		return p.code
	default:
		return -1
	}
}

// Signal sends sig to the child process itself, not to its group: the child
// decides what its own children hear, just as it would without a wrapper.
// Once the child has been reaped Signal does nothing and returns nil, so a
// caller racing with the exit never signals a recycled pid. sig must be a
// syscall.Signal.
func (p *Process) Signal(sig os.Signal) error {
	s, ok := sig.(syscall.Signal)
	if !ok {
		return errors.New("exec: unsupported signal type")
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.reaped {
		return nil
	}
	if err := syscall.Kill(p.pid, s); err != nil {
		return &os.SyscallError{Syscall: "kill", Err: err}
	}
	return nil
}

// Stop ends the child and everything in its process group, politely then
// firmly. It sends SIGTERM and then SIGCONT (so that a stopped job can act on
// the TERM) to the whole group, because a "sh -c" wrapper dies of TERM at once
// while the programs it started keep running unless they hear it too. If
// anything of the group is still running after grace, the whole group gets
// SIGKILL. Stop returns once the child has been reaped, so when it returns
// nothing of the group survives except processes that left the group
// themselves (setsid, setpgid). It returns at once if the child was already
// reaped, and concurrent calls all wait for the first one.
func (p *Process) Stop(grace time.Duration) {
	p.mu.Lock()
	if p.reaped || p.stopping {
		p.mu.Unlock()
		<-p.done
		return
	}
	p.stopping = true
	p.killGroup(syscall.SIGTERM)
	p.killGroup(syscall.SIGCONT)
	p.mu.Unlock()

	deadline := time.NewTimer(grace)
	defer deadline.Stop()
	p.waitGroupGone(deadline.C)

	p.mu.Lock()
	p.killGroup(syscall.SIGKILL)
	p.mu.Unlock()
	close(p.stopped)
	<-p.done
}

// killGroup signals the child's process group. The caller holds p.mu.
// While the leader is not reaped (alive or a zombie) its pid cannot be reused,
// neither as a pid nor as a group id, so the signal reaches only our group.
// Errors are ignored: ESRCH only means the group is already empty.
func (p *Process) killGroup(sig syscall.Signal) {
	if !p.reaped {
		_ = syscall.Kill(-p.pid, sig)
	}
}

// waitGroupGone returns when the leader has exited and no other live process
// remains in its group, or when deadline fires.
func (p *Process) waitGroupGone(deadline <-chan time.Time) {
	select {
	case <-p.exited:
	case <-deadline:
		return
	}
	// The leader is a zombie that we keep unreaped, so kill(-pgid, 0) would
	// always succeed; the only way to see whether its children are still
	// running is to look.
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for groupHasLive(p.pid) {
		select {
		case <-tick.C:
		case <-deadline:
			return
		}
	}
}

// startErr reads as a shell's message ("migrat: command not found",
// "./run: permission denied") and matches ErrNotFound or ErrNotExecutable
// under errors.Is.
type startErr struct {
	kind  error
	msg   string
	cause error
}

func (e *startErr) Error() string   { return e.msg }
func (e *startErr) Unwrap() []error { return []error{e.kind, e.cause} }

func notFound(name string) error {
	return &startErr{kind: ErrNotFound, msg: name + ": command not found"}
}

func notExecutable(name string, reason error) error {
	return &startErr{kind: ErrNotExecutable, msg: name + ": " + reason.Error(), cause: reason}
}
