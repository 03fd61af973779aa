package etcd

import (
	"context"
	"errors"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/withlock/withlock/internal/lock"
)

var (
	_ lock.Expiring   = (*lease)(nil)
	_ lock.Watcher    = (*lease)(nil)
	_ lock.Detachable = (*backend)(nil)
)

// lease is a key in a lock's queue and the etcd lease it is attached to:
// a held lock once TryAcquire or Acquire returns it.
type lease struct {
	b    *backend
	name string
	key  string
	id   clientv3.LeaseID
	rev  int64 // the key's create revision: the fencing token
	seen int64 // the last revision at which the queue was read
	// unleasedAhead says that the last read of the queue found a key
	// before ours that is not a lock key only for want of a lease: given
	// one, it would join the queue ahead of ours (handedOff).
	unleasedAhead bool
	// renewedAt is when the last renewal of the lease (or its grant) was
	// sent: the lease runs at least until renewedAt plus the ttl. renewal
	// is the same moment, read as the keep loop reads time (handedOff).
	renewedAt time.Time
	renewal   lock.Reading

	// watch follows the key while the lock is held (held).
	watch *keyWatch

	// stamp writes a waiter's record again once it has held the lock for
	// a while (stampLater), unless Release stops it first; its timer runs
	// beside Release, so mu guards it.
	mu    sync.Mutex
	stamp *time.Timer
}

// stopStamp stops a stamp not yet written: the lock is being released.
func (l *lease) stopStamp() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stamp != nil {
		l.stamp.Stop()
	}
}

// Token is the key's create revision, which grows with every acquisition
// of every name (etcdctl's ETCD_LOCK_REV is the revision at which etcdctl
// learned it holds the lock).
func (l *lease) Token() int64 { return l.rev }

// held starts the watch of the key, once the lease holds the lock.
func (l *lease) held() {
	l.watch = watchKey(l.b, l.key, l.rev, l.seen)
}

// Keep renews the lease for another ttl, judged by the server's clock, on
// the backend's renewal stream; a lease revoked (withlock release --force)
// or expired is ErrLost. Then it reads the key: a key deleted (etcdctl del)
// is ErrLost too. A member that is stopping gracefully serves the streams
// it has but takes no new request, so that read can fail while the lease
// is kept; the key's watch, which stays open on its own stream as the
// renewals do, then vouches for the key instead, if it is open.
func (l *lease) Keep(ctx context.Context) error {
	kctx, cancel := l.b.keepCall(ctx)
	err := l.b.keepAlive(kctx, l.id)
	cancel()
	if err != nil {
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			return lock.Errorf(lock.ErrLost, "its etcd lease %x expired or was revoked (withlock release --force?)", int64(l.id))
		}
		// The member may be stopping, and waits for its streams to end
		// (up to its request timeout) before it stops and can be started
		// again: the watch's is let go too, and opened again anew.
		l.watch.reset()
		return l.b.classify(err)
	}
	rctx, cancel := context.WithTimeout(ctx, min(callTimeout, l.b.opts.KeepInterval()/2))
	defer cancel()
	c, err := l.b.conn(rctx)
	if err == nil {
		var resp *clientv3.GetResponse
		if resp, err = c.Get(rctx, l.key, clientv3.WithKeysOnly()); err == nil {
			if len(resp.Kvs) == 0 || resp.Kvs[0].CreateRevision != l.rev {
				return l.lost()
			}
			return nil
		}
		err = l.b.classify(err)
	}
	switch l.watch.state() {
	case keyGone:
		return l.lost()
	case keyWatched:
		if ctx.Err() == nil {
			return nil
		}
	}
	return err
}

func (l *lease) lost() error {
	return lock.Errorf(lock.ErrLost, "its etcd key %s was deleted", l.key)
}

// Watch returns ErrLost as soon as the key's watch sees it deleted, or nil
// when ctx ends.
func (l *lease) Watch(ctx context.Context) error {
	select {
	case <-l.watch.gone:
		return l.lost()
	case <-ctx.Done():
		return nil
	}
}

