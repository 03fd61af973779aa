package redis_test

import (
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/withlock/withlock/internal/lock"
	"github.com/withlock/withlock/internal/lock/locktest"
	"github.com/withlock/withlock/internal/lock/redis"
	"github.com/withlock/withlock/internal/testenv"
)

// client is a go-redis client of the test's own, for looking at the server
// and writing to it behind withlock's back.
func client(t *testing.T, url string) *goredis.Client {
	t.Helper()
	o, err := goredis.ParseURL(url)
	if err != nil {
		t.Fatal(err)
	}
	c := goredis.NewClient(o)
	t.Cleanup(func() { c.Close() })
	return c
}

func try(t *testing.T, c *lock.Client, name string) lock.Lease {
	t.Helper()
	l, err := c.TryAcquire(locktest.Context(t), name)
	if err != nil {
		t.Fatalf("TryAcquire(%q) in mode %s: %v", name, c.Options().Mode, err)
	}
	return l
}

func held(t *testing.T, c *lock.Client, name string) error {
	t.Helper()
	l, err := c.TryAcquire(locktest.Context(t), name)
	if err == nil {
		l.Release(locktest.Context(t))
		t.Fatalf("TryAcquire(%q) in mode %s took a lock it must not have", name, c.Options().Mode)
	}
	if !errors.Is(err, lock.ErrHeld) {
		t.Fatalf("TryAcquire(%q) in mode %s: %v; want ErrHeld", name, c.Options().Mode, err)
	}
	return err
}

func holders(t *testing.T, c *lock.Client, name string) []lock.Holder {
	t.Helper()
	st, err := c.Inspect(locktest.Context(t), name)
	if err != nil {
		t.Fatal(err)
	}
	return st.Holders
}

func tokenOf(l lock.Lease) int64 { return l.(lock.Expiring).Token() }

// Each holder's lease ends on its own, by the server's clock: a shared or
// semaphore holder that stops renewing frees only its own place, while the
// others' leases go on.
func TestHolderLeaseEndsAlone(t *testing.T) {
	r := testenv.RequireRedis(t)
	const short = 700 * time.Millisecond
	for _, mode := range []lock.Options{
		{Mode: lock.Shared},
		{Mode: lock.Semaphore, MaxHolders: 2},
	} {
		t.Run(string(mode.Mode), func(t *testing.T) {
			name := locktest.Name(t)
			shortOpts, longOpts := mode, mode
			shortOpts.TTL, longOpts.TTL = short, 30*time.Second
			a := locktest.Open(t, r.URL, shortOpts) // never renews
			b := locktest.Open(t, r.URL, longOpts)
			c := locktest.Open(t, r.URL, longOpts)
			x := locktest.Open(t, r.URL, lock.Options{NoWait: true})
			la, lb := try(t, a, name), try(t, b, name)
			if n := len(holders(t, x, name)); n != 2 {
				t.Fatalf("%d holders; want 2", n)
			}
			if mode.Mode == lock.Semaphore {
				held(t, c, name) // full
			}
			// a's lease ends on the server; nothing else happens meanwhile.
			deadline := time.Now().Add(10 * time.Second)
			for len(holders(t, x, name)) != 1 {
				if time.Now().After(deadline) {
					t.Fatalf("a's lease of %v did not end within 10s", short)
				}
				time.Sleep(20 * time.Millisecond)
			}
			if h := holders(t, x, name); h[0].Token != tokenOf(lb) {
				t.Errorf("the holder left is %+v; want b (token %d)", h[0], tokenOf(lb))
			}
			if err := la.Keep(locktest.Context(t)); !errors.Is(err, lock.ErrLost) {
				t.Errorf("Keep of the ended lease: %v; want ErrLost", err)
			}
			if err := lb.Keep(locktest.Context(t)); err != nil {
				t.Errorf("b lost its lease with a's: %v", err)
			}
			held(t, x, name) // b still excludes an exclusive holder
			lc := try(t, c, name)
			if tokenOf(lc) <= tokenOf(lb) {
				t.Errorf("token %d after %d", tokenOf(lc), tokenOf(lb))
			}
			locktestRelease(t, lb, lc)
		})
	}
}

func locktestRelease(t *testing.T, ls ...lock.Lease) {
	t.Helper()
	for _, l := range ls {
		if err := l.Release(locktest.Context(t)); err != nil {
			t.Errorf("Release: %v", err)
		}
	}
}

