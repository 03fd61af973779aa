package etcd_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/withlock/withlock/internal/lock"
	"github.com/withlock/withlock/internal/lock/etcd"
	"github.com/withlock/withlock/internal/lock/locktest"
	"github.com/withlock/withlock/internal/stress/faultproxy"
	"github.com/withlock/withlock/internal/testenv"
)

func client(t *testing.T, e *testenv.Etcd) *clientv3.Client {
	t.Helper()
	c, err := e.Client()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// keys returns name's keys in etcd, in the order of their create revisions.
func keys(t *testing.T, c *clientv3.Client, name string) []string {
	t.Helper()
	resp, err := c.Get(locktest.Context(t), etcd.Prefix(name), clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
	if err != nil {
		t.Fatal(err)
	}
	var ks []string
	for _, kv := range resp.Kvs {
		ks = append(ks, string(kv.Key))
	}
	return ks
}

// holder takes name for a new client of e with opts, and returns its
// lease, released when the test ends.
func holder(t *testing.T, e *testenv.Etcd, name string, opts lock.Options) lock.Lease {
	t.Helper()
	l, err := locktest.Open(t, e.URL, opts).TryAcquire(locktest.Context(t), name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Release(context.Background()) })
	return l
}

// eachSetUp runs test, side by side when parallel, on the system's etcd
// and on every release of testenv.EtcdVersions, each with authentication
// off and on. With it on, url logs in as wl, a user who is not root and
// may read and write every key, and the releases the tests build hand out
// JWTs that expire after jwtTTL (the system's, simple tokens); e.Client
// logs in as root.
func eachSetUp(t *testing.T, parallel bool, jwtTTL time.Duration, test func(t *testing.T, e *testenv.Etcd, url string)) {
	eachRelease(t, parallel, testenv.EtcdOptions{}, func(t *testing.T, o testenv.EtcdOptions, auth bool) {
		if auth && o.Version != "" {
			o.JWTTTL = jwtTTL
		}
		e := testenv.RequireEtcd(t, o)
		url := e.URL
		if auth {
			addUser(t, e, "wl", "wlpw", testenv.EtcdEveryKey)
			enableAuth(t, e, "rootpw")
			url = e.URLAs("wl", "wlpw")
		}
		test(t, e, url)
	})
}

// eachRelease runs test on the system's etcd and on every release of
// testenv.EtcdVersions, each with authentication off and on, with o's
// Version set accordingly; the test starts its servers.
func eachRelease(t *testing.T, parallel bool, o testenv.EtcdOptions, test func(t *testing.T, o testenv.EtcdOptions, auth bool)) {
	for _, v := range append([]string{""}, testenv.EtcdVersions...) {
		for _, auth := range []bool{false, true} {
			name := "etcd" + v + map[bool]string{false: "", true: "/auth"}[auth]
			t.Run(name, func(t *testing.T) {
				if parallel {
					t.Parallel()
				}
				o := o
				o.Version = v
				test(t, o, auth)
			})
		}
	}
}

// The conformance suite, on every release, with authentication off and
// on, with JWTs that expire within most of its holds.
func TestConformance(t *testing.T) {
	eachSetUp(t, true, 2*time.Second, testConformance)
}

func testConformance(t *testing.T, e *testenv.Etcd, url string) {
	c := client(t, e)
	locktest.Run(t, locktest.Config{
		Open: func(t *testing.T, opts lock.Options) *lock.Client { return locktest.Open(t, url, opts) },
		Lease: &locktest.Lease{
			// A lease broken behind its holder's back: its key deleted, as
			// `etcdctl del` would.
			Break: func(t *testing.T, name string) {
				resp, err := c.Delete(locktest.Context(t), etcd.Prefix(name), clientv3.WithPrefix())
				if err != nil || resp.Deleted != 1 {
					t.Fatalf("delete %s*: %v, %v; want one key deleted", etcd.Prefix(name), resp, err)
				}
			},
			NoHeldFor: true,
		},
		Modes: locktest.Modes{RecordsN: true},
	})
}

// The keys are those of concurrency.Mutex, etcd's recipe, which etcdctl
// lock uses: NAME/<lease ID in hex>, attached to the lease, the value
// withlock's record; the token is the key's create revision.
func TestKeys(t *testing.T) {
	e := testenv.RequireEtcd(t)
	c := client(t, e)
	holder := lock.Holder{Host: "web-1", PID: 4242, Command: []string{"migrate", "up"}}
	b := locktest.Open(t, e.URL, lock.Options{TTL: 7 * time.Second, Holder: holder})
	name := locktest.Name(t)
	l, err := b.TryAcquire(locktest.Context(t), name)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.Get(locktest.Context(t), etcd.Prefix(name), clientv3.WithPrefix())
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("keys of %q: %v, %v; want one", name, resp, err)
	}
	kv := resp.Kvs[0]
	if want := etcd.Key(name, kv.Lease); string(kv.Key) != want || want != fmt.Sprintf("%s/%x", name, kv.Lease) {
		t.Errorf("key %q with lease %x; want %q", kv.Key, kv.Lease, want)
	}
	if tok := l.(lock.Expiring).Token(); tok != kv.CreateRevision {
		t.Errorf("token %d; want the key's create revision %d", tok, kv.CreateRevision)
	}
	var rec map[string]any
	if err := json.Unmarshal(kv.Value, &rec); err != nil {
		t.Fatalf("value %q: %v", kv.Value, err)
	}
	if rec["mode"] != "exclusive" || rec["host"] != "web-1" || rec["pid"] != 4242.0 || fmt.Sprint(rec["command"]) != "[migrate up]" {
		t.Errorf("record %s", kv.Value)
	}
	ttl, err := c.TimeToLive(locktest.Context(t), clientv3.LeaseID(kv.Lease))
	if err != nil || ttl.GrantedTTL != 7 {
		t.Errorf("lease: %v, %v; want granted 7s, the ttl", ttl, err)
	}
	if err := l.Release(locktest.Context(t)); err != nil {
		t.Fatal(err)
	}
	if ks := keys(t, c, name); len(ks) != 0 {
		t.Errorf("keys after release: %q", ks)
	}
	// The lease is revoked, not left to run out.
	if ttl, err := c.TimeToLive(locktest.Context(t), clientv3.LeaseID(kv.Lease)); err != nil || ttl.TTL != -1 {
		t.Errorf("lease after release: %v, %v; want it gone (TTL -1)", ttl, err)
	}
}

