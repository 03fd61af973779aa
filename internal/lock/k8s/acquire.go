package k8s

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/withlock/withlock/internal/lock"
)

var _ lock.Notifier = (*backend)(nil)

// TryAcquire takes the lock's Lease, or for a semaphore of N the first of
// its N Leases that is free or has run out: one read (a get, or for a
// semaphore one list of its slots), then one write.
func (b *backend) TryAcquire(ctx context.Context, name string) (lock.Lease, error) {
	ns := b.cfg.namespace
	if b.want() == 1 {
		cur, err := b.c.get(ctx, ns, LeaseName(name))
		switch {
		case isCode(err, http.StatusNotFound):
			cur = nil
		case err != nil:
			return nil, b.classify(err, "get")
		}
		return b.try(ctx, name, 0, cur, 0)
	}
	list, err := b.c.list(ctx, ns, url.Values{"labelSelector": {LabelLock + "=" + hashOf(name)}})
	if err != nil {
		return nil, b.classify(err, "list")
	}
	slots := map[string]*LeaseObject{}
	var floor int32 // the highest count of acquisitions of any slot
	for i := range list.Items {
		l := &list.Items[i]
		slots[l.Metadata.Name] = l
		floor = max(floor, l.Spec.LeaseTransitions)
	}
	return lock.FirstFreeSlot(b.want(), func(i int) (lock.Lease, error) {
		return b.try(ctx, name, i, slots[SlotName(name, i)], floor)
	})
}

// try takes slot i of name, if it is free or has run out. cur is the slot's
// Lease as just read, nil if there is none. The acquisition's count (the
// fencing token) is one more than the Lease's or floor, whichever is more:
// a semaphore's token grows across its slots.
func (b *backend) try(ctx context.Context, name string, slot int, cur *LeaseObject, floor int32) (lock.Lease, error) {
	ln := SlotName(name, slot)
	ns := b.cfg.namespace
	now := time.Now()
	if cur == nil {
		return b.create(ctx, name, ln, floor+1)
	}
	if h := cur.Spec.HolderIdentity; h != "" {
		if left, retry := b.left(ln, cur, now); left > 0 {
			n, want := recordedN(cur), b.want()
			switch {
			case n != want && n > 1 && want > 1:
				return nil, lock.Errorf(lock.ErrUsage, "%q is a semaphore of %d (--max-holders %d); this holder asked for %d", name, n, n, want)
			case n != want:
				// Held in another mode: no slot of ours is free.
				return nil, lock.HeldFor(retry)
			}
			return nil, lock.SlotHeld(retry)
		}
		b.opts.Log.Debug("the Lease was not renewed for its duration; taking it over", "lease", ln, "holder", h, "duration", durationOf(cur, b.ttl()))
	}
	next := &LeaseObject{Metadata: cur.Metadata, Spec: cur.Spec}
	b.hold(next, name, now, max(cur.Spec.LeaseTransitions, floor)+1)
	// A Lease deleted since it was read is created by this update (see
	// client.update): as good as a create, since one made by anyone else
	// in between would have failed it.
	sent := time.Now()
	out, _, err := b.c.update(ctx, ns, next)
	switch {
	case isCode(err, http.StatusConflict), isCode(err, http.StatusNotFound):
		// Someone else wrote first (or deleted it): they won.
		return nil, lock.SlotHeld(-1)
	case err != nil:
		return nil, b.classify(err, "update")
	}
	delete(b.seen, ln)
	return b.took(name, out, sent), nil
}

// took is the lease of the Lease out, just written by a create or an
// update sent at sent.
func (b *backend) took(name string, out *LeaseObject, sent time.Time) *lease {
	l := &lease{b: b, name: name, ns: b.cfg.namespace, obj: out, sent: sent, token: tokenOf(out)}
	l.granted, l.grantedKnown = renewedAt(out)
	return l
}

// ttl is the duration of a Lease that has none: ours.
func (b *backend) ttl() time.Duration { return time.Duration(b.duration) * time.Second }

// left is how long until the holder of cur (the Lease ln, read at now) runs
// out (zero or less: it has), and how long a waiter should wait before it
// looks again. By the API server's clock (serverExpiry) where the server
// gave its times. Else as client-go's leader election judges it, on this
// process's monotonic clock: the Lease runs out once this process has seen
// the same resourceVersion for leaseDurationSeconds, counted from when it
// first read it.
func (b *backend) left(ln string, cur *LeaseObject, now time.Time) (left, retry time.Duration) {
	if _, left, ok := serverExpiry(cur, b.ttl()); ok {
		delete(b.seen, ln)
		// The server's clock was anywhere in the second after its Date
		// when it answered, so the holder may run out up to a second
		// before left has passed: look again then, and every recheck
		// while the server's clock may be in that last second.
		return left, max(left-time.Second, 0) + recheck
	}
	obs, ok := b.seen[ln]
	if !ok || obs.rv != cur.Metadata.ResourceVersion {
		obs = observation{rv: cur.Metadata.ResourceVersion, at: now}
		b.seen[ln] = obs
	}
	left = durationOf(cur, b.ttl()) - now.Sub(obs.at)
	return left, left
}