// keepCall bounds one request of Keep. With one endpoint, only ctx does:
// Keep answers within its ctx's deadline. With several, callTimeout and
// half of lock.Options.KeepInterval do too, so that an endpoint that takes
// the request but does not answer fails this Keep early, and the next
// Keep, sent on a new stream, which the client sends to another endpoint,
// can still renew the lease before it runs out: a member cut off from its
// peers accepts a renewal, then waits for a leader it cannot reach, while
// the other members still hold the lock.
func (b *backend) keepCall(ctx context.Context) (context.Context, context.CancelFunc) {
	if len(b.endpoints) == 1 {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, min(callTimeout, b.opts.KeepInterval()/2))
}

// Release lets go of the lock. While the key's watch is open, it tells
// whether the key is still ours, and revoking the lease deletes the key:
// one write, the one that wakes the next waiter. (A deletion by hand in
// the moment before the release, which the watch has not delivered yet,
// goes unreported.) The revocation is bounded as a request of an attempt:
// one sent to a member that cannot serve it (cut off from its peers)
// waits for a leader it cannot reach.
//
// Otherwise (the watch being opened again, a lease taken up from a
// handle, which has none, a revocation that was not answered) it deletes
// the key if it is still ours, then revokes the lease, which deletes the
// key too: a deletion that failed (sent to a member that cannot serve it,
// bounded in the same way so that the revocation has time) is done by a
// revocation that succeeds, and the lock was ours if its lease was still
// there. After a revocation that was not answered, a key or lease already
// gone may be its doing, and is not reported.
func (l *lease) Release(ctx context.Context) error {
	st := l.watch.state()
	l.watch.stop()
	l.stopStamp()
	tried := false
	if st != keyUnknown {
		rctx, cancel := l.b.call(ctx)
		revoked, err := l.b.revokeLease(rctx, l.id)
		cancel()
		switch {
		case st == keyGone || err == nil && !revoked:
			// The key was deleted, or its lease is gone; a lease that could
			// not be revoked here runs out by itself.
			return lock.Errorf(lock.ErrNotOurs, "etcd: the lock's key was no longer ours at release")
		case err == nil:
			return nil
		}
		tried = true
	}
	c, err := l.b.conn(ctx)
	if err != nil {
		return err
	}
	tctx, cancel := l.b.call(ctx)
	resp, err := c.Txn(tctx).If(isKey(l.key, l.rev)).Then(clientv3.OpDelete(l.key)).Commit()
	cancel()
	// The lease goes either way; if this fails, it runs out by itself.
	revoked, rerr := l.b.revokeLease(ctx, l.id)
	switch {
	case err == nil && !resp.Succeeded && !tried:
		return lock.Errorf(lock.ErrNotOurs, "etcd: the lock's key was no longer ours at release")
	case err == nil || rerr == nil && (revoked || tried):
		return nil
	case rerr == nil:
		return lock.Errorf(lock.ErrNotOurs, "etcd: the lock's lease was gone at release")
	}
	return l.b.classify(err)
}

// isKey is the condition that key is still the one created at rev.
func isKey(key string, rev int64) clientv3.Cmp {
	return clientv3.Compare(clientv3.CreateRevision(key), "=", rev)
}

// ReleaseAt lets the lock end at until instead of now: the key moves to a
// new lease of the time left, rounded up to the second (etcd's leases are
// whole seconds, and no shorter than the server's minimum: 2s with its
// default election timeout), and the lease that was kept is revoked. The
// key keeps its place and its create revision.
func (l *lease) ReleaseAt(ctx context.Context, until time.Time) error {
	l.watch.stop()
	l.stopStamp()
	c, err := l.b.conn(ctx)
	if err != nil {
		return err
	}
	left := time.Until(until)
	g, err := c.Grant(ctx, int64(math.Ceil(left.Seconds())))
	if err != nil {
		return l.b.classify(err)
	}
	resp, err := c.Txn(ctx).If(isKey(l.key, l.rev)).
		Then(clientv3.OpPut(l.key, "", clientv3.WithLease(g.ID), clientv3.WithIgnoreValue())).Commit()
	if err != nil || !resp.Succeeded {
		l.revoke(ctx, g.ID)
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
	cctx, cancel := l.b.call(context.WithoutCancel(ctx))
	defer cancel()
	if err := l.revoke(cctx, l.id); err != nil {
		l.b.orphans = append(l.b.orphans, l.id)
	}
}

// revoke revokes lease id; one already gone is fine.
func (l *lease) revoke(ctx context.Context, id clientv3.LeaseID) error {
	return l.b.revoke(ctx, id)
}

func (b *backend) revoke(ctx context.Context, id clientv3.LeaseID) error {
	_, err := b.revokeLease(ctx, id)
	return err
}

// revokeLease revokes lease id, and reports whether it was still there.
func (b *backend) revokeLease(ctx context.Context, id clientv3.LeaseID) (bool, error) {
	c, err := b.conn(ctx)
	if err != nil {
		return false, err
	}
	_, err = c.Revoke(ctx, id)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(rpctypes.Error(err), rpctypes.ErrLeaseNotFound):
		return false, nil
	}
	return false, b.classify(err)
}

