// Package mongodb is the mongodb:// and mongodb+srv:// backend. A lock is a
// chain of immutable documents in the collection "locks" of the URL's database
// (default "withlock"), one document per change of the lock's state, each
// written only by inserting it under the next sequence number:
//
//	{_id: "NAME#<seq>", name, seq, op, at, holders: [{id, token, host, pid,
//	  command, acquiredAt, expiresAt}]}
//
// The document of NAME with the highest seq is the lock's state: holders is
// empty when NAME is free. Every change is decided on a state n and written
// by inserting state n+1: acquire (n is free, or its holder's lease has run
// out by the server's clock), renew and release (n lists our holder id).
// Two clients that decided on the same state race for the same _id; exactly
// one insert succeeds, the other gets a duplicate-key error, reads the state
// that won and decides again (a bounded loop inside one attempt: each lost
// race means that someone else's write landed).
//
// # Why this is atomic on FerretDB v1 as on MongoDB
//
// FerretDB v1 runs a conditional update or delete as "read the matching
// documents, then write each back by _id": the condition is not checked
// again when the write lands, so two clients can both act on the same
// version of a document. Only an insert is atomic there: SQLite's unique
// index on _id lets exactly one insert of an _id succeed. This backend never
// updates a document, and deletes only documents that nobody decides on any
// more (below). Every decision to change the lock is a claim on one _id.
// So a renewal and a takeover cannot both win: both decided on state n and
// both need "NAME#n+1". (An updated lease document cannot give this: its
// renewal, filtered on "expiresAt > now" with a now read a round trip
// earlier, can land after another client took the expired lease over.)
//
// # Expiry
//
// Expiry is judged by the server's clock only: an attempt reads it from
// hello's localTime (whole milliseconds). A holder writes expiresAt = that
// time + ttl, rounded down to the millisecond, and that time is later than
// when its caller (lock.Acquire, lock.Held) sent the attempt, from which the
// caller stops the command within ttl on its own clock. Another client takes
// over only once the server's time it read is after expiresAt, strictly,
// which with millisecond times means later than the holder's send time +
// ttl. A renewal needs no "still live" condition: if it is written right
// after a state that lists us, nobody took the lock over in between. One
// TryAcquire is bounded by TTL-Grace, so that it never hands its caller a
// lease whose time is already up.
//
// # Deleting old documents, and the check after each write
//
// One write in keep deletes the documents of its name more than keep below
// it, by name and seq: fields that never change, so a delete can only remove
// documents that nobody writes any more. But a deleted _id can be inserted
// again: a client that decided on state n and stalled (or whose insert sat
// in a network buffer) while the chain moved on by more than keep can insert
// "NAME#n+1" after it was deleted, on a state long gone. Such an insert is
// never the newest document, so it misleads no reader; only its writer could
// believe in it. Hence an acquisition or a renewal counts only if the newest
// state, read after its insert, is at most keep above it and lists the
// writer with the expiry it wrote. A renewal also checks that the state it
// followed is still below it: if the documents were deleted (an operator,
// a dropped collection), its insert began a chain of its own, and the lock
// is lost.
//
// # Fencing tokens
//
// WITHLOCK_TOKEN is the seq of the document that recorded the acquisition, so
// it grows with every acquisition (and with every other change). The first
// document of a name, when it has none (new, or the collection was dropped),
// is "NAME#0" with seq = the server's time in microseconds; the later ones
// count up from there. Tokens therefore keep growing across a drop as long as
// the server's clock does not go back and the name changes state less than
// once a microsecond on average. "NAME#0" is the same _id for every first
// acquisition, so that they race for it, and it is never deleted, so that a
// stale first acquisition cannot land later.
//
// # What it costs
//
// Round trips: a poll of a held lock 2 (the newest state, the server's
// time); an acquisition 4 (those, the insert, the check); a renewal 3 (the
// server's time, the insert, the check: a holder writes after its own last
// state without reading first); a release 1. One write in keep also deletes
// old documents. On MongoDB "the newest state of NAME" is a range of the _id
// index. FerretDB v1 hands only a filter on _id alone to SQLite; any other
// query reads and decodes the whole collection (about 0.2ms a document on a
// busy test machine), which the deletions keep to at most 2·keep+2
// documents per name. A poll could read by _id alone ("NAME#n+1", the state
// after the last one seen) and the server's time only when a takeover is
// possible; but a waiter that walks the chain one state per poll falls
// behind a burst of changes, and deletions can then leave it a gap to wait
// on. That needs deletions that spare recent documents first.
package mongodb

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/readpref"
	"go.mongodb.org/mongo-driver/v2/mongo/writeconcern"
	"go.mongodb.org/mongo-driver/v2/x/mongo/driver/auth"
	"go.mongodb.org/mongo-driver/v2/x/mongo/driver/connstring"

	"github.com/withlock/withlock/internal/lock"
)

