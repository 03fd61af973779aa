package lock_test

import (
	"context"
	"errors"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/withlock/withlock/internal/lock"
)

// long bounds every wait in these tests: generous, because the machines
// that run them are slow and shared. No test asserts anything tighter.
const long = 30 * time.Second

// The test doubles below are the Backend and Lease interfaces reduced to
// scripts, for testing the loops of Acquire and Held. The backends
// themselves are tested against real servers (locktest).

// script is a Backend whose n-th TryAcquire (from 0) returns answer(n): nil
// grants lease (a fresh fakeLease if lease is nil).
type script struct {
	answer func(n int) error
	lease  lock.Lease
	calls  atomic.Int32
}

func (s *script) TryAcquire(context.Context, string) (lock.Lease, error) {
	n := int(s.calls.Add(1)) - 1
	if err := s.answer(n); err != nil {
		return nil, err
	}
	if s.lease == nil {
		return &fakeLease{}, nil
	}
	return s.lease, nil
}

func (s *script) Inspect(context.Context, string) (lock.State, error)      { return lock.State{}, nil }
func (s *script) List(context.Context) ([]lock.State, error)               { return nil, nil }
func (s *script) Break(context.Context, string) ([]lock.Holder, error)     { return nil, nil }
func (s *script) Findings(context.Context, string) ([]lock.Finding, error) { return nil, nil }
func (s *script) Close() error                                             { return nil }

func always(err error) func(int) error { return func(int) error { return err } }

// waiter is a script that is also a lock.Waiter whose Acquire grants at
// once.
type waiter struct {
	script
	waits atomic.Int32
}

func (w *waiter) Acquire(context.Context, string) (lock.Lease, time.Time, error) {
	w.waits.Add(1)
	return &fakeLease{}, time.Now(), nil
}

// fakeLease is a Lease whose n-th Keep (from 0) returns keep(n), nil if
// keep is nil, and whose Release returns releaseErr. It counts its calls and
// reports each Keep on kept.
type fakeLease struct {
	keep       func(n int) error
	kept       chan time.Time // if not nil, gets the time of every Keep (never blocks)
	releaseErr error

	keeps    atomic.Int32
	releases atomic.Int32

	mu sync.Mutex
	// releaseCtxErr is the Err of the context of the last Release, when
	// it was called; releaseHasDeadline whether it had a deadline.
	releaseCtxErr      error
	releaseHasDeadline bool
}

func (l *fakeLease) Keep(context.Context) error {
	n := int(l.keeps.Add(1)) - 1
	if l.kept != nil {
		select {
		case l.kept <- time.Now():
		default:
		}
	}
	if l.keep == nil {
		return nil
	}
	return l.keep(n)
}

func (l *fakeLease) Release(ctx context.Context) error {
	l.mu.Lock()
	_, l.releaseHasDeadline = ctx.Deadline()
	l.releaseCtxErr = ctx.Err()
	l.mu.Unlock()
	l.releases.Add(1)
	return l.releaseErr
}

var (
	errUnreachable = lock.Unreachable("test", "connection refused")
	errHeld        = lock.Errorf(lock.ErrHeld, "test: held")
	errRefused     = lock.Errorf(lock.ErrRefused, "test: password authentication failed")
)

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), long)
	t.Cleanup(cancel)
	return ctx
}

// acquire runs Client.Acquire and releases what it got when t ends.
func acquire(t *testing.T, ctx context.Context, b lock.Backend, opts lock.Options) (*lock.Held, error) {
	t.Helper()
	h, err := lock.NewClient(b, opts).Acquire(ctx, "job")
	if err == nil {
		t.Cleanup(func() {
			// Bounded, so that a Release that hangs fails the test
			// instead of the whole run.
			done := make(chan struct{})
			go func() {
				defer close(done)
				h.Release(context.Background())
			}()
			select {
			case <-done:
			case <-time.After(long):
				t.Errorf("Release still running after %v", long)
			}
		})
	}
	return h, err
}

