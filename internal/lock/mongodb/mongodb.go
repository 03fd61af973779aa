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

// DefaultDatabase is the database used when the URL names none.
const DefaultDatabase = "withlock"

// Collection is the collection that holds every lock's documents.
const Collection = "locks"

// maxSelect bounds how long one operation looks for a usable server, so
// that an unreachable one fails the attempt with ErrUnavailable.
const maxSelect = 5 * time.Second

// attemptTimeout bounds one TryAcquire, Keep or Release, so that a server
// that stops answering in the middle of one (a black-holed network) is
// reported as unavailable instead of blocking its caller.
const attemptTimeout = 10 * time.Second

// keep is how many documents below the newest of a name are always kept,
// for people reading the chain.
const keep = 4

// spare is how long documents are kept after a later state was written
// (see the package doc): a client that knew the newest state less than
// spare/2 ago reads the states written since by _id and never finds a gap
// (current). It costs documents: a
// name keeps what it wrote in the last spare.
const spare = 2 * time.Second

// walk is how many states a poll reads one by one by _id before it reads
// the newest instead.
const walk = 4

// markTTL is how long an exclusive waiter's writer-waiting mark lasts
// unless refreshed; the waiter's attempts refresh it once less than half
// of it is left, so a waiter that attempts at least every markTTL/2 keeps it.
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
		// One attempt per operation: a backend never retries (lock.Backend),
		// and an insert's outcome is read back, never assumed.
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
