package etcd

import (
	"context"
	"math"
	"time"

	"github.com/withlock/withlock/internal/lock"
)

var _ lock.Expiring = (*lease)(nil)

// lease is a key in a lock's queue and the etcd lease it is attached to:
// a held lock once TryAcquire or Acquire returns it.
type lease struct {
	b    *backend
	c    *client
	name string
	key  string
	id   int64 // the lease
	rev  int64 // the key's create revision: the fencing token
	seen int64 // the last revision at which the queue was read
	// latent is whether that read had a key before l's that is not a lock
	// key for want of a lease alone (NAME/<hex>): a put can make it one.
	latent bool
	// renewedAt is when the last renewal of the lease (or its grant) was
	// sent: the lease runs at least until renewedAt plus the ttl.
	renewedAt time.Time
}

// Token is the key's create revision, which grows with every acquisition
// of every name (etcdctl's ETCD_LOCK_REV is the revision at which etcdctl
// learned it holds the lock).
func (l *lease) Token() int64 { return l.rev }

// Keep renews the lease for another ttl, judged by the server's clock, then
// checks that the key is still there: a lease revoked (withlock release
// --force) or expired, and a key deleted (etcdctl del), are ErrLost.
func (l *lease) Keep(ctx context.Context) error {
	kctx, cancel := l.b.keepCall(ctx)
	err := l.c.keepAliveOnce(kctx, l.id)
	cancel()
	if err != nil {
		if is(err, msgLeaseNotFound) {
			return lock.Errorf(lock.ErrLost, "its etcd lease %x expired or was revoked (withlock release --force?)", l.id)
		}
		return l.b.classify(err)
	}
	kctx, cancel = l.b.keepCall(ctx)
	resp, err := l.c.get(kctx, &rangeRequest{Key: []byte(l.key), KeysOnly: true})
	cancel()
	if err != nil {
		return l.b.classify(err)
	}
	if len(resp.Kvs) == 0 || resp.Kvs[0].CreateRevision != l.rev {
		return lock.Errorf(lock.ErrLost, "its etcd key %s was deleted", l.key)
	}
	return nil
}

// keepCall bounds one request of Keep. With one endpoint, only ctx does:
// Keep answers within its ctx's deadline. With several, callTimeout and
// half of lock.Options.KeepInterval do too, so that
// an endpoint that takes the request but does not answer fails this Keep
// early, and the next Keep, sent to the next endpoint, can still renew the
// lease before it runs out: a member cut off from its peers accepts a
// renewal and a linearizable read, then waits for a leader it cannot
// reach, while the other members still hold the lock.
func (b *backend) keepCall(ctx context.Context) (context.Context, context.CancelFunc) {
	if len(b.c.endpoints) == 1 {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, min(callTimeout, b.opts.KeepInterval()/2))
}

// Release deletes the key if it is still ours, then revokes the lease.
func (l *lease) Release(ctx context.Context) error {
	resp, err := l.c.txn(ctx, &txnRequest{
		Compare: []compare{createRevisionIs(l.key, l.rev)},
		Success: []requestOp{{DeleteRange: &deleteRangeRequest{Key: []byte(l.key)}}},
	})
	// The lease goes either way; if this fails, it runs out by itself.
	l.revoke(ctx, l.id)
	if err != nil {
		return l.b.classify(err)
	}
	if !resp.Succeeded {
		return lock.Errorf(lock.ErrNotOurs, "etcd: the lock's key was no longer ours at release")
	}
	return nil
}

// ReleaseAt lets the lock end at until instead of now: the key moves to a
// new lease of the time left, rounded up to the second (etcd's leases are
// whole seconds, and no shorter than the server's minimum: 2s with its
// default election timeout), and the lease that was kept is revoked. The
// key keeps its place and its create revision.
func (l *lease) ReleaseAt(ctx context.Context, until time.Time) error {
	left := time.Until(until)
	g, err := l.c.grant(ctx, int64(math.Ceil(left.Seconds())))
	if err != nil {
		return l.b.classify(err)
	}
	resp, err := l.c.txn(ctx, &txnRequest{
		Compare: []compare{createRevisionIs(l.key, l.rev)},
		Success: []requestOp{{Put: &putRequest{Key: []byte(l.key), Lease: g, IgnoreValue: true}}},
	})
	if err != nil || !resp.Succeeded {
		l.revoke(ctx, g)
		if err != nil {
			return l.b.classify(err)
		}
		return lock.Errorf(lock.ErrNotOurs, "etcd: the lock's key was no longer ours at release")
	}
	l.revoke(ctx, l.id)
	return nil
}

// drop revokes the lease of a key that is not going to hold the lock, which
// deletes the key. It runs even when ctx has ended (a wait given up), with
// a bound of its own. If it fails (the server is gone), the key would stay
// in the queue, ahead of this process's next attempt, until its lease runs
// out: the next attempt revokes it first.
func (l *lease) drop(ctx context.Context) {
	cctx, cancel := call(context.WithoutCancel(ctx))
	defer cancel()
	if err := l.revoke(cctx, l.id); err != nil {
		l.b.orphans = append(l.b.orphans, l.id)
	}
}

// revoke revokes lease id; one already gone is fine.
func (l *lease) revoke(ctx context.Context, id int64) error {
	err := l.c.revoke(ctx, id)
	if err != nil && !is(err, msgLeaseNotFound) {
		return l.b.classify(err)
	}
	return nil
}
