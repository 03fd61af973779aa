package k8s

import (
	"encoding/json"
	"time"
)

// expiryMargin is added to a Lease's duration when its run-out is judged
// by the API server's clock. The server records the time of a renewal in
// whole seconds, truncated, so the renewal may have reached it up to a
// second later than its record says. The time the server stamps on its
// answer (Date) is truncated too, which only makes a contender judge
// later: it needs no margin.
const expiryMargin = time.Second

// renewedAt is the API server's record of when l's renewTime was last
// written: the time of the managedFields entry that owns spec.renewTime
// (the latest, should several), by the server's clock in whole seconds,
// truncated. The server sets it when a field manager changes a field it
// owns, and every renewal changes renewTime. ok is false when no entry
// owns renewTime (managedFields cleared by hand).
func renewedAt(l *LeaseObject) (t time.Time, ok bool) {
	for _, m := range l.Metadata.ManagedFields {
		if !ownsRenewTime(m.FieldsV1) {
			continue
		}
		mt, err := time.Parse(time.RFC3339, m.Time)
		if err != nil {
			continue
		}
		if !ok || mt.After(t) {
			t, ok = mt, true
		}
	}
	return t, ok
}

// ownsRenewTime reports whether a managedFields entry's fieldsV1 holds
// spec.renewTime.
func ownsRenewTime(fields json.RawMessage) bool {
	var top struct {
		Spec map[string]json.RawMessage `json:"f:spec"`
	}
	if json.Unmarshal(fields, &top) != nil {
		return false
	}
	_, ok := top.Spec["f:renewTime"]
	return ok
}

// durationOf is l's leaseDurationSeconds, or d for a Lease without one.
func durationOf(l *LeaseObject, d time.Duration) time.Duration {
	if l.Spec.LeaseDurationSeconds > 0 {
		return time.Duration(l.Spec.LeaseDurationSeconds) * time.Second
	}
	return d
}

// serverExpiry judges by the API server's clock when l's holder runs out:
// at the server's record of the last renewal (renewedAt) plus
// leaseDurationSeconds plus expiryMargin (d stands in for a Lease without
// a duration). left is how long that is after the server sent l (its
// Date): zero or less means the holder has run out. ok is false when the
// server's times are missing; the caller then judges by its own clock.
//
// This is the one judgement of expiry: status, release --force and every
// attempt (--no-wait, a waiter, --timeout) make it, so they agree. It is
// safe against a holder that keeps to its side: a holder's lease ends ttl
// after it sent its last renewal, on its own clock (lock.Backend's
// TryAcquire, lock.Options' Grace), and it writes leaseDurationSeconds as
// the ttl rounded up. The renewal reached the server after it was sent, and
// the server's record of it is at most a second early (expiryMargin), so by
// the time any answer of the server says the Lease has run out, more than
// leaseDurationSeconds have passed since the renewal was sent. A contender
// then takes the Lease with an update conditional on the version it read,
// which fails if the holder renewed in between.
func serverExpiry(l *LeaseObject, d time.Duration) (at time.Time, left time.Duration, ok bool) {
	renewed, ok := renewedAt(l)
	if !ok || l.served.IsZero() {
		return time.Time{}, 0, false
	}
	at = renewed.Add(durationOf(l, d) + expiryMargin)
	return at, at.Sub(l.served), true
}
