package etcd

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"strings"
	"time"

	"github.com/withlock/withlock/internal/lock"
)

var _ lock.Waiter = (*backend)(nil)

// enqueue takes a lease and puts name's key for it, as Mutex.TryLock does,
// and returns the lease, the queue and the key's place in it.
func (b *backend) enqueue(ctx context.Context, name string) (*lease, []entry, int, error) {
	c := b.c
	cctx, cancel := call(ctx)
	defer cancel()
	for len(b.orphans) > 0 {
		if err := c.revoke(cctx, b.orphans[0]); err != nil && !is(err, msgLeaseNotFound) {
			return nil, nil, 0, b.classify(err)
		}
		b.orphans = b.orphans[1:]
	}
	sent := time.Now()
	id, err := c.grant(cctx, b.ttl)
	if err != nil {
		return nil, nil, 0, b.classify(err)
	}
	l := &lease{b: b, c: c, name: name, id: id, key: Key(name, id), renewedAt: sent}
	resp, err := c.txn(cctx, &txnRequest{
		Compare: []compare{createRevisionIs(l.key, 0)},
		Success: []requestOp{{Put: &putRequest{Key: []byte(l.key), Value: []byte(b.record()), Lease: id}}, b.getQueue(name)},
	})
	if err != nil {
		l.drop(ctx)
		return nil, nil, 0, b.classify(err)
	}
	if !resp.Succeeded {
		// A new lease's key cannot exist; someone wrote it by hand.
		l.drop(ctx)
		return nil, nil, 0, lock.Errorf(lock.ErrRefused, "etcd at %s: the key %s of a new lease already exists", b.addr, l.key)
	}
	l.rev, l.seen = resp.Header.Revision, resp.Header.Revision
	q, i, err := l.place(rangeAt(resp, 1))
	if err != nil {
		l.drop(ctx)
		return nil, nil, 0, err
	}
	return l, q, i, nil
}

// place returns the queue in kvs and l's place in it, and notes whether
// kvs had a latent key before l's.
func (l *lease) place(kvs []*keyValue) ([]entry, int, error) {
	prefix := Prefix(l.name)
	l.latent = slices.ContainsFunc(kvs, func(kv *keyValue) bool {
		return kv.CreateRevision < l.rev && kv.Lease == 0 && strings.HasPrefix(string(kv.Key), prefix) && lockID(string(kv.Key[len(prefix):]))
	})
	q := queue(l.name, kvs)
	for i, e := range q {
		if e.key == l.key && e.rev == l.rev {
			return q, i, nil
		}
	}
	return nil, 0, lock.Errorf(lock.ErrHeld, "etcd at %s: the waiter's key %s was deleted (its lease expired or was revoked)", l.b.addr, l.key)
}

// TryAcquire puts name's key and keeps it if it holds the lock; otherwise
// it revokes the lease, which deletes the key.
func (b *backend) TryAcquire(ctx context.Context, name string) (lock.Lease, error) {
	l, q, i, err := b.enqueue(ctx, name)
	if err != nil {
		return nil, err
	}
	holds, _, err := judge(name, q, i)
	if err == nil && holds {
		return l, nil
	}
	l.drop(ctx)
	if err != nil {
		return nil, err
	}
	return nil, lock.ErrHeld
}

// Acquire waits in name's queue until its key holds the lock. It watches
// name's keys from the revision at which it read the queue, and keeps its
// copy of the keys before its own up to date from the watch's events
// (waitTurn), so that the delete that hands the lock over is enough to take
// it, with no read after it. Meanwhile it renews its lease every
// lock.Options.KeepInterval, since a waiter's key must live as long as it
// waits; a renewal that fails ends the wait with its error. When ctx ends
// or anything fails, the lease is revoked, which deletes the key. The
// moment it returns with the lease is the lease's last renewal, from which
// the lock's life counts (lock.Waiter).
func (b *backend) Acquire(ctx context.Context, name string) (lock.Lease, time.Time, error) {
	l, q, i, err := b.enqueue(ctx, name)
	if err != nil {
		return nil, time.Time{}, err
	}
	holds, _, err := judge(name, q, i)
	waited := false
	for err == nil && !holds {
		waited = true
		var reread bool
		q, i, reread, err = l.waitTurn(ctx, q, i)
		if err == nil && reread {
			q, i, err = l.requeue(ctx)
		}
		if err == nil {
			holds, _, err = judge(name, q, i)
		}
	}
	if err != nil {
		l.drop(ctx)
		if ctx.Err() != nil {
			return nil, time.Time{}, context.Cause(ctx)
		}
		return nil, time.Time{}, err
	}
	if waited {
		go l.stamp()
	}
	return l, l.renewedAt, nil
}