func TestAcquireGrant(t *testing.T) {
	b := &script{answer: always(nil)}
	if _, err := acquire(t, testCtx(t), b, lock.Options{}); err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	if n := b.calls.Load(); n != 1 {
		t.Errorf("%d attempts, want 1", n)
	}
}

func TestAcquireRetriesUnavailable(t *testing.T) {
	t.Parallel()
	b := &script{answer: always(errUnreachable)}
	const timeout = 300 * time.Millisecond
	start := time.Now()
	_, err := acquire(t, testCtx(t), b, lock.Options{ConnectTimeout: timeout})
	took := time.Since(start)
	if !errors.Is(err, lock.ErrUnavailable) {
		t.Fatalf("Acquire: %v; want an error matching lock.ErrUnavailable", err)
	}
	if !retriedFor.MatchString(err.Error()) {
		t.Errorf("Acquire: %q; want the backend's message, then \"; retried for DURATION\"", err)
	}
	if took < timeout || took > long {
		t.Errorf("Acquire gave up after %v; want the connect timeout, %v", took, timeout)
	}
	// Pauses of at least 25ms, 50ms, 100ms, then the rest: 4 or 5 attempts
	// (fewer on a slow machine). More means no backoff.
	if n := b.calls.Load(); n < 2 || n > 6 {
		t.Errorf("%d attempts in %v; want 2 to 6", n, took)
	}
}

var retriedFor = regexp.MustCompile(`^cannot reach test \(connection refused\); retried for (\S+)$`)

// TestAcquireSaysHowLongItRetried: the message does not understate the
// wait, even for a connect timeout under a second.
func TestAcquireSaysHowLongItRetried(t *testing.T) {
	t.Parallel()
	const timeout = 300 * time.Millisecond
	_, err := acquire(t, testCtx(t), &script{answer: always(errUnreachable)}, lock.Options{ConnectTimeout: timeout})
	if err == nil {
		t.Fatal("Acquire succeeded")
	}
	m := retriedFor.FindStringSubmatch(err.Error())
	if m == nil {
		t.Fatalf("Acquire: %q; want the backend's message, then \"; retried for DURATION\"", err)
	}
	if d, perr := time.ParseDuration(m[1]); perr != nil || d < timeout {
		t.Errorf("Acquire: %q; want it to say it retried for at least the connect timeout, %v", err, timeout)
	}
}

// unsettled is the error of a backend that cannot vouch yet that the lock
// is free, for remaining more.
type unsettled struct{ remaining time.Duration }

func (e unsettled) Error() string {
	return "test has been up for 1s, less than --ttl; locks can be taken there in " + e.remaining.String()
}
func (e unsettled) Unwrap() error            { return lock.ErrUnsettled }
func (e unsettled) Remaining() time.Duration { return e.remaining }

// TestAcquireWaitsForUnsettled: a backend that cannot vouch yet that the
// lock is free is not a conflict, even with NoWait: Acquire waits until it
// can, as long as the connect timeout allows, and takes the lock.
func TestAcquireWaitsForUnsettled(t *testing.T) {
	t.Parallel()
	const remaining = 200 * time.Millisecond
	b := &script{answer: func(n int) error {
		if n == 0 {
			return unsettled{remaining}
		}
		return nil
	}}
	start := time.Now()
	if _, err := acquire(t, testCtx(t), b, lock.Options{NoWait: true, ConnectTimeout: long}); err != nil {
		t.Fatalf("Acquire with NoWait on an unsettled backend: %v; want the lock once it settles", err)
	}
	if took := time.Since(start); took < remaining {
		t.Errorf("acquired after %v; want no earlier than the backend said, %v", took, remaining)
	}
	if n := b.calls.Load(); n != 2 {
		t.Errorf("%d attempts; want 2, the second when the backend settles", n)
	}
}

