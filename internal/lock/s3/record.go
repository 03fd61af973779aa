package s3

import (
	"encoding/json"
	"time"
)

// The states of a lock object.
const (
	held = "held"
	free = "free"
)

// record is the body of a lock object. Every write changes Owner or
// Renewals, so no two bodies are the same and no two ETags match.
type record struct {
	Name  string `json:"name"`  // the lock's name, unescaped
	State string `json:"state"` // held or free
	// Owner is random per acquisition: the holder's proof that the object
	// is still its own. Empty when free.
	Owner string `json:"owner,omitempty"`
	// Renewals counts the writes of this acquisition after the first.
	Renewals int64 `json:"renewals"`
	// Acquisitions counts the acquisitions of this object; a free body
	// keeps it.
	Acquisitions int64 `json:"acquisitions"`
	// Token is the fencing token of the current or last holder.
	Token int64 `json:"token"`
	// TTLMillis is how long after the store recorded this write the lease
	// runs out (plus a second: see expiry).
	TTLMillis  int64     `json:"ttl_ms,omitempty"`
	MaxHolders int       `json:"max_holders,omitempty"` // a semaphore's N
	Host       string    `json:"host,omitempty"`
	PID        int       `json:"pid,omitempty"`
	Command    []string  `json:"command,omitempty"`
	AcquiredAt time.Time `json:"acquired_at,omitzero"` // by the holder's clock
}

func (r record) ttl() time.Duration { return time.Duration(r.TTLMillis) * time.Millisecond }

// n is the semaphore's N the holder took the object with (1: exclusive).
func (r record) n() int { return max(r.MaxHolders, 1) }

// freed is r with no holder: the counts and the name kept.
func (r record) freed() record {
	return record{Name: r.Name, State: free, Acquisitions: r.Acquisitions, Token: r.Token}
}

func (r record) marshal() []byte {
	b, _ := json.Marshal(r)
	return b
}

// object is a lock object as one GET found it.
type object struct {
	key    string
	exists bool
	rec    record
	etag   string
	// modified is the object's Last-Modified and served the response's
	// Date: both the store's clock, in whole seconds (truncated). served
	// is zero if the store gave no Date.
	modified time.Time
	served   time.Time
}

// expiryMargin is added to a lease when its end is judged by the store's
// clock: the store records a write's time in whole seconds, truncated, so
// the write may have reached it up to a second after Last-Modified says.
const expiryMargin = time.Second

// expiry is when o's holder runs out by the store's clock, and how long
// after the response that is (zero or less: it has). ok is false when the
// store gave no Date.
func (o *object) expiry() (at time.Time, left time.Duration, ok bool) {
	if o.served.IsZero() || o.modified.IsZero() {
		return time.Time{}, 0, false
	}
	at = o.modified.Add(o.rec.ttl() + expiryMargin)
	return at, at.Sub(o.served), true
}
