// Package k8s is the k8s:// and kubernetes:// backend: a lock is a
// coordination.k8s.io/v1 Lease in one namespace, the object client-go's
// leader election uses, reached with the pod's service account or a
// kubeconfig (config.go) through a small REST client of its own
// (client.go).
//
// The Lease of NAME is named NAME when NAME is a DNS-1123 subdomain, else
// "withlock-" and the first 32 hex digits of SHA-256(NAME) (LeaseName); the
// annotation withlock.io/name always holds NAME, and the label
// withlock.io/lock the hash, so that status finds a lock's Leases. Its spec
// says who holds it: holderIdentity is "host/pid", leaseDurationSeconds the
// ttl rounded up to whole seconds (at least 1), acquireTime and renewTime
// the holder's clock, leaseTransitions the number of acquisitions: the
// fencing token. The holder's record (host, pid, command) is in
// annotations. A semaphore of N (--max-holders) is N Leases, slot 0 being
// NAME's Lease and slot i the Lease "withlock-<hash>-i"; each records N.
//
// Every write is a create (409 AlreadyExists: someone else was first) or an
// update conditional on the resourceVersion last read (409 Conflict:
// someone else wrote first), so of two contenders exactly one wins.
//
// Expiry is judged by the API server's clock (expiry.go): a holder has run
// out once the time the server stamps on an answer (Date) reaches the
// server's own record of the last renewal (the managedFields time of the
// entry that owns renewTime) plus leaseDurationSeconds plus a second for
// the record's resolution. Every attempt, status and release --force make
// this one judgement. The holder renews every ttl/3 and stops its command
// by ttl - kill-after after the last renewal it sent (lock.Held), so it is
// gone before anyone can take over. Where the server's times are missing,
// a contender falls back to client-go's leader election rule, on its own
// monotonic clock.
//
// A release clears holderIdentity (conditional on the resourceVersion, so
// it never clears a newer holder) instead of deleting the Lease:
// leaseTransitions, the fencing token, must keep growing, and a Lease
// created again would count from 1. release --force does the same.
// Waiters watch the Lease (Notify), so a release wakes them at once.
package k8s

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/withlock/withlock/internal/lock"
)

func init() {
	lock.Register("k8s", open)
	lock.Register("kubernetes", open)
}

// Annotations and labels withlock puts on its Leases.
const (
	AnnotationName    = "withlock.io/name"
	AnnotationHost    = "withlock.io/host"
	AnnotationPID     = "withlock.io/pid"
	AnnotationCommand = "withlock.io/command" // JSON array
	AnnotationMax     = "withlock.io/max-holders"
	LabelLock         = "withlock.io/lock" // hashOf(NAME)
	LabelManagedBy    = "app.kubernetes.io/managed-by"
)

type backend struct {
	opts     lock.Options
	cfg      *config
	c        *client
	identity string
	duration int32 // leaseDurationSeconds: the ttl rounded up
	// seen is, per Lease, the version last read and when (on this
	// process's monotonic clock) it was first read: expiry is judged
	// from it.
	seen map[string]observation
}

type observation struct {
	rv string
	at time.Time
}

func open(u *url.URL, opts lock.Options) (lock.Backend, error) {
	if opts.Mode == lock.Shared {
		return nil, lock.Errorf(lock.ErrUsage, "the k8s:// backend has no shared locks: a Lease has one holder; use --max-holders N for N at once, or a backend with shared locks (postgres, redis, mongodb, etcd) for readers and writers")
	}
	cfg, err := loadConfig(u)
	if err != nil {
		return nil, err
	}
	d := math.Ceil(opts.TTL.Seconds())
	return &backend{
		opts:     opts,
		cfg:      cfg,
		c:        newClient(cfg),
		identity: fmt.Sprintf("%s/%d", opts.Holder.Host, opts.Holder.PID),
		duration: int32(max(d, 1)),
		seen:     map[string]observation{},
	}, nil
}

// Close drops idle connections. A Lease held through the backend stays
// held until it runs out.
func (b *backend) Close() error {
	b.c.http.CloseIdleConnections()
	return nil
}

// hashOf is the first 32 hex digits of SHA-256(name).
func hashOf(name string) string {
	sum := sha256.Sum256([]byte(name))
	return hex.EncodeToString(sum[:16])
}

