package mongodb

import (
	"context"
	"slices"

	"github.com/withlock/withlock/internal/lock"
)

// Break writes a state without holders after the newest, as any change:
// the holders' next renewals find themselves gone (ErrLost), and the next
// acquisition's token is larger still. A waiting writer's mark stays. It
// returns once the newest state, read back, lists none of those it broke.
func (b *backend) Break(ctx context.Context, name string) ([]lock.Holder, error) {
	if err := b.connect(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, attemptTimeout)
	defer cancel()
	cur, _, err := b.newest(ctx, name)
	if err != nil {
		return nil, err
	}
	// Read after the state decided on (see TryAcquire).
	now, err := b.serverTime(ctx)
	if err != nil {
		return nil, err
	}
	base := cur.seq()
	var broken []holder
	limit := rounds + cur.size()
	for round := 1; ; round++ {
		live := cur.live(now)
		if len(live) == 0 {
			break
		}
		n := cur.after(name, opBreak, now)
		n.Base = base
		n.Writer = cur.writer(now)
		n.By = &mark{Host: b.opts.Holder.Host, PID: b.opts.Holder.PID}
		ok, err := b.insert(ctx, &n)
		if err != nil {
			return nil, err
		}
		if !ok {
			if cur, err = b.advance(ctx, name, cur); err != nil {
				return nil, err
			}
		} else {
			for _, h := range live {
				if !slices.ContainsFunc(broken, func(o holder) bool { return o.ID == h.ID && o.Token == h.Token }) {
					broken = append(broken, h)
				}
			}
			// A write that landed late, on a deleted _id, broke nothing:
			// then the newest state still lists them.
			if cur, _, err = b.newest(ctx, name); err != nil {
				return nil, err
			}
			if !slices.ContainsFunc(broken, func(h holder) bool {
				o := cur.holder(h.ID)
				return o != nil && o.Token == h.Token
			}) {
				break
			}
		}
		if round >= limit {
			return nil, lock.Errorf(lock.ErrHeld, "mongodb at %s: %d writes to the lock %q in a row lost the race to its holders", b.addr, round, name)
		}
	}
	var hs []lock.Holder
	for _, h := range broken {
		hs = append(hs, holderOf(h))
	}
	return hs, nil
}
