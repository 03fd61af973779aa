// Package locktest is the conformance suite that every lock backend passes,
// run from the backend's own tests against a real server, in the manner of
// golang-migrate's database/testing. A backend's tests add only what is
// special to that backend.
package locktest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/withlock/withlock/internal/lock"
)

// long bounds every wait of the suite. It is generous because the machines
// that run the tests are slow and shared; no subtest asserts anything
// tighter.
const long = 30 * time.Second

// OpenFunc returns a new Client with opts on the lock space under test, not
// connected to any other: two calls are two independent clients, as two
// withlock processes would be. It closes the Client through t.Cleanup
// (Open does both).
type OpenFunc func(t *testing.T, opts lock.Options) *lock.Client

// Config describes the backend under test: how to reach it, and what it
// has. Its zero values mean a session backend whose modes and operator
// commands are all there.
type Config struct {
	// Open opens the clients of the suite.
	Open OpenFunc
	// Lease says that the backend holds leases (a fencing token, an end by
	// the server's clock) and how to check them; nil says that a lock
	// lives as long as the session of the Backend that took it
	// (PostgreSQL, MySQL, file), so closing that Backend frees the lock.
	Lease *Lease
	// Modes says which of the modes' cases apply.
	Modes Modes
	// Operators says what the backend records of a holder.
	Operators Operators
	// CoreOnly runs only the cases of taking, waiting for and releasing an
	// exclusive lock: for a second way to the same backend (through TLS, a
	// pooler, one node of a cluster) whose modes, leases and operator
	// commands the backend's main run covers.
	CoreOnly bool
}

// Lease is what a lease backend's cases need.
type Lease struct {
	// Break deletes name's lease directly on the server, behind its
	// holder's back, as an operator would.
	Break func(t *testing.T, name string)
	// NoHeldFor says that TryAcquire's ErrHeld does not say how long the
	// holder's lease has left (lock.HeldFor): the backend is a lock.Waiter,
	// whose waits never read it, and reading it would cost a request to
	// the server on every attempt that finds the lock held (etcd). The
	// lease must still expire by the server's clock.
	NoHeldFor bool
	// WholeSeconds says that the lease's length is the ttl rounded up to
	// whole seconds (a Kubernetes Lease's leaseDurationSeconds), so the
	// time left that lock.HeldFor reports may exceed the ttl by that much.
	WholeSeconds bool
	// Margin is how much longer than that a lease may be judged alive:
	// the margin of a backend whose server records a renewal's time only
	// to the second (a Kubernetes Lease runs out a second after
	// leaseDurationSeconds by the API server's record).
	Margin time.Duration
}

// Run runs the suite: the core cases, then those of a lease backend, of
// the operator commands and of the modes, as cfg says.
func Run(t *testing.T, cfg Config) {
	runCore(t, cfg.Open, cfg.Lease == nil)
	if cfg.CoreOnly {
		return
	}
	if cfg.Lease != nil {
		runLease(t, cfg.Open, *cfg.Lease)
	}
	runOperators(t, cfg.Open, cfg.Operators, cfg.Lease != nil)
	runModes(t, cfg.Open, cfg.Modes, cfg.Lease != nil)
}

// runCore runs the cases every backend passes, on every way to it.
func runCore(t *testing.T, open OpenFunc, session bool) {
	t.Run("TryAcquireFree", func(t *testing.T) { testTryAcquireFree(t, open) })
	t.Run("HeldExcludes", func(t *testing.T) { testHeldExcludes(t, open) })
	t.Run("NamesDiffer", func(t *testing.T) { testNamesDiffer(t, open) })
	t.Run("CloseFrees", func(t *testing.T) {
		if !session {
			t.Skip("a lease backend's lock ends with its lease (TTL), not when the holder closes its Backend")
		}
		testCloseFrees(t, open)
	})
	t.Run("WaiterGetsFreedLock", func(t *testing.T) { testWaiterGetsFreedLock(t, open) })
	t.Run("WaiterCancelled", func(t *testing.T) { testWaiterCancelled(t, open) })
	t.Run("AcquireHolds", func(t *testing.T) { testAcquireHolds(t, open) })
	t.Run("HeldBeyondTTL", func(t *testing.T) { testHeldBeyondTTL(t, open) })
	t.Run("AcquireNoWait", func(t *testing.T) { testAcquireNoWait(t, open) })
	t.Run("AcquireTimeout", func(t *testing.T) { testAcquireTimeout(t, open) })
}