// --ttl is rounded up to whole seconds, since etcd's leases are.
func TestTTLRoundedUp(t *testing.T) {
	e := testenv.RequireEtcd(t)
	c := client(t, e)
	name := locktest.Name(t)
	l, err := locktest.Open(t, e.URL, lock.Options{TTL: 2100 * time.Millisecond}).TryAcquire(locktest.Context(t), name)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(locktest.Context(t))
	resp, _ := c.Get(locktest.Context(t), etcd.Prefix(name), clientv3.WithPrefix())
	ttl, err := c.TimeToLive(locktest.Context(t), clientv3.LeaseID(resp.Kvs[0].Lease))
	if err != nil || ttl.GrantedTTL != 3 {
		t.Errorf("lease of --ttl 2.1s: %v, %v; want 3s", ttl, err)
	}
}

// session is etcd's own recipe, as etcdctl lock runs it: a Session (with its
// own keep-alive loop) and a Mutex on name.
func session(t *testing.T, e *testenv.Etcd, name string) *concurrency.Mutex {
	t.Helper()
	s, err := concurrency.NewSession(client(t, e), concurrency.WithTTL(10))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return concurrency.NewMutex(s, name)
}

// withlock and concurrency.Mutex, the recipe etcdctl lock uses, exclude each
// other on the same name, both ways, and hand over to each other's waiters.
// (The scripts in testdata/script/etcd do the same with etcdctl itself.)
func TestMutexInterop(t *testing.T) {
	e := testenv.RequireEtcd(t)
	name := locktest.Name(t)
	m := session(t, e, name)
	w := locktest.Open(t, e.URL, lock.Options{})

	// The recipe holds: withlock cannot take it, and waits.
	if err := m.Lock(locktest.Context(t)); err != nil {
		t.Fatal(err)
	}
	if _, err := w.TryAcquire(locktest.Context(t), name); !errors.Is(err, lock.ErrHeld) {
		t.Fatalf("TryAcquire while the Mutex holds: %v; want ErrHeld", err)
	}
	got := make(chan error, 1)
	var held *lock.Held
	go func() {
		h, err := w.Acquire(locktest.Context(t), name)
		held = h
		got <- err
	}()
	waitWatchers(t, e, 1) // withlock waits behind the Mutex
	select {
	case err := <-got:
		t.Fatalf("withlock's Acquire returned while the Mutex held the lock: %v", err)
	case <-time.After(200 * time.Millisecond): // it must not return: a wait is the check
	}
	if err := m.Unlock(locktest.Context(t)); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("withlock's wait after the Mutex's unlock: %v", err)
	}

	// withlock holds: the recipe's TryLock fails and its Lock waits.
	m2 := session(t, e, name)
	if err := m2.TryLock(locktest.Context(t)); !errors.Is(err, concurrency.ErrLocked) {
		t.Fatalf("Mutex.TryLock while withlock holds: %v; want ErrLocked", err)
	}
	locked := make(chan error, 1)
	go func() { locked <- m2.Lock(locktest.Context(t)) }()
	waitWatchers(t, e, 2)
	select {
	case err := <-locked:
		t.Fatalf("Mutex.Lock returned while withlock held the lock: %v", err)
	case <-time.After(200 * time.Millisecond): // it must not return: a wait is the check
	}
	if err := held.Release(locktest.Context(t)); err != nil {
		t.Fatal(err)
	}
	if err := <-locked; err != nil {
		t.Fatalf("Mutex.Lock after withlock's release: %v", err)
	}
	// The Mutex's holder is shown by status: a holder without a record,
	// exclusive, with its token.
	st, err := w.Inspect(locktest.Context(t), name)
	if err != nil || len(st.Holders) != 1 || st.Mode != lock.Exclusive {
		t.Fatalf("Inspect of the Mutex's lock: %+v, %v", st, err)
	}
	resp, err := client(t, e).Get(locktest.Context(t), m2.Key())
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("the Mutex's key: %v, %v", resp, err)
	}
	if h := st.Holders[0]; h.Token != resp.Kvs[0].CreateRevision || h.PID != 0 || h.ExpiresAt.IsZero() {
		t.Errorf("the Mutex's holder: %+v; want token %d (its key's create revision), no pid, an expiry", h, resp.Kvs[0].CreateRevision)
	}
	m2.Unlock(locktest.Context(t))
}

