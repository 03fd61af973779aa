package k8s

import (
	"context"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/withlock/withlock/internal/lock"
)

var (
	_ lock.Expiring   = (*lease)(nil)
	_ lock.Detachable = (*backend)(nil)
)

// lease is a Lease we hold: obj is what our last write left.
type lease struct {
	b    *backend
	name string
	ns   string
	obj  *LeaseObject
	// sent is when the write that took the Lease was sent, on this
	// process's clock; granted is the API server's record of it
	// (renewedAt), if grantedKnown.
	sent         time.Time
	granted      time.Time
	grantedKnown bool
	// token is tokenOf(obj) at acquisition, which no renewal changes,
	// kept apart: Token is read while Keep replaces obj.
	token int64
}

// Token is the fencing token of the acquisition.
func (l *lease) Token() int64 { return l.token }

// tokenOf is the fencing token of l's holder: leaseTransitions, which every
// acquisition raises by one, for an exclusive lock. A semaphore's holders
// that read the slots at once write the same count into different slots,
// so its token is count × N + slot: never given twice (a slot's next
// holder read this one's count and writes a larger one), and larger than
// that of any holder whose acquisition ended before this one's read began.
func tokenOf(l *LeaseObject) int64 {
	n, slot := recordedN(l), 0
	if rest, ok := strings.CutPrefix(l.Metadata.Name, "withlock-"+l.Metadata.Labels[LabelLock]+"-"); ok && n > 1 {
		if i, err := strconv.Atoi(rest); err == nil && i > 0 && i < n {
			slot = i
		}
	}
	return int64(l.Spec.LeaseTransitions)*int64(n) + int64(slot)
}

// Keep renews the Lease: renewTime set to now, conditional on the version
// we wrote last. A conflict is a loss if the Lease now has another holder
// (or none: release --force); a change by someone else that left us the
// holder (an annotation added with kubectl) is not, and the next Keep
// writes on that version.
func (l *lease) Keep(ctx context.Context) error {
	next := &LeaseObject{Metadata: l.obj.Metadata, Spec: l.obj.Spec}
	next.Spec.RenewTime = formatMicro(time.Now())
	next.Spec.LeaseDurationSeconds = l.b.duration
	out, created, err := l.b.c.update(ctx, l.ns, next)
	switch {
	case err == nil && created:
		// The Lease was deleted behind our back, and this renewal made it
		// again: the lock was broken all the same. Free the copy (unless
		// someone changed it already), with an update: the Role need not
		// allow delete.
		l.b.c.update(ctx, l.ns, freed(out))
		return lock.Errorf(lock.ErrLost, "its Lease %s/%s was deleted", l.ns, l.obj.Metadata.Name)
	case err == nil:
		l.obj = out
		return nil
	case isCode(err, http.StatusNotFound):
		return lock.Errorf(lock.ErrLost, "its Lease %s/%s was deleted", l.ns, l.obj.Metadata.Name)
	case !isCode(err, http.StatusConflict):
		return l.b.classify(err, "update")
	}
	cur, err := l.b.c.get(ctx, l.ns, l.obj.Metadata.Name)
	switch {
	case isCode(err, http.StatusNotFound):
		return lock.Errorf(lock.ErrLost, "its Lease %s/%s was deleted", l.ns, l.obj.Metadata.Name)
	case err != nil:
		return l.b.classify(err, "get")
	}
	if !l.same(cur) {
		who := cur.Spec.HolderIdentity
		if who == "" {
			return lock.Errorf(lock.ErrLost, "its Lease %s/%s was released by someone else (withlock release --force?)", l.ns, l.obj.Metadata.Name)
		}
		return lock.Errorf(lock.ErrLost, "its Lease %s/%s was taken over by %s", l.ns, l.obj.Metadata.Name, who)
	}
	l.obj = cur
	return lock.Errorf(lock.ErrUnavailable, "its Lease %s/%s was changed by someone else; renewing again", l.ns, l.obj.Metadata.Name)
}

// same reports whether cur is still our acquisition: our identity, the
// same acquisition count and time.
func (l *lease) same(cur *LeaseObject) bool {
	return cur.Spec.HolderIdentity == l.obj.Spec.HolderIdentity &&
		cur.Spec.LeaseTransitions == l.obj.Spec.LeaseTransitions &&
		parseMicro(cur.Spec.AcquireTime).Equal(parseMicro(l.obj.Spec.AcquireTime))
}

