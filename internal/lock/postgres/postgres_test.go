package postgres_test

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"net"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/withlock/withlock/internal/lock"
	"github.com/withlock/withlock/internal/lock/locktest"
	"github.com/withlock/withlock/internal/lock/postgres"
	"github.com/withlock/withlock/internal/testenv"
)

// database returns the URL of a fresh database in p.
func database(t *testing.T, p *testenv.Postgres) string {
	t.Helper()
	b := make([]byte, 6)
	rand.Read(b)
	u, err := p.CreateDatabase("t_" + hex.EncodeToString(b))
	if err != nil {
		t.Fatal(err)
	}
	return u
}

func query(t *testing.T, dbURL, sql string) string {
	t.Helper()
	rows, err := testenv.Exec(locktest.Context(t), dbURL, sql)
	if err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return strings.Join(rows, "|")
}

// TestConformance: the shared suite. Holder records are what the holder's
// session shows; a broken holder's next Keep finds its session ended; a
// semaphore's N is recorded (the mark of N, in pg_locks).
func TestConformance(t *testing.T) {
	db := database(t, testenv.RequirePostgres(t))
	locktest.Run(t, locktest.Config{
		Open: func(t *testing.T, opts lock.Options) *lock.Client {
			return locktest.Open(t, db, opts)
		},
		Modes: locktest.Modes{RecordsN: true},
	})
}

// TestKeys: the keys of docs/postgres.md, as the npm package advisory-lock derives
// them. The values were computed with node's crypto:
//
//	const b = crypto.createHash("sha256").update(name, "utf8").digest();
//	[b.readInt32LE(0), b.readInt32LE(4)]
func TestKeys(t *testing.T) {
	for _, tc := range []struct {
		name   string
		k1, k2 int32
	}{
		{"test-lock", -107789403, -1898803861},
		{"dbmigration", -1682085387, -1149921686},
		{"", 1120186595, 337443992},
		{"a/b", -1059238719, -1655966157},
		{"a%2Fb", -1507649673, 267509892},
		{"Test-Lock", -131296992, 1318882567},
		{"zü", 1255848429, 1872202416},
		{"日本語", -318082697, -1546694969},
		{strings.Repeat("x", 255), -636934446, 1821762362},
	} {
		if k1, k2 := postgres.Keys(tc.name); k1 != tc.k1 || k2 != tc.k2 {
			t.Errorf("Keys(%.20q) = (%d, %d), want (%d, %d)", tc.name, k1, k2, tc.k1, tc.k2)
		}
	}
}

// TestTwoKeyLock: the lock is pg_advisory_lock(k1, k2), the one that
// advisory-lock and psql users take.
func TestTwoKeyLock(t *testing.T) {
	db := database(t, testenv.RequirePostgres(t))
	b := locktest.Open(t, db, lock.Options{})
	l, err := b.TryAcquire(locktest.Context(t), "test-lock")
	if err != nil {
		t.Fatalf("TryAcquire: %v", err)
	}
	// testenv.Exec's connection ends right after, which frees what it took.
	try := "select pg_try_advisory_lock(-107789403, -1898803861)"
	if got := query(t, db, try); got != "f" {
		t.Errorf("%s while withlock held test-lock: %s, want f", try, got)
	}
	if err := l.Release(locktest.Context(t)); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if got := query(t, db, try); got != "t" {
		t.Errorf("%s after withlock released test-lock: %s, want t", try, got)
	}
}

// holderPID is the server pid of the one withlock session on db.
func holderPID(t *testing.T, db string) string {
	t.Helper()
	pid := query(t, db, `select pid from pg_stat_activity
		where application_name like 'withlock %' and datname = current_database()`)
	if pid == "" || strings.Contains(pid, "|") {
		t.Fatalf("withlock sessions in pg_stat_activity: %q, want one", pid)
	}
	return pid
}

