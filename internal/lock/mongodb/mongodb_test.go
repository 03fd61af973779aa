package mongodb_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/withlock/withlock/internal/lock"
	"github.com/withlock/withlock/internal/lock/locktest"
	"github.com/withlock/withlock/internal/lock/mongodb"
	"github.com/withlock/withlock/internal/testenv"
)

// locks returns the collection a backend on url uses.
func locks(t *testing.T, url string) *mongo.Collection {
	t.Helper()
	c, err := mongo.Connect(options.Client().ApplyURI(url))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Disconnect(context.Background()) })
	return c.Database(mongodb.DefaultDatabase).Collection(mongodb.Collection)
}

// doc is one document of a lock's chain, as the tests read it.
type doc struct {
	ID     string    `bson:"_id"`
	Name   string    `bson:"name"`
	Seq    int64     `bson:"seq"`
	Op     string    `bson:"op"`
	At     time.Time `bson:"at"`
	Mode   string    `bson:"mode"`
	Max    int       `bson:"max"`
	Writer *struct {
		ID    string    `bson:"id"`
		Until time.Time `bson:"until"`
	} `bson:"writer"`
	Holders []holderDoc `bson:"holders"`
}

// holderDoc is one holder's entry in a doc.
type holderDoc struct {
	ID         string    `bson:"id"`
	Token      int64     `bson:"token"`
	Host       string    `bson:"host"`
	PID        int       `bson:"pid"`
	Command    []string  `bson:"command"`
	AcquiredAt time.Time `bson:"acquiredAt"`
	ExpiresAt  time.Time `bson:"expiresAt"`
}

// chain returns every document of name, oldest first.
func chain(t *testing.T, c *mongo.Collection, name string) []doc {
	t.Helper()
	cur, err := c.Find(locktest.Context(t), bson.D{{Key: "name", Value: name}}, options.Find().SetSort(bson.D{{Key: "seq", Value: 1}}))
	if err != nil {
		t.Fatal(err)
	}
	var docs []doc
	if err := cur.All(locktest.Context(t), &docs); err != nil {
		t.Fatal(err)
	}
	return docs
}

func TestConformance(t *testing.T) {
	m := testenv.RequireMongo(t)
	locktest.Run(t, locktest.Config{
		Open: func(t *testing.T, opts lock.Options) *lock.Client { return locktest.Open(t, m.URL, opts) },
		Lease: &locktest.Lease{Break: func(t *testing.T, name string) {
			// As an operator who deletes the lock's documents would.
			res, err := locks(t, m.URL).DeleteMany(locktest.Context(t), bson.D{{Key: "name", Value: name}})
			if err != nil || res.DeletedCount == 0 {
				t.Fatalf("deleting the documents of %q: %d, %v", name, res.DeletedCount, err)
			}
		}},
		Modes: locktest.Modes{RecordsN: true},
	})
}

