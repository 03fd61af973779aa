package lock

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"
)

// releaseTimeout bounds the final release, together with the wait for a
// check that was in flight when it began; past it the lock ends with its
// session or lease anyway.
const releaseTimeout = 5 * time.Second

// abandonTimeout bounds the release of a lock given up because the server
// stopped answering. A renewal sent before a stall may still be applied
// when the server wakes, leaving a lease that outlives its holder by up to
// a ttl; a server that answers again by the time the command has stopped
// frees it at once instead. One that does not is not waited for: the lease
// ends on its own.
const abandonTimeout = 2 * time.Second

// Held is a lock taken by Acquire. A goroutine keeps it alive (renews the
// lease or checks the session every Options.KeepInterval) until Release.
type Held struct {
	name       string
	lease      Lease
	opts       Options
	log        *slog.Logger
	acquiredAt time.Time
	acquired   instant // acquiredAt on both clocks

	lost    chan struct{} // closed when the lock is given up for lost
	lostErr error         // why; written before lost is closed
	// unanswered says that the lock was given up because no Keep got an
	// answer in time, not because it is known gone: it may still be ours
	// (written before lost is closed).
	unanswered bool

	// stopLoop ends the keep loop's waits: no new Keep starts. It does
	// not interrupt a Keep in flight, which may be using the very
	// connection that Release needs (a server may end the session when a
	// statement is cut off); abortKeep does, as a last resort.
	stopLoop    context.CancelFunc
	abortKeep   context.CancelFunc
	keeperDone  chan struct{}
	releaseOnce sync.Once
	releaseErr  error
}

// newHeld starts keeping lease, last confirmed at confirmed.
func newHeld(name string, lease Lease, confirmed instant, opts Options) *Held {
	keepCtx, abort := context.WithCancel(context.Background())
	waitCtx, stop := context.WithCancel(keepCtx)
	h := &Held{
		name:       name,
		lease:      lease,
		opts:       opts,
		log:        opts.Log.With("lock", name),
		acquiredAt: confirmed.mono,
		acquired:   confirmed,
		lost:       make(chan struct{}),
		stopLoop:   stop,
		abortKeep:  abort,
		keeperDone: make(chan struct{}),
	}
	go h.keep(waitCtx, keepCtx)
	return h
}

// AcquiredAt is when the lock was known to be ours: for a single attempt
// (a lease), when that attempt was sent, no later than the moment the
// backend granted it; for a wait on the server's side (Waiter), when the
// grant arrived. The keep loop counts from it, and so does HoldAtLeast.
func (h *Held) AcquiredAt() time.Time { return h.acquiredAt }

// Token returns the fencing token, if the backend has one.
func (h *Held) Token() (int64, bool) {
	if e, ok := h.lease.(Expiring); ok {
		return e.Token(), true
	}
	return 0, false
}

// Lost is closed when the lock is known lost (an error wrapping ErrLost from
// the backend) or can no longer be vouched for: no Keep has succeeded for
// TTL-Grace, measured from when the last successful Keep was sent (or from
// AcquiredAt) on this process's monotonic clock or, where it moved more
// (the host was suspended), on the boot clock. Once Release has been
// called it closes only if a Keep already in flight finds the lock gone;
// Release then does not release it again.
func (h *Held) Lost() <-chan struct{} { return h.lost }

// Err says why the lock was lost; nil while Lost is open.
func (h *Held) Err() error {
	select {
	case <-h.lost:
		return h.lostErr
	default:
		return nil
	}
}

// keepSlice is the longest the keep loop waits without looking at the
// clocks. A Go timer counts on the monotonic clock, which stops while the
// host is suspended: after it wakes, a timer still waits out what was left
// of it, and a host that slept past its lease would run its command beside
// the lock's new holder until then. Judging the lease on both clocks at the
// end of every slice bounds that to one slice after waking. A second is
// short beside the default grace (5s) and costs one timer wake-up a second;
// under a grace shorter than 4s, a quarter of it, so that a host that wakes
// just before its deadline still renews, or gives up, with most of its
// grace ahead. Never below 10ms, which would only spin.
func keepSlice(grace time.Duration) time.Duration {
	return max(min(time.Second, grace/4), 10*time.Millisecond)
}

