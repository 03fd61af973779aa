package mongodb

import (
	"context"
	"errors"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/withlock/withlock/internal/lock"
)

// newest reads name's newest state (nil: it has none), and when the read
// was sent. On FerretDB v1 this reads the whole collection (see the
// package doc).
func (b *backend) newest(ctx context.Context, name string) (*state, time.Time, error) {
	sent := time.Now()
	cur, err := b.locks.Find(ctx, ofName(name), options.Find().SetSort(bson.D{{Key: "seq", Value: -1}}).SetLimit(1))
	if err != nil {
		return nil, sent, b.classify(ctx, err)
	}
	var ss []state
	if err := cur.All(ctx, &ss); err != nil {
		return nil, sent, b.classify(ctx, err)
	}
	if len(ss) == 0 {
		return nil, sent, nil
	}
	return &ss[0], sent, nil
}

// chain reads every document of name, newest first, and when the read was
// sent: a write's check reads them all, since deleting old ones needs
// their times (collect).
func (b *backend) chain(ctx context.Context, name string) ([]state, time.Time, error) {
	sent := time.Now()
	cur, err := b.locks.Find(ctx, ofName(name), options.Find().SetSort(bson.D{{Key: "seq", Value: -1}}))
	if err != nil {
		return nil, sent, b.classify(ctx, err)
	}
	var ss []state
	if err := cur.All(ctx, &ss); err != nil {
		return nil, sent, b.classify(ctx, err)
	}
	return ss, sent, nil
}

// byID reads one document by _id, the one query FerretDB v1 answers from
// an index; nil if there is none.
func (b *backend) byID(ctx context.Context, id string) (*state, error) {
	var s state
	err := b.locks.FindOne(ctx, bson.D{{Key: "_id", Value: id}}).Decode(&s)
	switch {
	case errors.Is(err, mongo.ErrNoDocuments):
		return nil, nil
	case err != nil:
		return nil, b.classify(ctx, err)
	}
	return &s, nil
}

// current returns name's newest state for a decision, and remembers it.
// Within spare/2 of the last time it knew the newest state, it reads the
// states after that one by _id, one at a time (usually the first is not
// there: nothing changed), up to walk of them; otherwise, or if the chain
// moved further, it reads the newest state. Documents younger than spare
// are never deleted (collect), so every state written since is still
// there to be read: a missing _id means that nothing was written after it.
// (Where that fails, for example when the server's clock jumps, a decision
// on an old state is still safe: every write is checked by reading the
// newest state back.)
func (b *backend) current(ctx context.Context, name string) (*state, error) {
	if s := b.seen; s.name == name && time.Since(s.sent) < b.spare/2 {
		cur := s.cur
		for range walk {
			sent := time.Now()
			next, err := b.byID(ctx, nextID(name, cur))
			if err != nil {
				return nil, err
			}
			if next == nil {
				if time.Since(s.sent) >= b.spare/2 {
					break // too late to be sure: read the newest
				}
				b.see(name, cur, sent)
				return cur, nil
			}
			cur = next
		}
	}
	cur, sent, err := b.newest(ctx, name)
	if err != nil {
		return nil, err
	}
	b.see(name, cur, sent)
	return cur, nil
}

// advance reads the states after s by _id, one at a time, and returns the
// last one there, which is the newest unless documents after s have been
// deleted already (the chain moved on far): a decision on it is checked
// anyway, since every write is. After more than 4·walk states it reads the
// newest instead.
func (b *backend) advance(ctx context.Context, name string, s *state) (*state, error) {
	for range 4 * walk {
		next, err := b.byID(ctx, nextID(name, s))
		if err != nil || next == nil {
			return s, err
		}
		s = next
	}
	s, _, err := b.newest(ctx, name)
	return s, err
}

// see remembers that cur (nil: none) was name's newest state when a read
// sent at sent was answered.
func (b *backend) see(name string, cur *state, sent time.Time) {
	b.seen.name, b.seen.cur, b.seen.sent = name, cur, sent
}

