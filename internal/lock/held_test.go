package lock_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/withlock/withlock/internal/lock"
)

// hold acquires "job" with lease through a script backend.
func hold(t *testing.T, lease lock.Lease, opts lock.Options) *lock.Held {
	t.Helper()
	h, err := acquire(t, testCtx(t), &script{answer: always(nil), lease: lease}, opts)
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	return h
}

// waitLost waits for h.Lost, failing t after long.
func waitLost(t *testing.T, h *lock.Held) {
	t.Helper()
	select {
	case <-h.Lost():
	case <-time.After(long):
		t.Fatalf("Lost not closed after %v", long)
	}
}

// mustNotBeLost checks that Lost is open and Err nil.
func mustNotBeLost(t *testing.T, h *lock.Held) {
	t.Helper()
	select {
	case <-h.Lost():
		t.Fatalf("Lost is closed: %v", h.Err())
	default:
	}
	if err := h.Err(); err != nil {
		t.Errorf("Err while Lost is open: %v", err)
	}
}

// TestLostWhenKeepCannotTell: Keep errors that do not say "lost" are
// retried, until no Keep has succeeded for TTL-Grace.
func TestLostWhenKeepCannotTell(t *testing.T) {
	t.Parallel()
	l := &fakeLease{keep: always(errors.New("test: no answer"))}
	h := hold(t, l, lock.Options{TTL: 600 * time.Millisecond, Grace: 200 * time.Millisecond})
	waitLost(t, h)
	// TTL-Grace is 400ms; allow for clocks that round.
	if d := time.Since(h.AcquiredAt()); d < 350*time.Millisecond || d > 5*time.Second {
		t.Errorf("Lost closed %v after acquisition; want about 400ms", d)
	}
	if err := h.Err(); !errors.Is(err, lock.ErrLost) || !strings.Contains(err.Error(), "test: no answer") {
		t.Errorf("Err: %v; want an error matching lock.ErrLost that gives the last error", err)
	}
	if n := l.keeps.Load(); n < 1 {
		t.Errorf("Keep called %d times", n)
	}
	if err := h.Release(testCtx(t)); err != nil {
		t.Errorf("Release after loss: %v", err)
	}
	// Unanswered is not known gone: a renewal the server applies late may
	// have kept the lease, which one release of its own frees.
	if n := l.releases.Load(); n != 1 {
		t.Errorf("the lease was released %d times after it was given up for lack of answers; want one try", n)
	}
}

func TestLostWhenKeepSaysLost(t *testing.T) {
	t.Parallel()
	lost := lock.Errorf(lock.ErrLost, "test: taken")
	l := &fakeLease{keep: always(lost)}
	// The first Keep is at TTL/3 = 500ms, the deadline at TTL-Grace = 1s.
	h := hold(t, l, lock.Options{TTL: 1500 * time.Millisecond, Grace: 500 * time.Millisecond})
	waitLost(t, h)
	if err := h.Err(); !errors.Is(err, lost) {
		t.Errorf("Err: %v; want the error of Keep, %v", err, lost)
	}
	if n := l.keeps.Load(); n != 1 {
		t.Errorf("Keep called %d times; want Lost closed at the first ErrLost", n)
	}
	if err := h.Release(testCtx(t)); err != nil {
		t.Errorf("Release after loss: %v", err)
	}
	if n := l.releases.Load(); n != 0 {
		t.Errorf("the lease was released %d times after its loss; a lost lock is not released", n)
	}
}

// watchingLease is a Watcher that reports a loss once lose is closed.
type watchingLease struct {
	*fakeLease
	lose chan struct{}
}

func (l watchingLease) Watch(ctx context.Context) error {
	select {
	case <-ctx.Done():
		return nil
	case <-l.lose:
		return lock.Errorf(lock.ErrLost, "test: session ended")
	}
}

