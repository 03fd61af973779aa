package etcd

import (
	"context"
	"errors"
	"slices"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/withlock/withlock/internal/lock"
)

var _ lock.Waiter = (*backend)(nil)

// enqueue takes a lease and puts name's key for it, as Mutex.TryLock does,
// and returns the lease, the queue and the key's place in it.
func (b *backend) enqueue(ctx context.Context, name string) (*lease, []entry, int, error) {
	cctx, cancel := b.call(ctx)
	defer cancel()
	c, err := b.conn(cctx)
	if err != nil {
		return nil, nil, 0, err
	}
	for len(b.orphans) > 0 {
		if err := b.revoke(cctx, b.orphans[0]); err != nil {
			return nil, nil, 0, err
		}
		b.orphans = b.orphans[1:]
	}
	sent, reading := time.Now(), lock.Read()
	g, err := c.Grant(cctx, b.ttl)
	if err != nil {
		return nil, nil, 0, b.classify(err)
	}
	l := &lease{b: b, name: name, id: g.ID, key: Key(name, int64(g.ID)), renewedAt: sent, renewal: reading}
	resp, err := c.Txn(cctx).If(clientv3.Compare(clientv3.CreateRevision(l.key), "=", 0)).
		Then(clientv3.OpPut(l.key, b.record(time.Now()), clientv3.WithLease(g.ID)), getQueue(name)).Commit()
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
	q, i, err := l.place(resp.Responses[1].GetResponseRange().GetKvs())
	if err != nil {
		l.drop(ctx)
		return nil, nil, 0, err
	}
	return l, q, i, nil
}

// place returns the queue in kvs and l's place in it.
func (l *lease) place(kvs []*mvccpb.KeyValue) ([]entry, int, error) {
	prefix := Prefix(l.name)
	l.unleasedAhead = slices.ContainsFunc(kvs, func(kv *mvccpb.KeyValue) bool {
		k := string(kv.Key)
		return kv.CreateRevision < l.rev && kv.Lease == 0 && strings.HasPrefix(k, prefix) && lockID(k[len(prefix):])
	})
	q := queue(l.name, kvs)
	for i, e := range q {
		if e.key == l.key && e.rev == l.rev {
			return q, i, nil
		}
	}
	return nil, 0, l.deleted()
}

// deleted is the end of a wait whose key is gone: an error wrapping
// lock.ErrHeld, as for a lock that others still hold.
func (l *lease) deleted() error {
	return lock.Errorf(lock.ErrHeld, "etcd at %s: the waiter's key %s was deleted (its lease expired or was revoked)", l.b.addr, l.key)
}

// TryAcquire puts name's key and keeps it if it holds the lock. Otherwise,
// when the caller is to wait (lock.Options.NoWait unset), the key stays in
// the queue for the Acquire that follows (waiting), as etcd's own recipe
// queues once; else it revokes the lease, which deletes the key.
func (b *backend) TryAcquire(ctx context.Context, name string) (lock.Lease, error) {
	if l := b.waiting; l != nil {
		b.waiting, b.queued = nil, nil
		l.drop(ctx)
	}
	l, q, i, err := b.enqueue(ctx, name)
	if err != nil {
		return nil, err
	}
	holds, _, err := judge(name, q, i)
	switch {
	case err == nil && holds:
		l.held()
		return l, nil
	case err == nil && !b.opts.NoWait:
		b.waiting, b.queued = l, q
		return nil, lock.ErrHeld
	}
	l.drop(ctx)
	if err != nil {
		return nil, err
	}
	return nil, lock.ErrHeld
}

