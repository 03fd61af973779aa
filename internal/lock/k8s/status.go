package k8s

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"time"

	"github.com/withlock/withlock/internal/lock"
)

// Inspect returns name's holders: its Lease, and a semaphore's other
// slots (found by their label). It only reads (get, list). A holder whose
// Lease has run out by the API server's clock (serverExpiry) is none, as
// it is to an attempt to take the lock.
func (b *backend) Inspect(ctx context.Context, name string) (lock.State, error) {
	leases, err := b.leasesOf(ctx, name)
	if err != nil {
		return lock.State{}, err
	}
	st := lock.State{Name: name, Key: b.cfg.namespace + "/" + LeaseName(name)}
	for _, l := range leases {
		b.addHolder(&st, &l, time.Now())
	}
	sortHolders(&st)
	return st, nil
}

// leasesOf returns name's Leases: those with its label (a semaphore's
// slots) and its own Lease, which another tool may have made without.
func (b *backend) leasesOf(ctx context.Context, name string) ([]LeaseObject, error) {
	list, err := b.c.list(ctx, b.cfg.namespace, url.Values{"labelSelector": {LabelLock + "=" + hashOf(name)}})
	if err != nil {
		return nil, b.classify(err, "list")
	}
	leases := list.Items
	first := LeaseName(name)
	if !slices.ContainsFunc(leases, func(l LeaseObject) bool { return l.Metadata.Name == first }) {
		l, err := b.c.get(ctx, b.cfg.namespace, first)
		switch {
		case isCode(err, http.StatusNotFound):
		case err != nil:
			return nil, b.classify(err, "get")
		default:
			leases = append(leases, *l)
		}
	}
	// Skip another name whose hash shares the label's prefix.
	return slices.DeleteFunc(leases, func(l LeaseObject) bool {
		n := l.Metadata.Annotations[AnnotationName]
		return n != "" && n != name
	}), nil
}

// List returns every withlock lock held in the namespace: its Leases with
// withlock's label, grouped by the name they record.
func (b *backend) List(ctx context.Context) ([]lock.State, error) {
	list, err := b.c.list(ctx, b.cfg.namespace, url.Values{"labelSelector": {LabelManagedBy + "=withlock"}})
	if err != nil {
		return nil, b.classify(err, "list")
	}
	byName := map[string]*lock.State{}
	now := time.Now()
	for _, l := range list.Items {
		name := l.Metadata.Annotations[AnnotationName]
		if name == "" {
			continue
		}
		st := byName[name]
		if st == nil {
			st = &lock.State{Name: name, Key: b.cfg.namespace + "/" + LeaseName(name)}
			byName[name] = st
		}
		b.addHolder(st, &l, now)
	}
	var held []lock.State
	for _, st := range byName {
		if len(st.Holders) > 0 {
			sortHolders(st)
			held = append(held, *st)
		}
	}
	return held, nil
}

// addHolder adds l's holder to st if it has one whose lease has not run
// out (read at now, by this host's clock).
func (b *backend) addHolder(st *lock.State, l *LeaseObject, now time.Time) {
	h, ok := b.holderOf(l, now)
	if !ok {
		return
	}
	st.Holders = append(st.Holders, h)
	if n := recordedN(l); n > 1 {
		st.Mode, st.MaxHolders = lock.Semaphore, n
	} else if st.Mode == "" {
		st.Mode = lock.Exclusive
	}
}

// holderOf reads l's holder, unless it has none or it has run out: its
// record where withlock wrote one, else what holderIdentity says. l was
// read at now, by this host's clock. ExpiresAt is by the API server's
// clock (serverExpiry); where the server gave no times, it is the
// holder's renewTime plus the duration, judged against this host's clock
// (the holder's and this host's clocks are then assumed to agree: status
// has nothing better).
func (b *backend) holderOf(l *LeaseObject, now time.Time) (lock.Holder, bool) {
	if l.Spec.HolderIdentity == "" {
		return lock.Holder{}, false
	}
	a := l.Metadata.Annotations
	h := lock.Holder{
		Host:       a[AnnotationHost],
		AcquiredAt: parseMicro(l.Spec.AcquireTime),
		Token:      tokenOf(l),
	}
	h.PID, _ = strconv.Atoi(a[AnnotationPID])
	json.Unmarshal([]byte(a[AnnotationCommand]), &h.Command)
	if h.Host == "" {
		// Another tool's holder (client-go's leader election): its
		// identity is all there is.
		h.Host = l.Spec.HolderIdentity
	}
	if at, left, ok := serverExpiry(l, b.ttl()); ok {
		h.ExpiresAt = at
		return h, left > 0
	}
	renewed := parseMicro(l.Spec.RenewTime)
	if renewed.IsZero() {
		renewed = h.AcquiredAt
	}
	h.ExpiresAt = renewed.Add(durationOf(l, b.ttl()))
	return h, h.ExpiresAt.After(now)
}

func sortHolders(st *lock.State) {
	if len(st.Holders) == 0 {
		*st = lock.State{Name: st.Name, Key: st.Key}
		return
	}
}
