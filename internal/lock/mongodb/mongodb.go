// Package mongodb is the mongodb:// and mongodb+srv:// backend. A lock is a
// chain of immutable documents in the collection "locks" of the URL's database
// (default "withlock"), one document per change of the lock's state, each
// written only by inserting it under the next sequence number:
//
//	{_id: "NAME#<seq>", name, seq, op, at, mode, max, holders: [{id, token,
//	  host, pid, command, acquiredAt, expiresAt}], writer: {id, host, pid, until}}
//
// The document of NAME with the highest seq is the lock's state: holders is
// empty when NAME is free; mode says how they hold it (exclusive, shared,
// semaphore; absent means exclusive) and max is a semaphore's N. Every
// change is decided on a state n and written by inserting state n+1:
// acquire (n has room for us: no live holder for an exclusive lock, only
// shared ones for a shared lock, fewer than N of the same N for a
// semaphore; a holder is live until its lease runs out by the server's
// clock), renew and release (n lists our holder id). Two clients that
// decided on the same state race for the same _id; exactly one insert
// succeeds, the other gets a duplicate-key error, reads the state that won
// and decides again (a bounded loop inside one attempt: each lost race
// means that someone else's write landed).
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
// Shared and semaphore holders are entries of one list, each with its own
// lease: a writer drops the entries whose lease has run out, so a crashed
// holder frees only its own place.
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
// # The check after each write
//
// An acquisition or a renewal counts only if the newest state, read after
// its insert, lists the writer with the expiry it wrote. Old documents are
// deleted (below), and a deleted _id can be inserted again: a client that
// decided on state n and stalled (or whose insert sat in a network buffer)
// while the chain moved on can insert "NAME#n+1" after it was deleted, on a
// state long gone. Such an insert is never the newest document, so nobody
// decides on it, and no newer state can copy its entry: only its writer
// could believe in it, and the check stops that. A renewal whose insert
// did not count but whose holder the newest state still lists (its insert
// was such a late one, or lost a race) writes again after the newest. A
// renewal also checks that its insert is not the oldest document of the
// name: if the documents were deleted (an operator, a dropped collection),
// its insert began a chain of its own, and the lock is lost.
//
// # Deleting old documents, and what a poll reads
//
// A write whose check read the whole chain deletes the documents of its
// name that are more than keep below the newest and older than spare: each
// is below a state whose writer read the server's time, after the state it
// followed had been written, more than spare ago. Until then, every state
// written after one that a client read as the newest is still there. So a
// waiting client, which knows the newest state as of its last poll, polls
// by reading the state after it by _id (FerretDB v1's one indexed query),
// usually finding nothing: one operation. It reads the newest state instead
// when that state is more than spare/2 old or the chain moved on by more
// than walk, and the server's time only when the state it knows could let
// it in by the server's clock as last read (upper) and running on since:
// a lock held for sure is reported with the time its holders' leases have
// left, which is when Client.Acquire comes back at the latest.
//
// # Fairness
//
// An exclusive waiter kept out by shared or semaphore holders writes a
// writer-waiting mark (writer: its id, until the server's time + markTTL)
// and refreshes it while it waits; every writer copies a live mark on. New
// shared and semaphore holders do not join while another's mark is live;
// the holders' renewals are not affected, so the lock drains and the
// exclusive waiter takes it, dropping its mark. A mark whose waiter is gone
// runs out after markTTL; one that gave up waiting (a timeout, a signal)
// takes it back in Close. With several exclusive waiters the writers come
// first: shared waiters wait while any writer waits.
//
// # Fencing tokens
//
// WITHLOCK_TOKEN is the seq of the document that recorded the acquisition, so
// it grows with every acquisition, in every mode (and with every other
// change). The first document of a name, when it has none (new, or the
// collection was dropped), is "NAME#0" with seq = the server's time in
// microseconds; the later ones count up from there. Tokens therefore keep
// growing across a drop as long as the server's clock does not go back and
// the name changes state less than once a microsecond on average. "NAME#0"
// is the same _id for every first acquisition, so that they race for it, and
// it is never deleted, so that a stale first acquisition cannot land later.
//
// # What it costs
//
// Round trips: a poll of a held lock 1 (the state after the newest known,
// by _id; one more for each state written since); an acquisition 3 more
// (the server's time, the insert, the check); an exclusive holder's
// renewal 3 (the server's time, the insert, the check: it writes after its
// own last state without reading first); a shared or semaphore holder's
// renewal 4 (it reads the newest state first, since the others write too);
// a release 1 (shared: 2). Each lost race adds a read of the newest state
// and of the server's time. On MongoDB "the newest state of NAME" is a
// range of the _id index. FerretDB v1 hands only a filter on _id alone to
// SQLite; any other query reads and decodes the whole collection (about
// 0.2ms a document on a busy test machine), which the deletions keep to
// keep+1 documents per name and those written in the last spare.
package mongodb

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/readpref"
	"go.mongodb.org/mongo-driver/v2/mongo/writeconcern"
	"go.mongodb.org/mongo-driver/v2/x/mongo/driver/auth"
	"go.mongodb.org/mongo-driver/v2/x/mongo/driver/connstring"
	"go.mongodb.org/mongo-driver/v2/x/mongo/driver/topology"

	"github.com/withlock/withlock/internal/lock"
)

