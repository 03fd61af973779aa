package mongodb_test

import (
	"context"
	"errors"
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
	open := func(t *testing.T, opts lock.Options) *lock.Client { return locktest.Open(t, m.URL, opts) }
	locktest.Run(t, open, locktest.Options{})
	locktest.RunLease(t, open,
		func(t *testing.T, name string) {
			res, err := locks(t, m.URL).DeleteOne(locktest.Context(t), bson.D{{Key: "_id", Value: name}})
			if err != nil || res.DeletedCount != 1 {
				t.Fatalf("deleting the lease document %q: %v", name, err)
			}
		})
}

// The lease document has the documented shape, with times from the
// server's clock and the holder's details.
func TestDocument(t *testing.T) {
	m := testenv.RequireMongo(t)
	b := locktest.Open(t, m.URL, lock.Options{TTL: 10 * time.Second})
	l, err := b.TryAcquire(locktest.Context(t), "doc")
	if err != nil {
		t.Fatal(err)
	}
	var doc bson.M
	if err := locks(t, m.URL).FindOne(locktest.Context(t), bson.D{{Key: "_id", Value: "doc"}}).Decode(&doc); err != nil {
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
	if err := l.Release(locktest.Context(t)); err != nil {
		t.Fatal(err)
	}
	if n, _ := locks(t, m.URL).CountDocuments(locktest.Context(t), bson.D{{Key: "_id", Value: "doc"}}); n != 0 {
		t.Errorf("the lease document is still there after Release")
	}
}

func TestUnreachable(t *testing.T) {
	b := locktest.Open(t, "mongodb://127.0.0.1:1/", lock.Options{ConnectTimeout: 500 * time.Millisecond})
	_, err := b.TryAcquire(locktest.Context(t), "job")
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