// keep is the single loop that keeps the lock: Keep every KeepInterval (a little
// sooner, at random, so that holders that took a shared lock or semaphore
// together do not renew at the same moment and race for the same write),
// sooner still after a failure, and give the lock up once it cannot be
// vouched for. Time is counted from the last confirmation on whichever of
// the monotonic and boot clocks moved more (instant.to), so that a host
// that slept renews as soon as it wakes, or gives up if it slept too long.
// waitCtx ends when Release stops the loop; keepCtx, its parent, only when
// Release gives up waiting for a Keep in flight.
func (h *Held) keep(waitCtx, keepCtx context.Context) {
	defer close(h.keeperDone)
	clk := h.opts.clock
	interval := h.opts.KeepInterval()
	life := h.opts.TTL - h.opts.Grace // how long a confirmation vouches for the lock
	retry := max(interval/5, 100*time.Millisecond)
	slice := keepSlice(h.opts.Grace)
	lastOK := h.acquired
	next := interval - rand.N(interval/4+1) // the next Keep, counted from lastOK
	var lastErr error
	watcher, _ := h.lease.(Watcher)
	for {
		if err := h.waitUntil(waitCtx, watcher, lastOK, min(next, life), slice); err != nil {
			if ran := lastOK.to(clk.now()); ran >= life && lastErr == nil {
				// The watch saw the lease go because this process did not
				// run to renew it: say that, the cause.
				err = notRun(life, ran)
			}
			h.giveUp(err)
			return
		}
		if waitCtx.Err() != nil {
			return
		}
		now := clk.now()
		ran := lastOK.to(now)
		if ran >= life {
			if lastErr == nil {
				// No check failed: none was even tried. This process
				// did not run from its last confirmation to past the
				// deadline (stopped, a VM paused, a laptop asleep),
				// and the lock may be someone else's by now. Giving
				// up here, before any write, leaves a new holder be.
				h.giveUp(notRun(life, ran))
				return
			}
			h.unanswered = true
			h.giveUp(Errorf(ErrLost, "could not confirm it for %s (last error: %v)", life.Round(time.Millisecond), lastErr))
			return
		}
		kctx, cancel := context.WithTimeout(keepCtx, life-ran)
		suspended := h.guardKeep(kctx, cancel, lastOK, life, slice)
		err := h.lease.Keep(kctx)
		cancel()
		// A Keep that ran out of time returns at its deadline, give or take
		// the scheduler; one that fails far past it was frozen through it,
		// by a stop (SIGSTOP, a paused VM) that both clocks saw.
		stopped := err != nil && lastOK.to(clk.now())-life > max(slice, life/2)
		if (suspended() || stopped) && !errors.Is(err, ErrLost) {
			// The host slept, or the process was stopped, past the
			// deadline while the Keep was in flight. The Keep may have
			// been applied before that, so the lease may still be ours:
			// Release tries once.
			h.unanswered = true
			h.giveUp(notRun(life, lastOK.to(clk.now())))
			return
		}
		switch {
		case err == nil:
			h.log.Debug("kept", "took", since(now.mono))
			lastOK, lastErr = now, nil
			next = interval - rand.N(interval/4+1)
		case errors.Is(err, ErrLost):
			h.giveUp(err)
			return
		case waitCtx.Err() != nil:
			return
		default:
			h.log.Warn("could not confirm the lock; retrying", "err", err)
			// A Keep cut short by the deadline says only that time ran
			// out; the error before it says why the checks failed.
			ran := lastOK.to(clk.now())
			if lastErr == nil || ran < life {
				lastErr = err
			}
			next = ran + retry
		}
	}
}

// guardKeep cuts the Keep under ctx short (cancel) once the deadline,
// life after from, has passed on the boot clock while it was in flight:
// ctx's own deadline is on the monotonic clock, which a suspend stops, and
// a Keep stuck on a network that changed while the host slept would
// otherwise run on, and the command with it, for up to TTL-Grace after
// waking. The returned func, called once ctx has ended, says whether it
// did.
func (h *Held) guardKeep(ctx context.Context, cancel context.CancelFunc, from instant, life, slice time.Duration) (suspended func() bool) {
	cut := make(chan bool, 1)
	go func() {
		h.waitUntil(ctx, nil, from, life, slice)
		// Past the deadline on the boot clock alone. On the monotonic
		// clock too, ctx's own deadline has ended the Keep, or is about
		// to: a Keep that ran out of time, not a suspend.
		now := h.opts.clock.now()
		c := ctx.Err() == nil && now.mono.Sub(from.mono) < life
		if c {
			cancel()
		}
		cut <- c
	}()
	return func() bool { return <-cut }
}

// waitUntil sleeps until due has passed since from (on either clock) or
// until ctx ends, looking at the clocks every slice, and watching the lease
// meanwhile where it can watch itself. The Watch runs once for the whole
// wait, beside the slices, not once per slice: restarting it costs no round
// trip, but cuts a read on the PostgreSQL or MySQL connection short and
// sets it up again (deadlines, buffers) every slice. It is cut off
// when the wait ends (and when Release begins), and waitUntil returns only
// once it has returned, so the connection is free for the Keep or the
// release that follows (the Watcher contract says a Watch cut off leaves
// the lease usable). It returns only a loss or a backend failure.
func (h *Held) waitUntil(ctx context.Context, w Watcher, from instant, due, slice time.Duration) error {
	left := due - from.to(h.opts.clock.now())
	if left <= 0 {
		return nil
	}
	var watched chan error
	if w != nil {
		wctx, cancel := context.WithCancel(ctx)
		watched = make(chan error, 1)
		go func() { watched <- w.Watch(wctx) }()
		defer func() {
			cancel()
			if watched != nil {
				<-watched
			}
		}()
	}
	t := time.NewTimer(min(left, slice))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-watched:
			watched = nil
			switch {
			case err == nil || ctx.Err() != nil:
			case errors.Is(err, ErrLost):
				return err
			default:
				// The watch failed but the lock may be fine: the next
				// Keep decides.
				h.log.Debug("watch failed", "err", err)
			}
		case <-t.C:
			left = due - from.to(h.opts.clock.now())
			if left <= 0 {
				return nil
			}
			t.Reset(min(left, slice))
		}
	}
}

