package redis_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/withlock/withlock/internal/lock"
	"github.com/withlock/withlock/internal/lock/locktest"
	"github.com/withlock/withlock/internal/lock/redis"
	"github.com/withlock/withlock/internal/testenv"
)

func TestConformance(t *testing.T) {
	r := testenv.RequireRedis(t)
	open := func(t *testing.T, opts lock.Options) *lock.Client { return locktest.Open(t, r.URL, opts) }
	locktest.Run(t, open, locktest.Options{})
	locktest.RunLease(t, open,
		func(t *testing.T, name string) {
			if n, err := testenv.RedisDo(locktest.Context(t), r.URL, "DEL", redis.Key(name)); err != nil || n != "1" {
				t.Fatalf("DEL %s: %q, %v", redis.Key(name), n, err)
			}
		})
}

func TestErrors(t *testing.T) {
	r := testenv.RequireRedisWithPassword(t, "s3cret-pw")
	bad := strings.Replace(r.URL, "s3cret-pw", "wrong", 1)
	_, err := locktest.Open(t, bad, lock.Options{}).TryAcquire(locktest.Context(t), "job")
	if !errors.Is(err, lock.ErrRefused) {
		t.Errorf("wrong password: %v; want ErrRefused", err)
	}
	_, err = locktest.Open(t, "redis://127.0.0.1:1/0", lock.Options{}).TryAcquire(locktest.Context(t), "job")
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