// TestAcquireUnsettledTooLong: a backend that will not settle within the
// connect timeout is tried once more at its end, then reported as
// unavailable, with its reason: never as held.
func TestAcquireUnsettledTooLong(t *testing.T) {
	t.Parallel()
	const timeout = 300 * time.Millisecond
	b := &script{answer: always(unsettled{time.Minute})}
	start := time.Now()
	_, err := acquire(t, testCtx(t), b, lock.Options{NoWait: true, ConnectTimeout: timeout})
	if !errors.Is(err, lock.ErrUnavailable) || errors.Is(err, lock.ErrHeld) {
		t.Fatalf("Acquire: %v; want ErrUnavailable, not ErrHeld", err)
	}
	if !strings.Contains(err.Error(), "locks can be taken there in 1m0s; waited") || !strings.HasSuffix(err.Error(), "(--connect-timeout)") {
		t.Errorf("Acquire: %q; want the backend's reason and how long it waited", err)
	}
	if took := time.Since(start); took < timeout {
		t.Errorf("gave up after %v; want the connect timeout, %v", took, timeout)
	}
	if n := b.calls.Load(); n != 2 {
		t.Errorf("%d attempts; want 2, the second at the connect timeout", n)
	}
}

func TestAcquireRecovers(t *testing.T) {
	t.Parallel()
	b := &script{answer: func(n int) error {
		if n < 3 {
			return errUnreachable
		}
		return nil
	}}
	if _, err := acquire(t, testCtx(t), b, lock.Options{ConnectTimeout: time.Minute}); err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	if n := b.calls.Load(); n != 4 {
		t.Errorf("%d attempts, want 4", n)
	}
}

// TestAcquireConnectTimeoutPerRun: the connect timeout counts from the
// first failure of a run of failures; an answer from the backend (held)
// ends the run.
func TestAcquireConnectTimeoutPerRun(t *testing.T) {
	t.Parallel()
	const timeout = 500 * time.Millisecond
	const cycles = 8 // unreachable, unreachable, held: each cycle lasts at least 125ms
	b := &script{answer: func(n int) error {
		switch {
		case n >= 3*cycles:
			return nil
		case n%3 == 2:
			return errHeld
		}
		return errUnreachable
	}}
	start := time.Now()
	if _, err := acquire(t, testCtx(t), b, lock.Options{ConnectTimeout: timeout}); err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	if took := time.Since(start); took <= timeout {
		t.Fatalf("bad test: the script took %v, no longer than the connect timeout %v", took, timeout)
	}
}

func TestAcquireOneAttempt(t *testing.T) {
	for _, tc := range []struct {
		desc   string
		err    error
		noWait bool
	}{
		{"refused", errRefused, false},
		{"other error", errors.New("test: something else"), false},
		{"held with NoWait", errHeld, true},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			b := &script{answer: always(tc.err)}
			_, err := acquire(t, testCtx(t), b, lock.Options{NoWait: tc.noWait, ConnectTimeout: time.Minute})
			if err != tc.err {
				t.Errorf("Acquire: %v; want the backend's error as it is, %v", err, tc.err)
			}
			if n := b.calls.Load(); n != 1 {
				t.Errorf("%d attempts, want 1", n)
			}
		})
	}
}

func TestAcquirePollsHeld(t *testing.T) {
	t.Parallel()
	b := &script{answer: func(n int) error {
		if n < 3 {
			return errHeld
		}
		return nil
	}}
	if _, err := acquire(t, testCtx(t), b, lock.Options{}); err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	if n := b.calls.Load(); n != 4 {
		t.Errorf("%d attempts, want 4", n)
	}
}