// terminate ends the server session pid and waits until it is gone.
func terminate(t *testing.T, db, pid string) {
	t.Helper()
	if got := query(t, db, "select pg_terminate_backend("+pid+")"); got != "t" {
		t.Fatalf("pg_terminate_backend(%s): %s", pid, got)
	}
	deadline := time.Now().Add(30 * time.Second)
	for query(t, db, "select count(*) from pg_stat_activity where pid = "+pid) != "0" {
		if time.Now().After(deadline) {
			t.Fatalf("session %s still there 30s after pg_terminate_backend", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestKeepAfterTerminate(t *testing.T) {
	db := database(t, testenv.RequirePostgres(t))
	a, b := locktest.Open(t, db, lock.Options{}), locktest.Open(t, db, lock.Options{})
	l, err := a.TryAcquire(locktest.Context(t), "job")
	if err != nil {
		t.Fatalf("TryAcquire: %v", err)
	}
	terminate(t, db, holderPID(t, db))
	if err := l.Keep(locktest.Context(t)); !errors.Is(err, lock.ErrLost) {
		t.Errorf("Keep after pg_terminate_backend: %v; want an error matching lock.ErrLost", err)
	}
	lb, err := b.TryAcquire(locktest.Context(t), "job")
	if err != nil {
		t.Fatalf("TryAcquire by another client after the holder's session ended: %v", err)
	}
	lb.Release(locktest.Context(t))
}

// TestHeldNoticesTerminate: the loss is noticed by watching the session,
// long before the next Keep (TTL/3 = 20s here).
func TestHeldNoticesTerminate(t *testing.T) {
	db := database(t, testenv.RequirePostgres(t))
	opts := lock.Options{TTL: time.Minute}
	h, err := locktest.Open(t, db, opts).Acquire(locktest.Context(t), "job")
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	defer h.Release(locktest.Context(t))
	terminate(t, db, holderPID(t, db))
	select {
	case <-h.Lost():
		if !errors.Is(h.Err(), lock.ErrLost) {
			t.Errorf("Err: %v; want an error matching lock.ErrLost", h.Err())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Lost not closed 10s after pg_terminate_backend")
	}
}

// closedPort returns a loopback port that nothing listens on.
func closedPort(t *testing.T) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	return port
}

func TestClassify(t *testing.T) {
	p := testenv.RequirePostgres(t)
	withPassword := func(raw, pw string) string {
		u, _ := url.Parse(raw)
		u.User = url.UserPassword(u.User.Username(), pw)
		return u.String()
	}
	withDB := func(raw, db string) string {
		u, _ := url.Parse(raw)
		u.Path = "/" + db
		return u.String()
	}
	for _, tc := range []struct {
		desc, url string
		kind      error
		says      string
	}{
		{"closed port", "postgres://withlock:wrong-pw-1@127.0.0.1:" + strconv.Itoa(closedPort(t)) + "/postgres?sslmode=disable",
			lock.ErrUnavailable, "connection refused"},
		{"wrong password", withPassword(p.URL, "wrong-pw-1"), lock.ErrRefused, "password authentication failed"},
		{"wrong password, no sslmode", strings.TrimSuffix(withPassword(p.URL, "wrong-pw-1"), "?sslmode=disable"), lock.ErrRefused, "password authentication failed"},
		{"no such database", withDB(p.URL, "no_such_db"), lock.ErrRefused, `"no_such_db" does not exist`},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			b := locktest.Open(t, tc.url, lock.Options{})
			l, err := b.TryAcquire(locktest.Context(t), "job")
			if err == nil {
				l.Release(locktest.Context(t))
				t.Fatal("TryAcquire succeeded")
			}
			if !errors.Is(err, tc.kind) {
				t.Errorf("TryAcquire: %v; want an error matching %v", err, tc.kind)
			}
			for _, other := range []error{lock.ErrUnavailable, lock.ErrRefused, lock.ErrHeld} {
				if other != tc.kind && errors.Is(err, other) {
					t.Errorf("TryAcquire: %v; matches %v too", err, other)
				}
			}
			if !strings.Contains(err.Error(), tc.says) {
				t.Errorf("TryAcquire: %q; want it to say %q", err, tc.says)
			}
			if strings.Contains(err.Error(), "wrong-pw-1") {
				t.Errorf("TryAcquire: %q shows the password", err)
			}
		})
	}
}

// TestRefusedAtOnce: Client.Acquire does not retry a refusal for the
// connect timeout.
func TestRefusedAtOnce(t *testing.T) {
	p := testenv.RequirePostgres(t)
	u, _ := url.Parse(p.URL)
	u.Path = "/no_such_db"
	opts := lock.Options{ConnectTimeout: time.Hour}
	start := time.Now()
	_, err := locktest.Open(t, u.String(), opts).Acquire(locktest.Context(t), "job")
	if !errors.Is(err, lock.ErrRefused) {
		t.Errorf("Acquire: %v; want an error matching lock.ErrRefused", err)
	}
	if d := time.Since(start); d > 20*time.Second {
		t.Errorf("Acquire took %v to give up on a refusal", d)
	}
}

func BenchmarkKeys(b *testing.B) {
	for b.Loop() {
		postgres.Keys("dbmigration")
	}
}

// BenchmarkRoundTrip is one acquire and release on an open connection.
func BenchmarkRoundTrip(b *testing.B) {
	p := testenv.RequirePostgres(b)
	locktest.BenchRoundTrip(b, p.URL)
}

// TestOneDial: one attempt is one connection; withlock's wait loop, not the
// driver, tries again. pgx follows a connection that failed in its startup
// with a cancel request (code 80877102; without the server's key data, 12
// bytes) on a connection of its own: not an attempt to connect.
func TestOneDial(t *testing.T) {
	cancelRequest := func(first []byte) bool {
		return len(first) >= 8 && binary.BigEndian.Uint32(first[4:8]) == 80877102
	}
	for _, mode := range []string{"disable", "require"} {
		t.Run(mode, func(t *testing.T) {
			locktest.RunOneDial(t, func(hostport string) string { return "postgres://u:p@" + hostport + "/db?sslmode=" + mode }, cancelRequest)
		})
	}
}