// The chain has the documented shape: _ids NAME#0 then NAME#seq, one
// document per change, times from the server's clock, the holder's details,
// and the fencing token is the seq of the acquiring document.
func TestDocuments(t *testing.T) {
	m := testenv.RequireMongo(t)
	const ttl = 10 * time.Second
	b := locktest.Open(t, m.URL, lock.Options{TTL: ttl, Holder: lock.Holder{Host: "h1", PID: 42, Command: []string{"migrate", "up"}}})
	name := locktest.Name(t) + "/a#b" // a "#" in the name is fine
	before := time.Now()
	l, err := b.TryAcquire(locktest.Context(t), name)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Keep(locktest.Context(t)); err != nil {
		t.Fatal(err)
	}
	if err := l.Release(locktest.Context(t)); err != nil {
		t.Fatal(err)
	}
	docs := chain(t, locks(t, m.URL), name)
	if len(docs) != 3 {
		t.Fatalf("after acquire, keep and release: %d documents, want 3: %+v", len(docs), docs)
	}
	acq, renew, rel := docs[0], docs[1], docs[2]
	if acq.ID != name+"#0" || acq.Op != "acquire" {
		t.Errorf("first document: _id %q op %q; want %q, acquire", acq.ID, acq.Op, name+"#0")
	}
	// The first seq is the server's time in microseconds (the server runs on
	// this machine, so its clock is ours).
	if s := time.UnixMicro(acq.Seq); s.Before(before.Add(-time.Second)) || s.After(time.Now().Add(time.Second)) {
		t.Errorf("first seq %d is %v; want the server's time in microseconds, about %v", acq.Seq, s, before)
	}
	for i, d := range docs {
		if want := acq.Seq + int64(i); d.Seq != want || i > 0 && d.ID != name+"#"+strconv.FormatInt(want, 10) || d.Name != name {
			t.Errorf("document %d: _id %q name %q seq %d; want seq %d", i, d.ID, d.Name, d.Seq, want)
		}
	}
	if renew.Op != "renew" || rel.Op != "release" || len(rel.Holders) != 0 {
		t.Errorf("ops %q, %q with holders %v; want renew, then release with none", renew.Op, rel.Op, rel.Holders)
	}
	if len(acq.Holders) != 1 || len(renew.Holders) != 1 {
		t.Fatalf("holders %v, %v; want one each", acq.Holders, renew.Holders)
	}
	h, hr := acq.Holders[0], renew.Holders[0]
	if h.Host != "h1" || h.PID != 42 || strings.Join(h.Command, " ") != "migrate up" || h.ID == "" {
		t.Errorf("holder %+v; want host h1, pid 42, command migrate up and an id", h)
	}
	if h.Token != acq.Seq || l.(lock.Expiring).Token() != acq.Seq || hr.Token != acq.Seq {
		t.Errorf("tokens: acquisition %d, renewal %d, Token() %d; want the acquiring seq %d", h.Token, hr.Token, l.(lock.Expiring).Token(), acq.Seq)
	}
	if !h.AcquiredAt.Equal(acq.At) || h.ExpiresAt.Sub(acq.At) != ttl {
		t.Errorf("acquiredAt %v, expiresAt %v, at %v; want acquiredAt = at and expiresAt = at + %v", h.AcquiredAt, h.ExpiresAt, acq.At, ttl)
	}
	if hr.ID != h.ID || !hr.AcquiredAt.Equal(h.AcquiredAt) || hr.ExpiresAt.Sub(renew.At) != ttl || renew.At.Before(acq.At) {
		t.Errorf("renewal %+v at %v; want the same holder with expiresAt = at + ttl", hr, renew.At)
	}

	// The next acquisition's token is the next seq.
	l2, err := b.TryAcquire(locktest.Context(t), name)
	if err != nil {
		t.Fatal(err)
	}
	if tok := l2.(lock.Expiring).Token(); tok != rel.Seq+1 {
		t.Errorf("second acquisition's token %d; want %d", tok, rel.Seq+1)
	}
	mustRelease(t, l2)
}

// --hold-at-least: ReleaseAt leaves the lease to run out then, by the
// server's clock.
func TestReleaseAt(t *testing.T) {
	m := testenv.RequireMongo(t)
	a, b := locktest.Open(t, m.URL, lock.Options{TTL: 10 * time.Second}), locktest.Open(t, m.URL, lock.Options{})
	name := locktest.Name(t)
	l, err := a.TryAcquire(locktest.Context(t), name)
	if err != nil {
		t.Fatal(err)
	}
	until := time.Now().Add(700 * time.Millisecond)
	if err := l.(lock.Expiring).ReleaseAt(locktest.Context(t), until); err != nil {
		t.Fatal(err)
	}
	docs := chain(t, locks(t, m.URL), name)
	last := docs[len(docs)-1]
	if last.Op != "linger" || len(last.Holders) != 1 {
		t.Fatalf("after ReleaseAt: %+v; want a linger document with the holder", last)
	}
	// Never earlier than until (but for the millisecond the server rounds
	// to); later by the time ReleaseAt took to read the server's clock.
	if d := last.Holders[0].ExpiresAt.Sub(until); d < -time.Millisecond || d > time.Second {
		t.Errorf("expiresAt %v; want %v, or a little later", last.Holders[0].ExpiresAt, until)
	}
	_, err = b.TryAcquire(locktest.Context(t), name)
	if !errors.Is(err, lock.ErrHeld) {
		t.Fatalf("TryAcquire before the lingering lease ran out: %v; want ErrHeld", err)
	}
	for {
		l2, err := b.TryAcquire(locktest.Context(t), name)
		if err == nil {
			if time.Now().Before(until) {
				t.Errorf("taken %v before the lingering lease ran out", time.Until(until))
			}
			mustRelease(t, l2)
			break
		}
		if time.Now().After(until.Add(10 * time.Second)) {
			t.Fatalf("still held 10s after the lingering lease ran out: %v", err)
		}
		time.Sleep(20 * time.Millisecond) // polling, as lock.Acquire does
	}
}