// LeaseName is the name of the Lease of the lock name: name itself if it is
// a DNS-1123 subdomain (as Kubernetes object names must be), else
// "withlock-" and the first 32 hex digits of SHA-256(name).
func LeaseName(name string) string {
	if len(name) <= 253 && isSubdomainPart(name) {
		return name
	}
	return "withlock-" + hashOf(name)
}

// SlotName is the name of slot i of a semaphore on name: slot 0 is the
// lock's own Lease, the others "withlock-<hash>-i".
func SlotName(name string, i int) string {
	if i == 0 {
		return LeaseName(name)
	}
	return "withlock-" + hashOf(name) + "-" + strconv.Itoa(i)
}

// isSubdomainPart reports whether s is dot-separated DNS-1123 labels:
// lower-case letters, digits and '-', each label starting and ending with
// a letter or digit.
func isSubdomainPart(s string) bool {
	if s == "" {
		return false
	}
	for _, label := range strings.Split(s, ".") {
		if label == "" || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for _, r := range label {
			if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-') {
				return false
			}
		}
	}
	return true
}

// want is how many holders this client's mode allows: 1 for an exclusive
// lock, N for a semaphore.
func (b *backend) want() int {
	if b.opts.Mode == lock.Semaphore {
		return b.opts.MaxHolders
	}
	return 1
}

// recordedN is the N a Lease's holder took it with (1: exclusive).
func recordedN(l *Lease) int {
	n, err := strconv.Atoi(l.Metadata.Annotations[AnnotationMax])
	if err != nil || n < 1 {
		return 1
	}
	return n
}

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
	slots := map[string]*Lease{}
	var floor int32 // the highest count of acquisitions of any slot
	for i := range list.Items {
		l := &list.Items[i]
		slots[l.Metadata.Name] = l
		floor = max(floor, l.Spec.LeaseTransitions)
	}
	var soonest time.Duration = -1
	for i := range b.want() {
		l, err := b.try(ctx, name, i, slots[SlotName(name, i)], floor)
		if err == nil {
			return l, nil
		}
		if !errors.Is(err, errNextSlot) {
			return nil, err
		}
		if left, ok := lock.Remaining(err); ok && (soonest < 0 || left < soonest) {
			soonest = left
		}
	}
	if soonest >= 0 {
		return nil, lock.HeldFor(soonest)
	}
	return nil, lock.ErrHeld
}

// errNextSlot marks an ErrHeld of one slot after which the next slot is
// worth trying.
var errNextSlot = errors.New("k8s: slot held")

type slotHeld struct{ left time.Duration } // left < 0: unknown

func (e slotHeld) Error() string { return lock.ErrHeld.Error() }
func (e slotHeld) Unwrap() []error {
	return []error{lock.ErrHeld, errNextSlot}
}

// heldNext is slotHeld as an error whose Remaining says left, when known.
func heldNext(left time.Duration) error {
	if left < 0 {
		return slotHeld{left}
	}
	return slotHeldFor{slotHeld{left}}
}

type slotHeldFor struct{ slotHeld }

func (e slotHeldFor) Remaining() time.Duration { return e.left }

// try takes slot i of name, if it is free or has run out. cur is the slot's
// Lease as just read, nil if there is none. The acquisition's count (the
// fencing token) is one more than the Lease's or floor, whichever is more:
// a semaphore's token grows across its slots.
func (b *backend) try(ctx context.Context, name string, slot int, cur *Lease, floor int32) (lock.Lease, error) {
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
			return nil, heldNext(retry)
		}
		b.opts.Log.Debug("the Lease was not renewed for its duration; taking it over", "lease", ln, "holder", h, "duration", durationOf(cur, b.ttl()))
	}
	next := &Lease{Metadata: cur.Metadata, Spec: cur.Spec}
	b.hold(next, name, now, max(cur.Spec.LeaseTransitions, floor)+1)
	// A Lease deleted since it was read is created by this update (see
	// client.update): as good as a create, since one made by anyone else
	// in between would have failed it.
	sent := time.Now()
	out, _, err := b.c.update(ctx, ns, next)
	switch {
	case isCode(err, http.StatusConflict), isCode(err, http.StatusNotFound):
		// Someone else wrote first (or deleted it): they won.
		return nil, heldNext(-1)
	case err != nil:
		return nil, b.classify(err, "update")
	}
	delete(b.seen, ln)
	return b.took(name, out, sent), nil
}

