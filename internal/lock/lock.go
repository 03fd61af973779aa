// Package lock takes, keeps and releases a named lock in a shared backend.
//
// Backends are dumb: each makes single attempts and reports what happened,
// sorted into the sentinel errors below. The policy lives once, here: the
// wait loop with its connection retries (Client.Acquire), and the loop that
// keeps a held lock alive and decides when it must be given up for lost
// (Held). A Client is a Backend opened with one Options value, which the
// backend and both loops read, so that the lease a backend takes and the
// cadence at which it is renewed cannot disagree.
//
// This file is the contract between the loops and the backends; the other
// files hold the registry (registry.go), the options (options.go), the
// client (client.go), error helpers (errors.go), names (names.go) and the
// holder's identity (holder.go).
package lock

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Sentinel errors. Backends wrap driver errors into exactly one of these at
// their edge, so that callers decide with errors.Is and never look at a
// driver's error types.
var (
	// ErrHeld means the lock is held by someone else right now.
	ErrHeld = errors.New("lock: held elsewhere")
	// ErrUnsettled means the backend cannot vouch yet that the lock is
	// free: its server started recently and may have lost, with its data,
	// a lease whose holder still runs its command. It matches ErrHeld too,
	// so Acquire waits (retrying when the error's Remaining has passed) and
	// --no-wait does not take the lock; the error's message says why and
	// for how long.
	ErrUnsettled = fmt.Errorf("%w: the server may have forgotten a holder", ErrHeld)
	// ErrUnavailable means the backend could not be reached or did not
	// answer; trying again later may succeed.
	ErrUnavailable = errors.New("lock: backend unavailable")
	// ErrRefused means the backend answered and refused us (authentication,
	// permission, no such database, unusable configuration such as a
	// read-only replica). Trying again will not help.
	ErrRefused = errors.New("lock: backend refused")
	// ErrLost means a lock we held is known to be gone: the session ended,
	// the lease was taken or deleted.
	ErrLost = errors.New("lock: lost")
	// ErrUsage means the URL, the lock name or the options cannot be used
	// at all (for example a mode the backend does not have).
	ErrUsage = errors.New("lock: bad usage")
	// ErrNotSupported means the URL's scheme names a backend that this
	// build does not have.
	ErrNotSupported = errors.New("lock: not supported yet")
)

// Backend is a connection to one lock server, opened from a URL by an
// Opener. It is used by one goroutine at a time and holds at most one lock.
//
// How to add a backend:
//  1. Create a package under internal/lock/ (see internal/lock/file for a
//     small one).
//  2. Implement Opener: parse and check the URL and the Options without
//     touching the network; return an error wrapping ErrUsage for a URL or
//     a mode that can never work. Keep the Options: the backend reads TTL
//     (the lease length), Mode, MaxHolders and Holder from them.
//  3. Implement Backend. TryAcquire makes one attempt: it connects if it has
//     to, and returns a Lease, or an error wrapping ErrHeld (use HeldFor when
//     the holder's lease has a known end), ErrUnavailable (connection
//     refused, reset, timed out: worth retrying) or ErrRefused
//     (authentication, permission, missing database: not worth retrying).
//     Never retry or sleep inside a backend; Client.Acquire does that.
//  4. Implement Lease: Keep renews the lease or confirms the session,
//     returning an error wrapping ErrLost when the lock is known gone;
//     Release gives the lock up, only if it is still ours.
//  5. Implement the optional interfaces that apply: Waiter (the server can
//     queue us), Notifier (the server can announce releases), Watcher (the
//     lease learns of its own loss), Fenced (a fencing token), Lingerer (the
//     lease can outlive the process), Renewed (a Waiter's lease, renewed
//     while it waited), Inspector (status) and Breaker (release --force).
//  6. Register the URL schemes in the package's init, and blank-import the
//     package in cmd/backends.go.
//  7. Run the conformance suite (internal/lock/locktest) from the package's
//     tests against a real server, and add the backend to the scripts in
//     testdata/script (script_test.go): every backend runs them.
type Backend interface {
	// TryAcquire makes one attempt to take the lock name. The returned
	// Lease is held until it is released or lost.
	TryAcquire(ctx context.Context, name string) (Lease, error)
	// Close drops the connection; any lock still held through it ends with
	// its session, or with its lease.
	Close() error
}

