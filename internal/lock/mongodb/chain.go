package mongodb

import (
	"slices"
	"strconv"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/withlock/withlock/internal/lock"
)

// state is one document of a name's chain. Documents are never changed.
type state struct {
	ID   string    `bson:"_id"`
	Name string    `bson:"name"`
	Seq  int64     `bson:"seq"`
	Op   string    `bson:"op"`
	At   time.Time `bson:"at,omitempty"` // the server's time the writer read, if it read one
	// Base is the seq of a state that the writer had read before it read
	// at: every state up to it was written before at (see collect).
	Base int64 `bson:"base,omitempty"`
	// Mode is the holders' mode (all of them have the same); absent in
	// documents of earlier versions, which had only exclusive holders,
	// and when there are none.
	Mode    lock.Mode `bson:"mode,omitempty"`
	Max     int       `bson:"max,omitempty"` // a semaphore's N
	Holders []holder  `bson:"holders"`
	// Writer is an exclusive waiter's mark, which new shared and semaphore
	// holders respect (see the package doc).
	Writer *mark `bson:"writer,omitempty"`
	// By is who broke the lock, in a document of op "break".
	By *mark `bson:"by,omitempty"`
}

// holder is one holder's entry in a state.
type holder struct {
	ID         string    `bson:"id"`    // random; proves that the entry is ours
	Token      int64     `bson:"token"` // the fencing token: seq of the acquiring state
	Host       string    `bson:"host"`
	PID        int       `bson:"pid"`
	Command    []string  `bson:"command"`
	AcquiredAt time.Time `bson:"acquiredAt"`
	ExpiresAt  time.Time `bson:"expiresAt"`
}

// mark names a client: an exclusive waiter (until its mark runs out, by
// the server's clock), or the operator who broke the lock.
type mark struct {
	ID    string    `bson:"id,omitempty"`
	Host  string    `bson:"host"`
	PID   int       `bson:"pid"`
	Until time.Time `bson:"until,omitempty"`
}

// docID is the _id of name's state seq. The first state of a chain is
// always "NAME#0", whatever its seq. The seq part has no "#", so the name is
// everything before the last "#" and no two (name, seq) share an _id.
func docID(name string, seq int64, first bool) string {
	if first {
		return name + "#0"
	}
	return name + "#" + strconv.FormatInt(seq, 10)
}

// nextID is the _id of the state after s (nil: the first state of name).
func nextID(name string, s *state) string {
	if s == nil {
		return docID(name, 0, true)
	}
	return docID(name, s.Seq+1, false)
}

// ofName selects the documents of name: an _id range, so that MongoDB finds
// them in its _id index (a longer name with the same prefix and a "#" can
// fall in the range too, hence the name).
func ofName(name string) bson.D {
	return bson.D{
		{Key: "_id", Value: bson.D{{Key: "$gte", Value: name + "#"}, {Key: "$lt", Value: name + "$"}}},
		{Key: "name", Value: name},
	}
}

// mode is the mode of s's holders.
func (s *state) mode() lock.Mode {
	if s == nil || s.Mode == "" {
		return lock.Exclusive
	}
	return s.Mode
}

// size is how many holders s lists, live or not.
func (s *state) size() int {
	if s == nil {
		return 0
	}
	return len(s.Holders)
}

// seq is s's seq; 0 for nil.
func (s *state) seq() int64 {
	if s == nil {
		return 0
	}
	return s.Seq
}

// holder returns the entry with holder id id, or nil. s may be nil.
func (s *state) holder(id string) *holder {
	if s == nil {
		return nil
	}
	for i := range s.Holders {
		if s.Holders[i].ID == id {
			return &s.Holders[i]
		}
	}
	return nil
}

// live returns the holders whose lease has not run out at the server's
// time now. A lease runs out only once now is after expiresAt.
func (s *state) live(now time.Time) []holder {
	if s == nil {
		return nil
	}
	var hs []holder
	for _, h := range s.Holders {
		if !now.After(h.ExpiresAt) {
			hs = append(hs, h)
		}
	}
	return hs
}

// writer returns s's writer-waiting mark if it has not run out at now.
func (s *state) writer(now time.Time) *mark {
	if s == nil || s.Writer == nil || now.After(s.Writer.Until) {
		return nil
	}
	return s.Writer
}

// after returns the start of the state that follows s (nil: the chain is
// empty): its _id and seq, op, and the server's time at which the writer
// decided (zero: not read). The caller fills in the rest.
func (s *state) after(name, op string, at time.Time) state {
	n := state{Name: name, Op: op, At: at, Holders: []holder{}} // an empty array, not null, for people reading it
	if s == nil {
		n.Seq = at.UnixMicro()
		n.ID = docID(name, n.Seq, true)
	} else {
		n.Seq = s.Seq + 1
		n.ID = docID(name, n.Seq, false)
	}
	return n
}

// holding sets n's holders, and its mode and N, which a state records only
// while it has holders.
func (n *state) holding(hs []holder, mode lock.Mode, max int) {
	n.Holders = hs
	if len(hs) == 0 {
		n.Mode, n.Max = "", 0
		return
	}
	n.Mode = mode
	if mode == lock.Semaphore {
		n.Max = max
	}
}

// with returns s's holders, with id's entry replaced by h (or h added at
// the end), and without the others whose lease ran out before now.
func (s *state) with(id string, h holder, now time.Time) []holder {
	hs := []holder{}
	found := false
	if s != nil {
		for _, o := range s.Holders {
			switch {
			case o.ID == id:
				hs = append(hs, h)
				found = true
			case !now.After(o.ExpiresAt):
				hs = append(hs, o)
			}
		}
	}
	if !found {
		hs = append(hs, h)
	}
	return hs
}