// TestAcquirePollsSlowerLater: a long wait polls fast for its first second
// (a lock held briefly changes hands at once), then slower, so that it
// costs the server little (every 525-700 ms), but never slower than every
// 700 ms, which keeps a hand-off within a second (docs/behaviour.md,
// Acquiring). Sleeps can only be longer than asked
// on a busy machine, so the slow polls' lower bound is exact.
func TestAcquirePollsSlowerLater(t *testing.T) {
	t.Parallel()
	const fastFor, waitPoll = time.Second, 700 * time.Millisecond
	var (
		mu    sync.Mutex
		calls []time.Time
	)
	start := time.Now()
	b := &script{answer: func(int) error {
		mu.Lock()
		defer mu.Unlock()
		calls = append(calls, time.Now())
		if time.Since(start) < fastFor+4*waitPoll {
			return errHeld
		}
		return nil
	}}
	if _, err := acquire(t, testCtx(t), b, lock.Options{}); err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	fast, slow := 0, 0
	for i := 1; i < len(calls); i++ {
		gap := calls[i].Sub(calls[i-1])
		if calls[i-1].Sub(calls[0]) < fastFor {
			if gap < waitPoll/2 {
				fast++
			}
			continue
		}
		slow++
		if gap < waitPoll*3/4 {
			t.Errorf("attempt %d came %v after the one before, %v into the wait; want at least %v once the first second is over", i, gap, calls[i-1].Sub(calls[0]), waitPoll*3/4)
		}
	}
	if fast == 0 {
		t.Errorf("no attempt in the first second came sooner than %v after the one before: %v", waitPoll/2, calls)
	}
	if slow < 2 {
		t.Errorf("%d attempts after the first second; the test needs some", slow)
	}
}

// TestAcquireUsesWaiter: a Waiter tries once, then waits on the server if
// the lock is held, unless NoWait asks for one attempt.
func TestAcquireUsesWaiter(t *testing.T) {
	for _, tc := range []struct {
		desc                string
		noWait              bool
		answer              error
		wantTries, wantWait int32
	}{
		{"free", false, nil, 1, 0},
		{"held", false, errHeld, 1, 1},
		{"free, NoWait", true, nil, 1, 0},
	} {
		b := &waiter{script: script{answer: always(tc.answer)}}
		if _, err := acquire(t, testCtx(t), b, lock.Options{NoWait: tc.noWait}); err != nil {
			t.Fatalf("%s: Acquire: %v", tc.desc, err)
		}
		if tries, waits := b.calls.Load(), b.waits.Load(); tries != tc.wantTries || waits != tc.wantWait {
			t.Errorf("%s: %d TryAcquire and %d Acquire calls; want %d and %d", tc.desc, tries, waits, tc.wantTries, tc.wantWait)
		}
	}
}

// expiringWaiter is a Waiter whose server-side wait runs out (ErrHeld) after
// wait, until its n-th wait (from 0), which grants the lock; it records when
// each wait began and ended.
type expiringWaiter struct {
	script
	wait       time.Duration
	grantAt    int
	mu         sync.Mutex
	began, end []time.Time
}

func (w *expiringWaiter) Acquire(context.Context, string) (lock.Lease, time.Time, error) {
	w.mu.Lock()
	n := len(w.began)
	w.began = append(w.began, time.Now())
	w.mu.Unlock()
	if n == w.grantAt {
		return &fakeLease{}, time.Now(), nil
	}
	time.Sleep(w.wait) // the server's wait
	w.mu.Lock()
	w.end = append(w.end, time.Now())
	w.mu.Unlock()
	return nil, time.Time{}, errHeld
}

// TestAcquireWaiterAsksAgainAtOnce: a server-side wait that ran out is
// issued again at once, without the poll's pause (the wait was the poll), so
// that a waiter is never away from the server's queue; a wait that returns
// sooner than the pause is still paced by it.
func TestAcquireWaiterAsksAgainAtOnce(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		wait   time.Duration
		atOnce bool
	}{
		{wait: time.Second, atOnce: true},
		{wait: time.Millisecond, atOnce: false},
	} {
		b := &expiringWaiter{script: script{answer: always(errHeld)}, wait: tc.wait, grantAt: 3}
		if _, err := acquire(t, testCtx(t), b, lock.Options{}); err != nil {
			t.Fatalf("Acquire: %v", err)
		}
		for i, end := range b.end {
			gap := b.began[i+1].Sub(end)
			// The shortest pause is 25ms. Asked again at once, the gap is
			// what a loaded machine adds between two calls (far below
			// 20ms); after a pause, at least the pause less the 1ms wait
			// and the scheduling of the attempt's end (12ms leaves room).
			if tc.atOnce && gap > 20*time.Millisecond {
				t.Errorf("a wait of %v ran out; the next began %v later, want at once", tc.wait, gap)
			}
			if !tc.atOnce && gap < 12*time.Millisecond {
				t.Errorf("a wait of %v returned; the next began %v later, want the poll's pause (25ms or more)", tc.wait, gap)
			}
		}
	}
}