// waitTurn watches name's keys from the revision after the one at which q
// was read, until its events show that q[i], l's key, holds the lock (or
// that judge refuses the queue: a semaphore of another N). Only
// the keys before l's own decide that (judge), and no key can join them
// after the read (a new key's create revision is higher than l's), so the
// events keep that part of the queue exact: a deletion takes a key out, a
// put of an earlier key (a record rewritten, a lease attached by hand)
// writes it again. A deletion of l's own key ends the wait, as a lease that
// ran out does. The revision of the event that lets l's key hold is one at
// which no earlier key was left and l's own was there: the same proof as a
// read at that revision, without its round trip.
//
// It returns the queue as the events left it, l's place in it, and reread
// when the events cannot tell (the revision was compacted, or a count of
// the earlier keys, made after each renewal, disagrees with the copy: a
// watch that stays open but says nothing, as behind a proxy that holds the
// stream's answers back, delays a waiter by one renewal interval at most,
// not forever).
func (l *lease) waitTurn(ctx context.Context, q []entry, i int) ([]entry, int, bool, error) {
	q = slices.Clone(q[:i+1]) // the keys after l's own do not matter
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	prefix := Prefix(l.name)
	w := watchCreate{Key: []byte(prefix), RangeEnd: prefixEnd(prefix), StartRevision: l.seen + 1}
	if l.b.opts.Mode == lock.Exclusive && !l.latent {
		// An exclusive key waits for every earlier key whatever its
		// record, and without a latent key no put can add one: the
		// deletions are all it needs, and the waiters are not woken by
		// every key that joins the queue.
		w.Filters = []string{"NOPUT"}
	}
	// The watch's answers come from a goroutine of their own, so that the
	// lease is renewed while it waits for them. It ends with wctx.
	type answer struct {
		resp *watchResponse
		err  error
	}
	answers := make(chan answer)
	go func() {
		s, err := l.c.watch(wctx, w)
		if err != nil {
			select {
			case answers <- answer{err: err}:
			case <-wctx.Done():
			}
			return
		}
		defer s.abort()
		resp := &watchResponse{Created: true}
		for {
			select {
			case answers <- answer{resp, err}:
			case <-wctx.Done():
				return
			}
			if err != nil {
				return
			}
			resp = new(watchResponse)
			if err = s.next(resp); err == nil {
				err = resp.err()
			}
		}
	}()
	// A watch that is not created within callTimeout is a server that does
	// not answer, as for any other request.
	creating := time.NewTimer(callTimeout)
	defer creating.Stop()
	interval := l.b.opts.KeepInterval()
	renew := time.NewTimer(time.Until(l.renewedAt.Add(interval)))
	defer renew.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil, 0, false, context.Cause(ctx)
		case <-creating.C:
			return nil, 0, false, lock.Unreachable("etcd at "+l.b.addr, "timed out")
		case <-renew.C:
			if err := l.renew(ctx); err != nil {
				return nil, 0, false, err
			}
			n, err := l.ahead(ctx)
			if err != nil {
				return nil, 0, false, err
			}
			if n != len(q)-1 {
				return q, len(q) - 1, true, nil
			}
			renew.Reset(time.Until(l.renewedAt.Add(interval)))
		case a := <-answers:
			switch {
			case a.err != nil && ctx.Err() != nil:
				return nil, 0, false, context.Cause(ctx)
			case errors.Is(a.err, errCompacted):
				return q, len(q) - 1, true, nil // the revision is gone: read the queue as it is now
			case errors.Is(a.err, errStreamEnded):
				return nil, 0, false, lock.Errorf(lock.ErrUnavailable, "etcd at %s: the watch of %s ended", l.b.addr, prefix)
			case a.err != nil:
				return nil, 0, false, l.b.classify(a.err)
			}
			creating.Stop()
			changed := false
			for _, ev := range a.resp.Events {
				if ev.Kv == nil {
					continue
				}
				if ev.Type == "DELETE" && string(ev.Kv.Key) == l.key {
					return nil, 0, false, lock.Errorf(lock.ErrHeld, "etcd at %s: the waiter's key %s was deleted", l.b.addr, l.key)
				}
				var ok bool
				if q, ok = l.apply(q, ev); ok {
					changed = true
				}
				l.seen = max(l.seen, ev.Kv.ModRevision)
			}
			if !changed {
				continue
			}
			if holds, _, err := judge(l.name, q, len(q)-1); holds || err != nil {
				return q, len(q) - 1, false, nil
			}
		}
	}
}

