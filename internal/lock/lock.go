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
// files hold the wait loop (acquire.go), the keep loop (held.go), the
// registry (registry.go), the options (options.go), the client and its
// operator commands (client.go), withlock check (check.go), error helpers
// (errors.go), TLS options shared by the URLs (tls.go), names (names.go)
// and the holder's identity (holder.go).
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
	// a lease whose holder still runs its command. It is not a conflict:
	// Acquire waits for it as for an unreachable backend, within
	// ConnectTimeout and even with NoWait, and tries again when the
	// error's Remaining has passed; still unsettled then, it fails with
	// ErrUnavailable. The error's message says why and for how long.
	ErrUnsettled = errors.New("lock: the server cannot vouch yet that the lock is free")
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
	// ErrNotSupported means the server cannot do what was asked, though
	// the backend can on other servers (listing MySQL's locks needs
	// performance_schema's metadata lock instrument).
	ErrNotSupported = errors.New("lock: not supported by this server")
	// ErrNotOurs means that Release found the lock already gone or someone
	// else's: broken by withlock release --force, or expired and taken
	// while this holder could not renew it. It matches ErrLost.
	ErrNotOurs = fmt.Errorf("%w: no longer ours at release", ErrLost)
)

// Backend is a connection to one lock server, opened from a URL by an
// Opener. It is used by one goroutine at a time and holds at most one lock.
// Every backend fills all of it; what really varies between backends is
// optional: how a waiter waits (Waiter, Notifier, or neither: polling),
// whether a held lock can notice its own loss (Watcher), and whether its
// lease is a record with a fencing token and an end (Expiring).
//
// How to add a backend:
//  1. Create a package under internal/lock/ with the files every backend
//     has (internal/lock/file is a small one): doc.go (the design),
//     <name>.go (Opener, options, errors), acquire.go (TryAcquire and any
//     wait), lease.go (Keep and Release), status.go (Inspect, List),
//     break.go (Break), check.go (Findings), and wire.go where the backend
//     speaks a protocol of its own.
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
//     Release gives the lock up, only if it is still ours (ErrNotOurs if
//     it was not).
//  5. Implement the optional interfaces that apply (at most these five).
//  6. Register the URL schemes in the package's init, and blank-import the
//     package in cmd/backends.go.
//  7. Run the conformance suite (internal/lock/locktest) from the package's
//     tests against a real server, and add the backend to the scripts in
//     testdata/script (script_test.go): every backend runs them.
type Backend interface {
	// TryAcquire makes one attempt to take the lock name. The returned
	// Lease is held until it is released or lost; it counts from when the
	// attempt was sent.
	TryAcquire(ctx context.Context, name string) (Lease, error)
	// Inspect returns name's state right now; a free lock has no Holders.
	// Holders may come in any order (Client.Inspect sorts them).
	Inspect(ctx context.Context, name string) (State, error)
	// List returns every lock held right now, in any order, including
	// locks held by other tools where the backend can see them (their
	// Name is then empty and Key says what they are). An error wrapping
	// ErrNotSupported means this server cannot show them.
	List(ctx context.Context) ([]State, error)
	// Break ends every current holder's hold on name and returns whom it
	// broke (none if name was free): the holders then find their lock
	// lost (withlock release --force). An error wrapping ErrHeld means the
	// lock could not be broken from here (a file lock held on another
	// host); ErrRefused that the server did not allow it.
	Break(ctx context.Context, name string) ([]Holder, error)
	// Findings reports, beyond what acquisition refuses (ErrUnsafe), the
	// conditions that weaken a lock on this backend (withlock check): a
	// server setting, a cluster's health, a file system. It reports what
	// it can read; a fact it cannot read is a Warn that says why, never a
	// guess. It runs after the probe lock probe was taken and released, on
	// the same connection; a backend whose probe leaves something behind
	// (a lock file) removes it. An error means the backend could not be
	// asked at all.
	Findings(ctx context.Context, probe string) ([]Finding, error)
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
	// Release gives the lock up if it is still ours, and returns an error
	// wrapping ErrNotOurs if it was not; afterwards the Lease must not be
	// used.
	Release(ctx context.Context) error
}

// Waiter is a Backend that can wait for a lock on the server's side, so
// that a waiter is handed the lock the moment it is free instead of
// polling: a queue on the server (file, postgres, mysql, etcd).
// Client.Acquire calls TryAcquire first and Acquire only once the lock was
// found held.
type Waiter interface {
	// Acquire blocks until the lock is taken or ctx is done, and returns
	// the Lease with the moment its life counts from: when the grant
	// arrived for a lock held by a session, or when the lease was last
	// renewed for a lease kept alive during the wait. When it returns an
	// error, nothing of this attempt stays in the backend: at most, a wait
	// that cannot be interrupted (flock) takes the lock for a moment when
	// it is freed and lets go at once.
	Acquire(ctx context.Context, name string) (Lease, time.Time, error)
}

// Notifier is a Backend that can tell waiters that a lock may have been
// released, so that they need not poll fast: a server that publishes
// releases (redis, k8s, a file semaphore). Client.Acquire subscribes
// before it waits and still polls slowly, since notifications can be lost.
type Notifier interface {
	// Notify returns a channel that receives a value whenever name may have
	// been released, until stop is called.
	Notify(ctx context.Context, name string) (released <-chan struct{}, stop func(), err error)
}

// Watcher is a Lease that can notice its own loss between two Keeps,
// because the server ends the session or tells it (file, postgres, mysql).
type Watcher interface {
	// Watch blocks until ctx is done (it then returns nil) or the lock is
	// known lost (an error wrapping ErrLost) or the backend failed (any other
	// error). A Watch ended by ctx must leave the lease usable: Release
	// follows at once, on the same connection.
	Watch(ctx context.Context) error
}

// Expiring is a Lease that is a record on the server with an end of its
// own, kept by renewal (redis, mongodb, etcd, k8s), rather than a lock
// held by a session. Such a record can carry a fencing token, and can be
// left to end by itself, which is how --hold-at-least outlives the process.
type Expiring interface {
	// Token is the fencing token: an integer that grows with every
	// acquisition of the same name. It is read from any goroutine, while
	// Keep runs too (Held.Token).
	Token() int64
	// ReleaseAt lets the lock end at until instead of now. Held calls it
	// only when until is at least a millisecond away (Release otherwise).
	ReleaseAt(ctx context.Context, until time.Time) error
}

// Detachable is a Backend whose leases can outlive the process that took
// them (withlock acquire --detach lease): the lease is written down as a
// ticket and left to run out, and another process takes it up again to
// renew or release it (redis, mongodb, etcd, k8s).
type Detachable interface {
	// Ticket is what identifies l, a Lease this backend returned, for
	// Resume. It holds no secret.
	Ticket(l Lease) string
	// Resume returns the lease that ticket names on name, as its holder
	// holds it: an Expiring whose ReleaseAt moves its end (renewing it)
	// and whose Release ends it, each only if it is still the ticket's
	// (an error wrapping ErrNotOurs otherwise). An error wrapping
	// ErrNotOurs from Resume itself means the lease is known gone.
	Resume(ctx context.Context, name, ticket string) (Lease, error)
}