func TestAcquireCancelled(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		desc string
		err  error
		// cancelIn is the attempt (from 0) during which the backend
		// cancels; if -1, the test cancels after the second attempt, while
		// Acquire pauses or makes the next one.
		cancelIn int
		// want is the backend error the result must match; nil for an
		// attempt that only ran out of time when the cancel cut it short
		// (a slow server is not an unavailable one: exit 75, not 69).
		want error
	}{
		{"held, cancelled in an attempt", errHeld, 2, errHeld},
		{"held, cancelled between attempts", errHeld, -1, errHeld},
		{"unreachable, cancelled in the first attempt", errUnreachable, 0, errUnreachable},
		{"slow, cut short in the first attempt", lock.Unreachable("test", "timed out"), 0, nil},
		{"unreachable, cancelled in a later attempt", errUnreachable, 2, errUnreachable},
		{"unreachable, cancelled between attempts", errUnreachable, -1, errUnreachable},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			cause := errors.New("test: stopped by a signal")
			ctx, cancel := context.WithCancelCause(testCtx(t))
			defer cancel(nil)
			second := make(chan struct{})
			b := &script{answer: func(n int) error {
				switch {
				case n == tc.cancelIn:
					cancel(cause)
				case n == 1 && tc.cancelIn < 0:
					close(second)
				}
				return tc.err
			}}
			done := make(chan error, 1)
			go func() {
				_, err := acquire(t, ctx, b, lock.Options{ConnectTimeout: time.Hour})
				done <- err
			}()
			if tc.cancelIn < 0 {
				<-second
				cancel(cause)
			}
			var err error
			select {
			case err = <-done:
			case <-time.After(long):
				t.Fatalf("Acquire did not return %v after its context was cancelled", long)
			}
			if !errors.Is(err, cause) {
				t.Errorf("Acquire: %v; want an error matching the cancel cause", err)
			}
			if tc.want != nil && !errors.Is(err, tc.want) {
				t.Errorf("Acquire: %v; want an error matching the last backend error, %v", err, tc.want)
			}
			if tc.want == nil && errors.Is(err, lock.ErrUnavailable) {
				t.Errorf("Acquire: %v; an attempt cut short by the cancel is not a sign of an unavailable backend", err)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("Acquire: %q is more than one line", err)
			}
		})
	}
}

func TestCheckName(t *testing.T) {
	for _, name := range []string{"", strings.Repeat("x", 256), strings.Repeat("ü", 128), "a\xffb", "\xc3"} {
		if err := lock.CheckName(name); !errors.Is(err, lock.ErrUsage) {
			t.Errorf("CheckName(%.20q): %v; want an error matching lock.ErrUsage", name, err)
		}
	}
	for _, name := range []string{"x", strings.Repeat("x", 255), "日本語", "../../etc/passwd", "a b"} {
		if err := lock.CheckName(name); err != nil {
			t.Errorf("CheckName(%.20q): %v", name, err)
		}
	}
}

func TestAcquireChecksName(t *testing.T) {
	b := &script{answer: always(nil)}
	_, err := lock.NewClient(b, lock.Options{}).Acquire(testCtx(t), "")
	if !errors.Is(err, lock.ErrUsage) {
		t.Errorf("Acquire with an empty name: %v; want an error matching lock.ErrUsage", err)
	}
	if n := b.calls.Load(); n != 0 {
		t.Errorf("%d attempts with a bad name, want 0", n)
	}
}

func TestErrorf(t *testing.T) {
	inner := errors.New("connection refused")
	err := lock.Errorf(lock.ErrUnavailable, "cannot reach db:5432 (%w)", inner)
	if got, want := err.Error(), "cannot reach db:5432 (connection refused)"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
	if !errors.Is(err, lock.ErrUnavailable) || !errors.Is(err, inner) {
		t.Errorf("%v: want it to match both lock.ErrUnavailable and the wrapped error", err)
	}
	if errors.Is(err, lock.ErrRefused) {
		t.Errorf("%v matches lock.ErrRefused", err)
	}
}