func init() {
	lock.Register("mongodb", open)
	lock.Register("mongodb+srv", open)
}

// DefaultDatabase is the database used when the URL names none.
const DefaultDatabase = "withlock"

// Collection is the collection that holds every lock's documents.
const Collection = "locks"

// maxSelect bounds how long one operation looks for a usable server, so
// that an unreachable one is retried (and reported) by the wait loop.
const maxSelect = 5 * time.Second

// attemptTimeout bounds one TryAcquire, Keep or Release, so that a server
// that stops answering in the middle of one (a black-holed network) is
// reported as unavailable instead of hanging the wait loop.
const attemptTimeout = 10 * time.Second

// keep is how far below the newest document of a name documents are kept.
// It is part of the protocol: the check after each write relies on every
// client deleting only documents more than keep below its own, so it may
// grow in a later version but never shrink.
const keep = 4

// rounds bounds the read-decide-insert loop of one attempt. Each round after
// the first follows someone else's successful write.
const rounds = 4

// Ops, recorded in each document for people and tests reading the chain.
const (
	opAcquire = "acquire" // the lock was free
	opTake    = "take"    // the holder's lease had run out
	opRenew   = "renew"
	opRelease = "release"
	opLinger  = "linger" // released, but held until a given time (--hold-at-least)
)

type backend struct {
	uri    string
	dbName string
	addr   string // host list, for messages
	wSet   bool   // the URL chose a write concern
	opts   lock.Options
	client *mongo.Client
	locks  *mongo.Collection
	keep   int64 // keep, except in tests

	// attempt is the holder id under which TryAcquire tries to take name.
	// It stays the same until an attempt succeeds, so that an insert whose
	// answer was lost (it may have taken the lock) is recognised as ours by
	// the next attempt instead of blocking it until the lease runs out.
	attempt struct{ name, id string }

	// gcFloor, if set (by tests), bounds the documents deleted: none at or
	// above the seq it returns.
	gcFloor func() int64
}

func open(u *url.URL, opts lock.Options) (lock.Backend, error) {
	if opts.Mode != lock.Exclusive {
		return nil, lock.Errorf(lock.ErrUsage, "%s locks are not supported by the mongodb backend yet", opts.Mode)
	}
	cs, err := connstring.Parse(u.String())
	if err != nil {
		return nil, lock.Errorf(lock.ErrUsage, "mongodb URL: %v", err)
	}
	db := cs.Database
	if db == "" {
		db = DefaultDatabase
	}
	return &backend{uri: u.String(), dbName: db, addr: strings.Join(cs.Hosts, ","), wSet: cs.WNumberSet || cs.WString != "", opts: opts, keep: keep}, nil
}

// connect creates the client on first use; the driver then keeps its
// connections up by itself.
func (b *backend) connect() error {
	if b.client != nil {
		return nil
	}
	co := options.Client().ApplyURI(b.uri).
		SetServerSelectionTimeout(min(maxSelect, b.opts.ConnectTimeout)).
		SetConnectTimeout(min(maxSelect, b.opts.ConnectTimeout)).
		SetAppName(fmt.Sprintf("withlock %d@%s", b.opts.Holder.PID, b.opts.Holder.Host)).
		// One attempt per operation: lock.Acquire and lock.Held decide when
		// to try again, and an insert's outcome is read back, never assumed.
		SetRetryWrites(false).
		SetRetryReads(false).
		// The newest document must come from the server that takes the
		// writes; a secondary's may be old.
		SetReadPreference(readpref.Primary())
	if !b.wSet {
		// A lease that a failover could roll back is no lock.
		co.SetWriteConcern(writeconcern.Majority())
	}
	client, err := mongo.Connect(co)
	if err != nil {
		return lock.Errorf(lock.ErrUsage, "mongodb URL: %v", err)
	}
	b.client = client
	b.locks = client.Database(b.dbName).Collection(Collection)
	return nil
}

