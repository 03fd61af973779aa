package mongodb

import (
	"context"
	"time"

	"github.com/withlock/withlock/internal/lock"
)

func (b *backend) TryAcquire(ctx context.Context, name string) (lock.Lease, error) {
	if err := b.connect(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, b.acquireTimeout())
	defer cancel()
	if b.attempt.name != name || b.attempt.id == "" {
		b.attempt.name, b.attempt.id = name, lock.NewToken()
	}
	id := b.attempt.id
	cur, err := b.current(ctx, name)
	if err != nil {
		return nil, err
	}
	// A lock held for sure by the server's clock as last read, and run on
	// since, is answered without reading that clock again.
	if u, ok := b.upper(); ok {
		v, until, err := b.decide(name, cur, id, u)
		if err != nil {
			return nil, err
		}
		if v == wait {
			return nil, lock.HeldFor(max(until.Sub(u), time.Millisecond))
		}
	}
	// One reading of the server's clock serves every round: it is later
	// than the caller's send time, which is all the expiry written needs,
	// and an older now only makes a lease look live longer. It is read
	// after cur, which makes cur's seq the base of what we write.
	now, err := b.serverTime(ctx)
	if err != nil {
		return nil, err
	}
	base := cur.seq()
	limit := rounds + cur.size()
	for round := 1; ; round++ {
		v, until, err := b.decide(name, cur, id, now)
		if err != nil {
			return nil, err
		}
		var n state
		switch v {
		case signal:
			if err := b.signal(ctx, name, cur, id, now, base); err != nil {
				return nil, err
			}
			fallthrough
		case wait:
			return nil, lock.HeldFor(max(until.Sub(now), time.Millisecond))
		case renew:
			// An earlier attempt took the lock and its answer was lost:
			// renew that entry for this attempt's caller.
			n = cur.renewed(name, opRenew, id, now, b.opts.TTL)
		case join:
			n = b.joined(name, cur, id, now)
			if n.Op == opTake {
				b.opts.Log.Debug("taking over expired leases", "lock", name, "holders", len(cur.Holders)-len(cur.live(now)))
			}
		}
		n.Base = base
		expires := n.holder(id).ExpiresAt
		ok, err := b.insert(ctx, &n)
		if err != nil {
			return nil, err
		}
		if ok {
			docs, sent, err := b.chain(ctx, name)
			if err != nil {
				return nil, err
			}
			top := first(docs)
			b.see(name, top, sent)
			if counts(top, id, expires) {
				b.collect(ctx, name, docs, now)
				b.attempt.id = ""
				b.mark.name = "" // dropped by our state (joined, renewed)
				return &lease{b: b, name: name, id: id, token: top.holder(id).Token, last: *top}, nil
			}
			b.opts.Log.Debug("our write did not count", "lock", name, "seq", n.Seq)
			cur = top
		} else if cur, err = b.advance(ctx, name, cur); err != nil {
			return nil, err // someone else's write landed first: decide on it
		}
		if round >= limit {
			return nil, lock.ErrHeld
		}
	}
}

// signal writes this client's writer-waiting mark after cur. Losing the
// race for the _id is no failure: the next attempt decides again.
func (b *backend) signal(ctx context.Context, name string, cur *state, id string, now time.Time, base int64) error {
	n := b.marked(name, cur, id, now)
	n.Base = base
	sent := time.Now()
	ok, err := b.insert(ctx, &n)
	if err != nil {
		return err
	}
	if ok {
		b.opts.Log.Debug("marked an exclusive waiter", "lock", name, "until", n.Writer.Until)
		b.mark.name, b.mark.id = name, id
		b.see(name, &n, sent)
	}
	return nil
}

// unmark writes a state without this client's mark after the newest, if
// that has it. One try: the mark runs out by itself anyway.
func (b *backend) unmark(ctx context.Context) {
	name := b.mark.name
	for range rounds {
		cur, _, err := b.newest(ctx, name)
		if err != nil || cur == nil || cur.Writer == nil || cur.Writer.ID != b.mark.id {
			return
		}
		n := cur.after(name, opUnmark, time.Time{})
		n.holding(cur.Holders, cur.mode(), cur.Max)
		if ok, err := b.insert(ctx, &n); ok || err != nil {
			return
		}
	}
}

// acquireTimeout bounds one TryAcquire by TTL-Grace. The lease counts from
// when the attempt was sent (lock.Backend's TryAcquire), and its holder is
// told it is lost TTL-Grace after that (lock.Options' Grace): a lease that
// comes back later is of no use, and a command started on it would still
// run after the lease ran out. An acquisition that
// lands after the timeout is not lost: the next attempt finds our holder id
// in the newest state and renews it.
func (b *backend) acquireTimeout() time.Duration {
	return min(b.opts.TTL-b.opts.Grace, attemptTimeout)
}