// renewer renews leases on one LeaseKeepAlive stream, opened on first use
// and kept open, one renewal at a time: a request and its answer. A stream
// keeps being served by a member that is stopping gracefully (it takes no
// new request, but lets the ones it has finish), where a renewal sent as a
// request of its own would be refused, or wait for the member to be back.
type renewer struct {
	mu     sync.Mutex
	stream pb.Lease_LeaseKeepAliveClient
	cancel context.CancelFunc
}

// keepAlive renews lease id once, within ctx. An expired or revoked lease
// is rpctypes.ErrLeaseNotFound. A stream that fails is closed, and the
// renewal sent once more on a new one, which the client opens on another
// endpoint where there are several: the member of the old one may be gone
// (a renewal received twice is still one renewal).
func (b *backend) keepAlive(ctx context.Context, id clientv3.LeaseID) error {
	r := &b.renewer
	r.mu.Lock()
	defer r.mu.Unlock()
	var err error
	for range max(2, len(b.endpoints)) {
		if r.stream == nil {
			if err = b.openStream(ctx); err != nil {
				return err
			}
		}
		var resp *pb.LeaseKeepAliveResponse
		stop := context.AfterFunc(ctx, r.cancel)
		if err = r.stream.Send(&pb.LeaseKeepAliveRequest{ID: int64(id)}); err == nil {
			resp, err = r.stream.Recv()
		}
		if !stop() {
			// ctx ended and cut the stream off.
			r.closeLocked()
			return context.Cause(ctx)
		}
		if err == nil {
			if resp.TTL <= 0 {
				return rpctypes.ErrLeaseNotFound
			}
			return nil
		}
		r.closeLocked()
		if refused(err) {
			b.auth.drop()
		}
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
	}
	return err
}

// openStream opens the renewal stream. Like the official client's own
// keep-alive, it asks the member to end it when the member has no leader,
// so that the next renewal goes to a member that can serve it.
func (b *backend) openStream(ctx context.Context) error {
	c, err := b.conn(ctx)
	if err != nil {
		return err
	}
	sctx, cancel := context.WithCancel(clientv3.WithRequireLeader(context.Background()))
	open := context.AfterFunc(ctx, cancel)
	s, err := pb.NewLeaseClient(c.ActiveConnection()).LeaseKeepAlive(sctx)
	if err != nil && refused(err) {
		b.auth.drop()
	}
	if !open() || err != nil {
		cancel()
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		return err
	}
	b.renewer.stream, b.renewer.cancel = s, cancel
	return nil
}

func (r *renewer) close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closeLocked()
}

func (r *renewer) closeLocked() {
	if r.cancel != nil {
		r.cancel()
	}
	r.stream, r.cancel = nil, nil
}

// keyState is what a key's watch knows of the key.
type keyState int

const (
	keyUnknown keyState = iota // the watch is not open: read the key
	keyWatched                 // the watch is open and saw no deletion
	keyGone                    // the watch saw the key deleted
)

// keyWatch follows a held lock's key from the revision at which it was
// known to be there, on the official client's watch stream, which resumes
// from its last revision on another member when its own goes. It ends when
// it sees the key deleted (gone closes) or when stopped.
type keyWatch struct {
	mu     sync.Mutex
	st     keyState
	gone   chan struct{}
	cancel context.CancelFunc // ends the watch
	cur    context.CancelFunc // ends the current stream of it (reset)
}

