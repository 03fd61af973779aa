package mysql_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/withlock/withlock/internal/lock"
	"github.com/withlock/withlock/internal/lock/locktest"
	"github.com/withlock/withlock/internal/lock/mysql"
	"github.com/withlock/withlock/internal/testenv"
)

func query(t *testing.T, dbURL, sql string) string {
	t.Helper()
	rows, err := testenv.MySQLExec(locktest.Context(t), dbURL, sql)
	// A fresh connection to a busy server can break in its handshake
	// ("invalid connection"); a SELECT is safe to send again.
	for try := 0; errors.Is(err, gomysql.ErrInvalidConn) && strings.HasPrefix(sql, "SELECT ") && try < 3; try++ {
		rows, err = testenv.MySQLExec(locktest.Context(t), dbURL, sql)
	}
	if err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return strings.Join(rows, "|")
}

func opener(db string) locktest.OpenFunc {
	return func(t *testing.T, opts lock.Options) *lock.Client { return locktest.Open(t, db, opts) }
}

// TestConformance: the shared suite. For status and release --force, a
// broken holder learns of it from its Watch, at once: the server closes the
// killed session. GET_LOCK has no shared mode.
func TestConformance(t *testing.T) {
	m := testenv.RequireMariaDB(t)
	locktest.Run(t, locktest.Config{
		Open: opener(m.URL),
		Operators: locktest.Operators{
			Lost: func(t *testing.T, l lock.Lease) error {
				ctx, cancel := context.WithTimeout(locktest.Context(t), 10*time.Second)
				defer cancel()
				start := time.Now()
				err := l.(lock.Watcher).Watch(ctx)
				t.Logf("Watch returned after %v: %v", time.Since(start), err)
				return err
			},
		},
		Modes: locktest.Modes{NoShared: true},
	})
}

// TestKeys: the keys of docs/mysql.md (How the lock is held). The values were computed with
// printf %s NAME | sha256sum | cut -c1-55 (and -48 for the slot prefix).
func TestKeys(t *testing.T) {
	for _, tc := range []struct{ name, key string }{
		{"job", "withlock:5e8c9902207afaeb7120430c585a445f21e92932081d64bc99f80e4"},
		{"test-lock", "withlock:a54393f96b8dd28eb1461ed1c905f706dc6b349a45737409907f541"},
		{"zü", "withlock:edb9da4ab08a976f7ce41ebb1b37cfb32ebfda27e2a613df4c07596"},
	} {
		if got := mysql.Key(tc.name); got != tc.key {
			t.Errorf("Key(%q) = %s, want %s", tc.name, got, tc.key)
		}
	}
	if got, want := mysql.SlotKey("job", 0), mysql.Key("job"); got != want {
		t.Errorf("SlotKey(job, 0) = %s, want Key(job) %s", got, want)
	}
	if got, want := mysql.SlotKey("job", 7), "withlock:5e8c9902207afaeb7120430c585a445f21e92932081d64bc:7"; got != want {
		t.Errorf("SlotKey(job, 7) = %s, want %s", got, want)
	}
	seen := map[string]bool{}
	for i := range mysql.MaxHolders {
		k := mysql.SlotKey("job", i)
		if len(k) > 64 || seen[k] {
			t.Fatalf("SlotKey(job, %d) = %s: longer than 64 characters or a duplicate", i, k)
		}
		seen[k] = true
	}
}

// TestGetLockInterop: the lock is GET_LOCK(Key(NAME)), the one a mysql
// client takes, both ways. (The scripts in testdata/script/mysql do the
// same with the real mysql client.)
func TestGetLockInterop(t *testing.T) {
	m := testenv.RequireMariaDB(t)
	b := locktest.Open(t, m.URL, lock.Options{})
	l, err := b.TryAcquire(locktest.Context(t), "test-lock")
	if err != nil {
		t.Fatalf("TryAcquire: %v", err)
	}
	try := fmt.Sprintf("SELECT GET_LOCK('%s', 0)", mysql.Key("test-lock"))
	if got := query(t, m.URL, try); got != "0" {
		t.Errorf("%s while withlock held test-lock: %s, want 0", try, got)
	}
	if err := l.Release(locktest.Context(t)); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if got := query(t, m.URL, try); got != "1" { // its connection ends right after, which frees it
		t.Errorf("%s after withlock released test-lock: %s, want 1", try, got)
	}
}