// notRun is the loss of a lock whose holder did not run for ran, past
// life, the time a confirmation vouches for it: stopped, a VM paused, a
// laptop asleep.
func notRun(life, ran time.Duration) error {
	return Errorf(ErrLost, "could not confirm it for %s: withlock did not run for %s (stopped or suspended?)", life.Round(time.Millisecond), ran.Round(time.Millisecond))
}

func (h *Held) giveUp(err error) {
	h.lostErr = err
	close(h.lost)
}

// Release stops keeping the lock and gives it up: at once, or, with
// HoldAtLeast, once that long has passed since acquisition (a backend that
// can let the lease linger is told so and Release returns at once; otherwise
// Release waits, still keeping the lock, and returns early, releasing, if
// ctx ends). A Keep in flight is let finish first, and the release itself
// is bounded by its own timeout. A lock known gone is not released again;
// one given up because the server stopped answering gets one short try,
// whose failure is not reported.
// Release may be called more than once; later calls return the first
// result.
func (h *Held) Release(ctx context.Context) error {
	h.releaseOnce.Do(func() { h.releaseErr = h.release(ctx) })
	return h.releaseErr
}

// Detach stops keeping the lock without releasing it, and lets its lease
// run out at until instead (Expiring.ReleaseAt): the lease outlives this
// process, and another may take it up again (Detachable). Release is then
// a no-op. It fails if the lock was lost, or if it is not a lease.
func (h *Held) Detach(ctx context.Context, until time.Time) error {
	expiring, ok := h.lease.(Expiring)
	if !ok {
		return Errorf(ErrUsage, "the lock %q is held by a session, which cannot outlive this process", h.name)
	}
	var err error
	h.releaseOnce.Do(func() {
		rctx, cancel := h.stopKeeping(ctx)
		defer cancel()
		if err = h.Err(); err == nil {
			err = expiring.ReleaseAt(rctx, until)
		}
		h.releaseErr = err
	})
	return err
}

// stopKeeping ends the keep loop, letting a Keep in flight finish, and
// returns the context that the release (or detach) that follows must
// finish within.
func (h *Held) stopKeeping(ctx context.Context) (context.Context, context.CancelFunc) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
	h.stopLoop()
	select {
	case <-h.keeperDone:
	case <-rctx.Done():
		h.abortKeep()
		<-h.keeperDone
	}
	h.abortKeep()
	return rctx, cancel
}

func (h *Held) release(ctx context.Context) error {
	// HoldAtLeast is counted on the monotonic clock alone, unlike the
	// lease's life: a host suspended meanwhile holds on longer than asked
	// (or leaves a lingering lease to end later), which delays the next
	// holder but never lets two hold at once, and the keep loop still gives
	// the lock up if the suspend outlasted the lease.
	until := h.acquiredAt.Add(h.opts.HoldAtLeast)
	expiring, canLinger := h.lease.(Expiring)
	if h.opts.HoldAtLeast > 0 && !canLinger && time.Now().Before(until) {
		// A session lock is held by staying. The keep loop goes on
		// meanwhile, so that a server that ends silent sessions does not
		// end this one before its time.
		h.log.Debug("holding", "until", until)
		t := time.NewTimer(time.Until(until))
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
		case <-h.lost:
			t.Stop()
		}
	}

	// Let a Keep in flight finish rather than cut it off: cutting a
	// statement off can end the session (on some servers) whose lock is about
	// to be given back. The Keep is bounded by its own deadline; the wait
	// for it and the release share releaseTimeout.
	rctx, cancel := h.stopKeeping(ctx)
	defer cancel()
	if err := h.Err(); err != nil {
		h.log.Debug("lost before it could be released", "err", err)
		if h.unanswered {
			// Release acts only for this holder, so trying costs no one
			// else their lock; its failure changes nothing.
			actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), abandonTimeout)
			err := h.lease.Release(actx)
			cancel()
			h.log.Debug("released the lock given up for lost, if it was still ours", "err", err)
		}
		return nil
	}

	start := time.Now()
	// A lease that would linger less than a millisecond is released: no
	// server keeps time that finely, and rounding it up would hold the
	// lock longer than asked.
	if h.opts.HoldAtLeast > 0 && canLinger && until.Sub(start) >= time.Millisecond {
		if err := expiring.ReleaseAt(rctx, until); err != nil {
			return fmt.Errorf("release %q: %w", h.name, err)
		}
		h.log.Debug("left to expire", "at", until, "took", since(start))
		return nil
	}
	if err := h.lease.Release(rctx); err != nil {
		return fmt.Errorf("release %q: %w", h.name, err)
	}
	h.log.Debug("released", "took", since(start))
	return nil
}