func watchKey(b *backend, key string, rev, seen int64) *keyWatch {
	ctx, cancel := context.WithCancel(context.Background())
	w := &keyWatch{gone: make(chan struct{}), cancel: cancel}
	go w.run(ctx, b, key, rev, seen+1)
	return w
}

func (w *keyWatch) run(ctx context.Context, b *backend, key string, rev, from int64) {
	for ctx.Err() == nil {
		c, err := b.conn(ctx)
		if err != nil {
			sleep(ctx, time.Second)
			continue
		}
		wctx, cancel := context.WithCancel(ctx)
		w.mu.Lock()
		w.cur = cancel
		w.mu.Unlock()
		wch := c.Watch(b.auth.watchContext(clientv3.WithRequireLeader(wctx)), key, clientv3.WithRev(from), clientv3.WithFilterPut(), clientv3.WithCreatedNotify())
		for resp := range wch {
			if err := resp.Err(); err != nil {
				// Compacted, the member lost its leader, or the token
				// was refused: read, then watch again.
				b.watchRefused(err)
				break
			}
			if resp.Created {
				w.set(keyWatched)
			}
			for _, ev := range resp.Events {
				if ev.Type == clientv3.EventTypeDelete {
					w.set(keyGone)
					return
				}
			}
			from = max(from, resp.Header.Revision+1)
		}
		cancel()
		w.set(keyUnknown)
		if ctx.Err() != nil {
			return
		}
		// The watch ended: see whether the key is still there, and watch
		// again from the revision of that read.
		cctx, cancel := b.call(ctx)
		resp, err := c.Get(cctx, key, clientv3.WithKeysOnly())
		cancel()
		switch {
		case err != nil:
			sleep(ctx, time.Second)
		case len(resp.Kvs) == 0 || resp.Kvs[0].CreateRevision != rev:
			w.set(keyGone)
			return
		default:
			from = resp.Header.Revision + 1
		}
	}
}

func (w *keyWatch) set(st keyState) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.st == keyGone {
		return
	}
	w.st = st
	if st == keyGone {
		close(w.gone)
	}
}

func (w *keyWatch) state() keyState {
	if w == nil {
		return keyUnknown // a lease taken up again (Resume) has no watch
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.st
}

// stop ends the watch; it may be called more than once.
func (w *keyWatch) stop() {
	if w != nil {
		w.cancel()
	}
}

// reset ends the watch's stream: the watch reads the key and is opened
// again, on a new stream.
func (w *keyWatch) reset() {
	if w == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.cur != nil {
		w.cur()
	}
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// Ticket is the lease's key and its create revision (the fencing token).
// Not the etcd lease's ID: ReleaseAt moves the key to a new lease.
func (b *backend) Ticket(l lock.Lease) string {
	el := l.(*lease)
	return strconv.FormatInt(el.rev, 10) + ":" + el.key
}

// Resume takes up the lease that ticket names: its key, still of the same
// create revision, and the etcd lease the key is on now. It is kept by
// ReleaseAt; it has no watch of its key.
func (b *backend) Resume(ctx context.Context, name, ticket string) (lock.Lease, error) {
	rev, key, ok := strings.Cut(ticket, ":")
	n, err := strconv.ParseInt(rev, 10, 64)
	if !ok || err != nil || key == "" {
		return nil, lock.Errorf(lock.ErrUsage, "etcd: %q is not a lease's ticket", ticket)
	}
	c, err := b.conn(ctx)
	if err != nil {
		return nil, err
	}
	cctx, cancel := b.call(ctx)
	defer cancel()
	resp, err := c.Get(cctx, key, clientv3.WithKeysOnly())
	if err != nil {
		return nil, b.classify(err)
	}
	if len(resp.Kvs) == 0 || resp.Kvs[0].CreateRevision != n {
		return nil, lock.Errorf(lock.ErrNotOurs, "etcd: the lock's key %s is gone (released, run out, or revoked)", key)
	}
	return &lease{b: b, name: name, key: key, id: clientv3.LeaseID(resp.Kvs[0].Lease), rev: n}, nil
}