// TestRefusals: what cannot work is refused before connecting (ErrUsage);
// what the server refuses is ErrRefused at once; a server that is not
// there is ErrUnavailable.
func TestRefusals(t *testing.T) {
	m := testenv.RequireMariaDB(t)
	for _, tc := range []struct {
		url  string
		opts lock.Options
		want string
	}{
		{m.URL, lock.Options{Mode: lock.Shared}, "no shared locks"},
		{m.URL, lock.Options{Mode: lock.Semaphore, MaxHolders: mysql.MaxHolders + 1}, "at most 1000"},
		{m.URL + "?sslmode=disable", lock.Options{}, `unknown parameter "sslmode"`},
		{m.URL + "?tls=maybe", lock.Options{}, "tls must be"},
		{"mysql:///db", lock.Options{}, "no host"},
	} {
		_, err := lock.Open(tc.url, tc.opts)
		if !errors.Is(err, lock.ErrUsage) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Open(%s, %+v): %v; want ErrUsage saying %q", lock.Redact(tc.url), tc.opts, err, tc.want)
		}
	}

	u, _ := url.Parse(m.URL)
	wrongPassword := *u
	wrongPassword.User = url.UserPassword(testenv.MariaDBUser, "hunter22")
	noDatabase := *u
	noDatabase.Path = "/nosuchdb"
	for _, tc := range []struct {
		url  string
		kind error
		want string
	}{
		{wrongPassword.String(), lock.ErrRefused, "Access denied"},
		{noDatabase.String(), lock.ErrRefused, "Unknown database"},
		{"mysql://u:hunter22@127.0.0.1:1/db", lock.ErrUnavailable, "connection refused"},
	} {
		c := locktest.Open(t, tc.url, lock.Options{})
		_, err := c.TryAcquire(locktest.Context(t), "job")
		if !errors.Is(err, tc.kind) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("TryAcquire on %s: %v; want %v saying %q", lock.Redact(tc.url), err, tc.kind, tc.want)
		}
		if strings.Contains(err.Error(), "hunter22") {
			t.Errorf("the error shows the password: %v", err)
		}
	}
}

// TestReadOnly: a read-only server (a replica) is refused at once, and a
// server that becomes read-only while the lock is held is a loss at the
// next Keep (docs/mysql.md, Which servers withlock refuses).
func TestReadOnly(t *testing.T) {
	m := testenv.RequireMariaDB(t)
	holder := locktest.Open(t, m.URL, lock.Options{})
	l, err := holder.TryAcquire(locktest.Context(t), "job")
	if err != nil {
		t.Fatal(err)
	}
	query(t, m.URL, "SET GLOBAL read_only = ON")
	if err := l.Keep(locktest.Context(t)); !errors.Is(err, lock.ErrLost) || !strings.Contains(err.Error(), "read-only") {
		t.Errorf("Keep on a server that became read-only: %v; want ErrLost saying read-only", err)
	}
	c := locktest.Open(t, m.URL, lock.Options{})
	_, err = c.Acquire(locktest.Context(t), "other")
	if !errors.Is(err, lock.ErrRefused) || !strings.Contains(err.Error(), "point withlock at the primary") {
		t.Errorf("Acquire on a read-only server: %v; want ErrRefused naming the fix", err)
	}
	if got := query(t, m.URL, fmt.Sprintf("SELECT IS_FREE_LOCK('%s')", mysql.Key("other"))); got != "1" {
		t.Errorf("the refused attempt took the lock on the read-only server: IS_FREE_LOCK = %s", got)
	}
	query(t, m.URL, "SET GLOBAL read_only = OFF")
}