// Shared and semaphore holders exclude the recipe, and it excludes them.
func TestMutexInteropModes(t *testing.T) {
	e := testenv.RequireEtcd(t)
	for _, opts := range []lock.Options{{Mode: lock.Shared}, {Mode: lock.Semaphore, MaxHolders: 3}} {
		t.Run(string(opts.Mode), func(t *testing.T) {
			name := locktest.Name(t)
			w := locktest.Open(t, e.URL, opts)
			l, err := w.TryAcquire(locktest.Context(t), name)
			if err != nil {
				t.Fatal(err)
			}
			m := session(t, e, name)
			if err := m.TryLock(locktest.Context(t)); !errors.Is(err, concurrency.ErrLocked) {
				t.Fatalf("Mutex.TryLock while a %s holder holds: %v; want ErrLocked", opts.Mode, err)
			}
			if err := l.Release(locktest.Context(t)); err != nil {
				t.Fatal(err)
			}
			if err := m.TryLock(locktest.Context(t)); err != nil {
				t.Fatalf("Mutex.TryLock of a free lock: %v", err)
			}
			if _, err := w.TryAcquire(locktest.Context(t), name); !errors.Is(err, lock.ErrHeld) {
				t.Fatalf("a %s TryAcquire while the Mutex holds: %v; want ErrHeld", opts.Mode, err)
			}
		})
	}
}

// waiting has c wait for name on a goroutine, and returns once the server
// shows the wait (a watcher); the channel gets what Acquire got: nil for an
// error, which fails t.
func waiting(t *testing.T, e *testenv.Etcd, c *lock.Client, name string) <-chan *lock.Held {
	t.Helper()
	return waitingWith(t, e, c, name, 2) // the holder's, of its own key, and the waiter's
}

// waitingWith is waiting, for a server that shows the wait once it has
// watchers watches open (a holder not of withlock's watches nothing).
func waitingWith(t *testing.T, e *testenv.Etcd, c *lock.Client, name string, watchers int) <-chan *lock.Held {
	t.Helper()
	got := make(chan *lock.Held, 1)
	go func() {
		h, err := c.Acquire(locktest.Context(t), name)
		if err != nil {
			t.Error(err)
		}
		got <- h
	}()
	waitWatchers(t, e, watchers)
	return got
}

// waitWatchers waits until the server has at least n watches open: waiters
// are queued (each watches the key it waits for; so does each withlock
// holder, its own key).
func waitWatchers(t *testing.T, e *testenv.Etcd, n int) {
	t.Helper()
	testenv.WaitFor(t, fmt.Sprintf("%d watches on the server", n), func() bool {
		got, err := e.Watchers()
		if err != nil {
			t.Fatal(err)
		}
		return got >= n
	})
}

// A writer that waits is not starved by readers that come after it: they
// queue behind it (the readers before it keep their lock).
func TestWriterNotStarved(t *testing.T) {
	e := testenv.RequireEtcd(t)
	name := locktest.Name(t)
	shared := lock.Options{Mode: lock.Shared}
	r1 := locktest.Open(t, e.URL, shared)
	l1, err := r1.TryAcquire(locktest.Context(t), name)
	if err != nil {
		t.Fatal(err)
	}
	x := locktest.Open(t, e.URL, lock.Options{})
	got := waiting(t, e, x, name)
	r2 := locktest.Open(t, e.URL, shared)
	if _, err := r2.TryAcquire(locktest.Context(t), name); !errors.Is(err, lock.ErrHeld) {
		t.Fatalf("a reader after a waiting writer: %v; want ErrHeld", err)
	}
	if err := l1.Release(locktest.Context(t)); err != nil {
		t.Fatal(err)
	}
	h := <-got
	if h == nil {
		return
	}
	if _, err := r2.TryAcquire(locktest.Context(t), name); !errors.Is(err, lock.ErrHeld) {
		t.Errorf("a reader while the writer holds: %v; want ErrHeld", err)
	}
	h.Release(locktest.Context(t))
}

