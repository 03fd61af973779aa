// Package lock takes, keeps and releases a named lock in a shared backend.
//
// Backends are dumb: each makes single attempts and reports what happened,
// sorted into the sentinel errors below. The policy lives once, here: the
// wait loop with its connection retries (Acquire), and the loop that keeps a
// held lock alive and decides when it must be given up for lost (Held).
package lock

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode/utf8"
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
	// permission, no such database, unusable configuration). Trying again
	// will not help.
	ErrRefused = errors.New("lock: backend refused")
	// ErrLost means a lock we held is known to be gone: the session ended,
	// the lease was taken or deleted.
	ErrLost = errors.New("lock: lost")
	// ErrUsage means the URL or the lock name cannot be used at all.
	ErrUsage = errors.New("lock: bad usage")
	// ErrNotSupported means the URL's scheme is a backend that the SPEC
	// names but this build does not have yet.
	ErrNotSupported = errors.New("lock: not supported yet")
)

// Backend is a connection to one lock server, opened from a URL by Open.
// It is used by one goroutine at a time and holds at most one lock.
//
// How to add a backend:
//  1. Create a package under internal/lock/ (see internal/lock/file for a
//     small one).
//  2. Implement Opener: parse and check the URL without touching the
//     network; return an error wrapping ErrUsage for a URL that can never
//     work.
//  3. Implement Backend. TryAcquire makes one attempt: it connects if it has
//     to, and returns a Lease, or an error wrapping ErrHeld, ErrUnavailable
//     (connection refused, reset, timed out: worth retrying) or ErrRefused
//     (authentication, permission, missing database: not worth retrying).
//     Never retry or sleep inside a backend; Acquire does that.
//  4. Implement Lease: Keep renews the lease or confirms the session,
//     returning an error wrapping ErrLost when the lock is known gone;
//     Release gives the lock up, only if it is still ours.
//  5. Implement the optional interfaces that apply: Waiter (the server can
//     queue us), Notifier (the server can announce releases), Watcher (the
//     lease learns of its own loss), Fenced (a fencing token), Lingerer (the
//     lease can outlive the process).
//  6. Register the URL schemes in the package's init, and blank-import the
//     package in cmd/backends.go.
//  7. Add the backend to the conformance scripts in testdata/script: every
//     backend runs them against a real server.
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
	// the lock is gone; any other error means Keep could not tell.
	Keep(ctx context.Context) error
	// Release gives the lock up if it is still ours; afterwards the Lease
	// must not be used.
	Release(ctx context.Context) error
}

// Waiter is a Backend that can wait for a lock on the server side, so that
// a waiter is handed the lock the moment it is free instead of polling.
type Waiter interface {
	// Acquire blocks until the lock is taken or ctx is done. When it
	// returns an error, nothing of this attempt stays in the backend: at
	// most, a wait that cannot be interrupted (flock) takes the lock for a
	// moment when it is freed and lets go at once.
	Acquire(ctx context.Context, name string) (Lease, error)
}

// Notifier is a Backend that can tell waiters that a lock may have been
// released, so that they need not poll fast. Acquire subscribes before it
// waits and still polls slowly, since notifications can be lost. A backend
// whose ErrHeld errors have a method Remaining() time.Duration (the time
// until the holder's lease runs out) is retried when that lease ends.
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

// Lingerer is a Lease that can be left to end by itself at a given time,
// which is how --hold-at-least works on lease backends.
type Lingerer interface {
	// ReleaseAt lets the lock end at until instead of now.
	ReleaseAt(ctx context.Context, until time.Time) error
}

// Holder describes the process that holds a lock, for backends that can
// record it (status, application_name).
type Holder struct {
	Host    string
	PID     int
	Command []string
}

// Opener opens a Backend for a URL. It must not touch the network. It may
// read opts.TTL, opts.Holder and opts.Log, already defaulted by Open.
type Opener func(u *url.URL, opts Options) (Backend, error)

var (
	registryMu sync.Mutex
	registry   = map[string]Opener{}
)

// Register makes a backend available under URL scheme. It panics if the
// scheme is registered twice, since that is a programming error.
func Register(scheme string, open Opener) {
	registryMu.Lock()
	defer registryMu.Unlock()
	if _, dup := registry[scheme]; dup {
		panic("lock: Register called twice for scheme " + scheme)
	}
	registry[scheme] = open
}