func init() {
	lock.Register("mongodb", open)
	lock.Register("mongodb+srv", open)
}

var (
	_ lock.Backend  = (*backend)(nil)
	_ lock.Expiring = (*lease)(nil)
)

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

// keep is how many documents below the newest of a name are always kept,
// for people reading the chain.
const keep = 4

// spare is how long documents are kept after a later state was written
// (see the package doc): longer than Client.Acquire's slowest poll, so
// that a waiter reading by _id never finds a gap. It costs documents: a
// name keeps what it wrote in the last spare.
const spare = 2 * time.Second

// walk is how many states a poll reads one by one by _id before it reads
// the newest instead.
const walk = 4

// markTTL is how long an exclusive waiter's writer-waiting mark lasts
// unless refreshed; it is refreshed once less than half of it is left,
// which a waiter polling at Client.Acquire's pace always sees in time.
const markTTL = 5 * time.Second

// rounds bounds the read-decide-insert loop of one attempt, together with
// the number of holders in the state it began with: each round after the
// first follows someone else's successful write, and every other holder
// renews once in a while, so that a renewal is not starved by its peers'.
const rounds = 4

// Ops, recorded in each document for people and tests reading the chain.
const (
	opAcquire = "acquire" // a holder joined (the lock was free, or shared)
	opTake    = "take"    // a holder joined, dropping holders whose lease had run out
	opRenew   = "renew"
	opRelease = "release"
	opLinger  = "linger" // released, but held until a given time (--hold-at-least)
	opMark    = "mark"   // an exclusive waiter marked itself waiting
	opUnmark  = "unmark" // the waiter gave up and took its mark back
	opBreak   = "break"  // withlock release --force
)

type backend struct {
	uri    string
	dbName string
	addr   string // host list, for messages
	wSet   bool   // the URL chose a write concern: w, below
	w      string // the URL's w (a number or a tag, "majority"), for withlock check
	opts   lock.Options
	client *mongo.Client
	locks  *mongo.Collection
	keep   int64         // keep, except in tests
	spare  time.Duration // spare, except in tests

	// attempt is the holder id under which TryAcquire tries to take name.
	// It stays the same until an attempt succeeds, so that an insert whose
	// answer was lost (it may have taken the lock) is recognised as ours by
	// the next attempt instead of blocking it until the lease runs out. It
	// is also the id of our writer-waiting mark.
	attempt struct{ name, id string }
	// mark is the name and id of the writer-waiting mark we wrote last,
	// until an acquisition drops it.
	mark struct{ name, id string }
	// seen is the newest state of name that TryAcquire knows of, and when
	// the read that showed it to be the newest was sent (see current).
	seen struct {
		name string
		cur  *state
		sent time.Time
	}
	// clock is the last reading of the server's clock, and when it was
	// sent (see upper).
	clock struct{ server, sent time.Time }

	// gcFloor, if set (by tests), bounds the documents deleted: none at or
	// above the seq it returns.
	gcFloor func() int64
}

