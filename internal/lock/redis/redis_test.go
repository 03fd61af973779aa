package redis_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/withlock/withlock/internal/lock"
	"github.com/withlock/withlock/internal/lock/locktest"
	"github.com/withlock/withlock/internal/lock/redis"
	"github.com/withlock/withlock/internal/testenv"
)

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

func open(t *testing.T, url string, opts lock.Options) lock.Backend {
	t.Helper()
	opts.Holder = lock.Holder{Host: "test", PID: os.Getpid()}
	b, err := lock.Open(url, opts)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

func TestConformance(t *testing.T) {
	r := testenv.RequireRedis(t)
	locktest.Run(t, func(t *testing.T) lock.Backend { return open(t, r.URL, lock.Options{TTL: 2 * time.Second}) }, locktest.Options{})
}

// The fencing token grows with every acquisition of a name.
func TestFenceGrows(t *testing.T) {
	r := testenv.RequireRedis(t)
	b := open(t, r.URL, lock.Options{})
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

// A lease whose key someone deleted is lost at the next Keep, and a
// newcomer's lease is not touched by the old holder's Release.
func TestKeyDeleted(t *testing.T) {
	r := testenv.RequireRedis(t)
	a, b := open(t, r.URL, lock.Options{}), open(t, r.URL, lock.Options{})
	la, err := a.TryAcquire(ctx(t), "job")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := testenv.RedisDo(ctx(t), r.URL, "DEL", redis.Key("job")); err != nil {
		t.Fatal(err)
	}
	if err := la.Keep(ctx(t)); !errors.Is(err, lock.ErrLost) {
		t.Fatalf("Keep after DEL: %v; want ErrLost", err)
	}
	lb, err := b.TryAcquire(ctx(t), "job")
	if err != nil {
		t.Fatalf("TryAcquire after DEL: %v", err)
	}
	if err := la.Release(ctx(t)); err == nil {
		t.Error("the old holder's Release succeeded on the newcomer's lease")
	}
	if err := lb.Keep(ctx(t)); err != nil {
		t.Errorf("the newcomer lost its lease to the old holder's Release: %v", err)
	}
}

// The server's clock decides: a lease not renewed expires after its TTL,
// and the holder's ErrHeld says how long is left.
func TestLeaseExpires(t *testing.T) {
	r := testenv.RequireRedis(t)
	a := open(t, r.URL, lock.Options{TTL: 500 * time.Millisecond})
	b := open(t, r.URL, lock.Options{})
	if _, err := a.TryAcquire(ctx(t), "job"); err != nil {
		t.Fatal(err)
	}
	_, err := b.TryAcquire(ctx(t), "job")
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
}

func TestErrors(t *testing.T) {
	r := testenv.RequireRedisWithPassword(t, "s3cret-pw")
	bad := strings.Replace(r.URL, "s3cret-pw", "wrong", 1)
	_, err := open(t, bad, lock.Options{}).TryAcquire(ctx(t), "job")
	if !errors.Is(err, lock.ErrRefused) {
		t.Errorf("wrong password: %v; want ErrRefused", err)
	}
	_, err = open(t, "redis://127.0.0.1:1/0", lock.Options{}).TryAcquire(ctx(t), "job")
	if !errors.Is(err, lock.ErrUnavailable) || !strings.Contains(err.Error(), "connection refused") {
		t.Errorf("closed port: %v; want ErrUnavailable saying connection refused", err)
	}
}

// BenchmarkRoundTrip is one acquire and release on an open connection.
func BenchmarkRoundTrip(b *testing.B) {
	r := testenv.RequireRedis(b)
	bk, err := lock.Open(r.URL, lock.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer bk.Close()
	locktest.BenchRoundTrip(b, bk)
}