func (b *backend) Close() error {
	if b.client == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	return b.client.Disconnect(ctx)
}

// state is one document of a name's chain. Documents are never changed.
type state struct {
	ID      string    `bson:"_id"`
	Name    string    `bson:"name"`
	Seq     int64     `bson:"seq"`
	Op      string    `bson:"op"`
	At      time.Time `bson:"at,omitempty"` // the server's time the writer read, if it read one
	Holders []holder  `bson:"holders"`
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

// docID is the _id of name's state seq. The first state of a chain is
// always "NAME#0", whatever its seq. The seq part has no "#", so the name is
// everything before the last "#" and no two (name, seq) share an _id.
func docID(name string, seq int64, first bool) string {
	if first {
		return name + "#0"
	}
	return name + "#" + strconv.FormatInt(seq, 10)
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

// live returns the holder whose lease has not run out at the server's time
// now, or nil. A lease runs out only once now is after expiresAt.
func (s *state) live(now time.Time) *holder {
	if s == nil {
		return nil
	}
	for i := range s.Holders {
		if !now.After(s.Holders[i].ExpiresAt) {
			return &s.Holders[i]
		}
	}
	return nil
}

// next returns the state that follows s (nil: the chain is empty), written
// at the server's time at (zero: not read) with holders.
func (s *state) next(name, op string, at time.Time, holders []holder) state {
	n := state{Name: name, Op: op, At: at, Holders: holders}
	if s == nil {
		n.Seq = at.UnixMicro()
		n.ID = docID(name, n.Seq, true)
	} else {
		n.Seq = s.Seq + 1
		n.ID = docID(name, n.Seq, false)
	}
	if n.Holders == nil {
		n.Holders = []holder{} // an empty array, not null, for people reading it
	}
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

// with returns s's holders with id's entry replaced by h (or h added), and
// without those whose lease ran out before now.
func (s *state) with(id string, h holder, now time.Time) []holder {
	hs := []holder{h}
	if s != nil {
		for _, o := range s.Holders {
			if o.ID != id && !now.After(o.ExpiresAt) {
				hs = append(hs, o)
			}
		}
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

// newest reads name's newest k states, newest first. On FerretDB v1 this
// reads the whole collection (see the package doc).
func (b *backend) newest(ctx context.Context, name string, k int64) ([]state, error) {
	cur, err := b.locks.Find(ctx, ofName(name), options.Find().SetSort(bson.D{{Key: "seq", Value: -1}}).SetLimit(k))
	if err != nil {
		return nil, b.classify(ctx, err)
	}
	var ss []state
	if err := cur.All(ctx, &ss); err != nil {
		return nil, b.classify(ctx, err)
	}
	return ss, nil
}

// newest1 is the newest state of name, or nil.
func (b *backend) newest1(ctx context.Context, name string) (*state, error) {
	ss, err := b.newest(ctx, name, 1)
	if err != nil || len(ss) == 0 {
		return nil, err
	}
	return &ss[0], nil
}

// serverTime reads the server's clock, which alone judges expiry.
func (b *backend) serverTime(ctx context.Context) (time.Time, error) {
	var hello struct {
		LocalTime time.Time `bson:"localTime"`
	}
	if err := b.client.Database("admin").RunCommand(ctx, bson.D{{Key: "hello", Value: 1}}).Decode(&hello); err != nil {
		return time.Time{}, b.classify(ctx, err)
	}
	if hello.LocalTime.IsZero() {
		return time.Time{}, lock.Errorf(lock.ErrRefused, "mongodb at %s does not tell its time (no localTime in hello)", b.addr)
	}
	return hello.LocalTime, nil
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

// counts reports whether n, just inserted, gives holder id the lease ending
// at expires, judged by top, the newest state read after the insert: not a
// stale insert (at most keep below top, see the package doc) and top lists
// id with that expiry.
func (b *backend) counts(n, top *state, id string, expires time.Time) bool {
	if top == nil || top.Seq > n.Seq+b.keep {
		return false
	}
	h := top.holder(id)
	return h != nil && !h.ExpiresAt.Before(expires)
}

// collect deletes, once every keep states, the documents of n's name more
// than keep below n, except the first ("NAME#0", so that a stale first
// acquisition cannot be inserted again). A failure only leaves them for the
// next time.
func (b *backend) collect(ctx context.Context, n *state) {
	if n.Seq%b.keep != 0 {
		return
	}
	filter := ofName(n.Name)
	filter[0].Value = bson.D{{Key: "$gt", Value: n.Name + "#0"}, {Key: "$lt", Value: n.Name + "$"}}
	below := n.Seq - b.keep
	if b.gcFloor != nil {
		below = min(below, b.gcFloor())
	}
	filter = append(filter, bson.E{Key: "seq", Value: bson.D{{Key: "$lt", Value: below}}})
	if _, err := b.locks.DeleteMany(ctx, filter); err != nil {
		b.opts.Log.Debug("could not delete old lock documents", "lock", n.Name, "err", err)
	}
}

func (b *backend) TryAcquire(ctx context.Context, name string) (lock.Lease, error) {
	if err := b.connect(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, b.acquireTimeout())
	defer cancel()
	if b.attempt.name != name || b.attempt.id == "" {
		b.attempt.name, b.attempt.id = name, lock.NewToken()
	}
	id := b.attempt.id
	// One reading of the server's clock serves every round: it is later
	// than the caller's send time, which is all the expiry written needs,
	// and an older now only makes a lease look live longer.
	var now time.Time
	for range rounds {
		cur, err := b.newest1(ctx, name)
		if err != nil {
			return nil, err
		}
		if now.IsZero() {
			if now, err = b.serverTime(ctx); err != nil {
				return nil, err
			}
		}
		expires := msAfter(now, b.opts.TTL)
		var n state
		if own := cur.holder(id); own != nil {
			// An earlier attempt took the lock and its answer was lost:
			// renew that entry for this attempt's caller.
			h := *own
			h.ExpiresAt = expires
			n = cur.next(name, opRenew, now, cur.with(id, h, now))
		} else if h := cur.live(now); h != nil {
			return nil, lock.HeldFor(max(h.ExpiresAt.Sub(now), time.Millisecond))
		} else {
			op := opAcquire
			if cur != nil && len(cur.Holders) > 0 {
				op = opTake
			}
			n = cur.next(name, op, now, nil)
			hold := b.opts.Holder
			n.Holders = cur.with(id, holder{
				ID: id, Token: n.Seq,
				Host: hold.Host, PID: hold.PID, Command: hold.Command,
				AcquiredAt: now, ExpiresAt: expires,
			}, now)
			if op == opTake {
				b.opts.Log.Debug("taking over an expired lease", "lock", name, "holder", cur.Holders[0].Host, "pid", cur.Holders[0].PID)
			}
		}
		ok, err := b.insert(ctx, &n)
		if err != nil {
			return nil, err
		}
		if !ok {
			continue // someone else's write landed first: read it
		}
		top, err := b.newest1(ctx, name)
		if err != nil {
			return nil, err
		}
		if b.counts(&n, top, id, expires) {
			b.collect(ctx, &n)
			b.attempt.id = ""
			return &lease{b: b, name: name, id: id, token: n.holder(id).Token, last: n}, nil
		}
		b.opts.Log.Debug("our write did not count", "lock", name, "seq", n.Seq)
	}
	return nil, lock.ErrHeld
}

// acquireTimeout bounds one TryAcquire. Its caller counts the lease from
// when it sent the attempt and stops the command TTL-Grace after that; a
// lease that comes back later is of no use, and a command started on it
// would still run (until KILL) after the lease ran out. An acquisition that
// lands after the timeout is not lost: the next attempt finds our holder id
// in the newest state and renews it.
func (b *backend) acquireTimeout() time.Duration {
	return min(b.opts.TTL-b.opts.Grace, attemptTimeout)
}

// classify sorts a driver error into lock's sentinels: a refusal only when
// the server answered and said no for good; everything else, including a
// connection cut at any step (even during authentication), is unavailable.
// Once ctx has ended, a server's error is about that, not a refusal
// (FerretDB answers the time limit the driver derives from ctx with an
// InternalError).
func (b *backend) classify(ctx context.Context, err error) error {
	if ctx.Err() == nil && refused(err) {
		return lock.Errorf(lock.ErrRefused, "mongodb at %s refused: %s", b.addr, err)
	}
	return lock.Unreachable("mongodb at "+b.addr, reason(err))
}

// refused reports whether err is the server's answer that will not change
// by trying again: authentication failed, not authorized, a command or
// option it does not have.
func refused(err error) bool {
	// The driver's authentication errors hide their cause from errors.As
	// (no Unwrap); what failed inside decides.
	var ae *auth.Error
	for errors.As(err, &ae) {
		if ae.Inner() == nil {
			return true
		}
		err = ae.Inner()
	}
	if mongo.IsNetworkError(err) || mongo.IsTimeout(err) {
		return false
	}
	var se mongo.ServerError
	if errors.As(err, &se) {
		return !transient(se)
	}
	msg := err.Error()
	// A server selection error carries the server's last error as text only.
	return strings.Contains(msg, "AuthenticationFailed") || strings.Contains(msg, "(Unauthorized)")
}

// transientCodes are server error codes that mean "not now": a primary
// stepping down or shutting down, a write concern or time limit not met, a
// network error seen by the server.
var transientCodes = []int{
	6, 7, 89, 9001, // HostUnreachable, HostNotFound, NetworkTimeout, SocketException
	91, 11600, 11602, // ShutdownInProgress, InterruptedAtShutdown, InterruptedDueToReplStateChange
	189, 10107, 13435, 13436, // PrimarySteppedDown, NotWritablePrimary, NotPrimaryNoSecondaryOk, NotPrimaryOrSecondary
	50, 64, 262, 11601, // MaxTimeMSExpired, WriteConcernFailed, ExceededTimeLimit, Interrupted
	24, 46, 112, 133, // LockTimeout, LockBusy, WriteConflict, FailedToSatisfyReadPreference
	1, // InternalError: FerretDB's answer to many passing troubles (a busy SQLite, a time limit)
}

func transient(se mongo.ServerError) bool {
	for _, l := range []string{"NetworkError", "RetryableWriteError", "TransientTransactionError", "SystemOverloadedError", "RetryableError"} {
		if se.HasErrorLabel(l) {
			return true
		}
	}
	for _, c := range transientCodes {
		if se.HasErrorCode(c) {
			return true
		}
	}
	return false
}

// reason picks the useful end of the driver's long messages: "connection
// refused", not the whole topology description.
func reason(err error) string {
	msg := err.Error()
	for _, r := range []string{"connection refused", "no such host", "connection reset", "broken pipe"} {
		if strings.Contains(msg, r) {
			return r
		}
	}
	switch {
	case strings.Contains(msg, "i/o timeout") || strings.Contains(msg, "server selection") ||
		strings.Contains(msg, "MaxTimeMS") || mongo.IsTimeout(err):
		return "timed out" // lock.Reason's word, which lock.Unreachable knows
	case strings.Contains(msg, "EOF"):
		return "connection closed"
	}
	return msg
}

type lease struct {
	b     *backend
	name  string
	id    string // our holder id
	token int64
	last  state // the newest state we wrote and saw count
}

func (l *lease) Token() int64 { return l.token }

// lost is the loss error for newest state top, which does not list us.
func (l *lease) lost(top *state) error {
	switch {
	case top == nil:
		return lock.Errorf(lock.ErrLost, "the lock %q has no documents in %s.%s any more (deleted or dropped)", l.name, l.b.dbName, Collection)
	case len(top.Holders) > 0:
		o := top.Holders[0]
		return lock.Errorf(lock.ErrLost, "the lease ran out and %s (pid %d) took the lock over", o.Host, o.PID)
	}
	return lock.Errorf(lock.ErrLost, "the lock was released by someone else (%s)", top.Op)
}

// Keep renews the lease for another TTL from the server's now. It writes
// the state after the last one it wrote without reading first: if that
// _id is taken, someone wrote after us and a read says whether we still
// hold. Our entry need not be live: if nobody wrote a state after ours,
// nobody took the lock over.
func (l *lease) Keep(ctx context.Context) error {
	return l.extend(ctx, opRenew, l.b.opts.TTL)
}

// extend writes a state in which our lease ends ttl after the server's now,
// and reads the newest two states back: it counts if they are that state
// and the one it follows (else the documents were deleted under us, and the
// insert started a chain of its own).
func (l *lease) extend(ctx context.Context, op string, ttl time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, attemptTimeout)
	defer cancel()
	var now time.Time
	for range rounds {
		var err error
		if now.IsZero() {
			if now, err = l.b.serverTime(ctx); err != nil {
				return err
			}
		}
		h := *l.last.holder(l.id)
		h.ExpiresAt = msAfter(now, ttl)
		n := l.last.next(l.name, op, now, l.last.with(l.id, h, now))
		ok, err := l.b.insert(ctx, &n)
		if err != nil {
			return err
		}
		if !ok {
			if err := l.follow(ctx); err != nil {
				return err
			}
			continue
		}
		top, err := l.b.newest(ctx, l.name, 2)
		if err != nil {
			return err
		}
		switch {
		case len(top) == 2 && l.b.counts(&n, &top[0], l.id, h.ExpiresAt) && top[0].Seq == n.Seq &&
			top[1].Seq == l.last.Seq && top[1].holder(l.id) != nil:
			l.last = n
			l.b.collect(ctx, &n)
			return nil
		case len(top) > 0 && top[0].Seq == n.Seq:
			// Our insert began a chain of its own: end it, so that the
			// next client need not wait for this lease to run out.
			free := n.next(l.name, opRelease, time.Time{}, n.without(l.id))
			l.b.insert(ctx, &free)
			return lock.Errorf(lock.ErrLost, "the documents of the lock %q in %s.%s were deleted (or dropped)", l.name, l.b.dbName, Collection)
		case len(top) == 0:
			return l.lost(nil)
		}
		return l.lost(&top[0])
	}
	return lock.Errorf(lock.ErrUnavailable, "mongodb at %s: %d writes to the lock %q in a row lost the race to others", l.b.addr, rounds, l.name)
}

// follow reads the newest state after our write lost the race for its _id:
// an error wrapping ErrLost unless it still lists us (our own earlier write,
// whose answer was lost), which then becomes the state to write after.
func (l *lease) follow(ctx context.Context) error {
	top, err := l.b.newest1(ctx, l.name)
	if err != nil {
		return err
	}
	if top.holder(l.id) == nil {
		return l.lost(top)
	}
	l.last = *top
	return nil
}

// Release writes a state without our entry after the last one we wrote. No
// check follows: a stale insert means that the lock was not ours anyway,
// and it misleads no reader.
func (l *lease) Release(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, attemptTimeout)
	defer cancel()
	for range rounds {
		n := l.last.next(l.name, opRelease, time.Time{}, l.last.without(l.id))
		ok, err := l.b.insert(ctx, &n)
		if err != nil {
			return err
		}
		if ok {
			l.b.collect(ctx, &n)
			return nil
		}
		if err := l.follow(ctx); err != nil {
			if errors.Is(err, lock.ErrLost) {
				return fmt.Errorf("mongodb: the lock was no longer ours at release: %w", err)
			}
			return err
		}
	}
	return lock.Errorf(lock.ErrUnavailable, "mongodb at %s: %d writes to the lock %q in a row lost the race to others", l.b.addr, rounds, l.name)
}

// ReleaseAt lets the lease run out at until (as the time left, counted by
// the server's clock) instead of releasing it now. The time left is rounded
// up to the millisecond: the server's time read is rounded down, and the
// lock must not end before until.
func (l *lease) ReleaseAt(ctx context.Context, until time.Time) error {
	left := time.Until(until)
	if left < time.Millisecond {
		return l.Release(ctx)
	}
	return l.extend(ctx, opLinger, left.Truncate(time.Millisecond)+time.Millisecond)
}
