package lock

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"
)

// pollInterval is how often Acquire retries a held lock on a backend that
// can neither wait on the server's side nor notify, for the first fastFor
// of a wait, since a lock held briefly changes hands at once; then about
// every waitPoll, so that a long wait costs the server little (under two
// attempts a second) while a waiter still takes a released lock within a
// second (docs/behaviour.md, Acquiring). slowPoll is the safety net of a
// backend that notifies, for notifications that get lost. Pauses are
// jittered: pollInterval's from half the interval up, waitPoll's from
// three quarters.
const (
	pollInterval = 50 * time.Millisecond
	fastFor      = time.Second
	waitPoll     = 700 * time.Millisecond
	slowPoll     = time.Second
)

// Acquire takes the lock name, waiting as long as the Client's Options
// allow and ctx lasts. Unreachable-backend errors are retried with backoff
// and jitter for up to ConnectTimeout; a refusal is returned at once.
//
// When ctx ends first, the error wraps context.Cause(ctx) and the last
// failure the backend reported, so that errors.Is sees both the cause and
// ErrHeld or ErrUnavailable. An attempt that ctx itself cut short reports
// nothing: a slow but healthy server is not an unavailable one. Nothing is
// left held when Acquire fails.
func (c *Client) Acquire(ctx context.Context, name string) (*Held, error) {
	if err := CheckName(name); err != nil {
		return nil, err
	}
	b, opts := c.Backend, c.opts
	log := opts.Log.With("lock", name)
	waiter, canWait := b.(Waiter)
	notifier, canNotify := b.(Notifier)
	start := time.Now()
	var (
		lastSaid         error // the last thing the server showed: held, refused, reset...
		unreachableSince time.Time
		backoff          = newBackoff()
		saidWaiting      bool
		waitingSince     time.Time       // when the lock was first found held
		released         <-chan struct{} // from the Notifier, once subscribed
	)
	for {
		sent := opts.clock.now()
		var lease Lease
		var err error
		// A single attempt's lease began no earlier than the attempt was
		// sent: the safe start of its life. A server-side wait can last
		// minutes; the Waiter says when its lease counts from (the grant's
		// arrival, or the lease's last renewal during the wait). Counting
		// from the start of the wait would give up a long waiter's lock the
		// moment it got it.
		confirmed := sent
		var countsFrom time.Time // a Waiter's, on the monotonic clock
		// A Waiter first tries once too, so that a free lock is taken in one
		// round trip and a held one is said to be (-v shows the wait).
		waited := canWait && !opts.NoWait && saidWaiting
		if waited {
			lease, countsFrom, err = waiter.Acquire(ctx, name)
		} else {
			lease, err = b.TryAcquire(ctx, name)
		}
		if took := sent.to(opts.clock.now()); err == nil && !waited && took >= opts.TTL-opts.Grace {
			// The answer came so late that the lease could run out before
			// the command could be stopped: the keep loop would give it up
			// at once. Give it back and try again, as after an outage.
			// Judged on the boot clock too: a host suspended while the
			// attempt was in flight finds a lease that ran out meanwhile.
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
			lease.Release(rctx)
			cancel()
			lease, err = nil, Errorf(ErrUnavailable, "the backend took %s to grant the lock, too long for a lease of %s to be kept (ttl - kill-after is %s); it was given back",
				took.Round(time.Millisecond), opts.TTL, opts.TTL-opts.Grace)
		}
		if err == nil {
			log.Debug("acquired", "took", since(start))
			if waited {
				// The boot clock's reading at countsFrom is inferred from
				// the monotonic time since: a suspend between a waiter's
				// last renewal and the grant's arrival is not counted, and
				// is left to the next renewal, which a lease that ran out
				// meanwhile fails.
				now := opts.clock.now()
				confirmed = instant{mono: countsFrom, boot: now.boot - now.mono.Sub(countsFrom)}
			}
			return newHeld(name, lease, confirmed, opts), nil
		}
		if ctx.Err() != nil {
			// ctx ended during the attempt. An attempt that only ran out of
			// time was cut off by ctx (a connection to a slow server still
			// being set up): that says nothing about the server. A failure
			// it did show (refused, reset) is worth reporting, and so is
			// an answer ("held") if nothing else was said.
			if errors.Is(err, ErrUnavailable) && !errors.Is(err, errTimedOut) || lastSaid == nil && errors.Is(err, ErrHeld) {
				lastSaid = err
			}
			return nil, gaveUp(ctx, lastSaid)
		}
		if !errors.Is(err, errTimedOut) {
			// A timeout says nothing about the server when the caller's
			// deadline is what ends the wait (a driver may give up early
			// when that deadline is near).
			lastSaid = err
		}
		var pause time.Duration
		switch {
		case errors.Is(err, ErrUnsettled):
			// Not a conflict, even with NoWait: nobody may hold the lock,
			// and a cron slot that exits as "held" would run nowhere.
			// Wait, within ConnectTimeout, until the server can vouch.
			now := time.Now()
			if unreachableSince.IsZero() {
				unreachableSince = now
			}
			tried := now.Sub(unreachableSince)
			if tried >= opts.ConnectTimeout {
				return nil, Errorf(ErrUnavailable, "%v; waited %s (--connect-timeout)", err, roundTried(tried))
			}
			left, _ := Remaining(err)
			pause = max(min(left, opts.ConnectTimeout-tried), time.Millisecond)
		case errors.Is(err, ErrHeld):
			if opts.NoWait {
				return nil, err
			}
			if !saidWaiting {
				log.Debug("held; waiting")
				saidWaiting = true
				waitingSince = time.Now()
				if opts.OnWait != nil {
					opts.OnWait()
				}
				if canWait {
					continue // into the server-side wait
				}
			}
			unreachableSince = time.Time{}
			backoff = newBackoff()
			pause = jitter(pollInterval)
			if time.Since(waitingSince) >= fastFor {
				pause = waitPoll*3/4 + rand.N(waitPoll/4)
			}
			if canNotify && !canWait {
				if released == nil {
					// Subscribe, then try again at once: a release between
					// the failed attempt and the subscription is not missed.
					ch, stop, err := notifier.Notify(ctx, name)
					if err == nil {
						released = ch
						defer stop()
						continue
					}
					log.Debug("cannot subscribe to releases; polling", "err", err)
					canNotify = false
					break
				}
				pause = slowPoll
			}
			if left, ok := Remaining(err); ok && left < pause {
				// The holder's lease runs out first: be there when it does.
				pause = max(left, time.Millisecond)
			}
			if waited {
				// A server-side wait that ran out has spent the pause
				// already: waiting in the server is the poll. Ask again at
				// once, so that the waiter is never away from the server's
				// queue.
				pause = max(pause-time.Since(sent.mono), 0)
			}
		case errors.Is(err, ErrUnavailable):
			now := time.Now()
			if unreachableSince.IsZero() {
				unreachableSince = now
			}
			tried := now.Sub(unreachableSince)
			if tried >= opts.ConnectTimeout {
				return nil, fmt.Errorf("%w; retried for %s", err, roundTried(tried))
			}
			pause = min(backoff.next(), opts.ConnectTimeout-tried)
			log.Debug("backend unavailable; retrying", "err", err, "in", pause.Round(time.Millisecond))
		default:
			return nil, err
		}
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, gaveUp(ctx, lastSaid)
		case <-t.C:
		case <-released:
			t.Stop()
		}
	}
}