// Old documents are deleted: however often a name changes hands, it keeps
// at most 2·keep+1 documents and its first one, once they are older than
// spare (here 0; TestDocumentsSpared checks spare).
func TestOldDocumentsDeleted(t *testing.T) {
	m := testenv.RequireMongo(t)
	b := locktest.Open(t, m.URL, lock.Options{TTL: 10 * time.Second})
	mongodb.SetSpare(b, 0)
	name := locktest.Name(t)
	for range 5 * mongodb.Keep {
		l, err := b.TryAcquire(locktest.Context(t), name)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Keep(locktest.Context(t)); err != nil {
			t.Fatal(err)
		}
		mustRelease(t, l)
	}
	docs := chain(t, locks(t, m.URL), name)
	if len(docs) > 2*mongodb.Keep+2 {
		t.Errorf("%d documents after %d changes; want at most %d", len(docs), 15*mongodb.Keep, 2*mongodb.Keep+2)
	}
	if docs[0].ID != name+"#0" {
		t.Errorf("the first document %q was deleted", name+"#0")
	}
	for i := 2; i < len(docs); i++ {
		if docs[i].Seq != docs[i-1].Seq+1 {
			t.Errorf("a gap among the newest documents: seq %d after %d", docs[i].Seq, docs[i-1].Seq)
		}
	}
	if n := len(docs); docs[n-1].Seq-docs[1].Seq < mongodb.Keep {
		t.Errorf("kept seqs %d..%d; want at least the newest %d", docs[1].Seq, docs[n-1].Seq, mongodb.Keep+1)
	}
}

// Fencing tokens keep growing when the collection is dropped:
// the first document of a chain takes its seq from the server's clock. A
// holder learns of the drop at its next renewal.
func TestTokensGrowAcrossDrop(t *testing.T) {
	m := testenv.RequireMongo(t)
	a, b := locktest.Open(t, m.URL, lock.Options{TTL: 10 * time.Second}), locktest.Open(t, m.URL, lock.Options{TTL: 10 * time.Second})
	name := locktest.Name(t)
	var last int64
	for range 3 {
		l, err := a.TryAcquire(locktest.Context(t), name)
		if err != nil {
			t.Fatal(err)
		}
		last = l.(lock.Expiring).Token()
		mustRelease(t, l)
	}
	held, err := a.TryAcquire(locktest.Context(t), name)
	if err != nil {
		t.Fatal(err)
	}
	if err := locks(t, m.URL).Drop(locktest.Context(t)); err != nil {
		t.Fatal(err)
	}
	l, err := b.TryAcquire(locktest.Context(t), name)
	if err != nil {
		t.Fatalf("after the drop: %v", err)
	}
	if tok := l.(lock.Expiring).Token(); tok <= held.(lock.Expiring).Token() || tok <= last {
		t.Errorf("token %d after the drop; want more than %d", tok, held.(lock.Expiring).Token())
	}
	if err := held.Keep(locktest.Context(t)); !errors.Is(err, lock.ErrLost) {
		t.Errorf("Keep after the drop: %v; want ErrLost", err)
	}
	mustRelease(t, l)
}