// Lease is a lock held through a Backend. Its methods are never called
// concurrently.
type Lease interface {
	// Keep renews the lease (lease backends) or checks that the session and
	// the lock are alive (session backends). An error wrapping ErrLost means
	// the lock is gone; any other error means Keep could not tell. Keep is
	// never cut off by Release: it runs to its ctx's deadline.
	Keep(ctx context.Context) error
	// Release gives the lock up if it is still ours; afterwards the Lease
	// must not be used.
	Release(ctx context.Context) error
}

// Waiter is a Backend that can wait for a lock on the server side, so that
// a waiter is handed the lock the moment it is free instead of polling.
// Client.Acquire calls TryAcquire first and Acquire only once the lock was
// found held.
type Waiter interface {
	// Acquire blocks until the lock is taken or ctx is done. When it
	// returns an error, nothing of this attempt stays in the backend: at
	// most, a wait that cannot be interrupted (flock) takes the lock for a
	// moment when it is freed and lets go at once.
	Acquire(ctx context.Context, name string) (Lease, error)
}

// Notifier is a Backend that can tell waiters that a lock may have been
// released, so that they need not poll fast. Client.Acquire subscribes
// before it waits and still polls slowly, since notifications can be lost;
// an ErrHeld that says how long the holder's lease has left (HeldFor) is
// retried when that lease ends.
type Notifier interface {
	// Notify returns a channel that receives a value whenever name may have
	// been released, until stop is called.
	Notify(ctx context.Context, name string) (released <-chan struct{}, stop func(), err error)
}

// Watcher is a Lease that can notice its own loss between two Keeps, for
// example because the server closes the session.
type Watcher interface {
	// Watch blocks until ctx is done (it then returns nil) or the lock is
	// known lost (an error wrapping ErrLost) or the backend failed (any other
	// error). A Watch ended by ctx must leave the lease usable: Release
	// follows at once, on the same connection.
	Watch(ctx context.Context) error
}

// Fenced is a Lease that carries a fencing token: an integer that grows with
// every acquisition of the same name.
type Fenced interface {
	Token() int64
}

// Renewed is a Lease that a Waiter kept alive while it waited (a lease
// backend that waits on the server's side, etcd): the lease runs from its
// last renewal, which may be some time before the wait ended (up to the
// interval of the waiter's renewals), so the keep loop counts from
// RenewedAt instead.
type Renewed interface {
	// RenewedAt is when the last renewal (or the grant) was sent.
	RenewedAt() time.Time
}

// Lingerer is a Lease that can be left to end by itself at a given time,
// which is how --hold-at-least works on lease backends.
type Lingerer interface {
	// ReleaseAt lets the lock end at until instead of now.
	ReleaseAt(ctx context.Context, until time.Time) error
}

// Inspector is a Backend that can tell who holds a lock (withlock status).
type Inspector interface {
	// Inspect returns name's state right now; a free lock has no Holders.
	Inspect(ctx context.Context, name string) (State, error)
	// List returns every lock held right now, in any order, including
	// locks held by other tools where the backend can see them (their
	// Name is then empty and Key says what they are).
	List(ctx context.Context) ([]State, error)
}

// Breaker is a Backend that can break a lock whoever holds it (withlock
// release --force): the holders then find their lock lost.
type Breaker interface {
	// Break ends every current holder's hold on name and returns whom it
	// broke (none if name was free). An error wrapping ErrHeld means the
	// lock could not be broken from here (a file lock held on another
	// host); ErrRefused that the server did not allow it.
	Break(ctx context.Context, name string) ([]Holder, error)
}
