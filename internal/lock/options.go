package lock

import (
	"log/slog"
	"time"
)

// Defaults for the zero values of Options.
const (
	DefaultTTL            = 15 * time.Second
	DefaultGrace          = 5 * time.Second
	DefaultConnectTimeout = 15 * time.Second
)

// Mode is how a lock is held.
type Mode string

// The modes. A lock's holders are either one Exclusive holder, any number
// of Shared holders, or up to MaxHolders Semaphore holders.
const (
	Exclusive Mode = "exclusive"
	Shared    Mode = "shared"
	Semaphore Mode = "semaphore"
)

// Options says how to take and keep a lock. The zero value means: an
// exclusive lock, waited for as long as it takes, with the default TTL,
// grace and connect timeout. One Options value is given to Open; the
// backend and the loops of the Client read that same value.
type Options struct {
	// Mode is Exclusive (the default), Shared or Semaphore.
	Mode Mode
	// MaxHolders is a Semaphore's N (at least 1); it must be zero in the
	// other modes.
	MaxHolders int
	// NoWait makes Acquire give up with ErrHeld after one attempt.
	NoWait bool
	// ConnectTimeout bounds how long Acquire retries an unreachable
	// backend, counted from the first failure of a run of failures.
	ConnectTimeout time.Duration
	// TTL is the lease length. The lock is kept (renewed or checked) every
	// KeepInterval.
	TTL time.Duration
	// Grace is how long before the lease could run out the holder is told
	// that the lock is lost when the backend stops answering, so that it
	// has Grace to stop its work: Lost closes once no Keep has succeeded
	// for TTL-Grace. It must be shorter than TTL; zero means DefaultGrace,
	// or TTL/3 when that is shorter.
	Grace time.Duration
	// HoldAtLeast keeps the lock until this long after acquisition, even
	// when Release is called earlier.
	HoldAtLeast time.Duration
	// Holder is recorded with the lock where the backend can (its Host, PID
	// and Command).
	Holder Holder
	// SharedFS is the user's word (withlock check --fs-shares-locks) that
	// a file:// directory on a network file system shares its locks
	// between every host that uses it; withlock cannot verify it.
	SharedFS bool
	// Log receives Debug lines about each step and Warn lines about
	// trouble that does not end the lock. Nil discards them.
	Log *slog.Logger
	// OnWait, if not nil, is called once, when Acquire first finds the
	// lock held and begins to wait (not with NoWait): withlock -v then
	// says who holds it.
	OnWait func()

	// clock is what the loops judge a lease's life by; nil means the
	// system's (tests give a clock of their own).
	clock clock
}

func (o Options) withDefaults() Options {
	if o.Mode == "" {
		o.Mode = Exclusive
	}
	if o.ConnectTimeout <= 0 {
		o.ConnectTimeout = DefaultConnectTimeout
	}
	if o.TTL <= 0 {
		o.TTL = DefaultTTL
	}
	if o.Grace <= 0 {
		o.Grace = min(DefaultGrace, o.TTL/3)
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.clock == nil {
		o.clock = systemClock{}
	}
	return o
}

// check refuses options that cannot work, with an error wrapping ErrUsage.
func (o Options) check() error {
	switch {
	case o.Mode != Exclusive && o.Mode != Shared && o.Mode != Semaphore:
		return Errorf(ErrUsage, "unknown lock mode %q", o.Mode)
	case o.Mode == Semaphore && o.MaxHolders < 1:
		return Errorf(ErrUsage, "a semaphore needs at least 1 holder, not %d", o.MaxHolders)
	case o.Mode != Semaphore && o.MaxHolders != 0:
		return Errorf(ErrUsage, "MaxHolders is for semaphores, not %s locks", o.Mode)
	case o.Grace >= o.TTL:
		return Errorf(ErrUsage, "the grace (%s) must be shorter than the ttl (%s), so the command is gone before the lease can expire", o.Grace, o.TTL)
	}
	return nil
}

// KeepInterval is how often a held lock is kept (renewed or checked), and
// how often a lease that waits in a queue on the server is renewed: TTL/3,
// or half of TTL-Grace when that is shorter, so that two checks fit in the
// time one confirmation vouches for the lock (a grace close to the ttl,
// --ttl 3s --kill-after 2500ms, leaves half a second).
func (o Options) KeepInterval() time.Duration {
	return min(o.TTL/3, (o.TTL-o.Grace)/2)
}
