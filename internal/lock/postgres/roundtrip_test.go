package postgres_test

import (
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/withlock/withlock/internal/lock"
	"github.com/withlock/withlock/internal/lock/locktest"
	"github.com/withlock/withlock/internal/stress/faultproxy"
	"github.com/withlock/withlock/internal/testenv"
)

// countTrips starts a fault proxy in front of a PostgreSQL server (no TLS)
// that counts the client's round trips in trips: each Query message (simple
// protocol), each Sync (the end of an extended-protocol exchange). It
// returns the proxy's host:port.
func countTrips(t *testing.T, target string, trips *atomic.Int64) string {
	p, err := faultproxy.Start(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	p.SetSplit(splitSteps)
	p.SetRule(func(m faultproxy.Message) faultproxy.Action {
		if m.Kind != "startup" && (m.Data[0] == 'Q' || m.Data[0] == 'S') {
			trips.Add(1)
		}
		return faultproxy.Action{}
	})
	return p.Addr()
}

// TestOneRoundTrip: in every mode, taking a lock (the checks, the lock,
// the record), each check of it, and its release are one round trip each.
func TestOneRoundTrip(t *testing.T) {
	p := testenv.RequirePostgres(t)
	var trips atomic.Int64
	dbURL := via(p.URL, countTrips(t, "127.0.0.1:"+strconv.Itoa(p.Port), &trips), "sslmode=disable")
	for _, opts := range []lock.Options{{Mode: lock.Exclusive}, {Mode: lock.Shared}, {Mode: lock.Semaphore, MaxHolders: 3}} {
		t.Run(string(opts.Mode), func(t *testing.T) {
			b := locktest.Open(t, dbURL, opts)
			step := func(what string, f func() error) {
				t.Helper()
				before := trips.Load()
				if err := f(); err != nil {
					t.Fatalf("%s: %v", what, err)
				}
				if n := trips.Load() - before; n != 1 {
					t.Errorf("%s: %d round trips; want 1", what, n)
				}
			}
			var l lock.Lease
			step("TryAcquire", func() (err error) { l, err = b.TryAcquire(locktest.Context(t), "job"); return err })
			step("Keep", func() error { return l.Keep(locktest.Context(t)) })
			step("Release", func() error { return l.Release(locktest.Context(t)) })
			if w, ok := b.Backend.(lock.Waiter); ok && opts.Mode != lock.Semaphore {
				step("Acquire (a wait in the server)", func() (err error) { l, _, err = w.Acquire(locktest.Context(t), "job"); return err })
				l.Release(locktest.Context(t))
			}
		})
	}
}