// A waiter whose wait outlasts its lease several times is still queued (it
// renews its lease while it waits) and gets the lock, held from then on.
func TestLongWaitRenews(t *testing.T) {
	e := testenv.RequireEtcd(t)
	c := client(t, e)
	name := locktest.Name(t)
	const ttl = time.Second
	la := holder(t, e, name, lock.Options{TTL: 10 * time.Second})
	b := locktest.Open(t, e.URL, lock.Options{TTL: ttl})
	got := waiting(t, e, b, name)
	waiter := keys(t, c, name)[1]
	// Three lease lengths: the point of this test.
	time.Sleep(3 * ttl)
	if ks := keys(t, c, name); len(ks) != 2 || ks[1] != waiter {
		t.Fatalf("after 3 ttl the keys are %q; want the waiter's %q still queued", ks, waiter)
	}
	released := time.Now()
	if err := la.Release(locktest.Context(t)); err != nil {
		t.Fatal(err)
	}
	h := <-got
	if h == nil {
		return
	}
	// status says when the waiter got the lock, not when it began to wait
	// (written a second after the hand-off, with the time of the hand-off).
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		st, err := b.Inspect(locktest.Context(t), name)
		if err != nil || len(st.Holders) != 1 {
			t.Fatalf("Inspect: %+v, %v", st, err)
		}
		if st.Holders[0].AcquiredAt.After(released) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("acquired_at %v; want after the release at %v", st.Holders[0].AcquiredAt, released)
		}
	}
	select {
	case <-h.Lost():
		t.Fatalf("lost within 3 ttl of the hand-off: %v", h.Err())
	case <-time.After(3 * ttl): // holding it is the point of this test
	}
	if ks := keys(t, c, name); len(ks) != 1 || ks[0] != waiter {
		t.Errorf("keys while the waiter holds: %q", ks)
	}
	h.Release(locktest.Context(t))
}

// A cancelled wait leaves no key behind, and its lease is revoked.
func TestCancelledWaitLeavesNothing(t *testing.T) {
	e := testenv.RequireEtcd(t)
	c := client(t, e)
	name := locktest.Name(t)
	holder(t, e, name, lock.Options{})
	b := locktest.Open(t, e.URL, lock.Options{})
	ctx, cancel := context.WithCancel(locktest.Context(t))
	done := make(chan error, 1)
	go func() {
		_, _, err := b.Backend.(lock.Waiter).Acquire(ctx, name)
		done <- err
	}()
	waitWatchers(t, e, 2)
	resp, _ := c.Get(locktest.Context(t), keys(t, c, name)[1])
	lease := clientv3.LeaseID(resp.Kvs[0].Lease)
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled wait: %v; want context.Canceled", err)
	}
	if ks := keys(t, c, name); len(ks) != 1 {
		t.Errorf("keys after the cancelled wait: %q; want the holder's alone", ks)
	}
	if ttl, err := c.TimeToLive(locktest.Context(t), lease); err != nil || ttl.TTL != -1 {
		t.Errorf("the cancelled waiter's lease: %v, %v; want it revoked", ttl, err)
	}
}

// A waiter queues once, as etcd's recipe does: the key its first attempt
// put stays, and its wait goes on from it and ends holding it, where a
// second lease and key would cost the server two more writes per
// acquisition. With NoWait the attempt leaves nothing.
func TestWaiterQueuesOnce(t *testing.T) {
	e := testenv.RequireEtcd(t)
	c := client(t, e)
	name := locktest.Name(t)
	la := holder(t, e, name, lock.Options{})

	n := locktest.Open(t, e.URL, lock.Options{NoWait: true})
	if _, err := n.TryAcquire(locktest.Context(t), name); !errors.Is(err, lock.ErrHeld) {
		t.Fatalf("an attempt on a held lock: %v; want ErrHeld", err)
	}
	if ks := keys(t, c, name); len(ks) != 1 {
		t.Errorf("keys after an attempt with NoWait: %q; want the holder's alone", ks)
	}

	b := locktest.Open(t, e.URL, lock.Options{})
	if _, err := b.TryAcquire(locktest.Context(t), name); !errors.Is(err, lock.ErrHeld) {
		t.Fatalf("an attempt on a held lock: %v; want ErrHeld", err)
	}
	ks := keys(t, c, name)
	if len(ks) != 2 {
		t.Fatalf("keys after an attempt of a waiter: %q; want the holder's and the waiter's", ks)
	}
	got := make(chan lock.Lease, 1)
	go func() {
		l, _, err := b.Backend.(lock.Waiter).Acquire(locktest.Context(t), name)
		if err != nil {
			t.Error(err)
		}
		got <- l
	}()
	waitWatchers(t, e, 2) // the holder's, of its own key, and the waiter's
	if now := keys(t, c, name); !slices.Equal(now, ks) {
		t.Errorf("keys while waiting: %q; want those after the attempt, %q", now, ks)
	}
	if err := la.Release(locktest.Context(t)); err != nil {
		t.Fatal(err)
	}
	lb := <-got
	if lb == nil {
		return
	}
	defer lb.Release(locktest.Context(t))
	if now := keys(t, c, name); len(now) != 1 || now[0] != ks[1] {
		t.Errorf("keys once the waiter holds: %q; want its first attempt's, %q", now, ks[1])
	}
}

