// Package mongodb is the mongodb:// and mongodb+srv:// backend: a lease
// document {_id: NAME, token, fence, holder, acquiredAt, expiresAt} in the
// collection "locks" of the URL's database (default "withlock").
//
// The document exists while the lock is held (or until someone clears it
// after it expired); a release deletes it. It is taken by inserting it, so
// the unique _id decides between contenders: the loser gets a duplicate-key
// error, which means "held". Expiry is judged by the server's clock: every
// write is preceded by reading the server's time (hello's localTime) and
// compares against that, never against this host's clock. Renewals and
// releases match the holder's token, so only the holder touches its lease.
//
// The fencing counter lives in the collection "fences", {_id: NAME, fence},
// bumped by the winner of each acquisition, so it survives the deletions.
//
// On MongoDB every step is a single-document atomic operation. On servers
// whose conditional updates and deletes are not atomic (FerretDB v1), two
// waiters that clear the same expired lease at the same moment can both win;
// a lock that is released normally is never affected.
package mongodb

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/writeconcern"
	"go.mongodb.org/mongo-driver/v2/x/mongo/driver/connstring"

	"github.com/withlock/withlock/internal/lock"
)

func init() {
	lock.Register("mongodb", open)
	lock.Register("mongodb+srv", open)
}

// DefaultDatabase is the database used when the URL names none.
const DefaultDatabase = "withlock"

// maxSelect bounds how long one operation looks for a usable server, so
// that an unreachable one is retried (and reported) by the wait loop.
const maxSelect = 5 * time.Second