// TestSilentHolderEnds: the server-side bound of docs/mysql.md. A holder that stops
// talking (here: a lease nobody keeps) has its session ended by the server
// after about the ttl (wait_timeout, whole seconds rounded up), so the
// lock frees itself, and not before.
func TestSilentHolderEnds(t *testing.T) {
	m := testenv.RequireMariaDB(t)
	const ttl = 1500 * time.Millisecond // wait_timeout 2
	a := locktest.Open(t, m.URL, lock.Options{TTL: ttl})
	b := locktest.Open(t, m.URL, lock.Options{})
	if _, err := a.TryAcquire(locktest.Context(t), "job"); err != nil {
		t.Fatal(err)
	}
	took := time.Now()
	ctx, cancel := context.WithTimeout(locktest.Context(t), 15*time.Second)
	defer cancel()
	h, err := b.Acquire(ctx, "job")
	if err != nil {
		t.Fatalf("the silent holder's lock was not freed within 15s: %v", err)
	}
	after := time.Since(took)
	h.Release(locktest.Context(t))
	t.Logf("freed %v after the silent holder took it", after)
	if after < time.Second {
		t.Errorf("freed after %v; want no sooner than wait_timeout (2s) allows", after)
	}
}

// TestCancelledWaitLeavesNothing: a wait given up is killed on the server
// (KILL QUERY from a second connection), so that it does not stay queued
// for a lock that its client no longer wants; a semaphore's too.
func TestCancelledWaitLeavesNothing(t *testing.T) {
	m := testenv.RequireMariaDB(t)
	for _, opts := range []lock.Options{{Mode: lock.Exclusive}, {Mode: lock.Semaphore, MaxHolders: 2}} {
		t.Run(string(opts.Mode), func(t *testing.T) {
			var holds []lock.Lease
			for range max(opts.MaxHolders, 1) {
				l, err := locktest.Open(t, m.URL, opts).TryAcquire(locktest.Context(t), "job")
				if err != nil {
					t.Fatal(err)
				}
				holds = append(holds, l)
			}
			b := locktest.Open(t, m.URL, opts)
			ctx, cancel := context.WithCancel(locktest.Context(t))
			done := make(chan error, 1)
			go func() {
				_, _, err := b.Backend.(lock.Waiter).Acquire(ctx, "job")
				done <- err
			}()
			waitWaiting(t, m.URL)
			cancel()
			if err := <-done; !errors.Is(err, context.Canceled) {
				t.Errorf("cancelled wait: %v; want context.Canceled", err)
			}
			if got := query(t, m.URL, waiting); got != "0" {
				t.Errorf("%s waits left in GET_LOCK after the waiter gave up; want none", got)
			}
			for _, l := range holds {
				l.Release(locktest.Context(t))
			}
		})
	}
}

// TestCancelAsGranted: a wait given up just as the holder lets go either
// returns the lock, or leaves nothing behind: a lock granted to a
// cancelled wait is released (its connection closed), never kept by a
// client that gave up.
func TestCancelAsGranted(t *testing.T) {
	m := testenv.RequireMariaDB(t)
	a := locktest.Open(t, m.URL, lock.Options{})
	b := locktest.Open(t, m.URL, lock.Options{})
	c := locktest.Open(t, m.URL, lock.Options{})
	granted, cancelled := 0, 0
	for i := range 20 {
		la, err := a.TryAcquire(locktest.Context(t), "job")
		if err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
		ctx, cancel := context.WithCancel(locktest.Context(t))
		done := make(chan result, 1)
		go func() {
			l, _, err := b.Backend.(lock.Waiter).Acquire(ctx, "job")
			done <- result{l, err}
		}()
		waitWaiting(t, m.URL)
		go la.Release(locktest.Context(t))
		cancel()
		r := <-done
		if r.err == nil {
			granted++
			if _, err := c.TryAcquire(locktest.Context(t), "job"); !errors.Is(err, lock.ErrHeld) {
				t.Fatalf("round %d: the wait returned the lock, but another client could take it: %v", i, err)
			}
			r.lease.Release(locktest.Context(t))
		} else {
			cancelled++
		}
		// Nothing is left: another client gets the lock within a second.
		deadline := time.Now().Add(time.Second)
		for {
			lc, err := c.TryAcquire(locktest.Context(t), "job")
			if err == nil {
				lc.Release(locktest.Context(t))
				break
			}
			if !errors.Is(err, lock.ErrHeld) || time.Now().After(deadline) {
				t.Fatalf("round %d: a second after the wait was given up: %v", i, err)
			}
			time.Sleep(10 * time.Millisecond)
		}
		if got := query(t, m.URL, waiting); got != "0" {
			t.Fatalf("round %d: %s waits left in GET_LOCK", i, got)
		}
	}
	t.Logf("of 20 waits given up as the lock was freed, %d returned it, %d did not", granted, cancelled)
}

