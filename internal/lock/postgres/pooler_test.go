package postgres_test

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/withlock/withlock/internal/lock"
	"github.com/withlock/withlock/internal/lock/locktest"
	"github.com/withlock/withlock/internal/testenv"
)

const advisoryLocks = "select count(*) from pg_locks where locktype = 'advisory'"

// TestTransactionPooler: behind a pgbouncer that hands server sessions to
// client after client (transaction and statement mode), every contender
// is refused, whether the pool is fresh or warm, whether it waits or tries
// once, and nothing stays locked on the server.
func TestTransactionPooler(t *testing.T) {
	p := testenv.RequirePostgres(t)
	for _, tc := range []struct {
		mode string
		pool int
	}{{"transaction", 1}, {"transaction", 2}, {"transaction", 5}, {"statement", 2}} {
		t.Run(fmt.Sprintf("%s/pool %d", tc.mode, tc.pool), func(t *testing.T) {
			b := testenv.RequirePgBouncer(t, p.URL, tc.mode, tc.pool)
			for round := range 3 {
				var wg sync.WaitGroup
				for i := range 4 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						bk := locktest.Open(t, b.URL, lock.Options{})
						var err error
						if i%2 == 0 {
							_, _, err = bk.Backend.(lock.Waiter).Acquire(locktest.Context(t), "job")
						} else {
							_, err = bk.TryAcquire(locktest.Context(t), "job")
						}
						if !errors.Is(err, lock.ErrRefused) || !strings.Contains(err.Error(), "shares server sessions between clients") {
							t.Errorf("round %d, contender %d: %v; want ErrRefused: ... shares server sessions between clients ...", round, i, err)
						}
					}()
				}
				wg.Wait()
			}
			if got := query(t, p.URL, advisoryLocks); got != "0" {
				t.Errorf("%s advisory locks left on the server", got)
			}
		})
	}
}

// TestSessionPooler: a session-mode pgbouncer keeps working, and its
// clients and direct ones exclude each other.
func TestSessionPooler(t *testing.T) {
	p := testenv.RequirePostgres(t)
	b := testenv.RequirePgBouncer(t, p.URL, "session", 4)
	locktest.Run(t, locktest.Config{
		Open: func(t *testing.T, opts lock.Options) *lock.Client {
			return locktest.Open(t, b.URL, opts)
		},
		CoreOnly: true,
	})
	t.Run("with direct clients", func(t *testing.T) {
		pooled, direct := locktest.Open(t, b.URL, lock.Options{}), locktest.Open(t, p.URL, lock.Options{})
		l, err := pooled.TryAcquire(locktest.Context(t), "job")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := direct.TryAcquire(locktest.Context(t), "job"); !errors.Is(err, lock.ErrHeld) {
			t.Errorf("direct TryAcquire while a pooled client holds it: %v; want ErrHeld", err)
		}
		l.Release(locktest.Context(t))
		if l, err = direct.TryAcquire(locktest.Context(t), "job"); err != nil {
			t.Fatal(err)
		}
		if _, err := pooled.TryAcquire(locktest.Context(t), "job"); !errors.Is(err, lock.ErrHeld) {
			t.Errorf("pooled TryAcquire while a direct client holds it: %v; want ErrHeld", err)
		}
		l.Release(locktest.Context(t))
	})
}

// TestPoolerMovesSession: a holder whose pooler starts handing its server
// session to others (here an administrator switches pgbouncer to
// transaction mode) loses the lock at its next check: when its statements
// land in another server process, and when another withlock's statement
// lands in its session.
func TestPoolerMovesSession(t *testing.T) {
	p := testenv.RequirePostgres(t)
	for _, intruder := range []string{"another client pins the session", "another withlock"} {
		t.Run(intruder, func(t *testing.T) {
			b := testenv.RequirePgBouncer(t, p.URL, "session", 2)
			l, err := locktest.Open(t, b.URL, lock.Options{}).TryAcquire(locktest.Context(t), "job")
			if err != nil {
				t.Fatal(err)
			}
			if err := b.SetPoolMode("transaction"); err != nil {
				t.Fatal(err)
			}
			// At the end of this check, pgbouncer puts the session back in the
			// pool, where the next client's statement finds it.
			if err := l.Keep(locktest.Context(t)); err != nil {
				t.Fatalf("Keep right after the switch: %v", err)
			}
			want := "another client ran statements in our session"
			if intruder == "another withlock" {
				_, err := locktest.Open(t, b.URL, lock.Options{}).TryAcquire(locktest.Context(t), "other")
				if !errors.Is(err, lock.ErrRefused) {
					t.Errorf("another withlock's TryAcquire: %v; want ErrRefused", err)
				}
			} else {
				// An open transaction keeps the session to itself.
				c, err := pgx.Connect(locktest.Context(t), b.URL)
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close(locktest.Context(t))
				if _, err := c.PgConn().Exec(locktest.Context(t), "begin; select 1").ReadAll(); err != nil {
					t.Fatal(err)
				}
				want = "our statements moved from server process"
			}
			err = l.Keep(locktest.Context(t))
			if !errors.Is(err, lock.ErrLost) || !strings.Contains(err.Error(), want) {
				t.Errorf("Keep: %v; want ErrLost: %s", err, want)
			}
		})
	}
}
