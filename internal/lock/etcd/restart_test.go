package etcd_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/withlock/withlock/internal/lock"
	"github.com/withlock/withlock/internal/lock/etcd"
	"github.com/withlock/withlock/internal/lock/locktest"
	"github.com/withlock/withlock/internal/testenv"
)

// eachCluster runs test, side by side, on a 3-member cluster of the
// system's etcd and of every release of testenv.EtcdVersions, each with
// authentication off and on; url names all three members (as wl, who may
// read and write every key, with authentication on).
func eachCluster(t *testing.T, test func(t *testing.T, members []*testenv.Etcd, url string)) {
	eachRelease(t, true, testenv.EtcdOptions{}, func(t *testing.T, o testenv.EtcdOptions, auth bool) {
		members := startCluster(t, o)
		var eps []string
		for _, m := range members {
			eps = append(eps, m.Endpoint)
		}
		url := "etcd://" + strings.Join(eps, ",")
		if auth {
			addUser(t, members[0], "wl", "wlpw", testenv.EtcdEveryKey)
			enableAuth(t, members[0], "rootpw")
			for _, m := range members {
				m.Root = "rootpw"
			}
			url = "etcd://wl:wlpw@" + strings.Join(eps, ",")
		}
		test(t, members, url)
	})
}

// through is url, of eachCluster, with endpoints in place of its own:
// the same user, other members or a proxy.
func through(url string, endpoints ...string) string {
	scheme, rest, _ := strings.Cut(url, "://")
	user, _, ok := strings.Cut(rest, "@")
	if !ok {
		user = ""
	} else {
		user += "@"
	}
	return scheme + "://" + user + strings.Join(endpoints, ",")
}

// runs counts the commands that run at once, and fails t if two do.
type runs struct {
	t   *testing.T
	now atomic.Int32
}

func (r *runs) start(who string) {
	if n := r.now.Add(1); n > 1 {
		r.t.Errorf("%s runs while %d others do", who, n-1)
	}
}

func (r *runs) stop() { r.now.Add(-1) }