// apply changes q, the keys up to l's own (the last), by the event ev, and
// reports whether it did: a deletion of a key before l's takes it out; a
// put of a key created before l's writes it again (or takes it out if it
// is no longer a lock key). Other keys are after l's, or not name's locks.
func (l *lease) apply(q []entry, ev watchEvent) ([]entry, bool) {
	key := string(ev.Kv.Key)
	me := len(q) - 1
	if key == l.key {
		return q, false
	}
	j := slices.IndexFunc(q[:me], func(e entry) bool { return e.key == key })
	if ev.Type == "DELETE" {
		if j < 0 {
			return q, false
		}
		return slices.Delete(q, j, j+1), true
	}
	if ev.Kv.CreateRevision >= l.rev {
		return q, false
	}
	changed := j >= 0
	if j >= 0 {
		q = slices.Delete(q, j, j+1)
	}
	if e := queue(l.name, []*keyValue{ev.Kv}); len(e) == 1 {
		k, _ := slices.BinarySearchFunc(q[:len(q)-1], e[0].rev, func(x entry, rev int64) int { return cmp.Compare(x.rev, rev) })
		q = slices.Insert(q, k, e[0])
		changed = true
	}
	return q, changed
}

// requeue reads the queue again when the watch cannot tell what it is, if
// the key is still there, and meanwhile renews the lease: the lock may be
// about to be ours, and its life runs from that renewal (Acquire returns it).
// Both fail if the key is gone.
func (l *lease) requeue(ctx context.Context) ([]entry, int, error) {
	renewed := make(chan error, 1)
	go func() { renewed <- l.renew(ctx) }()
	cctx, cancel := call(ctx)
	defer cancel()
	resp, err := l.c.txn(cctx, &txnRequest{
		Compare: []compare{createRevisionIs(l.key, l.rev)},
		Success: []requestOp{l.b.getQueue(l.name)},
	})
	if rerr := <-renewed; rerr != nil {
		return nil, 0, rerr
	}
	if err != nil {
		return nil, 0, l.b.classify(err)
	}
	if !resp.Succeeded {
		return nil, 0, lock.Errorf(lock.ErrHeld, "etcd at %s: the waiter's key %s was deleted", l.b.addr, l.key)
	}
	l.seen = resp.Header.Revision
	return l.place(rangeAt(resp, 0))
}

// ahead counts the lock keys before l's own, bounded by callTimeout.
func (l *lease) ahead(ctx context.Context) (int, error) {
	cctx, cancel := call(ctx)
	defer cancel()
	r := queueRange(l.name)
	r.MaxCreateRevision = l.rev - 1
	resp, err := l.c.get(cctx, r)
	if err != nil {
		return 0, l.b.classify(err)
	}
	return len(queue(l.name, resp.Kvs)), nil
}

// stamp writes the record again, with acquired_at now, once a waiter got
// the lock. It runs on its own, after the command has been let start, and
// writes only while the key is still there: a release or a break before it
// lands leaves nothing behind. A failure only leaves the time the waiter
// began to wait.
func (l *lease) stamp() {
	ctx, cancel := call(context.Background())
	defer cancel()
	l.c.txn(ctx, &txnRequest{
		Compare: []compare{createRevisionIs(l.key, l.rev)},
		Success: []requestOp{{Put: &putRequest{Key: []byte(l.key), Value: []byte(l.b.record()), IgnoreLease: true}}},
	})
}

// renew renews a waiter's lease once, bounded by callTimeout. A lease gone
// means the key is gone: the wait is over, with an error wrapping
// lock.ErrHeld, as for a lock that others still hold.
func (l *lease) renew(ctx context.Context) error {
	cctx, cancel := call(ctx)
	defer cancel()
	sent := time.Now()
	if err := l.c.keepAliveOnce(cctx, l.id); err != nil {
		if is(err, msgLeaseNotFound) {
			return lock.Errorf(lock.ErrHeld, "etcd at %s: the waiter's lease %x expired or was revoked", l.b.addr, l.id)
		}
		return l.b.classify(err)
	}
	l.renewedAt = sent
	return nil
}
