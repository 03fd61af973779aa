package mongodb_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/withlock/withlock/internal/lock"
	"github.com/withlock/withlock/internal/lock/locktest"
	_ "github.com/withlock/withlock/internal/lock/mongodb"
	"github.com/withlock/withlock/internal/testenv"
)

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

func open(t *testing.T, url string, opts lock.Options) lock.Backend {
	t.Helper()
	opts.Holder = lock.Holder{Host: "test", PID: os.Getpid(), Command: []string{"true"}}
	b, err := lock.Open(url, opts)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

// locks returns the collection a backend on url uses.
func locks(t *testing.T, url string) *mongo.Collection {
	t.Helper()
	c, err := mongo.Connect(options.Client().ApplyURI(url))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Disconnect(context.Background()) })
	return c.Database("withlock").Collection("locks")
}

func TestConformance(t *testing.T) {
	m := testenv.RequireMongo(t)
	locktest.Run(t, func(t *testing.T) lock.Backend { return open(t, m.URL, lock.Options{TTL: 2 * time.Second}) }, locktest.Options{})
}

// The lease document has the documented shape, with times from the
// server's clock and the holder's details.
func TestDocument(t *testing.T) {
	m := testenv.RequireMongo(t)
	b := open(t, m.URL, lock.Options{TTL: 10 * time.Second})
	l, err := b.TryAcquire(ctx(t), "doc")
	if err != nil {
		t.Fatal(err)
	}
	var doc bson.M
	if err := locks(t, m.URL).FindOne(ctx(t), bson.D{{Key: "_id", Value: "doc"}}).Decode(&doc); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"token", "fence", "holder", "acquiredAt", "expiresAt"} {
		if _, ok := doc[k]; !ok {
			t.Errorf("lease document lacks %q: %v", k, doc)
		}
	}
	acq, exp := doc["acquiredAt"].(bson.DateTime).Time(), doc["expiresAt"].(bson.DateTime).Time()
	if d := exp.Sub(acq); d != 10*time.Second {
		t.Errorf("expiresAt - acquiredAt = %v; want the TTL, 10s", d)
	}
	if f := doc["fence"].(int64); f != l.(lock.Fenced).Token() {
		t.Errorf("fence in the document %d, Token() %d", f, l.(lock.Fenced).Token())
	}
	if err := l.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	if n, _ := locks(t, m.URL).CountDocuments(ctx(t), bson.D{{Key: "_id", Value: "doc"}}); n != 0 {
		t.Errorf("the lease document is still there after Release")
	}
}

// The fencing token grows with every acquisition of a name, across
// releases (which delete the lease document).
func TestFenceGrows(t *testing.T) {
	m := testenv.RequireMongo(t)
	b := open(t, m.URL, lock.Options{})
	var last int64
	for i := 0; i < 3; i++ {
		l, err := b.TryAcquire(ctx(t), "fence")
		if err != nil {
			t.Fatal(err)
		}
		got := l.(lock.Fenced).Token()
		if got <= last {
			t.Fatalf("acquisition %d got fencing token %d after %d", i, got, last)
		}
		last = got
		if err := l.Release(ctx(t)); err != nil {
			t.Fatal(err)
		}
	}
}

// A lease whose document someone deleted is lost at the next Keep, and the
// old holder's Release leaves a newcomer's lease alone.
func TestDocumentDeleted(t *testing.T) {
	m := testenv.RequireMongo(t)
	a, b := open(t, m.URL, lock.Options{}), open(t, m.URL, lock.Options{})
	la, err := a.TryAcquire(ctx(t), "job")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := locks(t, m.URL).DeleteOne(ctx(t), bson.D{{Key: "_id", Value: "job"}}); err != nil {
		t.Fatal(err)
	}
	if err := la.Keep(ctx(t)); !errors.Is(err, lock.ErrLost) {
		t.Fatalf("Keep after the document was deleted: %v; want ErrLost", err)
	}
	lb, err := b.TryAcquire(ctx(t), "job")
	if err != nil {
		t.Fatalf("TryAcquire after the delete: %v", err)
	}
	if err := la.Release(ctx(t)); err == nil {
		t.Error("the old holder's Release succeeded on the newcomer's lease")
	}
	if err := lb.Keep(ctx(t)); err != nil {
		t.Errorf("the newcomer lost its lease to the old holder's Release: %v", err)
	}
}

// An expired lease is cleared by the next contender, and its holder's
// Keep then reports the loss; ErrHeld says how long a live lease has left.
func TestLeaseExpires(t *testing.T) {
	m := testenv.RequireMongo(t)
	a := open(t, m.URL, lock.Options{TTL: 500 * time.Millisecond})
	b := open(t, m.URL, lock.Options{})
	la, err := a.TryAcquire(ctx(t), "job")
	if err != nil {
		t.Fatal(err)
	}
	_, err = b.TryAcquire(ctx(t), "job")
	var remaining interface{ Remaining() time.Duration }
	if !errors.Is(err, lock.ErrHeld) || !errors.As(err, &remaining) {
		t.Fatalf("TryAcquire of a held lease: %v; want ErrHeld with Remaining", err)
	}
	if d := remaining.Remaining(); d <= 0 || d > 500*time.Millisecond {
		t.Errorf("Remaining() = %v; want in (0, 500ms]", d)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := b.TryAcquire(ctx(t), "job"); err == nil {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("the lease never expired: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := la.Keep(ctx(t)); !errors.Is(err, lock.ErrLost) {
		t.Errorf("Keep of the expired, taken lease: %v; want ErrLost", err)
	}
}

func TestUnreachable(t *testing.T) {
	b := open(t, "mongodb://127.0.0.1:1/", lock.Options{ConnectTimeout: 500 * time.Millisecond})
	_, err := b.TryAcquire(ctx(t), "job")
	if !errors.Is(err, lock.ErrUnavailable) || !strings.Contains(err.Error(), "connection refused") {
		t.Errorf("closed port: %v; want ErrUnavailable saying connection refused", err)
	}
}

// BenchmarkRoundTrip is one acquire and release on an open connection.
func BenchmarkRoundTrip(b *testing.B) {
	m := testenv.RequireMongo(b)
	bk, err := lock.Open(m.URL, lock.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer bk.Close()
	locktest.BenchRoundTrip(b, bk)
}