func open(u *url.URL, opts lock.Options) (lock.Backend, error) {
	cs, err := connstring.Parse(u.String())
	if err != nil {
		return nil, lock.Errorf(lock.ErrUsage, "mongodb URL: %v", err)
	}
	db := cs.Database
	if db == "" {
		db = DefaultDatabase
	}
	w := cs.WString
	if cs.WNumberSet {
		w = strconv.Itoa(cs.WNumber)
	}
	return &backend{uri: u.String(), dbName: db, addr: strings.Join(cs.Hosts, ","), wSet: w != "", w: w, opts: opts, keep: keep, spare: spare}, nil
}

// quiet is a driver log sink that drops everything.
type quiet struct{}

func (quiet) Info(int, string, ...any)    {}
func (quiet) Error(error, string, ...any) {}

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
		SetReadPreference(readpref.Primary()).
		// The driver logs on stderr by itself when $MONGODB_LOG_ALL (or
		// another $MONGODB_LOG_*) is set; withlock's stderr is its own,
		// and what goes wrong reaches us as errors anyway.
		SetLoggerOptions(options.Logger().SetSink(quiet{}))
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

// Close takes back this client's writer-waiting mark, if it left one
// (a wait that ended without the lock: a timeout, a signal), so that shared
// holders need not wait for it to run out; then it disconnects. Closing
// again does nothing.
func (b *backend) Close() error {
	if b.client == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if b.mark.name != "" {
		b.unmark(ctx)
		b.mark.name = ""
	}
	client := b.client
	b.client, b.locks = nil, nil
	return client.Disconnect(ctx)
}