// serverTime reads the server's clock, which alone judges expiry, and
// remembers it (upper).
func (b *backend) serverTime(ctx context.Context) (time.Time, error) {
	var hello struct {
		LocalTime time.Time `bson:"localTime"`
	}
	sent := time.Now()
	if err := b.client.Database("admin").RunCommand(ctx, bson.D{{Key: "hello", Value: 1}}).Decode(&hello); err != nil {
		return time.Time{}, b.classify(ctx, err)
	}
	if hello.LocalTime.IsZero() {
		return time.Time{}, lock.Errorf(lock.ErrRefused, "mongodb at %s does not tell its time (no localTime in hello)", b.addr)
	}
	b.clock.server, b.clock.sent = hello.LocalTime, sent
	return hello.LocalTime, nil
}

// upper is the latest time the server's clock can show now, by the last
// reading (false if none): that reading plus the time since it was sent,
// plus the millisecond it was rounded down by, plus 0.1% for clocks that
// run at different rates. A lease that is live by it is live.
func (b *backend) upper() (time.Time, bool) {
	if b.clock.server.IsZero() {
		return time.Time{}, false
	}
	d := time.Since(b.clock.sent)
	return b.clock.server.Add(d + d/1000 + time.Millisecond), true
}

// insert writes n as the state after n.Seq-1. It reports false, with no
// error, when another client wrote that state first.
func (b *backend) insert(ctx context.Context, n *state) (bool, error) {
	_, err := b.locks.InsertOne(ctx, n)
	switch {
	case mongo.IsDuplicateKeyError(err):
		return false, nil
	case err != nil:
		return false, b.classify(ctx, err)
	}
	return true, nil
}

// counts reports whether a write that gave holder id a lease ending at
// expires landed in the chain, judged by top, the newest state read after
// it: top lists id with that expiry (or a later one). Only a state built
// on ours can list it: a write that landed late, on an _id that had been
// deleted, is below the newest state, and nobody decides on a state that
// is not the newest.
func counts(top *state, id string, expires time.Time) bool {
	h := top.holder(id)
	return h != nil && !h.ExpiresAt.Before(expires)
}

// collect deletes old documents of name, given all of them (docs, newest
// first) as read at about the server's time now: those more than keep
// below the newest, and at or below the base of a state whose time is older
// than spare, since they were written before that time; never "NAME#0" (so
// that a stale first acquisition cannot be inserted again). So a document
// goes only once spare has passed since anyone could have read the state
// before it as the newest (see current). A failure only leaves them for
// the next time; nothing is deleted until there are at least keep of them.
func (b *backend) collect(ctx context.Context, name string, docs []state, now time.Time) {
	if len(docs) == 0 {
		return
	}
	below := docs[0].Seq - b.keep
	old := int64(-1)
	for _, d := range docs {
		if d.Base > 0 && !d.At.IsZero() && !d.At.After(now.Add(-b.spare)) {
			old = max(old, d.Base+1)
		}
	}
	below = min(below, old)
	if b.gcFloor != nil {
		below = min(below, b.gcFloor())
	}
	n := 0
	for _, d := range docs {
		if d.Seq < below && d.ID != docID(name, 0, true) {
			n++
		}
	}
	if n < int(b.keep) {
		return
	}
	filter := ofName(name)
	filter[0].Value = bson.D{{Key: "$gt", Value: name + "#0"}, {Key: "$lt", Value: name + "$"}}
	filter = append(filter, bson.E{Key: "seq", Value: bson.D{{Key: "$lt", Value: below}}})
	if _, err := b.locks.DeleteMany(ctx, filter); err != nil {
		b.opts.Log.Debug("could not delete old lock documents", "lock", name, "err", err)
	}
}

// first is the first of docs, or nil.
func first(docs []state) *state {
	if len(docs) == 0 {
		return nil
	}
	return &docs[0]
}
