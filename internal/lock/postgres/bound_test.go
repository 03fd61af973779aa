package postgres_test

import (
	"errors"
	"net/url"
	"testing"
	"time"

	"github.com/withlock/withlock/internal/lock"
	"github.com/withlock/withlock/internal/lock/locktest"
	"github.com/withlock/withlock/internal/stress/faultproxy"
	"github.com/withlock/withlock/internal/testenv"
)

// TestServerBound: the server-side bound of docs/postgres.md. A holder whose network is
// black-holed (its connection stays open, as a frozen holder's does: the
// proxy's kernel, like a stopped process's, still answers TCP) says
// nothing more after its lock statement. The server ends its session, and
// frees the lock for the others, about ttl after that statement: not
// before ttl from when it was sent, so never before withlock has stopped
// its command on its own clock, and not much later. A holder that goes on
// checking every ttl/3 keeps its session for longer than ttl.
func TestServerBound(t *testing.T) {
	db := database(t, testenv.RequirePostgres(t))
	u, err := url.Parse(db)
	if err != nil {
		t.Fatal(err)
	}
	proxy, err := faultproxy.Start(u.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	viaProxy := *u
	viaProxy.Host = proxy.Addr()
	const ttl = 2 * time.Second
	ctx := locktest.Context(t)
	name := locktest.Name(t)

	// The server's version decides which setting is at work.
	if v := query(t, db, "select current_setting('server_version_num')::int >= 140000"); v != "t" {
		t.Skip("the server is older than PostgreSQL 14: no idle_session_timeout; keepalives need a real partition")
	}

	holder := locktest.Open(t, viaProxy.String(), lock.Options{TTL: ttl})
	other := locktest.Open(t, db, lock.Options{TTL: ttl})
	sent := time.Now()
	l, err := holder.Backend.TryAcquire(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	answered := time.Now()
	if _, err := other.Backend.TryAcquire(ctx, name); !errors.Is(err, lock.ErrHeld) {
		t.Fatalf("TryAcquire by another client while held: %v, want ErrHeld", err)
	}
	proxy.BlackHole()
	defer proxy.Heal()
	var freed time.Time
	for {
		if time.Since(sent) > ttl+10*time.Second {
			t.Fatalf("the lock is still held %s after the holder fell silent", time.Since(sent).Round(time.Millisecond))
		}
		l2, err := other.Backend.TryAcquire(ctx, name)
		if err == nil {
			freed = time.Now()
			l2.Release(ctx)
			break
		}
		if !errors.Is(err, lock.ErrHeld) {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond) // polling the server, not waiting for a time
	}
	t.Logf("freed %s after the lock statement was sent (ttl %s)", freed.Sub(sent).Round(time.Millisecond), ttl)
	if freed.Sub(sent) < ttl {
		t.Errorf("the server freed the lock %s after the holder's last statement was sent, before the ttl (%s)", freed.Sub(sent), ttl)
	}
	if late := freed.Sub(answered) - ttl; late > 3*time.Second {
		t.Errorf("the server freed the lock %s after the ttl", late)
	}
	proxy.Heal()
	if err := l.Keep(ctx); !errors.Is(err, lock.ErrLost) && !errors.Is(err, lock.ErrUnavailable) {
		t.Errorf("Keep after the server ended the session: %v, want a loss", err)
	}

	// A holder that keeps checking stays.
	h, err := holder.Acquire(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Release(ctx)
	deadline := time.Now().Add(2 * ttl)
	for time.Now().Before(deadline) {
		select {
		case <-h.Lost():
			t.Fatalf("a holder that checks every ttl/3 lost its lock: %v", h.Err())
		case <-time.After(100 * time.Millisecond): // watching for what must not happen
		}
	}
	// A new client: other's session kept the bound after its release, and
	// has been silent since.
	third := locktest.Open(t, db, lock.Options{TTL: ttl})
	if _, err := third.Backend.TryAcquire(ctx, name); !errors.Is(err, lock.ErrHeld) {
		t.Fatalf("TryAcquire by another client after 2 ttl of checks: %v, want ErrHeld", err)
	}
}
