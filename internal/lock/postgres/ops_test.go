package postgres_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/withlock/withlock/internal/lock"
	"github.com/withlock/withlock/internal/lock/locktest"
	"github.com/withlock/withlock/internal/lock/postgres"
	"github.com/withlock/withlock/internal/testenv"
)

// connect opens a plain pgx connection to dbURL, closed with t: another
// tool's session (psql, the npm advisory-lock).
func connect(t *testing.T, dbURL string, appName string) *pgx.Conn {
	t.Helper()
	config, err := pgx.ParseConfig(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	if appName != "" {
		config.RuntimeParams["application_name"] = appName
	}
	c, err := pgx.ConnectConfig(locktest.Context(t), config)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

func exec(t *testing.T, c *pgx.Conn, sql string, args ...any) {
	t.Helper()
	if _, err := c.Exec(locktest.Context(t), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// waitTrue waits until sql on dbURL answers true.
func waitTrue(t *testing.T, dbURL, sql string) {
	t.Helper()
	testenv.WaitFor(t, sql+" to answer true", func() bool { return query(t, dbURL, sql) == "t" })
}

// TestRecordShown: the holder's record is the first value of its
// statements, so pg_stat_activity shows it (quotes and all) and status
// reads it back, from the statement that took the lock and from every
// check after it; the time of the grant stays the same.
func TestRecordShown(t *testing.T) {
	db := database(t, testenv.RequirePostgres(t))
	argv := []string{"sh", "-c", "echo it's \"quoted\"; -- not a comment\n", "zürich"}
	holder := lock.Holder{Host: "web-1", PID: 4242, Command: argv}
	a, b := locktest.Open(t, db, lock.Options{Holder: holder}), locktest.Open(t, db, lock.Options{})
	l, err := a.TryAcquire(locktest.Context(t), "job")
	if err != nil {
		t.Fatal(err)
	}
	shown := query(t, db, `select query from pg_stat_activity where application_name like 'withlock 4242@%'`)
	if !strings.HasPrefix(shown, `select  '{"withlock":1,"host":"web-1","pid":4242,"name":"job","command":["sh","-c","echo it''s \"quoted\"; -- not a comment\n","zürich"]}'`) {
		t.Errorf("pg_stat_activity.query of the holder: %q; want it to start with the record", shown)
	}
	st, err := b.Inspect(locktest.Context(t), "job")
	if err != nil || len(st.Holders) != 1 {
		t.Fatalf("Inspect: %+v, %v; want one holder", st, err)
	}
	first := st.Holders[0]
	if first.Host != "web-1" || first.PID != 4242 || !slices.Equal(first.Command, argv) || !strings.HasPrefix(first.Session, "postgres pid ") {
		t.Errorf("holder %+v; want web-1 pid 4242, its command and its session", first)
	}
	if d := time.Since(first.AcquiredAt); d < -time.Minute || d > time.Minute {
		t.Errorf("acquired at %v; want about now", first.AcquiredAt)
	}
	if err := l.Keep(locktest.Context(t)); err != nil {
		t.Fatal(err)
	}
	if shown := query(t, db, `select query from pg_stat_activity where application_name like 'withlock 4242@%'`); !strings.Contains(shown, `"at":"`) {
		t.Errorf("pg_stat_activity.query after a check: %q; want the record with the time of the grant", shown)
	}
	st, err = b.Inspect(locktest.Context(t), "job")
	if err != nil || len(st.Holders) != 1 {
		t.Fatalf("Inspect after a check: %+v, %v", st, err)
	}
	if d := st.Holders[0].AcquiredAt.Sub(first.AcquiredAt).Abs(); d > time.Second || !slices.Equal(st.Holders[0].Command, argv) {
		t.Errorf("after a check: acquired at %v, command %q; want %v and the same command", st.Holders[0].AcquiredAt, st.Holders[0].Command, first.AcquiredAt)
	}
	l.Release(locktest.Context(t))
}

// TestOtherTools: status lists every advisory lock in the database,
// whoever took it, by its keys where no holder names it, with what the
// session shows; release --force breaks another tool's lock too.
func TestOtherTools(t *testing.T) {
	db := database(t, testenv.RequirePostgres(t))
	psql := connect(t, db, "psql")
	exec(t, psql, "select pg_advisory_lock(1, 2), pg_advisory_lock_shared(42::int8)")
	npm := connect(t, db, "") // the npm advisory-lock sets no application_name
	k1, k2 := postgres.Keys("test-lock")
	exec(t, npm, "select pg_advisory_lock($1::int4, $2::int4)", k1, k2)
	tx := connect(t, db, "")
	exec(t, tx, "begin")
	exec(t, tx, "select pg_advisory_xact_lock(7, 8)")
	c := locktest.Open(t, db, lock.Options{Holder: lock.Holder{Host: "web-1", PID: 4242, Command: []string{"true"}}})
	l, err := c.TryAcquire(locktest.Context(t), "job")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(locktest.Context(t))

	ops := locktest.Open(t, db, lock.Options{})
	all, err := ops.List(locktest.Context(t))
	if err != nil {
		t.Fatal(err)
	}
	find := func(nameOrKey string) lock.State {
		t.Helper()
		i := slices.IndexFunc(all, func(st lock.State) bool { return st.Name == nameOrKey || st.Key == nameOrKey })
		if i < 0 {
			t.Fatalf("List does not show %s: %+v", nameOrKey, all)
		}
		return all[i]
	}
	if len(all) != 5 {
		t.Errorf("List: %d locks; want 5: %+v", len(all), all)
	}
	if st := find("job"); st.Mode != lock.Exclusive || len(st.Holders) != 1 || st.Holders[0].PID != 4242 {
		t.Errorf("job: %+v; want withlock's holder", st)
	}
	st := find("advisory lock (1, 2)")
	if st.Name != "" || st.Mode != lock.Exclusive || len(st.Holders) != 1 {
		t.Fatalf("psql's lock: %+v", st)
	}
	if h := st.Holders[0]; h.Host != "127.0.0.1" || h.PID != 0 || h.Command != nil ||
		!strings.Contains(h.Session, `application_name "psql"`) || !strings.Contains(h.Session, "user withlock") || !strings.Contains(h.Session, "connected ") {
		t.Errorf("psql's session: %+v; want its address, no pid or command, and what the session shows", h)
	}
	if st := find("advisory lock (42)"); st.Mode != lock.Shared || len(st.Holders) != 1 {
		t.Errorf("psql's bigint lock: %+v; want shared, one holder", st)
	}
	if st := find(fmt.Sprintf("advisory lock (%d, %d)", k1, k2)); st.Name != "" || st.Mode != lock.Exclusive {
		t.Errorf("the npm tool's lock: %+v; want it by its keys: its session does not name it", st)
	}
	if st := find("advisory lock (7, 8)"); st.Mode != lock.Exclusive {
		t.Errorf("a transaction's lock: %+v", st)
	}

	// NAME's keys are the npm tool's lock: Inspect names it, Break ends
	// its session.
	st, err = ops.Inspect(locktest.Context(t), "test-lock")
	if err != nil || len(st.Holders) != 1 || st.Mode != lock.Exclusive {
		t.Fatalf("Inspect(test-lock): %+v, %v; want the npm tool's session", st, err)
	}
	broken, err := ops.Break(locktest.Context(t), "test-lock")
	if err != nil || len(broken) != 1 || broken[0].Session != st.Holders[0].Session {
		t.Fatalf("Break(test-lock): %+v, %v; want the npm tool's session broken", broken, err)
	}
	if _, err := npm.Exec(locktest.Context(t), "select 1"); err == nil {
		t.Error("the npm tool's session still works after Break")
	}
	mustTake(t, ops, "test-lock")
}

func mustTake(t *testing.T, c *lock.Client, name string) {
	t.Helper()
	l, err := c.TryAcquire(locktest.Context(t), name)
	if err != nil {
		t.Fatalf("TryAcquire(%s): %v", name, err)
	}
	l.Release(locktest.Context(t))
}

// role creates a login role (plus grants) and returns dbURL as that role.
func role(t *testing.T, dbURL, grants string) string {
	t.Helper()
	b := make([]byte, 4)
	rand.Read(b)
	name := "r_" + hex.EncodeToString(b)
	query(t, dbURL, fmt.Sprintf("create role %s login password 'pw-%s' %s", name, name, grants))
	u, _ := url.Parse(dbURL)
	u.User = url.UserPassword(name, "pw-"+name)
	return u.String()
}

// TestBreakPrivileges: ending another role's session needs the privilege;
// without it release --force is refused with the server's reason, and
// the holder keeps its lock. status as another role sees what
// pg_stat_activity shows it: the application_name, not the record.
func TestBreakPrivileges(t *testing.T) {
	db := database(t, testenv.RequirePostgres(t))
	app := role(t, db, "")
	holder := locktest.Open(t, app, lock.Options{Holder: lock.Holder{Host: "web-1", PID: 4242, Command: []string{"migrate", "up"}}})
	l, err := holder.TryAcquire(locktest.Context(t), "job")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(locktest.Context(t))

	ops := locktest.Open(t, role(t, db, ""), lock.Options{})
	st, err := ops.Inspect(locktest.Context(t), "job")
	if err != nil || len(st.Holders) != 1 {
		t.Fatalf("Inspect as another role: %+v, %v", st, err)
	}
	if h := st.Holders[0]; h.PID != 4242 || h.Host != "web-1" || h.Command != nil || !h.AcquiredAt.IsZero() {
		t.Errorf("holder seen by another role: %+v; want pid and host from application_name, no command or time", h)
	}
	_, err = ops.Break(locktest.Context(t), "job")
	if !errors.Is(err, lock.ErrRefused) || !strings.Contains(err.Error(), "SQLSTATE 42501") || !strings.Contains(err.Error(), "pg_signal_backend") {
		t.Errorf("Break without the privilege: %v; want ErrRefused with the server's reason", err)
	}
	t.Log(err)
	if err := l.Keep(locktest.Context(t)); err != nil {
		t.Errorf("the holder lost its lock to a refused Break: %v", err)
	}

	reader := locktest.Open(t, role(t, db, "in role pg_read_all_stats"), lock.Options{})
	if st, err := reader.Inspect(locktest.Context(t), "job"); err != nil || len(st.Holders) != 1 || !slices.Equal(st.Holders[0].Command, []string{"migrate", "up"}) {
		t.Errorf("Inspect with pg_read_all_stats: %+v, %v; want the record", st, err)
	}

	signaller := locktest.Open(t, role(t, db, "in role pg_signal_backend"), lock.Options{})
	broken, err := signaller.Break(locktest.Context(t), "job")
	if err != nil || len(broken) != 1 || broken[0].PID != 4242 {
		t.Fatalf("Break as a member of pg_signal_backend: %+v, %v", broken, err)
	}
	if err := l.Keep(locktest.Context(t)); !errors.Is(err, lock.ErrLost) {
		t.Errorf("the broken holder's Keep: %v; want ErrLost", err)
	}
}

// TestQueueFairness: PostgreSQL queues lock requests. A waiting exclusive
// request holds back every later request on NAME (shared, a semaphore's
// slot), even tries, so a stream of shared holders cannot starve it; the
// later ones are served after it, in order.
func TestQueueFairness(t *testing.T) {
	db := database(t, testenv.RequirePostgres(t))
	shared := lock.Options{Mode: lock.Shared}
	a := locktest.Open(t, db, shared)
	la, err := a.TryAcquire(locktest.Context(t), "job")
	if err != nil {
		t.Fatal(err)
	}
	x := locktest.Open(t, db, lock.Options{Holder: lock.Holder{Host: "x", PID: 7001}})
	gotX := wait(t, x, "job")
	k1, k2 := postgres.Keys("job")
	waitTrue(t, db, fmt.Sprintf(`select exists(select 1 from pg_locks where locktype = 'advisory' and not granted
		and mode = 'ExclusiveLock' and classid::int8 = %d and objid::int8 = %d)`, uint32(k1), uint32(k2)))

	if _, err := locktest.Open(t, db, shared).TryAcquire(locktest.Context(t), "job"); !errors.Is(err, lock.ErrHeld) {
		t.Errorf("a shared try while an exclusive request waits: %v; want ErrHeld", err)
	}
	if _, err := locktest.Open(t, db, lock.Options{Mode: lock.Semaphore, MaxHolders: 3}).TryAcquire(locktest.Context(t), "job"); !errors.Is(err, lock.ErrHeld) {
		t.Errorf("a semaphore's try while an exclusive request waits: %v; want ErrHeld", err)
	}
	d := locktest.Open(t, db, shared)
	gotD := wait(t, d, "job")
	notYet(t, gotX, gotD)
	if err := la.Release(locktest.Context(t)); err != nil {
		t.Fatal(err)
	}
	lx := got(t, gotX)
	notYet(t, gotD)
	lx.Release(locktest.Context(t))
	got(t, gotD).Release(locktest.Context(t))
}

type result struct {
	l   lock.Lease
	err error
}

// wait waits for name through c's lock.Waiter on a goroutine.
func wait(t *testing.T, c *lock.Client, name string) <-chan result {
	ch := make(chan result, 1)
	done := make(chan struct{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	go func() {
		defer close(done)
		l, _, err := c.Backend.(lock.Waiter).Acquire(ctx, name)
		ch <- result{l, err}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return ch
}

// notYet checks that none of the waits has returned a moment later.
func notYet(t *testing.T, chs ...<-chan result) {
	t.Helper()
	time.Sleep(300 * time.Millisecond) // checks that something does not happen
	for i, ch := range chs {
		select {
		case r := <-ch:
			t.Fatalf("wait %d returned out of turn: %v", i, r.err)
		default:
		}
	}
}

func got(t *testing.T, ch <-chan result) lock.Lease {
	t.Helper()
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatalf("wait: %v", r.err)
		}
		return r.l
	case <-time.After(30 * time.Second):
		t.Fatal("wait did not return within 30s")
	}
	return nil
}

// TestSemaphoreWakes: a semaphore's waiter is woken when a slot frees,
// however it frees, without polling: by a release (NOTIFY), by the end of
// the session whose slot its detector waits for, by a check of a
// remaining holder when another holder's session ended without a word,
// and by the release of an exclusive holder.
func TestSemaphoreWakes(t *testing.T) {
	db := database(t, testenv.RequirePostgres(t))
	sem := func(pid int) lock.Options {
		return lock.Options{Mode: lock.Semaphore, MaxHolders: 2, Holder: lock.Holder{Host: "h", PID: pid}}
	}
	// sessionOf is the server pid of the session holding slot i of name.
	slotHolder := func(name string, i int) string {
		k := postgres.SlotKey(name, i)
		return query(t, db, fmt.Sprintf(`select pid from pg_locks where locktype = 'advisory' and objsubid = 1 and granted
			and classid::int8 = %d and objid::int8 = %d`, uint64(k)>>32, uint32(k)))
	}
	// detected is the slot the waiter's detector waits for, once it waits.
	detected := func(name string) int {
		k := postgres.SlotKey(name, 0)
		sql := fmt.Sprintf(`select exists(select 1 from pg_locks where locktype = 'advisory' and objsubid = 1 and not granted
			and classid::int8 = %d and objid::int8 >> 16 = %d)`, uint64(k)>>32, uint32(k)>>16)
		waitTrue(t, db, sql)
		var i int
		fmt.Sscan(query(t, db, fmt.Sprintf(`select objid::int8 & 65535 from pg_locks where locktype = 'advisory' and objsubid = 1 and not granted
			and classid::int8 = %d and objid::int8 >> 16 = %d`, uint64(k)>>32, uint32(k)>>16)), &i)
		return i
	}
	terminate := func(pid string) {
		t.Helper()
		query(t, db, "select pg_terminate_backend("+pid+", 30000)")
	}
	// full has two holders (pids 1 and 2) fill the semaphore name, and a
	// third wait.
	full := func(t *testing.T, name string) (la, lb lock.Lease, w <-chan result) {
		t.Helper()
		la, _ = locktest.Open(t, db, sem(1)).TryAcquire(locktest.Context(t), name)
		lb, _ = locktest.Open(t, db, sem(2)).TryAcquire(locktest.Context(t), name)
		if la == nil || lb == nil {
			t.Fatal("the holders could not take their slots")
		}
		return la, lb, wait(t, locktest.Open(t, db, sem(3)), name)
	}

	t.Run("every holder's session ends", func(t *testing.T) {
		name := locktest.Name(t)
		_, _, w := full(t, name)
		detected(name)
		// As if both holders' hosts died: no release, no NOTIFY, no check.
		terminate(slotHolder(name, 0))
		terminate(slotHolder(name, 1))
		got(t, w).Release(locktest.Context(t))
	})

	t.Run("another holder's session ends", func(t *testing.T) {
		name := locktest.Name(t)
		la, lb, w := full(t, name)
		watched := detected(name)
		survivor := map[int]lock.Lease{0: la, 1: lb}[watched] // slots are taken in order: a has 0
		waiterActivity := `select string_agg(query_start::text, ',' order by pid) from pg_stat_activity where application_name like 'withlock 3@%'`
		before := query(t, db, waiterActivity)
		terminate(slotHolder(name, 1-watched))
		// Nothing tells the waiter yet, and it does not poll: no statement
		// of its sessions starts meanwhile.
		notYet(t, w)
		time.Sleep(700 * time.Millisecond) // more of the same: checks that nothing happens
		if after := query(t, db, waiterActivity); after != before {
			t.Errorf("the waiter's sessions ran statements while it waited: %s, then %s", before, after)
		}
		// The survivor's next check sees a free slot and a waiter.
		if err := survivor.Keep(locktest.Context(t)); err != nil {
			t.Fatal(err)
		}
		got(t, w).Release(locktest.Context(t))
	})

	t.Run("a holder releases", func(t *testing.T) {
		name := locktest.Name(t)
		la, lb, w := full(t, name)
		watched := detected(name)
		// The holder whose slot the detector does not watch: only the NOTIFY
		// of its release can wake the waiter.
		l := map[int]lock.Lease{0: lb, 1: la}[watched]
		if err := l.Release(locktest.Context(t)); err != nil {
			t.Fatal(err)
		}
		got(t, w).Release(locktest.Context(t))
	})

	t.Run("an exclusive holder releases", func(t *testing.T) {
		name := locktest.Name(t)
		lx, err := locktest.Open(t, db, lock.Options{}).TryAcquire(locktest.Context(t), name)
		if err != nil {
			t.Fatal(err)
		}
		w := wait(t, locktest.Open(t, db, sem(3)), name)
		k1, k2 := postgres.Keys(name)
		waitTrue(t, db, fmt.Sprintf(`select exists(select 1 from pg_locks where locktype = 'advisory' and not granted
			and mode = 'ShareLock' and classid::int8 = %d and objid::int8 = %d)`, uint32(k1), uint32(k2)))
		notYet(t, w)
		lx.Release(locktest.Context(t))
		got(t, w).Release(locktest.Context(t))
	})
}

// TestEveryModeRefused: the standby and transaction-pooler checks apply
// in every mode, to a single attempt and to a wait, and leave nothing
// locked.
func TestEveryModeRefused(t *testing.T) {
	p := testenv.RequirePostgres(t)
	standby, err := p.StartStandby()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { standby.Close() })
	bouncer := testenv.RequirePgBouncer(t, p.URL, "transaction", 2)
	for _, opts := range []lock.Options{{Mode: lock.Shared}, {Mode: lock.Semaphore, MaxHolders: 3}} {
		for _, server := range []struct{ name, url, says string }{
			{"standby", standby.URL, "is a hot standby"},
			{"transaction pooler", bouncer.URL, "shares server sessions between clients"},
		} {
			for _, waits := range []bool{false, true} {
				t.Run(fmt.Sprintf("%s/%s/wait %v", opts.Mode, server.name, waits), func(t *testing.T) {
					c := locktest.Open(t, server.url, opts)
					if waits {
						_, _, err = c.Backend.(lock.Waiter).Acquire(locktest.Context(t), "job")
					} else {
						_, err = c.TryAcquire(locktest.Context(t), "job")
					}
					if !errors.Is(err, lock.ErrRefused) || !strings.Contains(err.Error(), server.says) {
						t.Errorf("%v; want ErrRefused: ... %s ...", err, server.says)
					}
				})
			}
		}
	}
	for _, u := range []string{standby.URL, p.URL} {
		if got := query(t, u, advisoryLocks); got != "0" {
			t.Errorf("%s advisory locks left on %s", got, lock.Redact(u))
		}
	}
	// status and release --force on a standby would see none of the
	// primary's locks.
	c := locktest.Open(t, standby.URL, lock.Options{})
	if _, err := c.Inspect(locktest.Context(t), "job"); !errors.Is(err, lock.ErrRefused) {
		t.Errorf("Inspect on a standby: %v; want ErrRefused", err)
	}
	if _, err := c.Break(locktest.Context(t), "job"); !errors.Is(err, lock.ErrRefused) {
		t.Errorf("Break on a standby: %v; want ErrRefused", err)
	}
}

// TestSemaphoreLimit: N and the slot number have 16 bits each in the keys;
// a larger N is refused before connecting.
func TestSemaphoreLimit(t *testing.T) {
	_, err := lock.Open("postgres://u@127.0.0.1:1/db", lock.Options{Mode: lock.Semaphore, MaxHolders: 65536})
	if !errors.Is(err, lock.ErrUsage) || !strings.Contains(err.Error(), "at most 65535") {
		t.Errorf("Open with N = 65536: %v; want ErrUsage: at most 65535", err)
	}
	if _, err := lock.Open("postgres://u@127.0.0.1:1/db", lock.Options{Mode: lock.Semaphore, MaxHolders: 65535}); err != nil {
		t.Errorf("Open with N = 65535: %v", err)
	}
}