// Acquire waits in name's queue until its key holds the lock, as etcd's
// own recipe does: it watches the one earlier key whose deletion it waits
// for (judge), from the revision at which it read the queue, so that a
// release wakes one waiter, not all; then, unless the queue it read less
// that key says its key holds (handedOff), it reads the queue again, in
// one transaction that also checks that its own key is still there (a
// watch of another key cannot say so). Meanwhile it renews its lease every
// lock.Options.KeepInterval and reads the queue again after each renewal,
// since a waiter's key must live as long as it waits and a watch may say
// nothing for a while (a member stopping, a proxy that holds events
// back).
//
// When ctx ends or the lock cannot be had, the lease is revoked, which
// deletes the key. When the server cannot be reached, the key is kept,
// with its place in the queue, for the next Acquire of the same name (the
// wait loop's next attempt), as long as its lease lasts. The moment it
// returns with the lease is the lease's last renewal, from which the
// lock's life counts (lock.Waiter).
func (b *backend) Acquire(ctx context.Context, name string) (lock.Lease, time.Time, error) {
	l, q, i, err := b.resume(ctx, name)
	if err != nil {
		return nil, time.Time{}, err
	}
	holds, wait, err := judge(name, q, i)
	waited := false
	for err == nil && !holds {
		waited = true
		q, i, err = l.waitTurn(ctx, q, i, wait)
		if err == nil {
			holds, wait, err = judge(name, q, i)
		}
	}
	if err != nil {
		if ctx.Err() == nil && errors.Is(err, lock.ErrUnavailable) {
			b.waiting = l
			return nil, time.Time{}, err
		}
		l.drop(ctx)
		if ctx.Err() != nil {
			return nil, time.Time{}, context.Cause(ctx)
		}
		return nil, time.Time{}, err
	}
	l.held()
	if waited {
		l.stampLater(time.Now())
	}
	return l, l.renewedAt, nil
}

// resume returns the key kept for a wait (waiting), if it is name's, with
// the queue its attempt read or, after a wait cut short by the server's
// unavailability, the queue read again if the key is still there; else a
// new one (enqueue).
func (b *backend) resume(ctx context.Context, name string) (*lease, []entry, int, error) {
	l, q := b.waiting, b.queued
	b.waiting, b.queued = nil, nil
	if l == nil {
		return b.enqueue(ctx, name)
	}
	if l.name != name {
		l.drop(ctx)
		return b.enqueue(ctx, name)
	}
	if q != nil {
		return l, q, slices.IndexFunc(q, func(e entry) bool { return e.key == l.key }), nil
	}
	q, i, err := l.requeue(ctx, true)
	switch {
	case err == nil:
		return l, q, i, nil
	case errors.Is(err, lock.ErrUnavailable) && ctx.Err() == nil:
		b.waiting = l
		return nil, nil, 0, err
	case errors.Is(err, lock.ErrHeld):
		// The key is gone (its lease ran out while the server could not
		// be reached): queue again.
		l.drop(ctx)
		return b.enqueue(ctx, name)
	}
	l.drop(ctx)
	return nil, nil, 0, err
}

// waitTurn waits until q, the queue up to l's key (q[i]), may have changed
// so that the key holds: it watches q[wait], the earlier key judge named,
// or, for a full semaphore (wait < 0), every key of name, for deletions,
// from the revision after the one at which q was read, and reads the queue
// again (requeue) after a deletion of an earlier key, after a renewal of
// the lease, every KeepInterval, or when the watch ends. It returns the
// queue and l's place in it.
func (l *lease) waitTurn(ctx context.Context, q []entry, i, wait int) ([]entry, int, error) {
	c, err := l.b.conn(ctx)
	if err != nil {
		return nil, 0, err
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	key, opts := Prefix(l.name), []clientv3.OpOption{clientv3.WithPrefix()}
	if wait >= 0 {
		key, opts = q[wait].key, nil
	}
	opts = append(opts, clientv3.WithRev(l.seen+1), clientv3.WithFilterPut())
	wch := c.Watch(l.b.auth.watchContext(clientv3.WithRequireLeader(wctx)), key, opts...)
	interval := l.b.opts.KeepInterval()
	renew := time.NewTimer(time.Until(l.renewedAt.Add(interval)))
	defer renew.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil, 0, context.Cause(ctx)
		case <-renew.C:
			// The watch is let go first: a member that is stopping
			// waits for its streams to end before it can be started
			// again, and the requests that follow may not reach it.
			cancel()
			return l.requeue(ctx, true)
		case resp, ok := <-wch:
			if !ok || resp.Err() != nil {
				// Compacted, cancelled (the member lost its leader, the
				// token was refused): read the queue as it is now.
				l.b.watchRefused(resp.Err())
				cancel()
				return l.requeue(ctx, true)
			}
			for _, ev := range resp.Events {
				k := string(ev.Kv.Key)
				if k == l.key {
					return nil, 0, l.deleted()
				}
				j := slices.IndexFunc(q[:i], func(e entry) bool { return e.key == k })
				if j < 0 {
					continue
				}
				cancel()
				if rest, ok := l.handedOff(q, i, j); ok {
					return rest, i - 1, nil
				}
				// The hand-off: one request, the lease's last renewal
				// (at most KeepInterval ago) is the lock's start.
				return l.requeue(ctx, false)
			}
		}
	}
}

