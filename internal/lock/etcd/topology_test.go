package etcd_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/withlock/withlock/internal/lock"
	"github.com/withlock/withlock/internal/lock/locktest"
	"github.com/withlock/withlock/internal/testenv"
)

// handOff checks the lock through url: a holder, a second holder refused,
// a waiter that gets the lock once, and only once, the holder lets go.
func handOff(t *testing.T, url string) {
	t.Helper()
	// A ttl that leaves the holder 5s to renew: on a busy machine a
	// request through a cluster's members can take seconds.
	handOffWith(t, url, lock.Options{TTL: 6 * time.Second, Grace: time.Second})
}

// handOffWith is handOff with opts' ttl and grace.
func handOffWith(t *testing.T, url string, opts lock.Options) {
	t.Helper()
	name := locktest.Name(t)
	holder, err := locktest.Open(t, url, opts).Acquire(locktest.Context(t), name)
	if err != nil {
		t.Fatalf("through %s: %v", url, err)
	}
	noWait := opts
	noWait.NoWait = true
	if _, err := locktest.Open(t, url, noWait).Acquire(locktest.Context(t), name); !errors.Is(err, lock.ErrHeld) {
		t.Fatalf("a second holder beside the first: %v; want ErrHeld", err)
	}
	type result struct {
		h   *lock.Held
		err error
	}
	got := make(chan result, 1)
	waiter := locktest.Open(t, url, opts)
	ctx, cancel := context.WithCancel(locktest.Context(t))
	done := make(chan struct{})
	go func() {
		defer close(done)
		h, err := waiter.Acquire(ctx, name)
		got <- result{h, err}
	}()
	// The waiter ends before its backend is closed, whatever happens.
	defer func() { cancel(); <-done }()
	select {
	case r := <-got:
		t.Fatalf("the waiter ended while the holder held the lock: %v, %v", r.h, r.err)
	case <-holder.Lost():
		t.Fatalf("the holder lost its lock: %v", holder.Err())
	case <-time.After(opts.TTL): // renewals of both
	}
	if err := holder.Release(locktest.Context(t)); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-got:
		if r.err != nil {
			t.Fatalf("the waiter: %v", r.err)
		}
		if err := r.h.Release(locktest.Context(t)); err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter did not get the lock within 10s of the release")
	}
}

// TestLearnerFirst: a URL whose first member is a learner, which serves
// no lock, takes, renews and hands the lock over through the voting
// members, and withlock check names the learner without failing it.
func TestLearnerFirst(t *testing.T) {
	testenv.RequireEtcd(t)
	eachCluster(t, func(t *testing.T, members []*testenv.Etcd, url string) {
		learner, err := testenv.StartEtcdLearner(members, testenv.EtcdOptions{Version: members[0].Version})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { learner.Close() })
		eps := []string{learner.Endpoint}
		for _, m := range members {
			eps = append(eps, m.Endpoint)
		}
		url = through(url, eps...)
		handOff(t, url)
		findings, err := locktest.Open(t, url, lock.Options{}).Check(locktest.Context(t))
		if err != nil {
			t.Fatalf("withlock check with a learner first: %v", err)
		}
		for _, f := range findings {
			if f.Status == lock.Fail || f.Name == "cluster" && (f.Status != lock.Ok || !strings.Contains(f.Detail, "learners")) {
				t.Errorf("withlock check: %s %s: %s; want the cluster ok, its learner named", f.Status, f.Name, f.Detail)
			}
		}
	})
}

// TestGRPCProxy: `etcd grpc-proxy` in front of a cluster, the URL naming
// the proxy alone: the lock is taken, excludes and is handed over, and it
// excludes a holder that reaches the members directly. The proxy of etcd
// 3.5 and later does not renew leases when authentication is on (etcdctl
// lease keep-alive through it sees its lease expire): there a holder
// gives its lock up, and says so, within its ttl.
func TestGRPCProxy(t *testing.T) {
	testenv.RequireEtcd(t)
	eachCluster(t, func(t *testing.T, members []*testenv.Etcd, url string) {
		var eps []string
		for _, m := range members {
			eps = append(eps, m.Endpoint)
		}
		proxy, err := testenv.StartEtcdGRPCProxy(members[0].Version, eps)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { proxy.Close() })
		viaProxy := through(url, proxy.Endpoint)
		if strings.Contains(url, "@") && members[0].Version != "" {
			opts := lock.Options{TTL: 3 * time.Second, Grace: time.Second}
			h, err := locktest.Open(t, viaProxy, opts).Acquire(locktest.Context(t), locktest.Name(t))
			if err != nil {
				t.Fatal(err)
			}
			select {
			case <-h.Lost():
				if !strings.Contains(h.Err().Error(), "could not confirm") {
					t.Errorf("the holder lost its lock: %v; want could not confirm it", h.Err())
				}
			case <-time.After(opts.TTL + 5*time.Second):
				t.Fatal("the holder kept a lock whose lease the proxy did not renew")
			}
			return
		}
		// The proxy answers a renewal when it next renews the lease
		// itself, up to a third of the ttl later: a ttl of some seconds
		// leaves room for that on a busy machine.
		handOffWith(t, viaProxy, lock.Options{TTL: 9 * time.Second, Grace: 2 * time.Second})
		name := locktest.Name(t)
		h, err := locktest.Open(t, viaProxy, lock.Options{}).Acquire(locktest.Context(t), name)
		if err != nil {
			t.Fatal(err)
		}
		defer h.Release(locktest.Context(t))
		if _, err := locktest.Open(t, url, lock.Options{NoWait: true}).Acquire(locktest.Context(t), name); !errors.Is(err, lock.ErrHeld) {
			t.Errorf("a holder through the members, beside one through the proxy: %v; want ErrHeld", err)
		}
	})
}

// TestWithoutGateway: a member whose JSON gateway is off
// (--enable-grpc-gateway=false), and one that serves it on a port of its
// own (--listen-client-http-urls, a flag of etcd 3.5 and later): withlock
// speaks gRPC on the client port, and needs neither.
func TestWithoutGateway(t *testing.T) {
	testenv.RequireEtcd(t)
	eachRelease(t, true, testenv.EtcdOptions{}, func(t *testing.T, o testenv.EtcdOptions, auth bool) {
		set := func(e *testenv.Etcd) string {
			if !auth {
				return e.URL
			}
			addUser(t, e, "wl", "wlpw", testenv.EtcdEveryKey)
			enableAuth(t, e, "rootpw")
			return e.URLAs("wl", "wlpw")
		}
		off := o
		off.Flags = []string{"--enable-grpc-gateway=false"}
		handOff(t, set(testenv.RequireEtcd(t, off)))
		if o.Version == "" {
			return // etcd 3.4 has no --listen-client-http-urls
		}
		port, err := testenv.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		own := o
		own.Flags = []string{"--listen-client-http-urls", "http://127.0.0.1:" + strconv.Itoa(port)}
		handOff(t, set(testenv.RequireEtcd(t, own)))
	})
}