// The waiter just behind a holder takes the lock on the holder's release
// with no request of its own: the queue it read, less the holder's key,
// says it holds, and no key can have come before it since. A waiter with
// another key still ahead of it in the queue it read reads again, since
// that key may have gone unseen.
func TestHandOffReadsNothing(t *testing.T) {
	e := testenv.RequireEtcd(t)
	c := client(t, e)
	ctx := locktest.Context(t)
	name := locktest.Name(t)
	reads := func() int {
		t.Helper()
		n, err := e.Reads()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	// Holders as etcdctl lock's: keys on leases, deleted by hand, which
	// costs no read.
	put := func() string {
		t.Helper()
		g, err := c.Grant(ctx, 60)
		if err != nil {
			t.Fatal(err)
		}
		key := etcd.Key(name, int64(g.ID))
		if _, err := c.Put(ctx, key, "", clientv3.WithLease(g.ID)); err != nil {
			t.Fatal(err)
		}
		return key
	}
	del := func(key string) {
		t.Helper()
		if _, err := c.Delete(ctx, key); err != nil {
			t.Fatal(err)
		}
	}
	first := put()
	got := waitingWith(t, e, locktest.Open(t, e.URL, lock.Options{}), name, 1)
	before := reads()
	del(first)
	h := <-got
	if h == nil {
		return
	}
	if n := reads() - before; n != 0 {
		t.Errorf("the waiter just behind the holder made %d reads on the hand-off; want none", n)
	}
	if ks := keys(t, c, name); len(ks) != 1 {
		t.Errorf("keys once the waiter holds: %q; want its own alone", ks)
	}
	if err := h.Release(ctx); err != nil {
		t.Fatal(err)
	}

	// Two keys ahead: the one just ahead goes first (a waiter giving up),
	// and the waiter must read to learn that the first is still there.
	first, second := put(), put()
	got = waitingWith(t, e, locktest.Open(t, e.URL, lock.Options{}), name, 1)
	before = reads()
	del(second)
	testenv.WaitFor(t, "the waiter's read of the queue", func() bool { return reads() > before })
	select {
	case <-got:
		t.Fatal("the waiter took the lock while the first key was still there")
	default:
	}
	del(first)
	if h := <-got; h != nil {
		h.Release(ctx)
	}
}

// withlock's locks "a" and "a/b" are two locks, though the keys of "a/b"
// are under the prefix of "a".
func TestSubNames(t *testing.T) {
	e := testenv.RequireEtcd(t)
	name := locktest.Name(t)
	a, b := locktest.Open(t, e.URL, lock.Options{}), locktest.Open(t, e.URL, lock.Options{})
	lb, err := b.TryAcquire(locktest.Context(t), name+"/b")
	if err != nil {
		t.Fatal(err)
	}
	la, err := a.TryAcquire(locktest.Context(t), name)
	if err != nil {
		t.Fatalf("%q while %q is held: %v", name, name+"/b", err)
	}
	st, err := a.Inspect(locktest.Context(t), name)
	if err != nil || len(st.Holders) != 1 || st.Holders[0].Token != la.(lock.Expiring).Token() {
		t.Errorf("Inspect(%q): %+v, %v; want its own holder alone", name, st, err)
	}
	la.Release(locktest.Context(t))
	lb.Release(locktest.Context(t))
}

// --hold-at-least: the key moves to a lease of the time left and keeps its
// place (and token); it ends by itself.
func TestReleaseAt(t *testing.T) {
	e := testenv.RequireEtcd(t)
	c := client(t, e)
	name := locktest.Name(t)
	a, b := locktest.Open(t, e.URL, lock.Options{}), locktest.Open(t, e.URL, lock.Options{})
	l, err := a.TryAcquire(locktest.Context(t), name)
	if err != nil {
		t.Fatal(err)
	}
	until := time.Now().Add(1500 * time.Millisecond)
	if err := l.(lock.Expiring).ReleaseAt(locktest.Context(t), until); err != nil {
		t.Fatal(err)
	}
	resp, err := c.Get(locktest.Context(t), etcd.Prefix(name), clientv3.WithPrefix())
	if err != nil || len(resp.Kvs) != 1 || resp.Kvs[0].CreateRevision != l.(lock.Expiring).Token() {
		t.Fatalf("keys after ReleaseAt: %v, %v; want the holder's, in its place", resp, err)
	}
	if _, err := b.TryAcquire(locktest.Context(t), name); !errors.Is(err, lock.ErrHeld) {
		t.Fatalf("TryAcquire while the lease lingers: %v; want ErrHeld", err)
	}
	h, err := b.Acquire(locktest.Context(t), name)
	if err != nil {
		t.Fatal(err)
	}
	// Whole seconds, and the server finds an expired lease within 500ms.
	if late := time.Since(until); late < 0 || late > 1500*time.Millisecond {
		t.Errorf("the lingering lock ended %v after its time; want within 1.5s after", late)
	}
	h.Release(locktest.Context(t))
}

func TestErrors(t *testing.T) {
	e := testenv.RequireEtcd(t)
	enableAuth(t, e, "rootpw")
	addUser(t, e, "app", "apppw", "jobs/")
	withUser := func(user, pw string) string {
		u, _ := url.Parse(e.URL)
		u.User = url.UserPassword(user, pw)
		return u.String()
	}
	try := func(t *testing.T, url, name string) error {
		t.Helper()
		_, err := locktest.Open(t, url, lock.Options{}).TryAcquire(locktest.Context(t), name)
		return err
	}
	t.Run("allowed", func(t *testing.T) {
		if err := try(t, withUser("app", "apppw"), "jobs"); err != nil {
			t.Errorf("a user with permission on jobs/: %v", err)
		}
	})
	t.Run("wrong password", func(t *testing.T) {
		err := try(t, withUser("app", "wrong"), "jobs")
		if !errors.Is(err, lock.ErrRefused) || !strings.Contains(err.Error(), "authentication failed") {
			t.Errorf("%v; want ErrRefused saying authentication failed", err)
		}
		if strings.Contains(err.Error(), "wrong") {
			t.Errorf("the error shows the password: %v", err)
		}
	})
	t.Run("no user", func(t *testing.T) {
		if err := try(t, e.URL, "jobs"); !errors.Is(err, lock.ErrRefused) {
			t.Errorf("%v; want ErrRefused", err)
		}
	})
	t.Run("permission denied", func(t *testing.T) {
		err := try(t, withUser("app", "apppw"), "other")
		if !errors.Is(err, lock.ErrRefused) || !strings.Contains(err.Error(), "permission denied") {
			t.Errorf("%v; want ErrRefused saying permission denied", err)
		}
	})
	t.Run("connection refused", func(t *testing.T) {
		start := time.Now()
		err := try(t, "etcd://127.0.0.1:1", "job")
		if !errors.Is(err, lock.ErrUnavailable) || !strings.Contains(err.Error(), "connection refused") {
			t.Errorf("%v; want ErrUnavailable saying connection refused", err)
		}
		// One attempt, not the client's wait for a connection.
		if d := time.Since(start); d > 2*time.Second {
			t.Errorf("took %v", d)
		}
	})
	t.Run("cluster, one member down", func(t *testing.T) {
		u := strings.Replace(withUser("app", "apppw"), "@", "@127.0.0.1:1,", 1)
		for i := range 3 {
			if err := try(t, u, fmt.Sprintf("jobs/%d", i)); err != nil {
				t.Errorf("%s: %v; want the member that answers used", lock.Redact(u), err)
			}
		}
	})
	t.Run("cluster, one member does not answer", func(t *testing.T) {
		// A member that takes connections and never answers (stopped, or
		// cut off behind a proxy), first in the URL: the client never
		// gets a connection to it ready, and the requests go to the
		// member that answers.
		member, _ := url.Parse(e.URL)
		hung, err := faultproxy.Start(member.Host)
		if err != nil {
			t.Fatal(err)
		}
		defer hung.Close()
		hung.BlackHole()
		u := strings.Replace(withUser("app", "apppw"), "@", "@"+hung.Addr()+",", 1)
		b := locktest.Open(t, u, lock.Options{})
		for range 2 {
			l, err := b.TryAcquire(locktest.Context(t), "jobs/hung")
			if err != nil {
				t.Fatalf("TryAcquire beside a member that does not answer: %v; want it sent to the member that answers", err)
			}
			if err := l.Release(locktest.Context(t)); err != nil {
				t.Fatal(err)
			}
		}
	})
	t.Run("paused", func(t *testing.T) {
		// The first request connects; then the server stops answering.
		b := locktest.Open(t, withUser("app", "apppw"), lock.Options{})
		l, err := b.TryAcquire(locktest.Context(t), "jobs/paused")
		if err != nil {
			t.Fatal(err)
		}
		if err := e.Pause(); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(locktest.Context(t), time.Second)
		err = l.Keep(ctx)
		cancel()
		e.Resume()
		if !errors.Is(err, lock.ErrUnavailable) || errors.Is(err, lock.ErrLost) {
			t.Errorf("Keep on a paused server: %v; want ErrUnavailable", err)
		}
		if err := l.Keep(locktest.Context(t)); err != nil {
			t.Errorf("Keep after the server resumed: %v", err)
		}
		l.Release(locktest.Context(t))
	})
}

func TestTLS(t *testing.T) {
	e := testenv.RequireEtcd(t, testenv.EtcdOptions{TLS: true})
	name := locktest.Name(t)
	l, err := locktest.Open(t, e.URL, lock.Options{}).TryAcquire(locktest.Context(t), name)
	if err != nil {
		t.Fatalf("etcds:// with cacert: %v", err)
	}
	l.Release(locktest.Context(t))
	// Without cacert the self-signed certificate is not trusted.
	_, err = locktest.Open(t, "etcds://"+e.Endpoint, lock.Options{}).TryAcquire(locktest.Context(t), name)
	if !errors.Is(err, lock.ErrRefused) || !strings.Contains(err.Error(), "x509") {
		t.Errorf("etcds:// without cacert: %v; want ErrRefused saying why (x509)", err)
	}
	// Plain etcd:// to a TLS port is not an answer.
	_, err = locktest.Open(t, "etcd://"+e.Endpoint, lock.Options{ConnectTimeout: time.Second}).TryAcquire(locktest.Context(t), name)
	if err == nil {
		t.Error("etcd:// to a TLS server took the lock")
	}
}

func TestURLs(t *testing.T) {
	for _, tc := range []struct {
		url  string
		want string // "" for a URL that opens
	}{
		{"etcd://h1:2379,h2:2379", ""},
		{"etcd://h1,h2", ""},
		{"etcd://u:p@h1:2379/", ""},
		{"etcd://[::1]:2379", ""},
		{"etcd://", "no HOST:PORT"},
		{"etcd://h1/prefix", "unexpected path"},
		{"etcd://h1,,h2", "is not HOST:PORT"},
		{"etcd://u@h1", "both a user and a password"},
		{"etcd://h1?cacert=/x", "use etcds://"},
		{"etcds://h1?sslmode=x", "unknown option"},
		{"etcds://h1?cert=/x", "both cert and key"},
		{"etcds://h1?cacert=/nonexistent", "cacert"},
	} {
		_, err := lock.Open(tc.url, lock.Options{})
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", tc.url, err)
		case tc.want != "" && (!errors.Is(err, lock.ErrUsage) || !strings.Contains(fmt.Sprint(err), tc.want)):
			t.Errorf("%s: %v; want ErrUsage saying %q", tc.url, err, tc.want)
		}
	}
}

