package postgres_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/withlock/withlock/internal/lock"
	"github.com/withlock/withlock/internal/lock/locktest"
	"github.com/withlock/withlock/internal/testenv"
)

// hostsURL is p's URL with several hosts, in order, and query.
func hostsURL(query string, ps ...*testenv.Postgres) string {
	var hosts []string
	for _, p := range ps {
		hosts = append(hosts, fmt.Sprintf("127.0.0.1:%d", p.Port))
	}
	return fmt.Sprintf("postgres://%s:%s@%s/postgres?%s", testenv.PostgresUser, testenv.PostgresPassword, strings.Join(hosts, ","), query)
}

// TestStandby: a hot standby grants advisory locks that only it knows of,
// so withlock refuses it at once; target_session_attrs finds the primary
// among several hosts, as libpq does.
func TestStandby(t *testing.T) {
	primary := testenv.RequirePostgres(t)
	standby, err := primary.StartStandby()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { standby.Close() })
	const name = "replica-trap"
	// The primary's holder, on a backend that lives as long as the test.
	holder := locktest.Open(t, primary.URL, lock.Options{})
	hold := func(t *testing.T) lock.Lease {
		l, err := holder.TryAcquire(locktest.Context(t), name)
		if err != nil {
			t.Fatalf("TryAcquire on the primary: %v", err)
		}
		return l
	}
	held := hold(t)
	noLocks := "select count(*) from pg_locks where locktype = 'advisory'"

	t.Run("refused", func(t *testing.T) {
		for _, wait := range []bool{false, true} {
			b := locktest.Open(t, standby.URL, lock.Options{})
			var err error
			if wait {
				_, _, err = b.Backend.(lock.Waiter).Acquire(locktest.Context(t), name)
			} else {
				_, err = b.TryAcquire(locktest.Context(t), name)
			}
			want := fmt.Sprintf("postgres at 127.0.0.1:%d is a hot standby, where a lock excludes nobody on the primary; "+
				"point withlock at the primary, or add target_session_attrs=read-write to a URL that lists every host", standby.Port)
			if !errors.Is(err, lock.ErrRefused) || err.Error() != want {
				t.Errorf("wait %v: %v; want ErrRefused: %s", wait, err, want)
			}
			if got := query(t, standby.URL, noLocks); got != "0" {
				t.Errorf("wait %v: %s advisory locks on the standby after the refusal", wait, got)
			}
		}
	})

	for _, attrs := range []string{"read-write", "primary"} {
		t.Run("target_session_attrs="+attrs, func(t *testing.T) {
			b := locktest.Open(t, hostsURL("target_session_attrs="+attrs, standby, primary), lock.Options{})
			if _, err := b.TryAcquire(locktest.Context(t), name); !errors.Is(err, lock.ErrHeld) {
				t.Fatalf("TryAcquire while the primary's holder holds it: %v; want ErrHeld", err)
			}
			if err := held.Release(locktest.Context(t)); err != nil {
				t.Fatal(err)
			}
			l, err := b.TryAcquire(locktest.Context(t), name)
			if err != nil {
				t.Fatalf("TryAcquire after the primary's holder let go: %v", err)
			}
			if got := query(t, primary.URL, noLocks); got != "1" {
				t.Errorf("advisory locks on the primary: %s, want 1 (ours)", got)
			}
			l.Release(locktest.Context(t))
			held = hold(t)
		})
	}

	t.Run("target_session_attrs=read-write, standbys only", func(t *testing.T) {
		_, err := locktest.Open(t, hostsURL("target_session_attrs=read-write", standby), lock.Options{}).TryAcquire(locktest.Context(t), name)
		want := fmt.Sprintf("cannot reach postgres at 127.0.0.1:%d (not the primary that target_session_attrs asks for)", standby.Port)
		if !errors.Is(err, lock.ErrUnavailable) || err.Error() != want {
			t.Errorf("TryAcquire: %v; want ErrUnavailable (a standby may be promoted): %s", err, want)
		}
	})

	for _, attrs := range []string{"standby", "read-only", "prefer-standby"} {
		t.Run("target_session_attrs="+attrs, func(t *testing.T) {
			_, err := lock.Open(hostsURL("target_session_attrs="+attrs, primary), lock.Options{})
			if !errors.Is(err, lock.ErrUsage) || !strings.Contains(err.Error(), "picks a standby") {
				t.Errorf("Open: %v; want ErrUsage saying it picks a standby", err)
			}
		})
	}

	// A standby that does not accept connections yet (hot_standby off here)
	// answers 57P03, "not accepting connections": an outage, not a refusal.
	t.Run("57P03", func(t *testing.T) {
		if err := standby.Configure("hot_standby = off"); err != nil {
			t.Fatal(err)
		}
		_, err := locktest.Open(t, standby.URL, lock.Options{}).TryAcquire(locktest.Context(t), name)
		if !errors.Is(err, lock.ErrUnavailable) || !strings.Contains(err.Error(), "the database system is not accepting connections") {
			t.Errorf("TryAcquire: %v; want ErrUnavailable: the database system is not accepting connections", err)
		}
	})
}
