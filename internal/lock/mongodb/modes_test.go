package mongodb_test

import (
	"context"
	"errors"
	"log/slog"
	"net/url"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/withlock/withlock/internal/lock"
	"github.com/withlock/withlock/internal/lock/locktest"
	"github.com/withlock/withlock/internal/lock/mongodb"
	"github.com/withlock/withlock/internal/stress/faultproxy"
	"github.com/withlock/withlock/internal/testenv"
)

// newest is the newest document of name.
func newest(t *testing.T, url, name string) doc {
	t.Helper()
	docs := chain(t, locks(t, url), name)
	if len(docs) == 0 {
		t.Fatalf("no documents of %q", name)
	}
	return docs[len(docs)-1]
}

// An exclusive waiter kept out by shared holders marks itself waiting: new
// shared holders then wait, while those inside renew as usual; once they
// have gone, the exclusive waiter takes the lock, and its mark goes with
// it. A waiter that gives up takes its mark back when closed; --no-wait
// marks nothing.
func TestWriterMark(t *testing.T) {
	m := testenv.RequireMongo(t)
	name := locktest.Name(t)
	shared := func() *lock.Client {
		return locktest.Open(t, m.URL, lock.Options{Mode: lock.Shared, TTL: 10 * time.Second})
	}
	s1, s2, s3 := shared(), shared(), shared()
	x := locktest.Open(t, m.URL, lock.Options{Holder: lock.Holder{Host: "writer", PID: 7}})
	l1, l2 := mustTake(t, s1, name), mustTake(t, s2, name)

	nowait := locktest.Open(t, m.URL, lock.Options{NoWait: true})
	if _, err := nowait.TryAcquire(locktest.Context(t), name); !errors.Is(err, lock.ErrHeld) {
		t.Fatalf("exclusive --no-wait TryAcquire of a shared lock: %v; want ErrHeld", err)
	}
	if d := newest(t, m.URL, name); d.Writer != nil {
		t.Errorf("--no-wait left a mark: %+v", d)
	}

	if _, err := x.TryAcquire(locktest.Context(t), name); !errors.Is(err, lock.ErrHeld) {
		t.Fatalf("exclusive TryAcquire of a shared lock: %v; want ErrHeld", err)
	}
	d := newest(t, m.URL, name)
	if d.Writer == nil || d.Op != "mark" || len(d.Holders) != 2 {
		t.Fatalf("after the exclusive waiter's attempt: %+v; want a mark with both shared holders", d)
	}
	if left := time.Until(d.Writer.Until); left <= 0 || left > mongodb.MarkTTL+time.Second {
		t.Errorf("the mark runs until %v, %v from now; want about %v", d.Writer.Until, left, mongodb.MarkTTL)
	}

	_, err := s3.TryAcquire(locktest.Context(t), name)
	if left, ok := lock.Remaining(err); !errors.Is(err, lock.ErrHeld) || !ok || left > mongodb.MarkTTL {
		t.Fatalf("a new shared holder under the mark: %v (in %v); want ErrHeld until the mark runs out", err, left)
	}
	if err := l1.Keep(locktest.Context(t)); err != nil {
		t.Fatalf("a shared holder's renewal under the mark: %v", err)
	}
	if d := newest(t, m.URL, name); d.Writer == nil {
		t.Errorf("the renewal dropped the mark: %+v", d)
	}

	mustRelease(t, l1)
	mustRelease(t, l2)
	lx, err := x.TryAcquire(locktest.Context(t), name)
	if err != nil {
		t.Fatalf("the exclusive waiter once the shared holders are gone: %v", err)
	}
	if d := newest(t, m.URL, name); d.Writer != nil {
		t.Errorf("the exclusive holder's state keeps the mark: %+v", d)
	}
	mustRelease(t, lx)
	l3 := mustTake(t, s3, name)

	// A waiter that gives up: Close takes its mark back.
	x2 := locktest.Open(t, m.URL, lock.Options{})
	if _, err := x2.TryAcquire(locktest.Context(t), name); !errors.Is(err, lock.ErrHeld) {
		t.Fatalf("exclusive TryAcquire of a shared lock: %v; want ErrHeld", err)
	}
	if d := newest(t, m.URL, name); d.Writer == nil {
		t.Fatalf("no mark: %+v", d)
	}
	if err := x2.Close(); err != nil {
		t.Fatal(err)
	}
	if d := newest(t, m.URL, name); d.Writer != nil || d.Op != "unmark" || len(d.Holders) != 1 {
		t.Errorf("after the waiter's Close: %+v; want its mark gone, the holder still there", d)
	}
	mustRelease(t, l3)
}