type result struct {
	lease lock.Lease
	err   error
}

type heldResult struct {
	held *lock.Held
	err  error
}

// TestBreakUnprivileged: release --force by a user that may not end the
// holder's session is refused with the server's reason (ErrRefused, 69).
func TestBreakUnprivileged(t *testing.T) {
	m := testenv.RequireMariaDB(t)
	holder := locktest.Open(t, m.URL, lock.Options{})
	l, err := holder.TryAcquire(locktest.Context(t), "job")
	if err != nil {
		t.Fatal(err)
	}
	c := locktest.Open(t, m.UnprivilegedURL(), lock.Options{})
	_, err = c.Break(locktest.Context(t), "job")
	if !errors.Is(err, lock.ErrRefused) || !strings.Contains(err.Error(), "not owner of thread") {
		t.Errorf("Break by %s: %v; want ErrRefused with the server's reason", testenv.MariaDBUnprivileged, err)
	}
	if err := l.Keep(locktest.Context(t)); err != nil {
		t.Errorf("the holder lost its lock to a refused Break: %v", err)
	}
}

// TestWatchServerGone: a server that stops (or restarts) ends the session;
// the holder's Watch says so at once.
func TestWatchServerGone(t *testing.T) {
	m := testenv.RequireMariaDB(t)
	holder := locktest.Open(t, m.URL, lock.Options{})
	l, err := holder.TryAcquire(locktest.Context(t), "job")
	if err != nil {
		t.Fatal(err)
	}
	watched := make(chan error, 1)
	go func() { watched <- l.(lock.Watcher).Watch(locktest.Context(t)) }()
	if err := m.Stop(); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	select {
	case err := <-watched:
		if !errors.Is(err, lock.ErrLost) {
			t.Errorf("Watch when the server stopped: %v; want ErrLost", err)
		}
		t.Logf("Watch returned %v after the server stopped: %v", time.Since(stopped), err)
	case <-time.After(10 * time.Second):
		t.Fatal("Watch did not notice within 10s that the server stopped")
	}
	if err := m.Start(); err != nil {
		t.Fatal(err)
	}
	// The Backend reconnects for its next attempt.
	l2, err := holder.TryAcquire(locktest.Context(t), "job")
	if err != nil {
		t.Fatalf("TryAcquire after the restart: %v", err)
	}
	l2.Release(locktest.Context(t))
}

