package s3

import (
	"context"
	"sync"
	"time"

	"github.com/withlock/withlock/internal/lock"
)

// want is how many holders this client's mode allows: 1 for an exclusive
// lock, N for a semaphore.
func (b *backend) want() int {
	if b.opts.Mode == lock.Semaphore {
		return b.opts.MaxHolders
	}
	return 1
}

// TryAcquire takes the lock's object, or for a semaphore of N the first of
// its N objects that is free or has run out: one read of each, then one
// conditional write.
func (b *backend) TryAcquire(ctx context.Context, name string) (lock.Lease, error) {
	slots, err := b.read(ctx, name, b.want())
	if err != nil {
		return nil, err
	}
	// The count of acquisitions of a semaphore grows across its slots:
	// each slot's next is one more than the highest of any.
	var floor int64
	for _, o := range slots {
		floor = max(floor, o.rec.Acquisitions)
	}
	return lock.FirstFreeSlot(len(slots), func(i int) (lock.Lease, error) {
		return b.try(ctx, name, i, slots[i], floor)
	})
}

// read gets the first n objects of name's lock, at once.
func (b *backend) read(ctx context.Context, name string, n int) ([]*object, error) {
	if n == 1 {
		o, err := b.get(ctx, b.keyOf(name, 0))
		if err != nil {
			return nil, err
		}
		return []*object{o}, nil
	}
	objs, errs := make([]*object, n), make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { objs[i], errs[i] = b.get(ctx, b.keyOf(name, i)) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err // the first: the wait loop sorts one error
		}
	}
	return objs, nil
}

// recheck is how often a waiter looks at an object in the second in which
// it may run out by the store's clock, whose fraction of a second the
// store does not say.
const recheck = 50 * time.Millisecond

// try takes slot i of name, o as just read, if it is free or has run out.
func (b *backend) try(ctx context.Context, name string, slot int, o *object, floor int64) (lock.Lease, error) {
	if o.exists && o.rec.Name != name {
		return nil, lock.Errorf(lock.ErrUsage, "%s: the object %s is the lock %q's, not %q's (a name ending in .slot-N names a semaphore's slot); choose another name", b.where, o.key, o.rec.Name, name)
	}
	cond := create
	if o.exists {
		cond = condition{ifMatch: o.etag}
		if o.rec.State == held {
			if left, retry := b.left(o, time.Now()); left > 0 {
				n, want := o.rec.n(), b.want()
				switch {
				case n != want && n > 1 && want > 1:
					return nil, lock.Errorf(lock.ErrUsage, "%q is a semaphore of %d (--max-holders %d); this holder asked for %d", name, n, n, want)
				case n != want:
					return nil, lock.HeldFor(retry) // held in another mode: no slot of ours is free
				}
				return nil, lock.SlotHeld(retry)
			}
			b.opts.Log.Debug("the lock object was not renewed within its ttl; taking it over", "key", o.key, "holder", o.rec.Host, "pid", o.rec.PID)
		}
	}
	acquisitions := max(o.rec.Acquisitions, floor) + 1
	rec := record{
		Name:         name,
		State:        held,
		Owner:        lock.NewToken(),
		Acquisitions: acquisitions,
		Token:        acquisitions,
		TTLMillis:    b.opts.TTL.Milliseconds(),
		Host:         b.opts.Holder.Host,
		PID:          b.opts.Holder.PID,
		Command:      b.opts.Holder.Command,
		AcquiredAt:   time.Now().UTC(),
	}
	if n := b.want(); n > 1 {
		// A semaphore's holders that read the slots at once write the same
		// count into different slots: its token is count × N + slot,
		// never given twice, and larger than that of any holder whose
		// acquisition ended before this one's read began.
		rec.MaxHolders, rec.Token = n, acquisitions*int64(n)+int64(slot)
	}
	sent := time.Now()
	etag, err := b.put(ctx, o.key, rec, cond)
	switch {
	case failed(err):
		return nil, lock.SlotHeld(-1) // someone else wrote first
	case err != nil:
		return nil, b.classify(err, "s3:PutObject")
	}
	delete(b.seen, o.key)
	return &lease{b: b, name: name, key: o.key, rec: rec, etag: etag, sent: sent, token: rec.Token}, nil
}

// left is how long until o's holder (read at now) runs out (zero or less:
// it has), and how long a waiter should wait before it looks again. By the
// store's clock (object.expiry) where the store gave its Date; else on
// this process's monotonic clock, counted from when it first read this
// version of the object.
func (b *backend) left(o *object, now time.Time) (left, retry time.Duration) {
	if _, left, ok := o.expiry(); ok {
		delete(b.seen, o.key)
		// The store's clock was anywhere in the second after its Date
		// when it answered, so the holder may run out up to a second
		// before left has passed: look again then, and every recheck
		// while the store's clock may be in that last second.
		return left, max(left-time.Second, 0) + recheck
	}
	obs, ok := b.seen[o.key]
	if !ok || obs.etag != o.etag {
		obs = observation{etag: o.etag, at: now}
		b.seen[o.key] = obs
	}
	left = o.rec.ttl() + expiryMargin - now.Sub(obs.at)
	return left, left
}