// Shared holders renewing at the same moment race for the same _id: each
// round lets one through, and an attempt allows a round for every holder,
// so that none is starved by its peers; it costs O(n²) writes and reads,
// though. 8 at once renew well within the time a renewal has before the
// next one is due.
func TestSharedRenewalsAtOnce(t *testing.T) {
	m := testenv.RequireMongo(t)
	const n, ttl, times = 8, 15 * time.Second, 5
	name := locktest.Name(t)
	leases := make([]lock.Lease, n)
	for i := range leases {
		c := locktest.Open(t, m.URL, lock.Options{Mode: lock.Shared, TTL: ttl})
		leases[i] = mustTake(t, c, name)
	}
	var took []time.Duration
	for range times {
		var (
			wg    sync.WaitGroup
			mu    sync.Mutex
			start = make(chan struct{})
		)
		for _, l := range leases {
			wg.Go(func() {
				<-start
				sent := time.Now()
				err := l.Keep(locktest.Context(t))
				mu.Lock()
				defer mu.Unlock()
				took = append(took, time.Since(sent))
				if err != nil {
					t.Errorf("a renewal among %d at once: %v", n, err)
				}
			})
		}
		close(start) // all at once
		wg.Wait()
	}
	slices.Sort(took)
	t.Logf("%d shared holders renewing at once, %d times: a renewal took %v at the median, %v at most", n, times, took[len(took)/2].Round(time.Millisecond), took[len(took)-1].Round(time.Millisecond))
	// lock.Held renews every ttl/3 and gives up at ttl - grace (ttl/3
	// here): a renewal has ttl/3.
	if slow := took[len(took)-1]; slow > ttl/3 {
		t.Errorf("a renewal took %v; it has %v", slow, ttl/3)
	}
	if d := newest(t, m.URL, name); len(d.Holders) != n {
		t.Errorf("%d holders after the renewals; want %d", len(d.Holders), n)
	}
	for _, l := range leases {
		mustRelease(t, l)
	}
}