// TestStatusWithoutPerformanceSchema: on MariaDB as shipped, status shows
// what IS_USED_LOCK and the processlist show (the holder's client address),
// nulls what cannot be known, and the list needs the plugin
// metadata_lock_info, which then shows withlock's locks and the mysql
// client's alike.
func TestStatusWithoutPerformanceSchema(t *testing.T) {
	m := testenv.RequireMariaDB(t, testenv.MariaDBOptions{NoPerformanceSchema: true})
	holder := locktest.Open(t, m.URL, lock.Options{Holder: lock.Holder{Host: "web-1", PID: 4242, Command: []string{"true"}}})
	l, err := holder.TryAcquire(locktest.Context(t), "job")
	if err != nil {
		t.Fatal(err)
	}
	c := locktest.Open(t, m.URL, lock.Options{})
	st, err := c.Inspect(locktest.Context(t), "job")
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Holders) != 1 || st.Mode != lock.Exclusive {
		t.Fatalf("Inspect: %+v; want one exclusive holder", st)
	}
	if h := st.Holders[0]; h.Host != "127.0.0.1" || h.PID != 0 || h.Command != nil || !h.AcquiredAt.IsZero() {
		t.Errorf("holder %+v; want only its client address, 127.0.0.1", h)
	}
	if _, err := c.List(locktest.Context(t)); !errors.Is(err, lock.ErrNotSupported) || !strings.Contains(err.Error(), "metadata_lock_info") {
		t.Errorf("List without performance_schema: %v; want ErrNotSupported naming the plugin", err)
	}

	query(t, m.URL, "INSTALL SONAME 'metadata_lock_info'")
	hold(t, m.URL, "someone-elses-lock")
	states, err := c.List(locktest.Context(t))
	if err != nil {
		t.Fatalf("List with metadata_lock_info: %v", err)
	}
	for _, key := range []string{mysql.Key("job"), "someone-elses-lock"} {
		i := slices.IndexFunc(states, func(st lock.State) bool { return st.Key == key })
		if i < 0 || len(states[i].Holders) != 1 || states[i].Holders[0].Host != "127.0.0.1" {
			t.Errorf("List = %+v; want %s held once, by 127.0.0.1", states, key)
		}
	}
	l.Release(locktest.Context(t))
}