// schemes makes a fresh scheme name per call: the registry is global and
// the tests may run more than once in a process (-count).
var schemes atomic.Int32

func freshScheme(prefix string) string {
	return prefix + "-" + strconv.Itoa(int(schemes.Add(1)))
}

func TestOpen(t *testing.T) {
	scheme := freshScheme("test-open")
	var gotURL *url.URL
	var gotOpts lock.Options
	lock.Register(scheme, func(u *url.URL, opts lock.Options) (lock.Backend, error) {
		gotURL, gotOpts = u, opts
		return &script{answer: always(nil)}, nil
	})
	found := false
	for _, s := range lock.Schemes() {
		found = found || s == scheme
	}
	if !found {
		t.Errorf("Schemes() = %q, without %q", lock.Schemes(), scheme)
	}

	if _, err := lock.Open(strings.ToUpper(scheme)+"://host/x", lock.Options{}); err != nil {
		t.Fatalf("Open of a registered scheme, in upper case: %v", err)
	}
	if gotURL == nil || gotURL.Host != "host" {
		t.Errorf("the opener got URL %v", gotURL)
	}
	if gotOpts.TTL != lock.DefaultTTL || gotOpts.Grace != lock.DefaultGrace ||
		gotOpts.ConnectTimeout != lock.DefaultConnectTimeout || gotOpts.Log == nil {
		t.Errorf("the opener got options without their defaults: %+v", gotOpts)
	}

	for _, tc := range []struct {
		url  string
		kind error
	}{
		{"nope://u:hunter2@host/", lock.ErrUsage},
		{"host/db", lock.ErrUsage},
		{"//u:hunter2@host/db", lock.ErrUsage},
		{"%zz://u:hunter2@host/", lock.ErrUsage},
		// Reserved schemes without a backend yet; drop each as its
		// backend lands.
	} {
		_, err := lock.Open(tc.url, lock.Options{})
		if !errors.Is(err, tc.kind) {
			t.Errorf("Open(%q): %v; want an error matching %v", tc.url, err, tc.kind)
			continue
		}
		if !strings.Contains(err.Error(), scheme+"://") {
			t.Errorf("Open(%q): %q; want it to list the supported schemes", tc.url, err)
		}
		if strings.Contains(err.Error(), "hunter2") {
			t.Errorf("Open(%q): %q shows the password", tc.url, err)
		}
	}
}

func TestRegisterTwicePanics(t *testing.T) {
	scheme := freshScheme("test-dup")
	open := func(*url.URL, lock.Options) (lock.Backend, error) { return nil, nil }
	lock.Register(scheme, open)
	defer func() {
		if recover() == nil {
			t.Errorf("registering %q twice did not panic", scheme)
		}
	}()
	lock.Register(scheme, open)
}

func TestRegisterNilPanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Errorf("registering a nil Opener did not panic")
		}
	}()
	lock.Register(freshScheme("test-nil"), nil)
}