// Release clears the holder, if the Lease is still as we left it.
func (l *lease) Release(ctx context.Context) error {
	_, created, err := l.b.c.update(ctx, l.ns, freed(l.obj))
	return l.released(err, created)
}

// released sorts the answer to a release's write. A Lease that changed
// meanwhile, or was deleted, was no longer ours (ErrNotOurs); a deleted
// one was written again, free, which does no harm.
func (l *lease) released(err error, created bool) error {
	switch {
	case err == nil && created:
		return lock.Errorf(lock.ErrNotOurs, "k8s: the Lease %s/%s was deleted before the release", l.ns, l.obj.Metadata.Name)
	case isCode(err, http.StatusConflict), isCode(err, http.StatusNotFound):
		return lock.Errorf(lock.ErrNotOurs, "k8s: the Lease %s/%s was no longer ours at release", l.ns, l.obj.Metadata.Name)
	case err != nil:
		return l.b.classify(err, "update")
	}
	return nil
}

// ReleaseAt lets the Lease run out at until instead of now, by the
// judgement every contender makes (serverExpiry): its leaseDurationSeconds
// is rewritten so that the Lease runs out, by the API server's clock, at
// the server's record of the grant plus until - sent rounded up to the
// second. The grant reached the server after sent, so no contender takes
// the Lease before until; and one can take it by until + 1s plus what the
// grant took to arrive. The write leaves renewTime as it was and is made
// under a field manager of its own (holdManager), so that the server's
// record of the last renewal, from which the judgement counts, stays put.
//
// Where the server keeps no managedFields, the Lease is renewed once more
// with a duration of the time left (rounded up), and contenders, judging by
// their own clocks, count from when they first see that version.
func (l *lease) ReleaseAt(ctx context.Context, until time.Time) error {
	left := time.Until(until)
	next := &LeaseObject{Metadata: l.obj.Metadata, Spec: l.obj.Spec}
	manager := fieldManager
	last, ok := renewedAt(l.obj)
	if ok && l.grantedKnown {
		end := l.granted.Add(time.Duration(math.Ceil(until.Sub(l.sent).Seconds())) * time.Second)
		// The field must be positive. A second is enough even when end is
		// no later than last: that renewal then reached the server after
		// until - 1s, and the Lease runs out more than a second after it.
		next.Spec.LeaseDurationSeconds = int32(max(end.Sub(last)/time.Second, 1))
		manager = holdManager
	} else {
		next.Spec.RenewTime = formatMicro(time.Now())
		next.Spec.LeaseDurationSeconds = int32(math.Ceil(left.Seconds()))
	}
	out, created, err := l.b.c.updateAs(ctx, l.ns, next, manager)
	switch {
	case err == nil && created:
		l.b.c.update(ctx, l.ns, freed(out)) // the copy this made: freed
	case err == nil:
		l.obj = out // a lease taken up again (Resume) may be released later
	}
	return l.released(err, created)
}

// holdManager is the field manager of the write of --hold-at-least, which
// changes only leaseDurationSeconds: the time of withlock's own entry in
// managedFields, the server's record of the last renewal, then stays.
const holdManager = "withlock-hold"

// Ticket is the name of the Lease held (a semaphore's slot) and the
// holder's identity in it.
func (b *backend) Ticket(l lock.Lease) string {
	kl := l.(*lease)
	return kl.obj.Spec.HolderIdentity + " " + kl.obj.Metadata.Name
}

// Resume takes up the Lease that ticket names: it must still have the
// ticket's holder. Its writes are conditional on the version read here.
func (b *backend) Resume(ctx context.Context, name, ticket string) (lock.Lease, error) {
	identity, leaseName, ok := strings.Cut(ticket, " ")
	if !ok || identity == "" || leaseName == "" {
		return nil, lock.Errorf(lock.ErrUsage, "k8s: %q is not a lease's ticket", ticket)
	}
	obj, err := b.c.get(ctx, b.cfg.namespace, leaseName)
	switch {
	case isCode(err, http.StatusNotFound):
		return nil, lock.Errorf(lock.ErrNotOurs, "k8s: the Lease %s/%s was deleted", b.cfg.namespace, leaseName)
	case err != nil:
		return nil, b.classify(err, "get")
	case obj.Spec.HolderIdentity != identity:
		return nil, lock.Errorf(lock.ErrNotOurs, "k8s: the Lease %s/%s is no longer held by %s", b.cfg.namespace, leaseName, identity)
	}
	b.identity = identity
	return &lease{b: b, name: name, ns: b.cfg.namespace, obj: obj, sent: time.Now(), token: tokenOf(obj)}, nil
}