func TestLostWhenWatchSaysLost(t *testing.T) {
	t.Parallel()
	l := watchingLease{&fakeLease{}, make(chan struct{})}
	h := hold(t, l, lock.Options{TTL: time.Hour})
	mustNotBeLost(t, h)
	close(l.lose)
	waitLost(t, h)
	if err := h.Err(); !errors.Is(err, lock.ErrLost) {
		t.Errorf("Err: %v; want an error matching lock.ErrLost", err)
	}
	if n := l.keeps.Load(); n != 0 {
		t.Errorf("Keep called %d times; want the loss noticed by Watch alone", n)
	}
}

// TestKeepCadence: Keep every TTL/3 less at most a quarter of it (at
// random, so that holders that started together drift apart), never sooner
// after a success.
func TestKeepCadence(t *testing.T) {
	t.Parallel()
	const interval = 300 * time.Millisecond
	l := &fakeLease{kept: make(chan time.Time, 100)}
	// A Keep every TTL instead of TTL/3 would come after the deadline
	// (TTL-Grace = 800ms) and lose the lock.
	h := hold(t, l, lock.Options{TTL: 3 * interval, Grace: 100 * time.Millisecond})
	prev := h.AcquiredAt()
	for i := range 3 {
		select {
		case k := <-l.kept:
			// Timers never fire early: each gap is at least 3/4 of the interval.
			if gap := k.Sub(prev); gap < interval*3/4-time.Millisecond {
				t.Errorf("Keep %d came %v after the previous one; want about %v", i+1, gap, interval)
			}
			prev = k
		case <-h.Lost():
			t.Fatalf("lost after %d Keeps: %v", i, h.Err())
		case <-time.After(long):
			t.Fatalf("no Keep %d after %v", i+1, long)
		}
	}
	if d := prev.Sub(h.AcquiredAt()); d > 5*time.Second {
		t.Errorf("3 Keeps took %v; want about %v", d, 3*interval)
	}
}

// TestKeepRetriesSooner: after a Keep that could not tell, the next comes
// sooner than TTL/3, so one hiccup does not lose the lock.
func TestKeepRetriesSooner(t *testing.T) {
	t.Parallel()
	l := &fakeLease{
		kept: make(chan time.Time, 100),
		keep: func(n int) error {
			if n == 0 {
				return errors.New("test: hiccup")
			}
			return nil
		},
	}
	// Keeps every 500ms; after the failed one at 500ms, a retry at the
	// next interval (1s) would meet the deadline (TTL-Grace = 1s) and lose
	// the lock.
	h := hold(t, l, lock.Options{TTL: 1500 * time.Millisecond, Grace: 500 * time.Millisecond})
	for i := range 3 {
		select {
		case <-l.kept:
		case <-h.Lost():
			t.Fatalf("lost after %d Keeps: %v", i, h.Err())
		case <-time.After(long):
			t.Fatalf("no Keep %d after %v", i+1, long)
		}
	}
	mustNotBeLost(t, h)
}

func TestReleaseStopsKeeping(t *testing.T) {
	t.Parallel()
	l := &fakeLease{}
	h := hold(t, l, lock.Options{TTL: 600 * time.Millisecond, Grace: 100 * time.Millisecond})
	if err := h.Release(testCtx(t)); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if n := l.releases.Load(); n != 1 {
		t.Errorf("the lease was released %d times, want 1", n)
	}
	keeps := l.keeps.Load()
	select {
	case <-h.Lost():
		t.Errorf("Lost closed after Release: %v", h.Err())
	case <-time.After(700 * time.Millisecond): // past a Keep's time and TTL-Grace
	}
	if n := l.keeps.Load(); n != keeps {
		t.Errorf("Keep called %d times after Release", n-keeps)
	}
}

func TestReleaseOnce(t *testing.T) {
	failed := errors.New("test: connection reset")
	l := &fakeLease{releaseErr: failed}
	h := hold(t, l, lock.Options{})
	err := h.Release(testCtx(t))
	if !errors.Is(err, failed) || !strings.Contains(err.Error(), `"job"`) {
		t.Errorf("Release: %v; want the lease's error, naming the lock", err)
	}
	if again := h.Release(testCtx(t)); again != err {
		t.Errorf("second Release: %v; want the first result, %v", again, err)
	}
	if n := l.releases.Load(); n != 1 {
		t.Errorf("the lease was released %d times, want 1", n)
	}
}