// TestOpenOptions: one Options value, defaulted once, reaches the backend
// and the Client alike; options that cannot work are refused before any
// backend is opened.
func TestOpenOptions(t *testing.T) {
	scheme := freshScheme("test-opts")
	var got lock.Options
	lock.Register(scheme, func(_ *url.URL, opts lock.Options) (lock.Backend, error) {
		got = opts
		return &script{answer: always(nil)}, nil
	})
	c, err := lock.Open(scheme+"://x", lock.Options{TTL: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if got.Grace != time.Second || c.Options().Grace != time.Second {
		t.Errorf("Grace with TTL 3s: backend %v, client %v; want ttl/3 = 1s", got.Grace, c.Options().Grace)
	}
	if got.TTL != c.Options().TTL || got.Mode != lock.Exclusive {
		t.Errorf("backend got %+v, client has %+v", got, c.Options())
	}
	if c, _ := lock.Open(scheme+"://x", lock.Options{}); c.Options().Grace != lock.DefaultGrace {
		t.Errorf("default Grace %v, want %v", c.Options().Grace, lock.DefaultGrace)
	}
	for _, bad := range []lock.Options{
		{TTL: time.Second, Grace: time.Second},
		{Mode: "sometimes"},
		{Mode: lock.Semaphore},
		{Mode: lock.Shared, MaxHolders: 2},
	} {
		if _, err := lock.Open(scheme+"://x", bad); !errors.Is(err, lock.ErrUsage) {
			t.Errorf("Open with %+v: %v; want ErrUsage", bad, err)
		}
	}
}

// slowFirst is a script whose first TryAcquire answers only after delay.
type slowFirst struct {
	script
	delay  time.Duration
	leases []*fakeLease
}

func (s *slowFirst) TryAcquire(ctx context.Context, name string) (lock.Lease, error) {
	if s.calls.Load() == 0 {
		time.Sleep(s.delay)
	}
	s.calls.Add(1)
	l := &fakeLease{}
	s.leases = append(s.leases, l)
	return l, nil
}

// TestLateGrantGivenBack: a lease granted after more than TTL-Grace could
// run out before the command could be stopped; Acquire gives it back and
// tries again rather than start the command on it.
func TestLateGrantGivenBack(t *testing.T) {
	t.Parallel()
	b := &slowFirst{delay: 500 * time.Millisecond}
	h, err := acquire(t, testCtx(t), b, lock.Options{TTL: 600 * time.Millisecond, Grace: 200 * time.Millisecond})
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	mustNotBeLost(t, h)
	if n := b.calls.Load(); n != 2 {
		t.Fatalf("%d attempts; want the late one and one more", n)
	}
	if n := b.leases[0].releases.Load(); n != 1 {
		t.Errorf("the late lease was released %d times; want 1", n)
	}
}

// TestSuspendedDuringAttempt: a lease granted to an attempt during which
// the host slept past TTL-Grace may have run out already: it is given back
// and the lock taken again, not handed to the keep loop to give up.
func TestSuspendedDuringAttempt(t *testing.T) {
	t.Parallel()
	clk := &lock.TestClock{}
	l := &fakeLease{}
	b := &script{lease: l, answer: func(n int) error {
		if n == 0 {
			clk.Suspend(time.Minute)
		}
		return nil
	}}
	h, err := acquire(t, testCtx(t), b, lock.WithClock(lock.Options{TTL: 30 * time.Second, Grace: time.Second}, clk))
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	if n := b.calls.Load(); n != 2 {
		t.Errorf("%d attempts; want the lease granted across a suspend given back, and a second attempt", n)
	}
	if n := l.releases.Load(); n != 1 {
		t.Errorf("the lease was released %d times during Acquire; want the late one given back", n)
	}
	mustNotBeLost(t, h)
}

// TestCheckWaitsForUnsettled: withlock check on a backend that cannot
// vouch yet that a lock is free waits for it within the connect timeout;
// beyond it, the probe lock is a warning that says when, not a failure.
func TestCheckWaitsForUnsettled(t *testing.T) {
	t.Parallel()
	b := &script{answer: func(n int) error {
		if n == 0 {
			return unsettled{100 * time.Millisecond}
		}
		return nil
	}}
	findings, err := lock.NewClient(b, lock.Options{ConnectTimeout: long}).Check(testCtx(t))
	if err != nil || len(findings) == 0 || findings[0].Status != lock.Ok {
		t.Fatalf("Check on a backend that settles within the connect timeout: %v, %+v; want the probe lock ok", err, findings)
	}
	b = &script{answer: always(unsettled{time.Minute})}
	findings, err = lock.NewClient(b, lock.Options{ConnectTimeout: 300 * time.Millisecond}).Check(testCtx(t))
	if err != nil || len(findings) == 0 || findings[0].Status != lock.Warn || !strings.Contains(findings[0].Detail, "locks can be taken there in 1m0s") {
		t.Fatalf("Check on a backend that will not settle in time: %v, %+v; want the probe lock a warning saying when", err, findings)
	}
	if n := b.calls.Load(); n != 1 {
		t.Errorf("%d attempts; want 1 (the wait is longer than the connect timeout)", n)
	}
}