type backend struct {
	uri    string
	dbName string
	addr   string // host list, for messages
	wSet   bool   // the URL chose a write concern
	opts   lock.Options
	client *mongo.Client
	locks  *mongo.Collection
	fences *mongo.Collection
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
	return &backend{uri: u.String(), dbName: db, addr: strings.Join(cs.Hosts, ","), wSet: cs.WNumberSet || cs.WString != "", opts: opts}, nil
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
		SetAppName(fmt.Sprintf("withlock %d@%s", b.opts.Holder.PID, b.opts.Holder.Host))
	if !b.wSet {
		// A lease that a failover could roll back is no lock.
		co.SetWriteConcern(writeconcern.Majority())
	}
	client, err := mongo.Connect(co)
	if err != nil {
		return lock.Errorf(lock.ErrUsage, "mongodb URL: %v", err)
	}
	b.client = client
	db := client.Database(b.dbName)
	b.locks, b.fences = db.Collection("locks"), db.Collection("fences")
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

// leaseDoc is the lock's document.
type leaseDoc struct {
	Name       string    `bson:"_id"`
	Token      string    `bson:"token"`
	Fence      int64     `bson:"fence"`
	Holder     holderDoc `bson:"holder"`
	AcquiredAt time.Time `bson:"acquiredAt"`
	ExpiresAt  time.Time `bson:"expiresAt"`
}

type holderDoc struct {
	Host    string   `bson:"host"`
	PID     int      `bson:"pid"`
	Command []string `bson:"command"`
}

// serverTime reads the server's clock, which alone judges expiry.
func (b *backend) serverTime(ctx context.Context) (time.Time, error) {
	var hello struct {
		LocalTime time.Time `bson:"localTime"`
	}
	if err := b.client.Database("admin").RunCommand(ctx, bson.D{{Key: "hello", Value: 1}}).Decode(&hello); err != nil {
		return time.Time{}, b.classify(err)
	}
	if hello.LocalTime.IsZero() {
		return time.Time{}, lock.Errorf(lock.ErrRefused, "mongodb at %s does not tell its time (no localTime in hello)", b.addr)
	}
	return hello.LocalTime, nil
}

func (b *backend) TryAcquire(ctx context.Context, name string) (lock.Lease, error) {
	if err := b.connect(); err != nil {
		return nil, err
	}
	// Two rounds at most: the second after clearing an expired lease.
	for range 2 {
		now, err := b.serverTime(ctx)
		if err != nil {
			return nil, err
		}
		h := b.opts.Holder
		doc := leaseDoc{
			Name: name, Token: lock.NewToken(),
			Holder:     holderDoc{Host: h.Host, PID: h.PID, Command: h.Command},
			AcquiredAt: now, ExpiresAt: now.Add(b.opts.TTL),
		}
		_, err = b.locks.InsertOne(ctx, doc)
		if err == nil {
			return b.fence(ctx, doc)
		}
		if !mongo.IsDuplicateKeyError(err) {
			return nil, b.classify(err)
		}
		var cur leaseDoc
		err = b.locks.FindOne(ctx, bson.D{{Key: "_id", Value: name}}).Decode(&cur)
		switch {
		case errors.Is(err, mongo.ErrNoDocuments):
			continue // released meanwhile
		case err != nil:
			return nil, b.classify(err)
		case cur.ExpiresAt.After(now):
			return nil, lock.HeldFor(cur.ExpiresAt.Sub(now))
		}
		// Expired: clear exactly that lease (same token, still expired),
		// then try again; whoever inserts first wins.
		_, err = b.locks.DeleteOne(ctx, bson.D{
			{Key: "_id", Value: name},
			{Key: "token", Value: cur.Token},
			{Key: "expiresAt", Value: bson.D{{Key: "$lte", Value: now}}},
		})
		if err != nil {
			return nil, b.classify(err)
		}
		b.opts.Log.Debug("cleared an expired lease", "lock", name, "holder", cur.Holder.Host, "pid", cur.Holder.PID)
	}
	return nil, lock.ErrHeld
}

// fence bumps the name's fencing counter for the lease just inserted and
// records it in the lease. Only the winner of the insert gets here.
func (b *backend) fence(ctx context.Context, doc leaseDoc) (lock.Lease, error) {
	l := &lease{b: b, name: doc.Name, token: doc.Token}
	var counter struct {
		Fence int64 `bson:"fence"`
	}
	err := b.fences.FindOneAndUpdate(ctx,
		bson.D{{Key: "_id", Value: doc.Name}},
		bson.D{{Key: "$inc", Value: bson.D{{Key: "fence", Value: int64(1)}}}},
		options.FindOneAndUpdate().SetUpsert(true).SetReturnDocument(options.After),
	).Decode(&counter)
	if err == nil {
		l.fence = counter.Fence
		_, err = b.locks.UpdateOne(ctx,
			bson.D{{Key: "_id", Value: doc.Name}, {Key: "token", Value: doc.Token}},
			bson.D{{Key: "$set", Value: bson.D{{Key: "fence", Value: counter.Fence}}}})
	}
	if err != nil {
		// We hold a lease without a fence: give it back rather than run
		// the command without one.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		l.Release(rctx)
		return nil, b.classify(err)
	}
	return l, nil
}

// classify sorts a driver error into lock's sentinels.
func (b *backend) classify(err error) error {
	var se mongo.ServerError
	msg := err.Error()
	switch {
	case errors.As(err, &se) && (se.HasErrorCode(18) || se.HasErrorCode(13)),
		strings.Contains(msg, "auth error"), strings.Contains(msg, "AuthenticationFailed"):
		return lock.Errorf(lock.ErrRefused, "mongodb at %s refused: %s", b.addr, msg)
	case mongo.IsNetworkError(err), mongo.IsTimeout(err), strings.Contains(msg, "server selection"):
		return lock.Unreachable("mongodb at "+b.addr, reason(msg))
	case errors.As(err, &se):
		return lock.Errorf(lock.ErrRefused, "mongodb at %s: %s", b.addr, msg)
	}
	return lock.Unreachable("mongodb at "+b.addr, reason(msg))
}

// reason picks the useful end of the driver's long server-selection
// message: "connection refused", not the whole topology description.
func reason(msg string) string {
	for _, r := range []string{"connection refused", "no such host", "connection reset"} {
		if strings.Contains(msg, r) {
			return r
		}
	}
	// Every kind of timeout is lock.Reason's "timed out", which
	// lock.Unreachable knows for what it is.
	if strings.Contains(msg, "i/o timeout") || strings.Contains(msg, "server selection") || strings.Contains(msg, "context deadline exceeded") {
		return "timed out"
	}
	return msg
}

type lease struct {
	b     *backend
	name  string
	token string
	fence int64
}

func (l *lease) Token() int64 { return l.fence }

// Keep renews the lease for another TTL from the server's now, if it is
// still ours and has not expired by the server's clock.
func (l *lease) Keep(ctx context.Context) error {
	now, err := l.b.serverTime(ctx)
	if err != nil {
		return err
	}
	return l.setExpiry(ctx, now, now.Add(l.b.opts.TTL), true)
}

func (l *lease) setExpiry(ctx context.Context, now, expires time.Time, mustBeLive bool) error {
	filter := bson.D{{Key: "_id", Value: l.name}, {Key: "token", Value: l.token}}
	if mustBeLive {
		filter = append(filter, bson.E{Key: "expiresAt", Value: bson.D{{Key: "$gt", Value: now}}})
	}
	res, err := l.b.locks.UpdateOne(ctx, filter, bson.D{{Key: "$set", Value: bson.D{{Key: "expiresAt", Value: expires}}}})
	if err != nil {
		return l.b.classify(err)
	}
	if res.MatchedCount == 0 {
		return lock.Errorf(lock.ErrLost, "the lease document %q in %s.locks expired, was deleted or was taken by another holder", l.name, l.b.dbName)
	}
	return nil
}

func (l *lease) Release(ctx context.Context) error {
	res, err := l.b.locks.DeleteOne(ctx, bson.D{{Key: "_id", Value: l.name}, {Key: "token", Value: l.token}})
	if err != nil {
		return l.b.classify(err)
	}
	if res.DeletedCount == 0 {
		return errors.New("mongodb: the lease was no longer ours at release")
	}
	return nil
}

// ReleaseAt lets the lease run out at until (as the time left, counted by
// the server's clock) instead of deleting it now.
func (l *lease) ReleaseAt(ctx context.Context, until time.Time) error {
	left := time.Until(until)
	if left < time.Millisecond {
		return l.Release(ctx)
	}
	now, err := l.b.serverTime(ctx)
	if err != nil {
		return err
	}
	return l.setExpiry(ctx, now, now.Add(left), false)
}