func TestHoldAtLeastWaits(t *testing.T) {
	t.Parallel()
	const least = 300 * time.Millisecond
	l := &fakeLease{}
	h := hold(t, l, lock.Options{HoldAtLeast: least})
	ctx, cancel := context.WithCancel(testCtx(t))
	if err := h.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
	cancel()
	if d := time.Since(h.AcquiredAt()); d < least {
		t.Errorf("Release returned %v after acquisition, before HoldAtLeast %v", d, least)
	}
	if n := l.releases.Load(); n != 1 {
		t.Errorf("the lease was released %d times, want 1", n)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.releaseCtxErr != nil || !l.releaseHasDeadline {
		t.Errorf("the lease's Release got a context that was done (%v) or had no deadline (%v); want its own timeout",
			l.releaseCtxErr, !l.releaseHasDeadline)
	}
}

func TestHoldAtLeastCancelled(t *testing.T) {
	t.Parallel()
	l := &fakeLease{}
	h := hold(t, l, lock.Options{HoldAtLeast: time.Hour})
	ctx, cancel := context.WithCancel(testCtx(t))
	done := make(chan error, 1)
	go func() { done <- h.Release(ctx) }()
	// Cancelled before or during the hold: either way Release ends early.
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Release: %v", err)
		}
	case <-time.After(long):
		t.Fatalf("Release with a cancelled context still holding after %v", long)
	}
	if n := l.releases.Load(); n != 1 {
		t.Errorf("the lease was released %d times, want 1", n)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.releaseCtxErr != nil {
		t.Errorf("the lease's Release got a done context: %v; a cancelled hold must still release", l.releaseCtxErr)
	}
}

// lingeringLease is an Expiring lease that records ReleaseAt.
type lingeringLease struct {
	*fakeLease
	releaseAts atomic.Int32
	until      chan time.Time
}

func (l *lingeringLease) Token() int64 { return 1 }

func (l *lingeringLease) ReleaseAt(_ context.Context, until time.Time) error {
	l.releaseAts.Add(1)
	l.until <- until
	return nil
}

func TestHoldAtLeastLingers(t *testing.T) {
	t.Parallel()
	l := &lingeringLease{fakeLease: &fakeLease{}, until: make(chan time.Time, 1)}
	h := hold(t, l, lock.Options{HoldAtLeast: time.Hour})
	if err := h.Release(testCtx(t)); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if n := l.releaseAts.Load(); n != 1 {
		t.Fatalf("ReleaseAt called %d times, want 1", n)
	}
	if until, want := <-l.until, h.AcquiredAt().Add(time.Hour); !until.Equal(want) {
		t.Errorf("ReleaseAt(%v); want acquisition + HoldAtLeast, %v", until, want)
	}
	if n := l.releases.Load(); n != 0 {
		t.Errorf("Release of the lease called %d times; want ReleaseAt alone", n)
	}
}

// fencedLease is an Expiring lease with a token.
type fencedLease struct {
	*fakeLease
	token int64
}

func (l fencedLease) Token() int64                               { return l.token }
func (l fencedLease) ReleaseAt(context.Context, time.Time) error { return nil }

func TestToken(t *testing.T) {
	h := hold(t, fencedLease{&fakeLease{}, 42}, lock.Options{})
	if token, ok := h.Token(); token != 42 || !ok {
		t.Errorf("Token() = %d, %v; want 42, true", token, ok)
	}
	h = hold(t, &fakeLease{}, lock.Options{})
	if token, ok := h.Token(); token != 0 || ok {
		t.Errorf("Token() of a lease without one = %d, %v; want 0, false", token, ok)
	}
}

// slowWaiter is a Waiter whose Acquire waits (as a server-side queue does)
// until grant is closed, then grants lease.
type slowWaiter struct {
	script
	grant chan struct{}
}

