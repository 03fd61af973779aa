package cmd

import (
	"context"
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"

	"github.com/withlock/withlock/internal/exec"
	"github.com/withlock/withlock/internal/lock"
)

// Exit statuses of withlock's own outcomes (docs/behaviour.md, Exit
// status); otherwise withlock
// exits with the command's status.
const (
	exitUsage         = 64  // EX_USAGE
	exitUnavailable   = 69  // EX_UNAVAILABLE
	exitLost          = 70  // EX_SOFTWARE: the lock was lost, the command stopped
	exitNotAcquired   = 75  // EX_TEMPFAIL: default for --conflict-exit-code
	exitConfig        = 78  // EX_CONFIG: withlock check found a lock would not exclude everyone
	exitNotExecutable = 126 // as a shell says it
	exitNotFound      = 127
)

var (
	errUsage    = errors.New("usage")
	errTimedOut = errors.New("timed out")
)

// timeoutError is the cause of a wait that --timeout ended. It is also a
// context.DeadlineExceeded, as the context's own error is: drivers that
// return the context's cause instead of its error (net/http does) must
// still read as "time ran out", not as a server that failed to answer.
type timeoutError struct {
	timeout time.Duration
	name    string
}

func (e timeoutError) Error() string {
	return fmt.Sprintf("%s after %s waiting for %q", errTimedOut, e.timeout, e.name)
}
func (e timeoutError) Unwrap() []error { return []error{errTimedOut, context.DeadlineExceeded} }

// signalError is the cause of a wait stopped by a signal.
type signalError struct{ sig os.Signal }

func (e signalError) Error() string { return "stopped by " + e.sig.String() }

// exitCode is the one table from outcome to exit status. Order matters:
// a signal wins over everything; a wait that timed out while the backend was
// unreachable is "unavailable", not "not acquired", so that an outage is
// never mistaken for a busy lock (and silenced by --conflict-exit-code 0).
func exitCode(err error, conflictCode int) int {
	var sig signalError
	switch {
	case errors.As(err, &sig):
		return 128 + int(sig.sig.(syscall.Signal))
	case errors.Is(err, lock.ErrLost):
		return exitLost
	case errors.Is(err, errCheckFailed):
		return exitConfig
	case errors.Is(err, exec.ErrNotFound):
		return exitNotFound
	case errors.Is(err, exec.ErrNotExecutable):
		return exitNotExecutable
	case errors.Is(err, lock.ErrUnavailable), errors.Is(err, lock.ErrRefused), errors.Is(err, lock.ErrUnsettled):
		// A server that cannot vouch yet that NAME is free (a --timeout
		// that ran out meanwhile) is not a conflict either.
		return exitUnavailable
	case errors.Is(err, lock.ErrHeld), errors.Is(err, errTimedOut):
		return conflictCode
	default:
		// lock.ErrUsage, lock.ErrNotSupported, errUsage, and cobra's
		// complaints about flags.
		return exitUsage
	}
}

// reported is an outcome whose message has already been logged.
type reported struct{ err error }

func (r reported) Error() string { return r.err.Error() }
func (r reported) Unwrap() error { return r.err }

// quiet reports whether an outcome goes unsaid without -v: being stopped by
// a signal (the sender knows), and a conflict that the user declared a
// success with --conflict-exit-code 0 (so that cron sends no mail).
func quiet(err error, code int) bool {
	var sig signalError
	return errors.As(err, &sig) || code == 0
}

// usagef is a usage error (exit 64) that reads as format says.
func usagef(format string, args ...any) error {
	return lock.Errorf(errUsage, format, args...)
}