// restartMember stops m as an operator does (SIGTERM, then its graceful
// stop to the end) and starts it again on its data, once it serves.
func restartMember(t *testing.T, m *testenv.Etcd) {
	t.Helper()
	start := time.Now()
	if err := m.Stop(); err != nil {
		t.Fatal(err)
	}
	stopped := time.Since(start)
	if err := m.Start(); err != nil {
		t.Fatal(err)
	}
	t.Logf("member %s stopped in %v, serves again after %v", m.Endpoint, stopped.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
}

// TestRollingRestart: a holder and two waiters, the URL naming all three
// members of a cluster, with --ttl 9s; each member in turn is stopped
// gracefully and started again, serving before the next one stops, the
// way an upgrade or a configuration change rolls through a cluster. The
// holder keeps its lock throughout, no waiter gets it meanwhile, and once
// the holder lets go each waiter gets it in turn: all three run, one at a
// time.
func TestRollingRestart(t *testing.T) {
	testenv.RequireEtcd(t)
	eachCluster(t, func(t *testing.T, members []*testenv.Etcd, url string) {
		opts := lock.Options{TTL: 9 * time.Second}
		r := &runs{t: t}
		name := locktest.Name(t)
		holder, err := locktest.Open(t, url, opts).Acquire(locktest.Context(t), name)
		if err != nil {
			t.Fatal(err)
		}
		r.start("the holder")
		got := make(chan *lock.Held, 2)
		// The waiters end before their clients are closed (cleanups run
		// last first), whatever ends the test: a waiter must not report
		// on a test that is over.
		ctx, cancel := context.WithCancel(locktest.Context(t))
		var waiters sync.WaitGroup
		for range 2 {
			waiter := locktest.Open(t, url, opts)
			waiters.Go(func() {
				h, err := waiter.Acquire(ctx, name)
				if err != nil && ctx.Err() == nil {
					t.Errorf("a waiter: %v", err)
				}
				got <- h
			})
		}
		t.Cleanup(func() { cancel(); waiters.Wait() })
		waitKeys(t, members[0], name, 3)
		for _, m := range members {
			restartMember(t, m)
			select {
			case <-holder.Lost():
				t.Fatalf("the holder lost its lock: %v", holder.Err())
			case h := <-got:
				t.Fatalf("a waiter got the lock while the holder held it (%v)", h != nil)
			default:
			}
		}
		// A renewal of each after the last restart.
		select {
		case <-holder.Lost():
			t.Fatalf("the holder lost its lock: %v", holder.Err())
		case h := <-got:
			t.Fatalf("a waiter got the lock while the holder held it (%v)", h != nil)
		case <-time.After(opts.TTL / 2):
		}
		r.stop()
		if err := holder.Release(locktest.Context(t)); err != nil {
			t.Fatalf("the holder's release: %v", err)
		}
		for i := range 2 {
			select {
			case h := <-got:
				if h == nil {
					t.Fatalf("waiter %d failed", i+1)
				}
				r.start(fmt.Sprintf("waiter %d", i+1))
				select {
				case <-h.Lost():
					t.Fatalf("waiter %d lost its lock: %v", i+1, h.Err())
				case <-time.After(100 * time.Millisecond):
				}
				r.stop()
				if err := h.Release(locktest.Context(t)); err != nil {
					t.Fatalf("waiter %d's release: %v", i+1, err)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("waiter %d did not get the lock within 10s of the release before", i+1)
			}
		}
	})
}

// waitKeys waits until name has n keys (holders and waiters) on m.
func waitKeys(t *testing.T, m *testenv.Etcd, name string, n int) {
	t.Helper()
	c := client(t, m)
	for {
		// A read that fails is tried again: on a busy machine the
		// cluster may be electing a leader ("leader changed").
		resp, err := c.Get(locktest.Context(t), etcd.Prefix(name), clientv3.WithPrefix(), clientv3.WithKeysOnly())
		if err == nil && len(resp.Kvs) == n {
			return
		}
		select {
		case <-locktest.Context(t).Done():
			t.Fatalf("%s never had %d keys (last read: %v)", name, n, err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// TestGracefulRestart: a single member, restarted gracefully (SIGTERM,
// then started again on its data) while a holder with --ttl 15s holds and
// a waiter, connected to the same member, waits. The member serves the
// streams it has until it stops, and the holder's renewals are sent on
// one: the holder keeps its lock, and the waiter gets it once it lets go.
// (A stop and start take some 6s on a busy 2-core machine: the ttl leaves
// the holder 10s to reach the member again.)
func TestGracefulRestart(t *testing.T) {
	eachSetUp(t, true, 5*time.Second, func(t *testing.T, e *testenv.Etcd, url string) {
		opts := lock.Options{TTL: 15 * time.Second}
		name := locktest.Name(t)
		holder, err := locktest.Open(t, url, opts).Acquire(locktest.Context(t), name)
		if err != nil {
			t.Fatal(err)
		}
		got := make(chan *lock.Held, 1)
		waiter := locktest.Open(t, url, opts)
		ctx, cancel := context.WithCancel(locktest.Context(t))
		var waiting sync.WaitGroup
		waiting.Go(func() {
			h, err := waiter.Acquire(ctx, name)
			if err != nil && ctx.Err() == nil {
				t.Errorf("the waiter: %v", err)
			}
			got <- h
		})
		t.Cleanup(func() { cancel(); waiting.Wait() }) // before the waiter's Close
		waitWatchers(t, e, 2)
		restartMember(t, e)
		select {
		case <-holder.Lost():
			t.Fatalf("the holder lost its lock: %v", holder.Err())
		case h := <-got:
			t.Fatalf("the waiter got the lock while the holder held it (%v)", h != nil)
		case <-time.After(opts.TTL / 2):
		}
		if err := holder.Release(locktest.Context(t)); err != nil {
			t.Fatalf("the holder's release: %v", err)
		}
		select {
		case h := <-got:
			if h != nil {
				h.Release(locktest.Context(t))
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the waiter did not get the lock within 10s of the release")
		}
	})
}

// TestWaiterKeepsItsPlace: a waiter whose only member is stopped, and
// started again within the waiter's ttl, is still first in the queue: it,
// not a waiter that came after it through another member, gets the lock
// when the holder lets go.
func TestWaiterKeepsItsPlace(t *testing.T) {
	testenv.RequireEtcd(t)
	eachCluster(t, func(t *testing.T, members []*testenv.Etcd, url string) {
		opts := lock.Options{TTL: 9 * time.Second}
		name := locktest.Name(t)
		holder, err := locktest.Open(t, through(url, members[1].Endpoint), opts).Acquire(locktest.Context(t), name)
		if err != nil {
			t.Fatal(err)
		}
		type grant struct {
			who string
			h   *lock.Held
		}
		got := make(chan grant, 2)
		ctx, cancel := context.WithCancel(locktest.Context(t))
		var waiters sync.WaitGroup
		wait := func(who string, m *testenv.Etcd) {
			w := locktest.Open(t, through(url, m.Endpoint), opts)
			waiters.Go(func() {
				h, err := w.Acquire(ctx, name)
				if err != nil && ctx.Err() == nil {
					t.Errorf("%s: %v", who, err)
				}
				got <- grant{who, h}
			})
			t.Cleanup(func() { cancel(); waiters.Wait() }) // before w's Close
		}
		wait("the first waiter", members[0])
		waitKeys(t, members[1], name, 2)
		wait("the second waiter", members[2])
		waitKeys(t, members[1], name, 3)
		restartMember(t, members[0])
		if err := holder.Release(locktest.Context(t)); err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{"the first waiter", "the second waiter"} {
			select {
			case g := <-got:
				if g.h == nil {
					t.Fatalf("%s failed", g.who)
				}
				if g.who != want {
					t.Errorf("%s got the lock; want %s", g.who, want)
				}
				if err := g.h.Release(locktest.Context(t)); err != nil {
					t.Fatal(err)
				}
			case <-time.After(20 * time.Second):
				t.Fatalf("%s did not get the lock", want)
			}
		}
	})
}