// 16 shared holders as withlock runs them: waiting behind an exclusive
// holder (lock.Client.Acquire), let in together when it releases, then kept
// by lock.Held, renewing every ttl/3 from when each got in, for three
// rounds. None loses its lock. A renewal that had to be retried is logged,
// not failed: FerretDB spends about 1.5 ms of CPU on each operation, and a
// shared holder's renewal is several (read, insert, read back) racing 15
// others, so on a small, busy machine with the race detector one attempt
// can take longer than ttl/3. The ttl is twice the default for the same
// reason, so that such a machine tests the holders rather than FerretDB's
// speed.
func TestSharedHolders(t *testing.T) {
	m := testenv.RequireMongo(t)
	const n, ttl = 16, 2 * lock.DefaultTTL
	name := locktest.Name(t)
	x := locktest.Open(t, m.URL, lock.Options{})
	lx := mustTake(t, x, name)
	var (
		mu       sync.Mutex
		warnings []string
		waiting  int
		helds    = make([]*lock.Held, n)
		wg       sync.WaitGroup
	)
	for i := range helds {
		log := slog.New(logHandler(func(r slog.Record) {
			mu.Lock()
			defer mu.Unlock()
			switch {
			case r.Level >= slog.LevelWarn:
				msg := r.Message
				r.Attrs(func(a slog.Attr) bool {
					msg += " " + a.String()
					return true
				})
				warnings = append(warnings, msg)
			case r.Message == "held; waiting":
				waiting++
			}
		}))
		c := locktest.Open(t, m.URL, lock.Options{Mode: lock.Shared, TTL: ttl, Log: log})
		wg.Go(func() {
			h, err := c.Acquire(locktest.Context(t), name)
			if err != nil {
				t.Errorf("shared Acquire: %v", err)
				return
			}
			helds[i] = h
		})
	}
	testenv.WaitFor(t, "every shared waiter waiting", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return waiting == n
	})
	mustRelease(t, lx)
	wg.Wait()
	start := time.Now()
	const rounds = 3
	time.Sleep(rounds * ttl / 3) // renewals are what this test watches: let them happen
	for i, h := range helds {
		if h == nil {
			continue
		}
		select {
		case <-h.Lost():
			t.Errorf("holder %d lost its lock: %v", i, h.Err())
		default:
		}
		switch err := h.Release(locktest.Context(t)); {
		case errors.Is(err, lock.ErrUnavailable):
			// A release that FerretDB, busy with the others' renewals, did
			// not answer in time: withlock warns and leaves the lease to
			// run out, as a renewal retried is only logged here.
			t.Logf("holder %d: Release: %v", i, err)
		case err != nil:
			t.Errorf("holder %d: Release: %v", i, err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	t.Logf("%d shared holders kept for %v (%d renewals each)", n, time.Since(start).Round(time.Millisecond), rounds)
	for _, w := range warnings {
		t.Logf("a holder warned (a renewal retried): %s", w)
	}
}

// A waiter's poll of a held lock is one operation, a read by _id, and it
// reads the server's time only when a takeover is possible: it says how
// long the holder's lease has left from the server's time as last read.
func TestPollCost(t *testing.T) {
	m := testenv.RequireMongo(t)
	u, err := url.Parse(m.URL)
	if err != nil {
		t.Fatal(err)
	}
	p := startProxy(t, u.Host)
	var (
		mu   sync.Mutex
		msgs []faultproxy.Message
	)
	p.SetRule(func(msg faultproxy.Message) faultproxy.Action {
		mu.Lock()
		msgs = append(msgs, msg)
		mu.Unlock()
		return faultproxy.Action{}
	})
	// ops counts the commands f sent, by name, on the connections that
	// carry the backend's work (not the driver's monitor, whose hellos
	// come every 10s).
	ops := func(f func()) map[string]int {
		t.Helper()
		mu.Lock()
		from := len(msgs)
		mu.Unlock()
		f()
		mu.Lock()
		defer mu.Unlock()
		work := map[int64]bool{}
		for _, msg := range msgs {
			if msg.Kind == "find" || msg.Kind == "insert" {
				work[msg.Conn] = true
			}
		}
		n := map[string]int{}
		for _, msg := range msgs[from:] {
			if work[msg.Conn] && msg.Index > 1 {
				n[msg.Kind]++
			}
		}
		return n
	}

	const ttl = 10 * time.Second
	holder := locktest.Open(t, m.URL, lock.Options{TTL: ttl})
	waiter := locktest.Open(t, "mongodb://"+p.Addr()+"/", lock.Options{})
	name := locktest.Name(t)
	l := mustTake(t, holder, name)
	poll := func() (time.Duration, map[string]int) {
		t.Helper()
		var err error
		n := ops(func() { _, err = waiter.TryAcquire(locktest.Context(t), name) })
		left, ok := lock.Remaining(err)
		if !errors.Is(err, lock.ErrHeld) || !ok || left <= 0 || left > ttl {
			t.Fatalf("a poll of a held lock: %v (%v left); want ErrHeld with the time the lease has left", err, left)
		}
		return left, n
	}
	if _, n := poll(); n["find"] != 1 || n["hello"] != 1 || len(n) != 2 {
		t.Errorf("the first poll: %v; want the newest state and the server's time", n)
	}
	for range 3 {
		if _, n := poll(); n["find"] != 1 || len(n) != 1 {
			t.Errorf("a poll of an unchanged lock: %v; want one find, nothing else", n)
		}
	}
	if err := l.Keep(locktest.Context(t)); err != nil {
		t.Fatal(err)
	}
	if left, n := poll(); n["find"] != 2 || len(n) != 1 || left < ttl-2*time.Second {
		t.Errorf("a poll after a renewal: %v, %v left; want two finds by _id (the renewal, and nothing after it) and the renewed lease", n, left)
	}
	mustRelease(t, l)
	n := ops(func() {
		l, err := waiter.TryAcquire(locktest.Context(t), name)
		if err != nil {
			t.Fatalf("TryAcquire of the released lock: %v", err)
		}
		mustRelease(t, l)
	})
	if n["find"] != 3 || n["hello"] != 1 || n["insert"] != 2 {
		t.Errorf("acquiring a released lock and releasing it: %v; want 3 finds (two polls by _id, the check), a hello, two inserts", n)
	}
}

// Documents younger than spare are not deleted, so that a waiter that
// polls by _id finds every state written since its last poll; older ones
// are.
func TestDocumentsSpared(t *testing.T) {
	m := testenv.RequireMongo(t)
	b := locktest.Open(t, m.URL, lock.Options{TTL: 10 * time.Second})
	name := locktest.Name(t)
	l := mustTake(t, b, name)
	const renewals = 4 * mongodb.Keep
	for range renewals {
		if err := l.Keep(locktest.Context(t)); err != nil {
			t.Fatal(err)
		}
	}
	if docs := chain(t, locks(t, m.URL), name); len(docs) != renewals+1 {
		t.Errorf("%d documents after an acquisition and %d renewals within %v; want all of them", len(docs), renewals, mongodb.Spare)
	}
	time.Sleep(mongodb.Spare) // the time that must pass is what this test is about
	if err := l.Keep(locktest.Context(t)); err != nil {
		t.Fatal(err)
	}
	if docs := chain(t, locks(t, m.URL), name); len(docs) > mongodb.Keep+2 {
		t.Errorf("%d documents once they are older than %v; want at most %d", len(docs), mongodb.Spare, mongodb.Keep+2)
	}
	mustRelease(t, l)
}

// logHandler is a slog.Handler that hands every record to a function.
type logHandler func(slog.Record)

func (h logHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h logHandler) Handle(_ context.Context, r slog.Record) error {
	h(r)
	return nil
}

func (h logHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h logHandler) WithGroup(string) slog.Handler      { return h }

// mustTake takes name through c at once.
func mustTake(t *testing.T, c *lock.Client, name string) lock.Lease {
	t.Helper()
	l, err := c.TryAcquire(locktest.Context(t), name)
	if err != nil {
		t.Fatalf("TryAcquire(%q): %v", name, err)
	}
	return l
}