// unmark writes a state without this client's mark after the newest, if
// that has it. One try: the mark runs out by itself anyway.
func (b *backend) unmark(ctx context.Context) {
	name := b.mark.name
	for range rounds {
		cur, _, err := b.newest(ctx, name)
		if err != nil || cur == nil || cur.Writer == nil || cur.Writer.ID != b.mark.id {
			return
		}
		n := cur.after(name, opUnmark, time.Time{})
		n.holding(cur.Holders, cur.mode(), cur.Max)
		if ok, err := b.insert(ctx, &n); ok || err != nil {
			return
		}
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
	cur, err := b.current(ctx, name)
	if err != nil {
		return nil, err
	}
	// A lock held for sure by the server's clock as last read, and run on
	// since, is answered without reading that clock again.
	if u, ok := b.upper(); ok {
		v, until, err := b.decide(name, cur, id, u)
		if err != nil {
			return nil, err
		}
		if v == wait {
			return nil, lock.HeldFor(max(until.Sub(u), time.Millisecond))
		}
	}
	// One reading of the server's clock serves every round: it is later
	// than the caller's send time, which is all the expiry written needs,
	// and an older now only makes a lease look live longer. It is read
	// after cur, which makes cur's seq the base of what we write.
	now, err := b.serverTime(ctx)
	if err != nil {
		return nil, err
	}
	base := cur.seq()
	limit := rounds + cur.size()
	for round := 1; ; round++ {
		v, until, err := b.decide(name, cur, id, now)
		if err != nil {
			return nil, err
		}
		var n state
		switch v {
		case signal:
			if err := b.signal(ctx, name, cur, id, now, base); err != nil {
				return nil, err
			}
			fallthrough
		case wait:
			return nil, lock.HeldFor(max(until.Sub(now), time.Millisecond))
		case renew:
			// An earlier attempt took the lock and its answer was lost:
			// renew that entry for this attempt's caller.
			n = cur.renewed(name, opRenew, id, now, b.opts.TTL)
		case join:
			n = b.joined(name, cur, id, now)
			if n.Op == opTake {
				b.opts.Log.Debug("taking over expired leases", "lock", name, "holders", len(cur.Holders)-len(cur.live(now)))
			}
		}
		n.Base = base
		expires := n.holder(id).ExpiresAt
		ok, err := b.insert(ctx, &n)
		if err != nil {
			return nil, err
		}
		if ok {
			docs, sent, err := b.chain(ctx, name)
			if err != nil {
				return nil, err
			}
			top := first(docs)
			b.see(name, top, sent)
			if counts(top, id, expires) {
				b.collect(ctx, name, docs, now)
				b.attempt.id = ""
				b.mark.name = "" // dropped by our state (joined, renewed)
				return &lease{b: b, name: name, id: id, token: top.holder(id).Token, last: *top}, nil
			}
			b.opts.Log.Debug("our write did not count", "lock", name, "seq", n.Seq)
			cur = top
		} else if cur, err = b.advance(ctx, name, cur); err != nil {
			return nil, err // someone else's write landed first: decide on it
		}
		if round >= limit {
			return nil, lock.ErrHeld
		}
	}
}

// signal writes this client's writer-waiting mark after cur. Losing the
// race for the _id is no failure: the next poll decides again.
func (b *backend) signal(ctx context.Context, name string, cur *state, id string, now time.Time, base int64) error {
	n := b.marked(name, cur, id, now)
	n.Base = base
	sent := time.Now()
	ok, err := b.insert(ctx, &n)
	if err != nil {
		return err
	}
	if ok {
		b.opts.Log.Debug("marked an exclusive waiter", "lock", name, "until", n.Writer.Until)
		b.mark.name, b.mark.id = name, id
		b.see(name, &n, sent)
	}
	return nil
}

// first is the first of docs, or nil.
func first(docs []state) *state {
	if len(docs) == 0 {
		return nil
	}
	return &docs[0]
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
	if tlsErr := tlsRefusal(err); tlsErr != nil {
		return lock.Errorf(lock.ErrRefused, "mongodb at %s: %v", b.addr, tlsErr)
	}
	return lock.Unreachable("mongodb at "+b.addr, reason(err))
}

// tlsRefusal finds in a server selection error a server's TLS answer that
// trying again will not change: a certificate we do not trust (signed by
// an unknown CA, for another host name, expired) or a peer that does not
// speak TLS. The driver keeps it as the server's last error and reports the
// selection as timed out. A handshake that was cut or timed out is not one.
func tlsRefusal(err error) error {
	var sel topology.ServerSelectionError
	if !errors.As(err, &sel) {
		return nil
	}
	for _, s := range sel.Desc.Servers {
		if s.LastError != nil && lock.TLSRefusal(s.LastError) {
			return s.LastError
		}
	}
	return nil
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
	last  state // the newest state we know that lists us: we write after it
}

func (l *lease) Token() int64 { return l.token }

// Keep renews the lease for another TTL from the server's now. An
// exclusive holder writes the state after its last one without reading
// first: that is the newest unless the lock was taken from it. A shared or
// semaphore holder, whose peers write too, first reads the states written
// since by _id, as a poll does. If the _id is taken, it reads on from
// there and writes after the newest. Our entry need not be live: if nobody
// wrote a state without it, nobody took the lock over.
func (l *lease) Keep(ctx context.Context) error {
	return l.extend(ctx, opRenew, l.b.opts.TTL)
}

// extend writes a state in which our lease ends ttl after the server's now,
// and reads the chain back (see the package doc).
func (l *lease) extend(ctx context.Context, op string, ttl time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, attemptTimeout)
	defer cancel()
	if l.b.opts.Mode != lock.Exclusive {
		// The other holders write too: read what they wrote since our last
		// state rather than lose the race for its successor's _id (on
		// FerretDB, a failed insert waits for SQLite's write lock as a
		// successful one does).
		if err := l.catchUp(ctx); err != nil {
			return err
		}
	}
	// Read after the state we write after (see TryAcquire).
	now, err := l.b.serverTime(ctx)
	if err != nil {
		return err
	}
	base := l.last.Seq
	limit := rounds + len(l.last.Holders)
	for round := 1; ; round++ {
		n := l.last.renewed(l.name, op, l.id, now, ttl)
		n.Base = base
		expires := n.holder(l.id).ExpiresAt
		ok, err := l.b.insert(ctx, &n)
		if err != nil {
			return err
		}
		if !ok {
			if err := l.catchUp(ctx); err != nil {
				return err
			}
		} else {
			docs, _, err := l.b.chain(ctx, l.name)
			if err != nil {
				return err
			}
			top := first(docs)
			switch {
			case top == nil:
				return l.lost(nil)
			case counts(top, l.id, expires):
				if docs[len(docs)-1].Seq == n.Seq {
					// Our insert began a chain of its own: end it, so that
					// the next client need not wait for this lease to run
					// out.
					free := top.released(l.name, opRelease, l.id)
					l.b.insert(ctx, &free)
					return lock.Errorf(lock.ErrLost, "the documents of the lock %q in %s.%s were deleted (or dropped)", l.name, l.b.dbName, Collection)
				}
				l.last = *top
				l.b.collect(ctx, l.name, docs, now)
				return nil
			case top.holder(l.id) == nil:
				return l.lost(l.why(docs))
			}
			// Our insert landed on a deleted _id, below the newest state,
			// which still lists us: write after that one.
			l.last = *top
		}
		if round >= limit {
			return lock.Errorf(lock.ErrUnavailable, "mongodb at %s: %d writes to the lock %q in a row lost the race to others", l.b.addr, round, l.name)
		}
	}
}