func (w *slowWaiter) Acquire(ctx context.Context, _ string) (lock.Lease, time.Time, error) {
	select {
	case <-w.grant:
		return w.lease, time.Now(), nil
	case <-ctx.Done():
		return nil, time.Time{}, ctx.Err()
	}
}

// TestLongWaitIsNotLost: a lock granted after a server-side wait longer
// than TTL-Grace is kept from the grant on, not given up at once because
// the wait began long ago (a deploy's second pod waiting for the first's
// migration).
func TestLongWaitIsNotLost(t *testing.T) {
	t.Parallel()
	const ttl, grace = 600 * time.Millisecond, 200 * time.Millisecond
	l := &fakeLease{kept: make(chan time.Time, 100)}
	w := &slowWaiter{script: script{answer: always(errHeld), lease: l}, grant: make(chan struct{})}
	// The wait lasts three times TTL-Grace.
	time.AfterFunc(3*(ttl-grace), func() { close(w.grant) })
	h, err := acquire(t, testCtx(t), w, lock.Options{TTL: ttl, Grace: grace})
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	granted := time.Now()
	if d := granted.Sub(h.AcquiredAt()); d > 100*time.Millisecond || d < 0 {
		t.Errorf("AcquiredAt is %v before Acquire returned; want the moment of the grant", d)
	}
	select {
	case k := <-l.kept:
		if gap := k.Sub(granted); gap < ttl/3-50*time.Millisecond {
			t.Errorf("first Keep %v after the grant; want about TTL/3 = %v", gap, ttl/3)
		}
	case <-h.Lost():
		t.Fatalf("lost right after a long wait: %v", h.Err())
	case <-time.After(long):
		t.Fatalf("no Keep after %v", long)
	}
	mustNotBeLost(t, h)
}

// blockingLease is a Lease whose Keep, from the second on, blocks until
// unblock is closed, and which records the order of events.
type blockingLease struct {
	fakeLease
	inKeep, unblock chan struct{}
	mu              sync.Mutex
	events          []string
}

func (l *blockingLease) record(e string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events = append(l.events, e)
}

func (l *blockingLease) Keep(ctx context.Context) error {
	close(l.inKeep)
	<-l.unblock
	if ctx.Err() != nil {
		l.record("keep cut off")
	}
	l.record("keep done")
	return nil
}

func (l *blockingLease) Release(ctx context.Context) error {
	l.record("release")
	return l.fakeLease.Release(ctx)
}

