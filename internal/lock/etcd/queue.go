package etcd

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/withlock/withlock/internal/lock"
)

var _ lock.Waiter = (*backend)(nil)

// Prefix is the prefix of name's keys, as `etcdctl lock NAME` has it
// (concurrency.NewMutex).
func Prefix(name string) string { return name + "/" }

// Key is the key of name's holder or waiter with lease id, as
// concurrency.Mutex names it.
func Key(name string, id int64) string {
	return fmt.Sprintf("%s%x", Prefix(name), id)
}

// record is the value of withlock's keys: the holder's mode and who it is.
// AcquiredAt is by withlock's clock (etcd has no clock to ask); a waiter
// writes it again once it got the lock (stamp), so that it says when the
// holder got the lock, not when it began to wait.
type record struct {
	Mode       lock.Mode `json:"mode"`
	MaxHolders int       `json:"max_holders,omitempty"`
	Host       string    `json:"host"`
	PID        int       `json:"pid"`
	Command    []string  `json:"command"`
	AcquiredAt time.Time `json:"acquired_at"`
}

// entry is one key of a lock's queue.
type entry struct {
	key   string
	rev   int64 // create revision: the place in the queue, the fencing token
	lease int64
	rec   *record // nil for a key that is not withlock's (etcdctl lock's)
}

// mode is how the key holds: a key without a withlock record is exclusive,
// as concurrency.Mutex treats every key.
func (e entry) mode() lock.Mode {
	if e.rec == nil {
		return lock.Exclusive
	}
	return e.rec.Mode
}

// lockKey reports whether kv, a key under prefix, is a lock key of that
// prefix's name: one more path element, a lease ID in hex, and a lease. A
// key with more elements belongs to a longer name (NAME/sub/<id>), so
// withlock's locks "a" and "a/b" are two locks; etcdctl lock "a" counts
// the keys of "a/b" too.
func lockKey(prefix string, kv *keyValue) bool {
	return kv.Lease != 0 && lockID(string(kv.Key[len(prefix):]))
}

// lockID reports whether id, the last path element of a key, is a lease
// ID in hex, as a lock key's is.
func lockID(id string) bool {
	if id == "" || len(id) > 16 {
		return false
	}
	for _, c := range id {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// queue returns the lock keys among kvs, the keys under name's prefix in
// the order of their create revisions.
func queue(name string, kvs []*keyValue) []entry {
	prefix := Prefix(name)
	var q []entry
	for _, kv := range kvs {
		if !strings.HasPrefix(string(kv.Key), prefix) || !lockKey(prefix, kv) {
			continue
		}
		e := entry{key: string(kv.Key), rev: kv.CreateRevision, lease: kv.Lease}
		var r record
		if json.Unmarshal(kv.Value, &r) == nil && (r.Mode == lock.Exclusive || r.Mode == lock.Shared || r.Mode == lock.Semaphore && r.MaxHolders > 0) {
			e.rec = &r
		}
		q = append(q, e)
	}
	return q
}

// judge says whether the key q[i] holds the lock. If not, wait is the index
// of the earlier key whose deletion to wait for, or -1 if the deletion of
// any earlier key may do (a full semaphore). An exclusive key waits for
// every earlier key, and waits on the one just before it, as the recipe
// does; a shared key for the earlier keys that are not shared; a semaphore
// key of N for the earlier keys that are not the same semaphore, then until
// fewer than N keys are before it. A semaphore key with another N than an
// earlier one's is an error wrapping lock.ErrUsage.
func judge(name string, q []entry, i int) (holds bool, wait int, err error) {
	me := q[i]
	switch me.mode() {
	case lock.Shared:
		for j := i - 1; j >= 0; j-- {
			if q[j].mode() != lock.Shared {
				return false, j, nil
			}
		}
		return true, 0, nil
	case lock.Semaphore:
		n := me.rec.MaxHolders
		for j := 0; j < i; j++ {
			if q[j].mode() == lock.Semaphore && q[j].rec.MaxHolders != n {
				m := q[j].rec.MaxHolders
				return false, 0, lock.Errorf(lock.ErrUsage, "%q is a semaphore of %d (--max-holders %d); this holder asked for %d", name, m, m, n)
			}
		}
		for j := i - 1; j >= 0; j-- {
			if q[j].mode() != lock.Semaphore {
				return false, j, nil
			}
		}
		if i < n {
			return true, 0, nil
		}
		return false, -1, nil
	}
	if i == 0 {
		return true, 0, nil
	}
	return false, i - 1, nil
}

// holders are the keys of q that hold the lock, oldest first.
func holders(name string, q []entry) []entry {
	var hs []entry
	for i := range q {
		if holds, _, err := judge(name, q, i); holds && err == nil {
			hs = append(hs, q[i])
		}
	}
	return hs
}

// record is this holder's record, acquiring now.
func (b *backend) record() string {
	r := record{
		Mode:       b.opts.Mode,
		MaxHolders: b.opts.MaxHolders,
		Host:       b.opts.Holder.Host,
		PID:        b.opts.Holder.PID,
		Command:    b.opts.Holder.Command,
		AcquiredAt: time.Now().UTC(),
	}
	v, _ := json.Marshal(r)
	return string(v)
}

// getQueue reads name's keys in queue order.
func (b *backend) getQueue(name string) requestOp {
	return requestOp{Range: queueRange(name)}
}

// queueRange reads name's keys in the order of their create revisions,
// with their values. Not keys only, although an exclusive key needs only
// the others' leases: etcd 3.7 answers a keys-only read from its index,
// which has no leases, and the lease is what tells a lock key from a key
// of data.
func queueRange(name string) *rangeRequest {
	return &rangeRequest{Key: []byte(Prefix(name)), RangeEnd: prefixEnd(Prefix(name)), SortOrder: "ASCEND", SortTarget: "CREATE"}
}

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
// it, with no read after it. Meanwhile it renews its lease every ttl/3,
// since a waiter's key must live as long as it waits; a renewal that fails
// ends the wait (Client.Acquire tries again). When ctx ends or anything
// fails, the lease is revoked, which deletes the key. The lock's life
// counts from the lease's last renewal.
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
// stream's answers back, delays a waiter by ttl/3 at most, not forever).
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
// means the key is gone: the wait is over, and Client.Acquire queues anew.
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