// catchUp makes the newest state the one to write after, once our write
// lost the race for its _id: read by _id from our last state on (advance),
// if it still lists us (another holder's write, or our own earlier one
// whose answer was lost); else the whole chain says whether we are gone
// (follow).
func (l *lease) catchUp(ctx context.Context) error {
	s, err := l.b.advance(ctx, l.name, &l.last)
	if err != nil {
		return err
	}
	if s.holder(l.id) == nil {
		return l.follow(ctx)
	}
	l.last = *s
	return nil
}

// follow reads the chain: an error wrapping ErrLost unless the newest state
// still lists us, which then becomes the state to write after.
func (l *lease) follow(ctx context.Context) error {
	docs, _, err := l.b.chain(ctx, l.name)
	if err != nil {
		return err
	}
	top := first(docs)
	if top.holder(l.id) == nil {
		if top != nil {
			top = l.why(docs)
		}
		return l.lost(top)
	}
	l.last = *top
	return nil
}

// why is the state that dropped us: the first of docs (newest first) after
// our last state without our entry; the newest if none is left.
func (l *lease) why(docs []state) *state {
	for i := len(docs) - 1; i >= 0; i-- {
		if docs[i].Seq > l.last.Seq && docs[i].holder(l.id) == nil {
			return &docs[i]
		}
	}
	return &docs[0]
}

// lost is the loss error for state s, the one that does not list us.
func (l *lease) lost(s *state) error {
	switch {
	case s == nil:
		return lock.Errorf(lock.ErrLost, "the lock %q has no documents in %s.%s any more (deleted or dropped)", l.name, l.b.dbName, Collection)
	case s.Op == opBreak && s.By != nil:
		return lock.Errorf(lock.ErrLost, "the lock was broken by withlock release --force on %s (pid %d)", s.By.Host, s.By.PID)
	case len(s.Holders) > 0:
		o := s.Holders[len(s.Holders)-1]
		return lock.Errorf(lock.ErrLost, "the lease ran out and %s (pid %d) took the lock over", o.Host, o.PID)
	}
	return lock.Errorf(lock.ErrLost, "the lock was released by someone else (%s)", s.Op)
}

// Release writes a state without our entry after the newest one, found as
// Keep finds it. No check follows: a late insert means that the lock was
// not ours anyway, and it misleads no reader.
func (l *lease) Release(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, attemptTimeout)
	defer cancel()
	notOurs := func(err error) error {
		if errors.Is(err, lock.ErrLost) {
			return lock.Errorf(lock.ErrNotOurs, "mongodb: the lock was no longer ours at release: %w", err)
		}
		return err
	}
	if l.b.opts.Mode != lock.Exclusive {
		if err := l.catchUp(ctx); err != nil { // as Keep does
			return notOurs(err)
		}
	}
	limit := rounds + len(l.last.Holders)
	for round := 1; ; round++ {
		n := l.last.released(l.name, opRelease, l.id)
		ok, err := l.b.insert(ctx, &n)
		if err != nil || ok {
			return err
		}
		if err := l.catchUp(ctx); err != nil {
			return notOurs(err)
		}
		if round >= limit {
			return lock.Errorf(lock.ErrUnavailable, "mongodb at %s: %d writes to the lock %q in a row lost the race to others", l.b.addr, round, l.name)
		}
	}
}

// ReleaseAt lets the lease run out at until (as the time left, counted by
// the server's clock) instead of releasing it now. The time left is rounded
// up to the millisecond: the server's time read is rounded down, and the
// lock must not end before until.
func (l *lease) ReleaseAt(ctx context.Context, until time.Time) error {
	left := time.Until(until)
	return l.extend(ctx, opLinger, left.Truncate(time.Millisecond)+time.Millisecond)
}