// hold takes key with GET_LOCK on a connection of its own, as another
// client would, until t ends.
func hold(t *testing.T, dbURL, key string) {
	t.Helper()
	db, err := testenv.MySQLDB(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	conn, err := db.Conn(locktest.Context(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	var got int
	if err := conn.QueryRowContext(locktest.Context(t), "SELECT GET_LOCK(?, 0)", key).Scan(&got); err != nil || got != 1 {
		t.Fatalf("GET_LOCK(%s): %d, %v", key, got, err)
	}
}

// TestTLS: the conformance suite over TLS (tls=skip-verify: the server's
// certificate is self-signed), where the lease watches the socket beneath
// TLS; and tls=true refuses that certificate at once.
func TestTLS(t *testing.T) {
	m := testenv.RequireMariaDB(t, testenv.MariaDBOptions{TLS: true})
	locktest.Run(t, locktest.Config{Open: opener(m.URL + "?tls=skip-verify"), CoreOnly: true})
	var cipher string
	c := locktest.Open(t, m.URL+"?tls=skip-verify", lock.Options{})
	l, err := c.TryAcquire(locktest.Context(t), "job")
	if err != nil {
		t.Fatal(err)
	}
	cipher = query(t, m.URL, fmt.Sprintf(`SELECT VARIABLE_VALUE FROM performance_schema.status_by_thread s
		JOIN performance_schema.threads t USING (THREAD_ID)
		WHERE t.PROCESSLIST_ID = IS_USED_LOCK('%s') AND s.VARIABLE_NAME = 'Ssl_cipher'`, mysql.Key("job")))
	if cipher == "" {
		t.Errorf("the holder's session has no TLS cipher")
	}
	t.Logf("the holder's TLS cipher: %s", cipher)
	l.Release(locktest.Context(t))

	v := locktest.Open(t, m.URL+"?tls=true", lock.Options{})
	if _, err := v.TryAcquire(locktest.Context(t), "job"); !errors.Is(err, lock.ErrRefused) {
		t.Errorf("tls=true with a self-signed certificate: %v; want ErrRefused", err)
	}
}

// TestDefaultPort: a URL without a port means 3306.
func TestDefaultPort(t *testing.T) {
	c := locktest.Open(t, "mysql://u:p@127.0.0.1/db", lock.Options{ConnectTimeout: time.Second})
	_, err := c.TryAcquire(locktest.Context(t), "job")
	if err == nil || !strings.Contains(err.Error(), net.JoinHostPort("127.0.0.1", "3306")) {
		t.Errorf("TryAcquire: %v; want it to name 127.0.0.1:3306", err)
	}
}

// TestSemaphoreWaitsInServer: a waiter for a full semaphore waits in
// GET_LOCK on the server (a slot chosen at random), re-issued every
// second, rather than polling every slot ten times a second; and it gets
// the first slot freed, whether or not it waited in that one.
func TestSemaphoreWaitsInServer(t *testing.T) {
	m := testenv.RequireMariaDB(t)
	sem := lock.Options{Mode: lock.Semaphore, MaxHolders: 2}
	a, b, c := locktest.Open(t, m.URL, sem), locktest.Open(t, m.URL, sem), locktest.Open(t, m.URL, sem)
	la, err := a.TryAcquire(locktest.Context(t), "job")
	if err != nil {
		t.Fatal(err)
	}
	lb, err := b.TryAcquire(locktest.Context(t), "job")
	if err != nil {
		t.Fatal(err)
	}
	defer lb.Release(locktest.Context(t))
	ctx, cancel := context.WithCancel(locktest.Context(t))
	defer cancel()
	got := make(chan heldResult, 1)
	go func() {
		h, err := c.Acquire(ctx, "job")
		got <- heldResult{h, err}
	}()
	waitWaiting(t, m.URL)
	// Statements run by anyone in 3s: the waiter's attempts (one a second,
	// or four at most), and maybe a check by each holder (every ttl/3, 5s).
	// Polling every 100ms would be thirty.
	selects := func() int {
		var n int
		fmt.Sscan(strings.Fields(query(t, m.URL, "SHOW GLOBAL STATUS LIKE 'Com_select'"))[1], &n)
		return n
	}
	before := selects()
	time.Sleep(3 * time.Second) // counts what happens meanwhile
	// The last query above ran one SELECT too: SHOW is not one.
	if n := selects() - before; n > 8 {
		t.Errorf("%d statements in 3s while one waiter waited for a full semaphore; want no more than 8", n)
	} else {
		t.Logf("%d statements in 3s while one waiter waited for a full semaphore", n)
	}
	freed := time.Now()
	if err := la.Release(locktest.Context(t)); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-got:
		if r.err != nil {
			t.Fatalf("the waiter: %v", r.err)
		}
		t.Logf("the waiter got the freed slot %v after it was freed", time.Since(freed))
		r.held.Release(locktest.Context(t))
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter did not get the freed slot within 10s")
	}
}

func BenchmarkKey(b *testing.B) {
	for b.Loop() {
		mysql.Key("dbmigration")
	}
}

// BenchmarkRoundTrip is one acquire and release on an open connection.
func BenchmarkRoundTrip(b *testing.B) {
	m := testenv.RequireMariaDB(b)
	locktest.BenchRoundTrip(b, m.URL)
}

// TestOneDial: one attempt is one connection; withlock's wait loop, not the
// driver, tries again.
func TestOneDial(t *testing.T) {
	locktest.RunOneDial(t, func(hostport string) string { return "mysql://u:p@" + hostport + "/db" }, nil)
}

// TestConnectionLimit: a server, or an account, at its connection limit is
// an outage (retried), said as it is, with the server's words, not as a
// server that cannot be reached.
func TestConnectionLimit(t *testing.T) {
	m := testenv.RequireMariaDB(t)
	query(t, m.URL, fmt.Sprintf("ALTER USER '%s'@'%%' WITH MAX_USER_CONNECTIONS 1", testenv.MariaDBUnprivileged))
	hold(t, m.UnprivilegedURL(), "someone-elses-lock") // the account's one connection
	c := locktest.Open(t, m.UnprivilegedURL(), lock.Options{})
	_, err := c.TryAcquire(locktest.Context(t), "job")
	if !errors.Is(err, lock.ErrUnavailable) || !strings.Contains(err.Error(), "is at its connection limit: ") ||
		!strings.Contains(err.Error(), "max_user_connections") || strings.Contains(err.Error(), "cannot reach") {
		t.Errorf("TryAcquire by an account at its connection limit: %v; want ErrUnavailable saying so in the server's words", err)
	}
}