// BenchmarkRoundTrip is one acquire and release on an open client.
func BenchmarkRoundTrip(b *testing.B) {
	e := testenv.RequireEtcd(b)
	locktest.BenchRoundTrip(b, e.URL)
}

// said is a slog.Handler that tells when a message is logged.
type said struct {
	msg  string
	seen chan struct{}
	once *sync.Once
}

func (h said) Enabled(context.Context, slog.Level) bool { return true }
func (h said) Handle(_ context.Context, r slog.Record) error {
	if r.Message == h.msg {
		h.once.Do(func() { close(h.seen) })
	}
	return nil
}
func (h said) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h said) WithGroup(string) slog.Handler      { return h }

// etcd stops while a holder holds and a waiter waits, long enough for the
// waiter's renewal to fail. When it is back (keys and leases are on disk,
// and a restarted server gives every lease its ttl again), the holder
// still holds, and the waiter resumes its wait with the key it had, in its
// place: it gets the lock as soon as the holder lets go.
func TestWaitAcrossRestart(t *testing.T) {
	e := testenv.RequireEtcd(t)
	c := client(t, e)
	name := locktest.Name(t)
	a := locktest.Open(t, e.URL, lock.Options{TTL: 15 * time.Second})
	ha, err := a.Acquire(locktest.Context(t), name)
	if err != nil {
		t.Fatal(err)
	}
	retrying := said{msg: "backend unavailable; retrying", seen: make(chan struct{}), once: new(sync.Once)}
	b := locktest.Open(t, e.URL, lock.Options{TTL: 9 * time.Second, ConnectTimeout: time.Minute, Log: slog.New(retrying)})
	got := waiting(t, e, b, name)
	before := keys(t, c, name) // the holder's and the waiter's
	if len(before) != 2 {
		t.Fatalf("keys of a holder and a waiter: %q", before)
	}
	if err := e.Stop(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-retrying.seen: // the waiter's renewal (every 3s) failed
	case <-time.After(30 * time.Second):
		t.Fatal("the waiter did not notice the server was gone within 30s")
	}
	if err := e.Start(); err != nil {
		t.Fatal(err)
	}
	// The waiter renews its lease again: a renewal after the restart, and
	// its key is still there.
	waitWatchers(t, e, 2)
	if ks := keys(t, c, name); fmt.Sprint(ks) != fmt.Sprint(before) {
		t.Errorf("keys after the restart: %q; want %q, the waiter in its place", ks, before)
	}
	select {
	case <-ha.Lost():
		t.Fatalf("the holder lost its lock across the restart: %v", ha.Err())
	default:
	}
	released := time.Now()
	if err := ha.Release(locktest.Context(t)); err != nil {
		t.Fatal(err)
	}
	select {
	case h := <-got:
		if h != nil {
			t.Logf("hand-off after the restart took %v (from the start of the release)", time.Since(released))
			h.Release(locktest.Context(t))
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the waiter did not get the lock within 5s of the release (its old key in the way?)")
	}
}

// List finds the locks of every name in the key space, withlock's and the
// recipe's (etcdctl lock's), and nothing else: not a key without a lease,
// not a waiter. On the system's etcd and on 3.7, whose keys-only reads
// leave the keys' leases out.
func TestList(t *testing.T) {
	for _, v := range []string{"", "3.7"} {
		t.Run("etcd"+v, func(t *testing.T) { testList(t, testenv.RequireEtcd(t, testenv.EtcdOptions{Version: v})) })
	}
}

func testList(t *testing.T, e *testenv.Etcd) {
	c := client(t, e)
	w := locktest.Open(t, e.URL, lock.Options{})
	if _, err := w.TryAcquire(locktest.Context(t), "jobs/a"); err != nil {
		t.Fatal(err)
	}
	if _, err := locktest.Open(t, e.URL, lock.Options{}).TryAcquire(locktest.Context(t), "jobs/a/b"); err != nil {
		t.Fatal(err)
	}
	if err := session(t, e, "by-etcdctl").Lock(locktest.Context(t)); err != nil {
		t.Fatal(err)
	}
	// A data key that looks like a lock key but has no lease.
	if _, err := c.Put(locktest.Context(t), "config/beef", "v"); err != nil {
		t.Fatal(err)
	}
	// A lock key of a name withlock could not take (not UTF-8).
	g, err := c.Grant(locktest.Context(t), 30)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Put(locktest.Context(t), etcd.Key("\xff", int64(g.ID)), "", clientv3.WithLease(g.ID)); err != nil {
		t.Fatal(err)
	}
	// A waiter is not a holder, and its name is listed once.
	waiting := make(chan error, 1)
	ctx, cancel := context.WithCancel(locktest.Context(t))
	go func() {
		_, _, err := locktest.Open(t, e.URL, lock.Options{}).Backend.(lock.Waiter).Acquire(ctx, "jobs/a")
		waiting <- err
	}()
	defer func() { cancel(); <-waiting }()
	waitWatchers(t, e, 3)

	all, err := w.List(locktest.Context(t))
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for _, st := range all {
		k := st.Name
		if k == "" {
			k = "key " + st.Key
		}
		got[k] += len(st.Holders)
	}
	want := map[string]int{"jobs/a": 1, "jobs/a/b": 1, "by-etcdctl": 1, "key \xff/": 1}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("List: %v; want %v", got, want)
	}
}