// took is the lease of the Lease out, just written by a create or an
// update sent at sent.
func (b *backend) took(name string, out *Lease, sent time.Time) *lease {
	l := &lease{b: b, name: name, ns: b.cfg.namespace, obj: out, sent: sent}
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
func (b *backend) left(ln string, cur *Lease, now time.Time) (left, retry time.Duration) {
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
	l := &Lease{Metadata: ObjectMeta{Name: ln}}
	sent := time.Now()
	b.hold(l, name, sent, transitions)
	out, err := b.c.create(ctx, b.cfg.namespace, l)
	switch {
	case isCode(err, http.StatusConflict):
		return nil, heldNext(-1) // created by someone else meanwhile
	case err != nil:
		return nil, b.classify(err, "create")
	}
	return b.took(name, out, sent), nil
}

// hold makes l held by us from now, as acquisition number transitions.
func (b *backend) hold(l *Lease, name string, now time.Time, transitions int32) {
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
func freed(l *Lease) *Lease {
	out := &Lease{Metadata: l.Metadata, Spec: LeaseSpec{
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
// server ends is opened again while the caller waits.
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
			// this a busy loop; the caller's slow poll covers the rest.
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

// lease is a Lease we hold: obj is what our last write left.
type lease struct {
	b    *backend
	name string
	ns   string
	obj  *Lease
	// sent is when the write that took the Lease was sent, on this
	// process's clock; granted is the API server's record of it
	// (renewedAt), if grantedKnown.
	sent         time.Time
	granted      time.Time
	grantedKnown bool
}

// Token is the fencing token of the acquisition that wrote l.obj.
func (l *lease) Token() int64 { return tokenOf(l.obj) }

// tokenOf is the fencing token of l's holder: leaseTransitions, which every
// acquisition raises by one, for an exclusive lock. A semaphore's holders
// that read the slots at once write the same count into different slots,
// so its token is count × N + slot: never given twice (a slot's next
// holder read this one's count and writes a larger one), and larger than
// that of any holder whose acquisition ended before this one's read began.
func tokenOf(l *Lease) int64 {
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
	next := &Lease{Metadata: l.obj.Metadata, Spec: l.obj.Spec}
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
func (l *lease) same(cur *Lease) bool {
	return cur.Spec.HolderIdentity == l.obj.Spec.HolderIdentity &&
		cur.Spec.LeaseTransitions == l.obj.Spec.LeaseTransitions &&
		parseMicro(cur.Spec.AcquireTime).Equal(parseMicro(l.obj.Spec.AcquireTime))
}

// Release clears the holder, if the Lease is still as we left it.
func (l *lease) Release(ctx context.Context) error {
	_, created, err := l.b.c.update(ctx, l.ns, freed(l.obj))
	if err == nil && created {
		// Deleted meanwhile: this made a free copy, which does no harm.
		return fmt.Errorf("k8s: the Lease %s/%s was deleted before the release", l.ns, l.obj.Metadata.Name)
	}
	switch {
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
	next := &Lease{Metadata: l.obj.Metadata, Spec: l.obj.Spec}
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
	if err == nil && created {
		l.b.c.update(ctx, l.ns, freed(out)) // the copy this made: freed
		return fmt.Errorf("k8s: the Lease %s/%s was deleted before the release", l.ns, l.obj.Metadata.Name)
	}
	switch {
	case isCode(err, http.StatusConflict), isCode(err, http.StatusNotFound):
		return lock.Errorf(lock.ErrNotOurs, "k8s: the Lease %s/%s was no longer ours at release", l.ns, l.obj.Metadata.Name)
	case err != nil:
		return l.b.classify(err, "update")
	}
	return nil
}

// holdManager is the field manager of the write of --hold-at-least, which
// changes only leaseDurationSeconds: the time of withlock's own entry in
// managedFields, the server's record of the last renewal, then stays.
const holdManager = "withlock-hold"

var (
	_ lock.Backend  = (*backend)(nil)
	_ lock.Notifier = (*backend)(nil)
	_ lock.Expiring = (*lease)(nil)
)