// An exclusive waiter kept out by shared holders sets the writer mark, and
// new shared (and semaphore) holders wait while it is there: a stream of
// overlapping shared holders, each joining before the last leaves, would
// otherwise keep the lock shared for ever.
func TestWriterNotStarved(t *testing.T) {
	r := testenv.RequireRedis(t)
	rc := client(t, r.URL)
	name := locktest.Name(t)
	marked := func() bool {
		n, err := rc.Exists(locktest.Context(t), redis.WriterKey(name)).Result()
		if err != nil {
			t.Fatal(err)
		}
		return n == 1
	}
	shared := lock.Options{Mode: lock.Shared}
	s1, s2, s3 := locktest.Open(t, r.URL, shared), locktest.Open(t, r.URL, shared), locktest.Open(t, r.URL, shared)
	l1 := try(t, s1, name)
	l2 := try(t, s2, name) // shared holders join each other
	locktestRelease(t, l1)
	l1 = try(t, s1, name) // ... and the stream goes on: never a moment free

	// An exclusive --no-wait attempt is no waiter: it leaves no mark.
	held(t, locktest.Open(t, r.URL, lock.Options{NoWait: true}), name)
	if marked() {
		t.Fatal("a --no-wait attempt left the writer mark")
	}

	x := locktest.Open(t, r.URL, lock.Options{})
	type result struct {
		h   *lock.Held
		err error
	}
	got := make(chan result, 1)
	go func() {
		h, err := x.Acquire(locktest.Context(t), name)
		got <- result{h, err}
	}()
	deadline := time.Now().Add(10 * time.Second)
	for !marked() {
		if time.Now().After(deadline) {
			t.Fatal("the exclusive waiter set no writer mark within 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	// The stream cannot go on: a new shared holder waits, and so does a
	// semaphore's.
	err := held(t, s3, name)
	if d, ok := lock.Remaining(err); !ok || d <= 0 || d > 3*time.Second {
		t.Errorf("a shared attempt against the mark: Remaining %v, %v; want the mark's time left, at most 3s", d, ok)
	}
	held(t, locktest.Open(t, r.URL, lock.Options{Mode: lock.Semaphore, MaxHolders: 5}), name)
	locktestRelease(t, l1, l2)
	var res result
	select {
	case res = <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("the exclusive waiter did not get the lock within 10s of the last shared holder's release")
	}
	if res.err != nil {
		t.Fatal(res.err)
	}
	if marked() {
		t.Error("the exclusive holder did not clear its writer mark")
	}
	held(t, s3, name)
	if err := res.h.Release(locktest.Context(t)); err != nil {
		t.Fatal(err)
	}
	// Without a mark, shared holders come in at once.
	l3 := try(t, s3, name)

	// A waiter that gives up clears its mark when it closes, and wakes the
	// shared waiters.
	w, err := lock.Open(r.URL, lock.Options{}) // closed below, not by t
	if err != nil {
		t.Fatal(err)
	}
	held(t, w, name)
	if !marked() {
		t.Fatal("a waiting exclusive attempt against a shared holder set no writer mark")
	}
	sub := rc.Subscribe(locktest.Context(t), redis.Channel(name))
	defer sub.Close()
	if _, err := sub.Receive(locktest.Context(t)); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if marked() {
		t.Error("Close left the writer mark")
	}
	if _, err := sub.ReceiveMessage(locktest.Context(t)); err != nil {
		t.Errorf("no release message when the mark was cleared: %v", err)
	}
	locktestRelease(t, l3, try(t, s2, name))
}

// Another N than the recorded one is a usage error that names both.
func TestSemaphoreOtherN(t *testing.T) {
	r := testenv.RequireRedis(t)
	name := locktest.Name(t)
	l := try(t, locktest.Open(t, r.URL, lock.Options{Mode: lock.Semaphore, MaxHolders: 2}), name)
	_, err := locktest.Open(t, r.URL, lock.Options{Mode: lock.Semaphore, MaxHolders: 3}).TryAcquire(locktest.Context(t), name)
	want := strconv.Quote(name) + " is a semaphore of 2 (--max-holders 2); this holder asked for 3"
	if !errors.Is(err, lock.ErrUsage) || err.Error() != want {
		t.Errorf("%v; want ErrUsage %q", err, want)
	}
	locktestRelease(t, l)
	// Once free, the next holder sets N anew.
	locktestRelease(t, try(t, locktest.Open(t, r.URL, lock.Options{Mode: lock.Semaphore, MaxHolders: 3}), name))
}

// release --force deletes every holder's lease, keeps the fence counter
// and publishes the release, so that waiters try at once.
func TestBreakPublishesKeepsFence(t *testing.T) {
	r := testenv.RequireRedis(t)
	rc := client(t, r.URL)
	name := locktest.Name(t)
	sem := lock.Options{Mode: lock.Semaphore, MaxHolders: 3}
	la, lb := try(t, locktest.Open(t, r.URL, sem), name), try(t, locktest.Open(t, r.URL, sem), name)
	fence := do(t, r.URL, "GET", redis.FenceKey(name))
	sub := rc.Subscribe(locktest.Context(t), redis.Channel(name))
	defer sub.Close()
	if _, err := sub.Receive(locktest.Context(t)); err != nil {
		t.Fatal(err)
	}
	broken, err := locktest.Open(t, r.URL, lock.Options{}).Break(locktest.Context(t), name)
	if err != nil {
		t.Fatal(err)
	}
	tokens := []int64{broken[0].Token, broken[len(broken)-1].Token}
	if len(broken) != 2 || !slices.Equal(tokens, []int64{tokenOf(la), tokenOf(lb)}) {
		t.Errorf("broke %+v; want the two holders, oldest first", broken)
	}
	if _, err := sub.ReceiveMessage(locktest.Context(t)); err != nil {
		t.Errorf("no release message: %v", err)
	}
	if got := do(t, r.URL, "EXISTS", redis.Key(name)); got != "0" {
		t.Errorf("%s still exists", redis.Key(name))
	}
	if got := do(t, r.URL, "GET", redis.FenceKey(name)); got != fence {
		t.Errorf("the fence counter is %q after the break; want it kept, %q", got, fence)
	}
}

// A withlock:{NAME} string with an expiry, as an exclusive holder's token
// was once kept, counts as a lease: it excludes every mode until it
// expires, status shows it, and release --force deletes it. A string
// without expiry is no lease: it counts as held, and release leaves it.
func TestStringKey(t *testing.T) {
	r := testenv.RequireRedis(t)
	name := locktest.Name(t)
	do(t, r.URL, "SET", redis.Key(name), "0123456789abcdef0123456789abcdef", "PX", "30000")
	for _, o := range []lock.Options{{}, {Mode: lock.Shared}, {Mode: lock.Semaphore, MaxHolders: 2}} {
		err := held(t, locktest.Open(t, r.URL, o), name)
		if d, ok := lock.Remaining(err); !ok || d <= 0 || d > 30*time.Second {
			t.Errorf("%s: Remaining %v, %v; want the string's PTTL", o.Mode, d, ok)
		}
	}
	c := locktest.Open(t, r.URL, lock.Options{})
	st, err := c.Inspect(locktest.Context(t), name)
	if err != nil || len(st.Holders) != 1 || st.Holders[0].ExpiresAt.IsZero() {
		t.Errorf("Inspect of an older withlock's lease: %+v, %v; want one holder with its end", st, err)
	}
	all, err := c.List(locktest.Context(t))
	if err != nil || len(all) != 1 || all[0].Name != name {
		t.Errorf("List: %+v, %v; want the string", all, err)
	}
	if broken, err := c.Break(locktest.Context(t), name); err != nil || len(broken) != 1 {
		t.Errorf("Break: %+v, %v; want one holder broken", broken, err)
	}
	locktestRelease(t, try(t, c, name))

	do(t, r.URL, "SET", redis.Key(name), "someone else's")
	err = held(t, c, name)
	if !strings.Contains(err.Error(), "exists without an expiry; it is not a withlock lease") {
		t.Errorf("message %q does not say why", err)
	}
	if _, err := c.Break(locktest.Context(t), name); !errors.Is(err, lock.ErrHeld) || !strings.Contains(err.Error(), "left alone") {
		t.Errorf("Break of a string without expiry: %v; want ErrHeld saying it was left alone", err)
	}
	if got := do(t, r.URL, "GET", redis.Key(name)); got != "someone else's" {
		t.Errorf("Break changed a key that is no lease: %q", got)
	}
}

// List walks the key space with SCAN, page by page, never KEYS: it finds
// every held lock among many other keys, and leaves out free ones.
func TestListScans(t *testing.T) {
	r := testenv.RequireRedis(t)
	rc := client(t, r.URL)
	ctx := locktest.Context(t)
	// Other keys, so that SCAN needs several round trips.
	p := rc.Pipeline()
	for i := range 5000 {
		p.Set(ctx, "cache:"+strconv.Itoa(i), "x", 0)
	}
	if _, err := p.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	base := locktest.Name(t)
	var names []string
	var leases []lock.Lease
	for i, o := range []lock.Options{{}, {Mode: lock.Shared}, {Mode: lock.Semaphore, MaxHolders: 2}} {
		name := base + "/" + strconv.Itoa(i)
		names = append(names, name)
		leases = append(leases, try(t, locktest.Open(t, r.URL, o), name))
	}
	freed := base + "/free"
	locktestRelease(t, try(t, locktest.Open(t, r.URL, lock.Options{}), freed))
	if err := rc.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	all, err := locktest.Open(t, r.URL, lock.Options{}).List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, st := range all {
		got = append(got, st.Name)
	}
	if !slices.Equal(got, names) {
		t.Errorf("List: %q; want %q", got, names)
	}
	if all[2].Mode != lock.Semaphore || all[2].MaxHolders != 2 || all[1].Mode != lock.Shared {
		t.Errorf("List: modes %q, %q, %q (N %d)", all[0].Mode, all[1].Mode, all[2].Mode, all[2].MaxHolders)
	}
	stats := rc.Info(ctx, "commandstats").Val()
	if strings.Contains(stats, "cmdstat_keys:") {
		t.Error("List sent KEYS")
	}
	_, after, _ := strings.Cut(stats, "cmdstat_scan:calls=")
	if calls, _ := strconv.Atoi(strings.SplitN(after, ",", 2)[0]); calls < 3 {
		t.Errorf("List sent SCAN %d times over 5,000 keys; want page by page", calls)
	}
	locktestRelease(t, leases...)
}

// The record of each holder: host, pid, command, and times by the server's
// clock; a renewal moves the end of the renewing holder's lease only.
func TestHolderRecords(t *testing.T) {
	r := testenv.RequireRedis(t)
	name := locktest.Name(t)
	shared := func(pid int) lock.Options {
		return lock.Options{Mode: lock.Shared, TTL: 10 * time.Second,
			Holder: lock.Holder{Host: "web-" + strconv.Itoa(pid), PID: pid, Command: []string{"sh", "-c", `echo "it's"`}}}
	}
	la := try(t, locktest.Open(t, r.URL, shared(1)), name)
	lb := try(t, locktest.Open(t, r.URL, shared(2)), name)
	c := locktest.Open(t, r.URL, lock.Options{})
	before := holders(t, c, name)
	if len(before) != 2 || before[0].PID != 1 || before[1].PID != 2 || before[1].Host != "web-2" ||
		!slices.Equal(before[0].Command, []string{"sh", "-c", `echo "it's"`}) || before[0].Token != tokenOf(la) {
		t.Fatalf("holders %+v", before)
	}
	server := time.UnixMicro(serverMicros(t, r.URL))
	for _, h := range before {
		if d := server.Sub(h.AcquiredAt); d < 0 || d > 5*time.Second {
			t.Errorf("acquired at %v; the server's clock says %v", h.AcquiredAt, server)
		}
		if d := h.ExpiresAt.Sub(h.AcquiredAt); d != 10*time.Second {
			t.Errorf("lease of %v; want the ttl, 10s", d)
		}
	}
	// The server's clock moves on by at least a millisecond.
	for !time.UnixMicro(serverMicros(t, r.URL)).After(before[1].AcquiredAt.Add(time.Millisecond)) {
		time.Sleep(time.Millisecond)
	}
	if err := la.Keep(locktest.Context(t)); err != nil {
		t.Fatal(err)
	}
	after := holders(t, c, name)
	if !after[0].ExpiresAt.After(before[0].ExpiresAt) || !after[1].ExpiresAt.Equal(before[1].ExpiresAt) ||
		!after[0].AcquiredAt.Equal(before[0].AcquiredAt) {
		t.Errorf("after a's renewal: %+v; before: %+v", after, before)
	}
	locktestRelease(t, la)
	if h := holders(t, c, name); len(h) != 1 || h[0].PID != 2 {
		t.Errorf("after a's release: %+v; want b alone", h)
	}
	locktestRelease(t, lb)
	if got := do(t, r.URL, "EXISTS", redis.Key(name)); got != "0" {
		t.Error("the last release left the lock's hash behind")
	}
}