// enableAuth creates the root user with password rootPassword and turns
// authentication on, as etcdctl user add root and etcdctl auth enable do.
func enableAuth(t *testing.T, e *testenv.Etcd, rootPassword string) {
	t.Helper()
	if err := e.EnableAuth(rootPassword); err != nil {
		t.Fatal(err)
	}
}

// addUser creates user name with password, allowed to read and write the
// keys under prefix and nothing else (an empty prefix: no key at all).
func addUser(t *testing.T, e *testenv.Etcd, name, password, prefix string) {
	t.Helper()
	if err := e.AddUser(name, password, prefix); err != nil {
		t.Fatal(err)
	}
}

// A waiter takes the lock from watch events only while they show every key
// before its own gone and its own still there: a key made a lock key by
// hand ahead of it (a lease attached to an older key) is waited for, and a
// waiter whose own key was deleted does not take the lock.
func TestWaitFollowsTheQueue(t *testing.T) {
	e := testenv.RequireEtcd(t)
	c := client(t, e)
	ctx := locktest.Context(t)
	name := locktest.Name(t)
	// An older key of name with a lease ID's form but no lease: not a lock
	// key, until a lease is attached to it.
	byHand := etcd.Prefix(name) + "abc"
	if _, err := c.Put(ctx, byHand, ""); err != nil {
		t.Fatal(err)
	}
	a := locktest.Open(t, e.URL, lock.Options{})
	ha, err := a.Acquire(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	b := locktest.Open(t, e.URL, lock.Options{})
	got := make(chan *lock.Held, 1)
	go func() {
		h, err := b.Acquire(ctx, name)
		if err != nil {
			t.Error(err)
		}
		got <- h
	}()
	waitWatchers(t, e, 2)
	g, err := c.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Put(ctx, byHand, "", clientv3.WithLease(g.ID)); err != nil {
		t.Fatal(err)
	}
	if err := ha.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case h := <-got:
		t.Fatalf("the waiter took the lock while a key before its own was there (%v)", h != nil)
	case <-time.After(500 * time.Millisecond): // it must not return: a wait is the check
	}
	if _, err := c.Revoke(ctx, g.ID); err != nil {
		t.Fatal(err)
	}
	h := <-got
	if h == nil {
		return
	}
	if err := h.Release(ctx); err != nil {
		t.Fatal(err)
	}

	// The waiter's own key deleted by hand while it waits: the deletion of
	// the key before it does not give it the lock for longer than the watch
	// of its key takes to say so, as for a holder whose key is deleted.
	// Behind a holder alone it takes the lock without a read (the hand-off
	// reads nothing), and loses it at once; else its read ends the wait.
	ha, err = a.Acquire(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		l, _, err := b.Backend.(lock.Waiter).Acquire(ctx, name)
		if err == nil {
			wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			if err = l.(lock.Watcher).Watch(wctx); err == nil {
				err = errors.New("held, and its watch saw no deletion within 5s")
			}
			cancel()
			l.Release(ctx)
		}
		done <- err
	}()
	waitWatchers(t, e, 2)
	ks := keys(t, c, name)
	if len(ks) != 2 {
		t.Fatalf("keys of a holder and a waiter: %q", ks)
	}
	if _, err := c.Delete(ctx, ks[1]); err != nil {
		t.Fatal(err)
	}
	if err := ha.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, lock.ErrHeld) && !errors.Is(err, lock.ErrLost) {
		t.Errorf("the wait of a waiter whose key was deleted: %v; want ErrHeld, or the lock lost at once", err)
	}
}