// Name returns a lock name that no other test uses: the test's name and a
// random suffix, at most 120 bytes, so that callers can append to it.
func Name(t testing.TB) string {
	b := make([]byte, 6)
	rand.Read(b)
	n := t.Name()
	if len(n) > 100 {
		n = strings.ToValidUTF8(n[:100], "")
	}
	return "locktest/" + n + "/" + hex.EncodeToString(b)
}

// Context is a context for one test step: ended with t, and bounded so
// that a hung server fails the test instead of hanging it.
func Context(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), long)
	t.Cleanup(cancel)
	return ctx
}

// Open opens a Client for url, closed (and its Close checked) when t ends.
// A zero opts.Holder becomes this test process.
func Open(t *testing.T, url string, opts lock.Options) *lock.Client {
	t.Helper()
	if opts.Holder.PID == 0 {
		opts.Holder = lock.Holder{Host: "test", PID: os.Getpid(), Command: []string{"true"}}
	}
	b, err := lock.Open(url, opts)
	if err != nil {
		t.Fatalf("Open(%s): %v", lock.Redact(url), err)
	}
	t.Cleanup(func() {
		if err := b.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return b
}

// mustTry takes name through b, failing t if it cannot.
func mustTry(t *testing.T, b lock.Backend, name string) lock.Lease {
	t.Helper()
	l, err := b.TryAcquire(Context(t), name)
	if err != nil {
		t.Fatalf("TryAcquire(%q): %v", name, err)
	}
	if l == nil {
		t.Fatalf("TryAcquire(%q) returned a nil Lease and no error", name)
	}
	return l
}

// mustTrySoon is mustTry for a lock that a cancelled wait may still touch
// for a moment (see lock.Waiter): it retries ErrHeld for up to a second.
func mustTrySoon(t *testing.T, b lock.Backend, name string) lock.Lease {
	t.Helper()
	deadline := time.Now().Add(time.Second)
	for {
		l, err := b.TryAcquire(Context(t), name)
		if err == nil {
			return l
		}
		if !errors.Is(err, lock.ErrHeld) || time.Now().After(deadline) {
			t.Fatalf("TryAcquire(%q) a second after the holder let go: %v", name, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// mustBeHeld checks that b cannot take name because someone else holds it.
func mustBeHeld(t *testing.T, b lock.Backend, name string) {
	t.Helper()
	l, err := b.TryAcquire(Context(t), name)
	if err == nil {
		l.Release(Context(t))
		t.Fatalf("TryAcquire(%q) by a second client succeeded while the lock was held", name)
	}
	if !errors.Is(err, lock.ErrHeld) {
		t.Fatalf("TryAcquire(%q) of a held lock: %v; want an error matching lock.ErrHeld", name, err)
	}
}

func mustRelease(t *testing.T, l lock.Lease) {
	t.Helper()
	if err := l.Release(Context(t)); err != nil {
		t.Fatalf("Release: %v", err)
	}
}

func testTryAcquireFree(t *testing.T, open OpenFunc) {
	a := open(t, lock.Options{})
	name := Name(t)
	l := mustTry(t, a, name)
	if err := l.Keep(Context(t)); err != nil {
		t.Errorf("Keep of a fresh lease: %v", err)
	}
	if w, ok := l.(lock.Watcher); ok {
		ctx, cancel := context.WithTimeout(Context(t), 100*time.Millisecond)
		err := w.Watch(ctx)
		cancel()
		if err != nil {
			t.Errorf("Watch of a healthy lease, until its ctx ended: %v; want nil", err)
		}
	}
	mustRelease(t, l)
	// The same client can take it again.
	mustRelease(t, mustTry(t, a, name))
}

func testHeldExcludes(t *testing.T, open OpenFunc) {
	a, b := open(t, lock.Options{}), open(t, lock.Options{})
	name := Name(t)
	la := mustTry(t, a, name)
	mustBeHeld(t, b, name)
	mustRelease(t, la)
	lb := mustTry(t, b, name)
	mustBeHeld(t, a, name)
	mustRelease(t, lb)
}

func testNamesDiffer(t *testing.T, open OpenFunc) {
	// long returns prefix padded with x to n bytes, ending in last.
	long := func(prefix string, n int, last string) string {
		return prefix + strings.Repeat("x", n-len(prefix)-len(last)) + last
	}
	for _, tc := range []struct {
		desc string
		x, y func(prefix string) string
	}{
		{"case", suffix("/lock"), suffix("/LOCK")},
		{"slash vs escaped slash", suffix("/a/b"), suffix("/a%2Fb")},
		{"percent vs escaped percent", suffix("/a%b"), suffix("/a%25b")},
		{"dot-dot", suffix("/../x"), suffix("/..%2Fx")},
		{"unicode vs ascii", suffix("/zü"), suffix("/zu")},
		{"NUL byte", suffix("/a\x00b"), suffix("/a")},
		{"unicode vs its escape", suffix("/zü"), suffix("/z%C3%BC")},
		{"NFC vs NFD", suffix("/\u00e9"), suffix("/e\u0301")},
		{"trailing space", suffix("/a"), suffix("/a ")},
		{"quotes", suffix(`/it's "quoted"; --`), suffix("/it")},
		{"255 bytes, last byte differs",
			func(p string) string { return long(p, lock.MaxNameLen, "1") },
			func(p string) string { return long(p, lock.MaxNameLen, "2") }},
		{"255 bytes vs 254",
			func(p string) string { return long(p, lock.MaxNameLen, "") },
			func(p string) string { return long(p, lock.MaxNameLen-1, "") }},
		{"255 bytes of unicode, last rune differs",
			func(p string) string { return long(p, lock.MaxNameLen, "ü") },
			func(p string) string { return long(p, lock.MaxNameLen, "ö") }},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			prefix := Name(t)
			x, y := tc.x(prefix), tc.y(prefix)
			for _, n := range []string{x, y} {
				if err := lock.CheckName(n); err != nil {
					t.Fatalf("bad test: %q: %v", n, err)
				}
			}
			a, b, c := open(t, lock.Options{}), open(t, lock.Options{}), open(t, lock.Options{})
			lx := mustTry(t, a, x)
			mustBeHeld(t, c, x)
			ly := mustTry(t, b, y)
			mustBeHeld(t, c, y)
			mustRelease(t, lx)
			mustRelease(t, ly)
		})
	}
}

func suffix(s string) func(string) string {
	return func(prefix string) string { return prefix + s }
}

func testCloseFrees(t *testing.T, open OpenFunc) {
	a, b := open(t, lock.Options{}), open(t, lock.Options{})
	name := Name(t)
	mustTry(t, a, name)
	if err := a.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	// The server may take a moment to notice the session's end, so b waits
	// (Acquire) rather than trying once.
	ctx, cancel := context.WithTimeout(Context(t), 10*time.Second)
	defer cancel()
	h, err := b.Acquire(ctx, name)
	if err != nil {
		t.Fatalf("after the holder's Backend was closed, another client could not take the lock within 10s: %v", err)
	}
	if err := h.Release(Context(t)); err != nil {
		t.Errorf("Release: %v", err)
	}
}

type result struct {
	lease lock.Lease
	err   error
}

// waitInBackground calls w.Acquire on a goroutine; the returned channel
// gets its result. The goroutine is waited for before the test's Backends
// are closed.
func waitInBackground(t *testing.T, ctx context.Context, w lock.Waiter, name string) <-chan result {
	done := make(chan result, 1)
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		l, _, err := w.Acquire(ctx, name)
		done <- result{l, err}
	}()
	// Cleanups run last-in first-out, so this runs before the Backends
	// (opened earlier) are closed; t.Context is done by then.
	t.Cleanup(func() { <-finished })
	return done
}

// mustBlock checks that nothing arrives on c for a moment.
func mustBlock(t *testing.T, c <-chan result, what string) {
	t.Helper()
	select {
	case r := <-c:
		if r.err == nil {
			r.lease.Release(Context(t))
		}
		t.Fatalf("%s returned while the lock was held: %v", what, r.err)
	case <-time.After(300 * time.Millisecond):
	}
}

func testWaiterGetsFreedLock(t *testing.T, open OpenFunc) {
	a, b, c := open(t, lock.Options{}), open(t, lock.Options{}), open(t, lock.Options{})
	w, ok := b.Backend.(lock.Waiter)
	if !ok {
		t.Skip("the backend is not a lock.Waiter")
	}
	name := Name(t)
	la := mustTry(t, a, name)
	got := waitInBackground(t, Context(t), w, name)
	mustBlock(t, got, "Acquire")
	mustRelease(t, la)
	released := time.Now()
	var r result
	select {
	case r = <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("Acquire did not return within 10s of the holder's release")
	}
	if r.err != nil {
		t.Fatalf("Acquire after the holder's release: %v", r.err)
	}
	t.Logf("hand-off took %v", time.Since(released))
	mustBeHeld(t, c, name)
	if err := r.lease.Keep(Context(t)); err != nil {
		t.Errorf("Keep of the waited-for lease: %v", err)
	}
	mustRelease(t, r.lease)
	mustRelease(t, mustTry(t, c, name))
}

func testWaiterCancelled(t *testing.T, open OpenFunc) {
	a, b, c := open(t, lock.Options{}), open(t, lock.Options{}), open(t, lock.Options{})
	w, ok := b.Backend.(lock.Waiter)
	if !ok {
		t.Skip("the backend is not a lock.Waiter")
	}
	name := Name(t)
	la := mustTry(t, a, name)
	ctx, cancel := context.WithCancelCause(Context(t))
	defer cancel(nil)
	got := waitInBackground(t, ctx, w, name)
	mustBlock(t, got, "Acquire")
	cancel(errors.New("locktest: stop waiting"))
	cancelled := time.Now()
	select {
	case r := <-got:
		if r.err == nil {
			r.lease.Release(Context(t))
			t.Fatal("Acquire with a cancelled context returned a lease while the lock was held")
		}
		t.Logf("Acquire returned after %v: %v", time.Since(cancelled), r.err)
	case <-time.After(10 * time.Second):
		t.Fatal("Acquire did not return within 10s of its context being cancelled")
	}
	// Nothing of the cancelled wait is left: once the holder lets go, a
	// newcomer gets the lock (at once, or after the moment lock.Waiter
	// allows).
	mustRelease(t, la)
	lc := mustTrySoon(t, c, name)
	mustRelease(t, lc)
	// And the cancelled client still works. (If c won the race above, the
	// cancelled wait took the lock for its moment when c let go.)
	mustRelease(t, mustTrySoon(t, b, name))
}

func testAcquireHolds(t *testing.T, open OpenFunc) {
	a, b := open(t, lock.Options{}), open(t, lock.Options{})
	name := Name(t)
	h, err := a.Acquire(Context(t), name)
	if err != nil {
		t.Fatalf("Acquire of a free lock: %v", err)
	}
	select {
	case <-h.Lost():
		t.Fatalf("Lost is closed right after Acquire: %v", h.Err())
	default:
	}
	mustBeHeld(t, b, name)
	if err := h.Release(Context(t)); err != nil {
		t.Fatalf("Held.Release: %v", err)
	}
	mustRelease(t, mustTry(t, b, name))
}

// testHeldBeyondTTL: a lock taken through Acquire is kept (renewed, or its
// session checked) with the lease length it was taken with, so it outlives
// that length several times over and still excludes others. The ttl is
// short, to keep the test short, but leaves a renewal on a busy machine
// (one that fetches a new auth token first, too) two thirds of a second to
// be answered.
func testHeldBeyondTTL(t *testing.T, open OpenFunc) {
	const ttl = 2 * time.Second
	a, b := open(t, lock.Options{TTL: ttl}), open(t, lock.Options{})
	name := Name(t)
	h, err := a.Acquire(Context(t), name)
	if err != nil {
		t.Fatalf("Acquire of a free lock: %v", err)
	}
	// Holding for three lease lengths is the point of this test.
	select {
	case <-h.Lost():
		t.Fatalf("lost within 3 ttl of %v: %v", ttl, h.Err())
	case <-time.After(3 * ttl):
	}
	mustBeHeld(t, b, name)
	if err := h.Release(Context(t)); err != nil {
		t.Fatalf("Held.Release: %v", err)
	}
	mustRelease(t, mustTry(t, b, name))
}

func testAcquireNoWait(t *testing.T, open OpenFunc) {
	a, b := open(t, lock.Options{}), open(t, lock.Options{NoWait: true})
	name := Name(t)
	la := mustTry(t, a, name)
	h, err := b.Acquire(Context(t), name)
	if err == nil {
		h.Release(Context(t))
		t.Fatal("Acquire with NoWait took a held lock")
	}
	if !errors.Is(err, lock.ErrHeld) {
		t.Errorf("Acquire with NoWait on a held lock: %v; want an error matching lock.ErrHeld", err)
	}
	mustRelease(t, la)
}

func testAcquireTimeout(t *testing.T, open OpenFunc) {
	a, b, c := open(t, lock.Options{}), open(t, lock.Options{}), open(t, lock.Options{})
	name := Name(t)
	la := mustTry(t, a, name)
	ctx, cancel := context.WithTimeout(Context(t), 300*time.Millisecond)
	defer cancel()
	h, err := b.Acquire(ctx, name)
	if err == nil {
		h.Release(Context(t))
		t.Fatal("Acquire took a held lock")
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Acquire that timed out: %v; want an error matching context.DeadlineExceeded", err)
	}
	mustRelease(t, la)
	mustRelease(t, mustTrySoon(t, c, name))
}

// BenchRoundTrip measures one TryAcquire and Release through an open
// client of url, the hot path of every backend.
func BenchRoundTrip(b *testing.B, url string) {
	bk, err := lock.Open(url, lock.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer bk.Close()
	ctx := context.Background()
	for b.Loop() {
		l, err := bk.TryAcquire(ctx, "locktest-bench")
		if err != nil {
			b.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// runLease runs what every lease backend must do besides the core: fencing
// tokens that grow, a lease deleted behind its holder's back, and expiry by
// the server's clock.
func runLease(t *testing.T, open OpenFunc, o Lease) {
	withTTL := func(t *testing.T, ttl time.Duration) lock.Backend {
		return open(t, lock.Options{TTL: ttl})
	}
	t.Run("FenceGrows", func(t *testing.T) {
		b, name := withTTL(t, 10*time.Second), Name(t)
		var last int64
		for i := 0; i < 3; i++ {
			l := mustTry(t, b, name)
			f, ok := l.(lock.Expiring)
			if !ok {
				t.Fatal("a lease backend's Lease must be lock.Expiring")
			}
			if f.Token() <= last {
				t.Fatalf("acquisition %d got fencing token %d after %d", i, f.Token(), last)
			}
			last = f.Token()
			mustRelease(t, l)
		}
	})
	t.Run("Broken", func(t *testing.T) {
		a, b, name := withTTL(t, 10*time.Second), withTTL(t, 10*time.Second), Name(t)
		la := mustTry(t, a, name)
		o.Break(t, name)
		if err := la.Keep(Context(t)); !errors.Is(err, lock.ErrLost) {
			t.Fatalf("Keep of a deleted lease: %v; want ErrLost", err)
		}
		lb := mustTry(t, b, name)
		if err := la.Release(Context(t)); err == nil {
			t.Error("the old holder's Release succeeded on the newcomer's lease")
		}
		if err := lb.Keep(Context(t)); err != nil {
			t.Errorf("the newcomer lost its lease to the old holder's Release: %v", err)
		}
	})
	t.Run("Detached", func(t *testing.T) {
		// A lease detached by its holder and taken up again by another
		// client (another process, in withlock acquire --detach lease)
		// holds the lock, moves its end, and releases it, only while it
		// is the ticket's.
		a, name := open(t, lock.Options{TTL: 10 * time.Second}), Name(t)
		if !a.Detachable() {
			t.Fatal("a lease backend must be lock.Detachable")
		}
		h, err := a.Acquire(Context(t), name)
		if err != nil {
			t.Fatal(err)
		}
		ticket, err := a.Detach(Context(t), h, time.Now().Add(10*time.Second))
		if err != nil {
			t.Fatalf("Detach: %v", err)
		}
		other := withTTL(t, 10*time.Second)
		if _, err := other.TryAcquire(Context(t), name); !errors.Is(err, lock.ErrHeld) {
			t.Fatalf("TryAcquire of a detached lease: %v; want ErrHeld", err)
		}
		resumer := open(t, lock.Options{TTL: 10 * time.Second})
		e, l, err := resumer.Resume(Context(t), name, ticket)
		if err != nil {
			t.Fatalf("Resume: %v", err)
		}
		if err := e.ReleaseAt(Context(t), time.Now().Add(20*time.Second)); err != nil {
			t.Fatalf("ReleaseAt of a resumed lease: %v", err)
		}
		if err := l.Release(Context(t)); err != nil {
			t.Fatalf("Release of a resumed lease: %v", err)
		}
		mustRelease(t, mustTry(t, other, name))
		if _, l, err := resumer.Resume(Context(t), name, ticket); err == nil {
			if err := l.Release(Context(t)); !errors.Is(err, lock.ErrNotOurs) {
				t.Errorf("a second Release of a resumed lease: %v; want ErrNotOurs", err)
			}
		} else if !errors.Is(err, lock.ErrNotOurs) {
			t.Errorf("Resume of a released lease: %v; want ErrNotOurs, or a lease whose Release says so", err)
		}
	})
	t.Run("Expires", func(t *testing.T) {
		// Short, but long enough that one attempt fits in ttl - grace on a
		// loaded machine (a backend may bound its attempt by that).
		const ttl = 2 * time.Second
		a, b, name := withTTL(t, ttl), withTTL(t, 10*time.Second), Name(t)
		la := mustTry(t, a, name)
		_, err := b.TryAcquire(Context(t), name)
		d, ok := lock.Remaining(err)
		limit := ttl
		if o.WholeSeconds {
			limit = (ttl + time.Second - 1).Truncate(time.Second)
		}
		limit += o.Margin
		switch {
		case o.NoHeldFor && !errors.Is(err, lock.ErrHeld):
			t.Fatalf("TryAcquire of a live lease: %v; want ErrHeld", err)
		case o.NoHeldFor:
		case !errors.Is(err, lock.ErrHeld) || !ok:
			t.Fatalf("TryAcquire of a live lease: %v; want ErrHeld made by lock.HeldFor", err)
		case d <= 0 || d > limit:
			t.Errorf("lock.Remaining = %v; want in (0, %v]", d, limit)
		}
		deadline := time.Now().Add(10 * time.Second)
		for {
			if _, err := b.TryAcquire(Context(t), name); err == nil {
				break
			} else if time.Now().After(deadline) {
				t.Fatalf("the lease never expired: %v", err)
			}
			time.Sleep(50 * time.Millisecond)
		}
		if err := la.Keep(Context(t)); !errors.Is(err, lock.ErrLost) {
			t.Errorf("Keep of an expired, taken lease: %v; want ErrLost", err)
		}
	})
}