// A lock held by a process that was killed: its lease runs out by the
// server's clock, and the next holder gets a larger token.
func TestTakeover(t *testing.T) {
	m := testenv.RequireMongo(t)
	const ttl = 300 * time.Millisecond
	a, b := locktest.Open(t, m.URL, lock.Options{TTL: ttl}), locktest.Open(t, m.URL, lock.Options{TTL: ttl})
	name := locktest.Name(t)
	la, start := take(t, a, name) // a relies on its lease until start + ttl
	lb, _ := take(t, b, name)
	if d := time.Since(start); d < ttl {
		t.Errorf("taken over after %v; the lease lasts %v", d, ttl)
	}
	if lb.(lock.Expiring).Token() <= la.(lock.Expiring).Token() {
		t.Errorf("token %d after %d", lb.(lock.Expiring).Token(), la.(lock.Expiring).Token())
	}
	took := false
	for _, d := range chain(t, locks(t, m.URL), name) {
		took = took || d.Op == "take" && d.Seq == lb.(lock.Expiring).Token()
	}
	if !took {
		t.Errorf("no document with op take at the new holder's token %d", lb.(lock.Expiring).Token())
	}
	err := la.Keep(locktest.Context(t))
	if !errors.Is(err, lock.ErrLost) || !strings.Contains(err.Error(), "took the lock over") {
		t.Errorf("the old holder's Keep: %v; want ErrLost saying it was taken over", err)
	}
	if err := la.Release(locktest.Context(t)); err == nil {
		t.Error("the old holder's Release succeeded")
	}
	mustRelease(t, lb)
}

func TestUnreachable(t *testing.T) {
	b := locktest.Open(t, "mongodb://127.0.0.1:1/", lock.Options{ConnectTimeout: 500 * time.Millisecond})
	_, err := b.TryAcquire(locktest.Context(t), "job")
	if !errors.Is(err, lock.ErrUnavailable) || !strings.Contains(err.Error(), "connection refused") {
		t.Errorf("closed port: %v; want ErrUnavailable saying connection refused", err)
	}
}

// A server that answers "authentication failed" refuses us: not worth
// retrying. (FerretDB fails the driver's default SCRAM mechanisms.)
func TestAuthFailed(t *testing.T) {
	m := testenv.RequireMongo(t)
	url := strings.Replace(m.URL, "mongodb://", "mongodb://u:hunter22@", 1)
	_, err := locktest.Open(t, url, lock.Options{ConnectTimeout: 2 * time.Second}).TryAcquire(locktest.Context(t), "job")
	if !errors.Is(err, lock.ErrRefused) || strings.Contains(err.Error(), "hunter22") {
		t.Errorf("failed authentication: %v; want ErrRefused without the password", err)
	}
}

// take has c take name within 10s, trying again as Client.Acquire would
// while it is held or an attempt does not finish in time (with a short
// ttl, an attempt on a busy machine may not), and says when the attempt
// that took it was sent.
func take(t *testing.T, c *lock.Client, name string) (lock.Lease, time.Time) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		sent := time.Now()
		l, err := c.TryAcquire(locktest.Context(t), name)
		if err == nil {
			return l, sent
		}
		if !errors.Is(err, lock.ErrHeld) && !errors.Is(err, lock.ErrUnavailable) || time.Now().After(deadline) {
			t.Fatalf("TryAcquire(%q): %v", name, err)
		}
		time.Sleep(10 * time.Millisecond) // polling, as Client.Acquire does
	}
}

func mustRelease(t *testing.T, l lock.Lease) {
	t.Helper()
	if err := l.Release(locktest.Context(t)); err != nil {
		t.Fatalf("Release: %v", err)
	}
}

// BenchmarkRoundTrip is one acquire and release on an open connection.
func BenchmarkRoundTrip(b *testing.B) {
	m := testenv.RequireMongo(b)
	locktest.BenchRoundTrip(b, m.URL)
}
