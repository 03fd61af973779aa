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
// lease or checks the session every TTL/3) until Release.
type Held struct {
	name       string
	lease      Lease
	opts       Options
	log        *slog.Logger
	acquiredAt time.Time

	lost    chan struct{} // closed when the lock is given up for lost
	lostErr error         // why; written before lost is closed
	// unanswered says that the lock was given up because no Keep got an
	// answer in time, not because it is known gone: it may still be ours
	// (written before lost is closed).
	unanswered bool

	// stopKeeping ends the keep loop's waits: no new Keep starts. It does
	// not interrupt a Keep in flight, which may be using the very
	// connection that Release needs (a server may end the session when a
	// statement is cut off); abortKeep does, as a last resort.
	stopKeeping context.CancelFunc
	abortKeep   context.CancelFunc
	keeperDone  chan struct{}
	releaseOnce sync.Once
	releaseErr  error
}

// newHeld starts keeping lease, last confirmed at confirmed.
func newHeld(name string, lease Lease, confirmed time.Time, opts Options) *Held {
	keepCtx, abort := context.WithCancel(context.Background())
	waitCtx, stop := context.WithCancel(keepCtx)
	h := &Held{
		name:        name,
		lease:       lease,
		opts:        opts,
		log:         opts.Log.With("lock", name),
		acquiredAt:  confirmed,
		lost:        make(chan struct{}),
		stopKeeping: stop,
		abortKeep:   abort,
		keeperDone:  make(chan struct{}),
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
// TTL-Grace, measured on this process's monotonic clock from when the last
// successful Keep was sent (or from AcquiredAt). Once Release has been
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

// keep is the single loop that keeps the lock: Keep every TTL/3 (a little
// sooner, at random, so that holders that took a shared lock or semaphore
// together do not renew at the same moment and race for the same write),
// sooner still after a failure, and give the lock up once it cannot be
// vouched for.
// waitCtx ends when Release stops the loop; keepCtx, its parent, only when
// Release gives up waiting for a Keep in flight.
func (h *Held) keep(waitCtx, keepCtx context.Context) {
	defer close(h.keeperDone)
	interval := h.opts.TTL / 3
	retry := max(interval/5, 100*time.Millisecond)
	lastOK := h.acquiredAt
	next := lastOK.Add(interval - rand.N(interval/4+1))
	var lastErr error
	watcher, _ := h.lease.(Watcher)
	for {
		deadline := lastOK.Add(h.opts.TTL - h.opts.Grace)
		wake := next
		if deadline.Before(wake) {
			wake = deadline
		}
		if err := h.waitUntil(waitCtx, watcher, wake); err != nil {
			h.giveUp(err)
			return
		}
		if waitCtx.Err() != nil {
			return
		}
		if now := time.Now(); !now.Before(deadline) {
			if lastErr == nil {
				// No check failed: none was even tried. This process
				// did not run from its last confirmation to past the
				// deadline (stopped, a VM paused, a laptop asleep),
				// and the lock may be someone else's by now. Giving
				// up here, before any write, leaves a new holder be.
				h.giveUp(Errorf(ErrLost, "could not confirm it for %s: withlock did not run for %s (stopped or suspended?)", (h.opts.TTL - h.opts.Grace).Round(time.Millisecond), now.Sub(lastOK).Round(time.Millisecond)))
				return
			}
			h.unanswered = true
			h.giveUp(Errorf(ErrLost, "could not confirm it for %s (last error: %v)", (h.opts.TTL - h.opts.Grace).Round(time.Millisecond), lastErr))
			return
		}
		sent := time.Now()
		kctx, cancel := context.WithDeadline(keepCtx, deadline)
		err := h.lease.Keep(kctx)
		cancel()
		switch {
		case err == nil:
			h.log.Debug("kept", "took", since(sent))
			lastOK, lastErr = sent, nil
			next = sent.Add(interval - rand.N(interval/4+1))
		case errors.Is(err, ErrLost):
			h.giveUp(err)
			return
		case waitCtx.Err() != nil:
			return
		default:
			h.log.Warn("could not confirm the lock; retrying", "err", err)
			// A Keep cut short by the deadline says only that time ran
			// out; the error before it says why the checks failed.
			if lastErr == nil || time.Now().Before(deadline) {
				lastErr = err
			}
			next = time.Now().Add(retry)
		}
	}
}

// waitUntil sleeps until t or until ctx ends, watching the lease meanwhile
// where it can watch itself (a Watch is cut off when Release begins; the
// Watcher contract says that leaves the lease usable). It returns only a
// loss or a backend failure.
func (h *Held) waitUntil(ctx context.Context, w Watcher, t time.Time) error {
	wctx, cancel := context.WithDeadline(ctx, t)
	defer cancel()
	if w != nil {
		err := w.Watch(wctx)
		if err == nil || wctx.Err() != nil {
			return nil
		}
		if errors.Is(err, ErrLost) {
			return err
		}
		// The watch failed but the lock may be fine: the next Keep decides.
		h.log.Debug("watch failed", "err", err)
	}
	<-wctx.Done()
	return nil
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

func (h *Held) release(ctx context.Context) error {
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
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
	defer cancel()
	h.stopKeeping()
	select {
	case <-h.keeperDone:
	case <-rctx.Done():
		h.abortKeep()
		<-h.keeperDone
	}
	h.abortKeep()
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