// handedOff says whether the key q[i] holds the lock, now that the earlier
// key q[j] is gone, without reading the queue again; if so, it returns the
// queue without q[j]. Keys only leave the part of the queue before ours,
// never join it (a new key's create revision is greater than ours), and
// no earlier key's leaving makes ours wait (judge): if the queue read,
// less q[j], lets ours hold, so does the queue as it is now. So the waiter
// just behind a holder starts its command one round trip sooner. The one
// way to join is a key written before ours without a lease, given one
// since (unleasedAhead): with such a key, it reads.
//
// What a read would add is that our own key is still there. While the
// lease's last renewal is less than KeepInterval ago, counting suspended
// time, the lease runs for most of the ttl yet, and the key was there at
// the last read; a deletion of it since, by hand, is seen by the watch of
// the key that a holder keeps from that read's revision on (held), as the
// deletion of a held key is. Past that (a process stopped, a host
// suspended while it waited), the lease may have run out: read.
func (l *lease) handedOff(q []entry, i, j int) ([]entry, bool) {
	if l.unleasedAhead || l.renewal.Since() >= l.b.opts.KeepInterval() {
		return nil, false
	}
	rest := slices.Delete(slices.Clone(q), j, j+1)
	holds, _, err := judge(l.name, rest, i-1)
	return rest, holds && err == nil
}

// requeue reads the queue again, if the key is still there, and, with
// renew, meanwhile renews the lease. Either fails if the key is gone. The
// lock may be about to be ours, and its life runs from the lease's last
// renewal (Acquire returns it): the wait renews it every KeepInterval, so
// that a hand-off, woken by the deletion it waited for, needs no renewal
// of its own, only the read.
func (l *lease) requeue(ctx context.Context, renew bool) ([]entry, int, error) {
	renewed := make(chan error, 1)
	if renew {
		go func() { renewed <- l.renew(ctx) }()
	} else {
		renewed <- nil
	}
	cctx, cancel := l.b.call(ctx)
	defer cancel()
	c, err := l.b.conn(cctx)
	if err != nil {
		<-renewed
		return nil, 0, err
	}
	resp, err := c.Txn(cctx).If(isKey(l.key, l.rev)).Then(getQueue(l.name)).Commit()
	if rerr := <-renewed; rerr != nil {
		return nil, 0, rerr
	}
	if err != nil {
		return nil, 0, l.b.classify(err)
	}
	if !resp.Succeeded {
		return nil, 0, l.deleted()
	}
	l.seen = resp.Header.Revision
	return l.place(resp.Responses[0].GetResponseRange().GetKvs())
}

// stampDelay is how long a waiter holds the lock before it writes its
// record again (stamp). Most commands run under a lock end sooner, and
// need no second write; until it lands, status says when the holder began
// to wait.
const stampDelay = time.Second

// stampLater writes the record again, with acquired_at, once the lock has
// been held for stampDelay, unless it is released before (stopStamp).
func (l *lease) stampLater(acquired time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.stamp = time.AfterFunc(stampDelay, func() { l.stampNow(acquired) })
}

// stampNow writes the record again, with acquired_at, only while the key
// is still there: a release or a break before it lands leaves nothing
// behind. A failure only leaves the time the waiter began to wait.
func (l *lease) stampNow(acquired time.Time) {
	ctx, cancel := l.b.call(context.Background())
	defer cancel()
	c, err := l.b.conn(ctx)
	if err != nil {
		return
	}
	c.Txn(ctx).If(isKey(l.key, l.rev)).Then(clientv3.OpPut(l.key, l.b.record(acquired), clientv3.WithIgnoreLease())).Commit()
}

// renew renews a waiter's lease once, bounded by callTimeout. A lease gone
// means the key is gone: the wait is over, with an error wrapping
// lock.ErrHeld, as for a lock that others still hold.
func (l *lease) renew(ctx context.Context) error {
	cctx, cancel := l.b.call(ctx)
	defer cancel()
	sent, reading := time.Now(), lock.Read()
	if err := l.b.keepAlive(cctx, l.id); err != nil {
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			return lock.Errorf(lock.ErrHeld, "etcd at %s: the waiter's lease %x expired or was revoked", l.b.addr, int64(l.id))
		}
		return l.b.classify(err)
	}
	l.renewedAt, l.renewal = sent, reading
	return nil
}
