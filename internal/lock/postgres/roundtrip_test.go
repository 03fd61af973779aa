package postgres_test

import (
	"bufio"
	"io"
	"net"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/withlock/withlock/internal/lock"
	"github.com/withlock/withlock/internal/lock/locktest"
	"github.com/withlock/withlock/internal/testenv"
)

// counter is a TCP proxy in front of a PostgreSQL server (no TLS) that
// counts the client's round trips: each Query message (simple protocol),
// each Sync (the end of an extended-protocol exchange).
type counter struct {
	trips atomic.Int64
	addr  string
}

func newCounter(t *testing.T, target string) *counter {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	c := &counter{addr: l.Addr().String()}
	go func() {
		for {
			client, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer client.Close()
				server, err := net.Dial("tcp", target)
				if err != nil {
					return
				}
				defer server.Close()
				go func() {
					io.Copy(client, server)
					client.Close()
				}()
				r := bufio.NewReader(client)
				for started := false; ; started = true {
					_, msg, err := next(r, started)
					if err != nil {
						return
					}
					if started && (msg[0] == 'Q' || msg[0] == 'S') {
						c.trips.Add(1)
					}
					if _, err := server.Write(msg); err != nil {
						return
					}
				}
			}()
		}
	}()
	return c
}

// TestOneRoundTrip: in every mode, taking a lock (the checks, the lock,
// the record), each check of it, and its release are one round trip each.
func TestOneRoundTrip(t *testing.T) {
	p := testenv.RequirePostgres(t)
	c := newCounter(t, "127.0.0.1:"+strconv.Itoa(p.Port))
	dbURL := via(p.URL, c.addr, "sslmode=disable")
	for _, opts := range []lock.Options{{Mode: lock.Exclusive}, {Mode: lock.Shared}, {Mode: lock.Semaphore, MaxHolders: 3}} {
		t.Run(string(opts.Mode), func(t *testing.T) {
			b := locktest.Open(t, dbURL, opts)
			step := func(what string, f func() error) {
				t.Helper()
				before := c.trips.Load()
				if err := f(); err != nil {
					t.Fatalf("%s: %v", what, err)
				}
				if n := c.trips.Load() - before; n != 1 {
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