// recheck is how often a waiter looks at a Lease in the second in which it
// may run out by the API server's clock, whose fraction of a second the
// server does not say.
const recheck = 50 * time.Millisecond

// create makes the Lease ln, held by us as acquisition number transitions.
func (b *backend) create(ctx context.Context, name, ln string, transitions int32) (lock.Lease, error) {
	l := &LeaseObject{Metadata: ObjectMeta{Name: ln}}
	sent := time.Now()
	b.hold(l, name, sent, transitions)
	out, err := b.c.create(ctx, b.cfg.namespace, l)
	switch {
	case isCode(err, http.StatusConflict):
		return nil, lock.SlotHeld(-1) // created by someone else meanwhile
	case err != nil:
		return nil, b.classify(err, "create")
	}
	return b.took(name, out, sent), nil
}

// hold makes l held by us from now, as acquisition number transitions.
func (b *backend) hold(l *LeaseObject, name string, now time.Time, transitions int32) {
	m := map[string]string{}
	for k, v := range l.Metadata.Annotations {
		m[k] = v
	}
	cmd, _ := json.Marshal(b.opts.Holder.Command)
	m[AnnotationName] = name
	m[AnnotationHost] = b.opts.Holder.Host
	m[AnnotationPID] = strconv.Itoa(b.opts.Holder.PID)
	m[AnnotationCommand] = string(cmd)
	delete(m, AnnotationMax)
	if n := b.want(); n > 1 {
		m[AnnotationMax] = strconv.Itoa(n)
	}
	l.Metadata.Annotations = m
	labels := map[string]string{}
	for k, v := range l.Metadata.Labels {
		labels[k] = v
	}
	labels[LabelLock] = hashOf(name)
	labels[LabelManagedBy] = "withlock"
	l.Metadata.Labels = labels
	l.Spec = LeaseSpec{
		HolderIdentity:       b.identity,
		LeaseDurationSeconds: b.duration,
		AcquireTime:          formatMicro(now),
		RenewTime:            formatMicro(now),
		LeaseTransitions:     transitions,
		Strategy:             l.Spec.Strategy,
		PreferredHolder:      l.Spec.PreferredHolder,
	}
}

// freed is l with no holder: the holder's fields and record cleared, the
// count of acquisitions, the lock's name and what other tools wrote kept.
func freed(l *LeaseObject) *LeaseObject {
	out := &LeaseObject{Metadata: l.Metadata, Spec: LeaseSpec{
		LeaseTransitions: l.Spec.LeaseTransitions,
		Strategy:         l.Spec.Strategy,
		PreferredHolder:  l.Spec.PreferredHolder,
	}}
	m := map[string]string{}
	for k, v := range l.Metadata.Annotations {
		switch k {
		case AnnotationHost, AnnotationPID, AnnotationCommand, AnnotationMax:
		default:
			m[k] = v
		}
	}
	out.Metadata.Annotations = m
	return out
}

// Notify watches the lock's Leases (all the slots of a semaphore) and
// reports every change: a release, a takeover, a renewal. A watch that the
// server ends is opened again, until stop is called.
func (b *backend) Notify(ctx context.Context, name string) (<-chan struct{}, func(), error) {
	q := url.Values{"fieldSelector": {"metadata.name=" + LeaseName(name)}}
	if b.want() > 1 {
		q = url.Values{"labelSelector": {LabelLock + "=" + hashOf(name)}}
	}
	list, err := b.c.list(ctx, b.cfg.namespace, q)
	if err != nil {
		return nil, nil, b.classify(err, "list")
	}
	wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	changed := make(chan struct{}, 1)
	seen := func(event string) { b.opts.Log.Debug("the Lease changed", "lock", name, "event", event) }
	done, err := b.c.watch(wctx, b.cfg.namespace, q, list.Metadata.ResourceVersion, changed, seen)
	if err != nil {
		cancel()
		return nil, nil, b.classify(err, "watch")
	}
	b.opts.Log.Debug("watching the Lease for a release", "lock", name, "namespace", b.cfg.namespace)
	go func() {
		for {
			opened := time.Now()
			select {
			case <-wctx.Done():
				return
			case <-done:
			}
			// The server ended the watch (its timeout, a restart): open
			// another from now, unless it ended at once, which would make
			// this a busy loop: a lost notification is allowed (lock.Notifier).
			if time.Since(opened) < time.Second {
				return
			}
			select {
			case changed <- struct{}{}: // something may have been missed
			default:
			}
			list, err := b.c.list(wctx, b.cfg.namespace, q)
			if err != nil {
				return
			}
			if done, err = b.c.watch(wctx, b.cfg.namespace, q, list.Metadata.ResourceVersion, changed, seen); err != nil {
				return
			}
		}
	}()
	return changed, cancel, nil
}