// TestReleaseLetsKeepFinish: a Release that begins while a Keep is in
// flight waits for it instead of cutting it off, which on PostgreSQL would
// close the very session whose lock is to be released.
func TestReleaseLetsKeepFinish(t *testing.T) {
	t.Parallel()
	l := &blockingLease{inKeep: make(chan struct{}), unblock: make(chan struct{})}
	// The Keep's own deadline (TTL-Grace after acquisition) is far off.
	h := hold(t, l, lock.Options{TTL: 3 * time.Second, Grace: time.Second})
	<-l.inKeep
	released := make(chan error, 1)
	go func() { released <- h.Release(testCtx(t)) }()
	select {
	case err := <-released:
		t.Fatalf("Release returned while a Keep was in flight: %v", err)
	case <-time.After(100 * time.Millisecond): // Release must not overtake the Keep
	}
	close(l.unblock)
	if err := <-released; err != nil {
		t.Fatalf("Release: %v", err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if got := strings.Join(l.events, ", "); got != "keep done, release" {
		t.Errorf("events: %s; want the Keep to finish uncut, then the release", got)
	}
}

// TestHoldAtLeastKeepsChecking: while a session lock is held on for
// HoldAtLeast, it is still checked, so that a server that ends silent
// sessions does not free it early.
func TestHoldAtLeastKeepsChecking(t *testing.T) {
	t.Parallel()
	l := &fakeLease{kept: make(chan time.Time, 100)}
	// A ttl of seconds: with one of 300ms, a machine busy enough not to
	// run the keep loop for 200ms made it give the lock up as a stopped
	// process would, without a release.
	h := hold(t, l, lock.Options{TTL: 3 * time.Second, Grace: time.Second, HoldAtLeast: 2500 * time.Millisecond})
	if err := h.Release(testCtx(t)); err != nil {
		t.Fatalf("Release: %v", err)
	}
	// Two and a half Keep intervals; a loaded machine may run fewer Keeps,
	// but never none (before, the keep loop stopped when the hold began).
	if n := l.keeps.Load(); n < 1 {
		t.Errorf("%d Keeps during a hold of 7 Keep intervals; want the lock checked while held", n)
	}
	if n := l.releases.Load(); n != 1 {
		t.Errorf("the lease was released %d times, want 1", n)
	}
}

// soon bounds how long after waking a holder may take to act, in tests
// whose next Keep is 7.5s or more away: a loop that judged the lease only
// when its renewal timer fired would take that long; the keep loop looks
// at the clocks every slice (250ms under a grace of 1s), and a busy machine
// gets the rest.
const soon = 5 * time.Second

// waitSlice waits until the keep loop has looked at clk again at the end
// of a slice (so that it is well into a wait, with a timer set on the
// monotonic clock, when the test moves clk).
func waitSlice(t *testing.T, clk *lock.TestClock) {
	t.Helper()
	// Acquire reads the clock twice, the keep loop once on entering its
	// wait, and once at the end of each slice.
	deadline := time.Now().Add(long)
	for clk.Reads() < 4 {
		if time.Now().After(deadline) {
			t.Fatalf("the keep loop did not look at the clock for %v", long)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestLostWhenSuspendedPastLease: a host that slept past its lease (the
// boot clock jumped, the monotonic clock did not) gives the lock up within
// a slice of waking, before any Keep, and says why.
func TestLostWhenSuspendedPastLease(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		lease func(*fakeLease) lock.Lease
	}{
		{"lease", func(l *fakeLease) lock.Lease { return l }},
		{"watched", func(l *fakeLease) lock.Lease { return watchingLease{l, make(chan struct{})} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			l := &fakeLease{}
			clk := &lock.TestClock{}
			// A Keep every 10s or a little sooner; TTL-Grace is 29s.
			h := hold(t, tc.lease(l), lock.WithClock(lock.Options{TTL: 30 * time.Second, Grace: time.Second}, clk))
			waitSlice(t, clk)
			mustNotBeLost(t, h)
			clk.Suspend(time.Minute)
			woke := time.Now()
			select {
			case <-h.Lost():
			case <-time.After(soon):
				t.Fatalf("Lost not closed %v after waking from a suspend twice the ttl", soon)
			}
			t.Logf("lost %v after waking", time.Since(woke))
			err := h.Err()
			if !errors.Is(err, lock.ErrLost) || !strings.Contains(err.Error(), "stopped or suspended?") {
				t.Errorf("Err: %v; want an error matching lock.ErrLost that says withlock was suspended", err)
			}
			if n := l.keeps.Load(); n != 0 {
				t.Errorf("Keep called %d times; want the lock given up before any renewal after the deadline", n)
			}
			if err := h.Release(testCtx(t)); err != nil {
				t.Errorf("Release after loss: %v", err)
			}
			if n := l.releases.Load(); n != 0 {
				t.Errorf("the lease was released %d times; a lease that may be someone else's by now is left alone", n)
			}
		})
	}
}

// TestSuspendedBrieflyRenews: a host that slept past its renewal but not
// past TTL-Grace renews as soon as it wakes and keeps the lock.
func TestSuspendedBrieflyRenews(t *testing.T) {
	t.Parallel()
	l := &fakeLease{kept: make(chan time.Time, 100)}
	clk := &lock.TestClock{}
	h := hold(t, l, lock.WithClock(lock.Options{TTL: 30 * time.Second, Grace: time.Second}, clk))
	waitSlice(t, clk)
	// Past the renewal (10s at the latest), 14s short of TTL-Grace.
	clk.Suspend(15 * time.Second)
	woke := time.Now()
	select {
	case k := <-l.kept:
		t.Logf("kept %v after waking", k.Sub(woke))
	case <-h.Lost():
		t.Fatalf("lost after a suspend shorter than ttl - grace: %v", h.Err())
	case <-time.After(soon):
		t.Fatalf("no Keep %v after waking past the renewal", soon)
	}
	mustNotBeLost(t, h)
}

// TestLostWhenStopped: a process that did not run past TTL-Grace while its
// host did (SIGSTOP: both clocks moved) gives the lock up within a slice,
// before any Keep, as it does after a suspend.
func TestLostWhenStopped(t *testing.T) {
	t.Parallel()
	l := &fakeLease{}
	clk := &lock.TestClock{}
	h := hold(t, l, lock.WithClock(lock.Options{TTL: 30 * time.Second, Grace: time.Second}, clk))
	waitSlice(t, clk)
	clk.Stop(time.Minute)
	select {
	case <-h.Lost():
	case <-time.After(soon):
		t.Fatalf("Lost not closed %v after being stopped for twice the ttl", soon)
	}
	if err := h.Err(); !errors.Is(err, lock.ErrLost) || !strings.Contains(err.Error(), "did not run for 1m0") {
		t.Errorf("Err: %v; want an error matching lock.ErrLost that says how long withlock did not run", err)
	}
	if n := l.keeps.Load(); n != 0 {
		t.Errorf("Keep called %d times; want the lock given up before any renewal after the deadline", n)
	}
}

// countingWatcher is a Watcher that counts its Watches and checks that no
// Keep runs while one is in flight (both use the same connection).
type countingWatcher struct {
	*fakeLease
	watches, watching atomic.Int32
	overlapped        atomic.Bool
}

func (l *countingWatcher) Watch(ctx context.Context) error {
	l.watches.Add(1)
	l.watching.Add(1)
	defer l.watching.Add(-1)
	<-ctx.Done()
	return nil
}

func (l *countingWatcher) Keep(ctx context.Context) error {
	if l.watching.Load() != 0 {
		l.overlapped.Store(true)
	}
	return l.fakeLease.Keep(ctx)
}

// TestWatchSpansSlices: a Watch lasts from one Keep to the next, however
// many slices the wait is cut into, and has returned before the Keep.
func TestWatchSpansSlices(t *testing.T) {
	t.Parallel()
	l := &countingWatcher{fakeLease: &fakeLease{kept: make(chan time.Time, 100)}}
	// Slices of 25ms (a quarter of the grace), a Keep every 225-300ms.
	h := hold(t, l, lock.Options{TTL: 900 * time.Millisecond, Grace: 100 * time.Millisecond})
	for i := range 3 {
		select {
		case <-l.kept:
		case <-h.Lost():
			t.Fatalf("lost after %d Keeps: %v", i, h.Err())
		case <-time.After(long):
			t.Fatalf("no Keep %d after %v", i+1, long)
		}
	}
	// One Watch before each Keep, and one under way; at most one more if
	// the loop has begun its next wait since.
	if n := l.watches.Load(); n < 3 || n > 5 {
		t.Errorf("%d Watches for 3 Keeps; want one per wait, not one per slice", n)
	}
	if l.overlapped.Load() {
		t.Errorf("a Keep ran while a Watch was in flight on the same lease")
	}
}

// stuckLease is a Lease whose Keeps, from the first on, block until their
// context ends (a network that changed while the host slept), after
// saying so on inKeep.
type stuckLease struct {
	*fakeLease
	inKeep chan struct{}
}

func (l stuckLease) Keep(ctx context.Context) error {
	l.keeps.Add(1)
	l.inKeep <- struct{}{}
	<-ctx.Done()
	return ctx.Err()
}

// TestSuspendedDuringKeep: a Keep in flight when the host slept past the
// lease is cut short within a slice of waking, not left to run to its own
// deadline on the monotonic clock (14s here), and the lock is given up.
func TestSuspendedDuringKeep(t *testing.T) {
	t.Parallel()
	l := stuckLease{&fakeLease{}, make(chan struct{}, 1)}
	clk := &lock.TestClock{}
	h := hold(t, l, lock.WithClock(lock.Options{TTL: 30 * time.Second, Grace: time.Second}, clk))
	waitSlice(t, clk)
	// Past the renewal: the Keep begins at once, 14s short of TTL-Grace.
	clk.Suspend(15 * time.Second)
	select {
	case <-l.inKeep:
	case <-time.After(long):
		t.Fatalf("no Keep %v after waking past the renewal", long)
	}
	clk.Suspend(time.Minute)
	woke := time.Now()
	select {
	case <-h.Lost():
	case <-time.After(soon):
		t.Fatalf("Lost not closed %v after waking, mid-Keep, from a suspend twice the ttl", soon)
	}
	t.Logf("lost %v after waking", time.Since(woke))
	if err := h.Err(); !errors.Is(err, lock.ErrLost) || !strings.Contains(err.Error(), "stopped or suspended?") {
		t.Errorf("Err: %v; want an error matching lock.ErrLost that says withlock was suspended", err)
	}
	if n := l.keeps.Load(); n != 1 {
		t.Errorf("Keep called %d times; want none after the one cut short", n)
	}
}

// TestKeepRunsOutOfTime: a Keep that hangs to its deadline, on a host that
// was not suspended, is a check that went unanswered, not a suspend.
func TestKeepRunsOutOfTime(t *testing.T) {
	t.Parallel()
	l := stuckLease{&fakeLease{}, make(chan struct{}, 1)}
	h := hold(t, l, lock.Options{TTL: 600 * time.Millisecond, Grace: 200 * time.Millisecond})
	waitLost(t, h)
	if err := h.Err(); !errors.Is(err, lock.ErrLost) || !strings.Contains(err.Error(), "last error: context deadline exceeded") {
		t.Errorf("Err: %v; want an error matching lock.ErrLost that gives the Keep's timeout as the last error", err)
	}
}

// TestGraceCloseToTTL: a grace that leaves less than TTL/3 (--ttl 3s
// --kill-after 2500ms) is kept by checks at least twice as often as that
// time, not given up before the first check as a process that did not run.
func TestGraceCloseToTTL(t *testing.T) {
	t.Parallel()
	opts := lock.Options{TTL: 3 * time.Second, Grace: 2500 * time.Millisecond}
	if got := opts.KeepInterval(); got != 250*time.Millisecond {
		t.Errorf("KeepInterval() = %s; want half of ttl - grace, 250ms", got)
	}
	l := &fakeLease{kept: make(chan time.Time, 100)}
	h := hold(t, l, opts)
	// Six checks span 1.25s and more: more than twice what one check vouches
	// for (500ms).
	for range 6 {
		select {
		case <-l.kept:
		case <-h.Lost():
			t.Fatalf("lost after %d checks: %v", l.keeps.Load(), h.Err())
		case <-time.After(long):
			t.Fatal("no check")
		}
	}
	select {
	case <-h.Lost():
		t.Fatalf("lost: %v", h.Err())
	default:
	}
}

// TestStoppedDuringKeep: a Keep in flight when the process was stopped
// (both clocks moved) fails at its deadline once it runs again; the lock is
// given up as one that withlock did not run to keep, not as a check that
// went unanswered.
func TestStoppedDuringKeep(t *testing.T) {
	t.Parallel()
	l := stuckLease{&fakeLease{}, make(chan struct{}, 1)}
	clk := &lock.TestClock{}
	h := hold(t, l, lock.WithClock(lock.Options{TTL: 3 * time.Second, Grace: time.Second}, clk))
	select {
	case <-l.inKeep:
	case <-time.After(long):
		t.Fatalf("no Keep within %v", long)
	}
	clk.Stop(time.Minute)
	waitLost(t, h)
	if err := h.Err(); !errors.Is(err, lock.ErrLost) || !strings.Contains(err.Error(), "did not run for 1m") || !strings.Contains(err.Error(), "stopped or suspended?") {
		t.Errorf("Err: %v; want an error matching lock.ErrLost that says withlock did not run for a minute", err)
	}
	if n := l.keeps.Load(); n != 1 {
		t.Errorf("Keep called %d times; want none after the one in flight", n)
	}
}