// without returns s's holders except id's.
func (s *state) without(id string) []holder {
	hs := []holder{}
	for _, o := range s.Holders {
		if o.ID != id {
			hs = append(hs, o)
		}
	}
	return hs
}

// othersMark is s's writer-waiting mark at now unless it is id's own.
func (s *state) othersMark(id string, now time.Time) *mark {
	if w := s.writer(now); w != nil && w.ID != id {
		return w
	}
	return nil
}

// renewed is the state after s in which holder id's lease ends ttl after
// the server's time now.
func (s *state) renewed(name, op, id string, now time.Time, ttl time.Duration) state {
	n := s.after(name, op, now)
	h := *s.holder(id)
	h.ExpiresAt = msAfter(now, ttl)
	n.holding(s.with(id, h, now), s.mode(), s.Max)
	n.Writer = s.othersMark(id, now)
	return n
}

// released is the state after s without holder id.
func (s *state) released(name, op, id string) state {
	n := s.after(name, op, time.Time{})
	n.holding(s.without(id), s.mode(), s.Max)
	n.Writer = s.Writer
	return n
}

// msAfter is t + d in whole milliseconds (rounded down), as the server
// stores it; so that an expiry read back equals the one written. Rounding
// down stays safe: a lease is taken over only once the server's time, also
// in whole milliseconds, is after expiresAt, so at least a millisecond
// after, which is later than t + d.
func msAfter(t time.Time, d time.Duration) time.Time {
	return t.Add(d).Truncate(time.Millisecond)
}

// A verdict is what a client may do with a lock's state.
type verdict int

const (
	wait   verdict = iota // not now
	join                  // take a place among the holders (the only one, if exclusive)
	renew                 // our entry is there already: an earlier attempt's insert, whose answer was lost
	signal                // wait, after marking an exclusive writer waiting
)

// decide says what this client may do with name's state cur at the
// server's time now. When it must wait, until is when it may be let in if
// nobody writes meanwhile (the server's time at which the leases in its
// way have run out). An exclusive client kept out by shared or semaphore
// holders marks itself waiting unless another one's mark is there (or its
// own lasts a while yet), so that new shared and semaphore holders let it
// have its turn; --no-wait does not wait, so it marks nothing.
func (b *backend) decide(name string, cur *state, id string, now time.Time) (v verdict, until time.Time, err error) {
	if cur.holder(id) != nil {
		return renew, time.Time{}, nil
	}
	live := cur.live(now)
	var theirs *mark
	if b.opts.Mode != lock.Exclusive {
		theirs = cur.othersMark(id, now)
	}
	if len(live) == 0 {
		if theirs != nil {
			return wait, theirs.Until, nil
		}
		return join, time.Time{}, nil
	}
	expiries := make([]time.Time, len(live))
	for i, h := range live {
		expiries[i] = h.ExpiresAt
	}
	slices.SortFunc(expiries, time.Time.Compare)
	last := expiries[len(expiries)-1]
	mode := cur.mode()
	if b.opts.Mode == lock.Exclusive {
		w := cur.writer(now)
		if mode != lock.Exclusive && !b.opts.NoWait && (w == nil || w.ID == id && w.Until.Sub(now) < markTTL/2) {
			return signal, last, nil
		}
		return wait, last, nil
	}
	if mode != b.opts.Mode {
		return wait, last, nil
	}
	if mode == lock.Semaphore {
		if n := b.opts.MaxHolders; cur.Max != n {
			return wait, time.Time{}, lock.Errorf(lock.ErrUsage, "%q is a semaphore of %d (--max-holders %d); this holder asked for %d", name, cur.Max, cur.Max, n)
		}
		if len(live) >= b.opts.MaxHolders {
			// A slot frees once all but N-1 of the leases have run out.
			until = expiries[len(live)-b.opts.MaxHolders]
		}
	}
	if theirs != nil && theirs.Until.After(until) {
		until = theirs.Until
	}
	if !until.IsZero() {
		return wait, until, nil
	}
	return join, time.Time{}, nil
}

// joined is the state after cur in which this client, holder id, has
// joined the holders at the server's time now.
func (b *backend) joined(name string, cur *state, id string, now time.Time) state {
	op := opAcquire
	if cur != nil && len(cur.live(now)) < len(cur.Holders) {
		op = opTake // some lease had run out
	}
	n := cur.after(name, op, now)
	hold := b.opts.Holder
	n.holding(cur.with(id, holder{
		ID: id, Token: n.Seq,
		Host: hold.Host, PID: hold.PID, Command: hold.Command,
		AcquiredAt: now, ExpiresAt: msAfter(now, b.opts.TTL),
	}, now), b.opts.Mode, b.opts.MaxHolders)
	// No mark stays: an exclusive holder's mark (ours or another
	// waiter's) has done its work, and a shared or semaphore holder joins
	// only when no mark is live. After an exclusive holder, every waiter
	// has its chance again.
	n.Writer = nil
	return n
}

// marked is the state after cur with this client's writer-waiting mark.
func (b *backend) marked(name string, cur *state, id string, now time.Time) state {
	n := cur.after(name, opMark, now)
	n.holding(cur.live(now), cur.mode(), cur.Max)
	n.Writer = &mark{ID: id, Host: b.opts.Holder.Host, PID: b.opts.Holder.PID, Until: msAfter(now, markTTL)}
	return n
}