// Schemes lists the registered URL schemes, sorted.
func Schemes() []string {
	registryMu.Lock()
	defer registryMu.Unlock()
	var s []string
	for k := range registry {
		s = append(s, k)
	}
	sort.Strings(s)
	return s
}

// planned are schemes the SPEC names that have no backend in this build.
var planned = []string{"etcd", "mysql"}

// Open returns the Backend for rawURL. It does not connect. Errors wrap
// ErrUsage (malformed URL, unknown scheme) or ErrNotSupported.
func Open(rawURL string, opts Options) (Backend, error) {
	u, err := url.Parse(rawURL)
	if err != nil || u.Scheme == "" {
		return nil, Errorf(ErrUsage, "%q is not a URL; %s", Redact(rawURL), schemesHint())
	}
	scheme := strings.ToLower(u.Scheme)
	registryMu.Lock()
	open := registry[scheme]
	registryMu.Unlock()
	if open == nil {
		for _, p := range planned {
			if p == scheme {
				return nil, Errorf(ErrNotSupported, "the %s:// backend is not supported yet; %s", scheme, schemesHint())
			}
		}
		return nil, Errorf(ErrUsage, "unknown scheme %q; %s", u.Scheme, schemesHint())
	}
	return open(u, opts.withDefaults())
}

func schemesHint() string {
	var s []string
	for _, k := range Schemes() {
		s = append(s, k+"://")
	}
	return "supported: " + strings.Join(s, ", ")
}

// Redact returns rawURL with any password replaced by "xxxxx", for messages.
func Redact(rawURL string) string {
	u, err := url.Parse(rawURL)
	if err != nil {
		return "(unparsable URL)"
	}
	return u.Redacted()
}

// MaxNameLen is the longest lock name, in bytes.
const MaxNameLen = 255

// CheckName reports whether name can be a lock name: non-empty UTF-8 of at
// most MaxNameLen bytes. The error wraps ErrUsage.
func CheckName(name string) error {
	switch {
	case name == "":
		return Errorf(ErrUsage, "the lock name is empty")
	case len(name) > MaxNameLen:
		return Errorf(ErrUsage, "the lock name is %d bytes long; at most %d", len(name), MaxNameLen)
	case !utf8.ValidString(name):
		return Errorf(ErrUsage, "the lock name is not valid UTF-8")
	}
	return nil
}

// Hostname is os.Hostname, or "unknown".
func Hostname() string {
	h, err := os.Hostname()
	if err != nil || h == "" {
		return "unknown"
	}
	return h
}

// Errorf returns an error whose message is format's alone but which also
// matches kind (one of this package's sentinels) under errors.Is, so that
// users read "cannot reach postgres at db:5432 (connection refused)" and not
// the sentinel's text.
func Errorf(kind error, format string, args ...any) error {
	return &kindError{kind: kind, err: fmt.Errorf(format, args...)}
}

type kindError struct{ kind, err error }

func (e *kindError) Error() string   { return e.err.Error() }
func (e *kindError) Unwrap() []error { return []error{e.kind, e.err} }

// HeldFor returns an error matching ErrHeld that also says how long the
// holder's lease has left (its Remaining method), so that Acquire can retry
// when the lease runs out. For lease backends' TryAcquire.
func HeldFor(remaining time.Duration) error { return heldError{remaining} }

type heldError struct{ remaining time.Duration }

func (e heldError) Error() string            { return ErrHeld.Error() }
func (e heldError) Unwrap() error            { return ErrHeld }
func (e heldError) Remaining() time.Duration { return e.remaining }

// NewToken returns 128 random bits in hex: a lease holder's proof that the
// lease is its own.
func NewToken() string {
	var b [16]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Reason is the innermost useful part of a network error, for messages:
// "connection refused", not the whole dial chain; "timed out" for any
// timeout. Backends use it in their ErrUnavailable messages.
func Reason(err error) string {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return errno.Error()
	}
	var dnsErr *net.DNSError
	if errors.As(err, &dnsErr) {
		return dnsErr.Error()
	}
	var netErr net.Error
	if errors.Is(err, context.DeadlineExceeded) || errors.As(err, &netErr) && netErr.Timeout() {
		return "timed out"
	}
	return err.Error()
}