// roundTried rounds a retry period for humans: 15s, 300ms.
func roundTried(d time.Duration) time.Duration {
	if d >= 10*time.Second {
		return d.Round(time.Second)
	}
	return d.Round(100 * time.Millisecond)
}

// gaveUp is the error of a wait that ctx ended: its cause, and the last
// thing the backend said, both visible to errors.Is, on one line.
func gaveUp(ctx context.Context, lastErr error) error {
	if lastErr == nil {
		return context.Cause(ctx)
	}
	return fmt.Errorf("%w (last: %w)", context.Cause(ctx), lastErr)
}

// backoff doubles from 50ms to 2s. Each pause is jittered so that the
// waiters of a restarted server do not all come back at once.
type backoff struct{ d time.Duration }

func newBackoff() *backoff { return &backoff{d: 50 * time.Millisecond} }

func (b *backoff) next() time.Duration {
	d := b.d
	b.d = min(2*b.d, 2*time.Second)
	return jitter(d)
}

// jitter returns a duration drawn evenly from [d/2, d).
func jitter(d time.Duration) time.Duration {
	return d/2 + rand.N(d/2)
}

// since is the time since t, rounded for humans.
func since(t time.Time) time.Duration {
	return time.Since(t).Round(10 * time.Microsecond)
}
