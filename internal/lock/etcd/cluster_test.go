package etcd_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/withlock/withlock/internal/lock"
	"github.com/withlock/withlock/internal/lock/locktest"
	"github.com/withlock/withlock/internal/testenv"
)

// startCluster starts a 3-member cluster with o, closed when t ends; a
// missing etcd skips t (fails it under CI) saying how to get one.
func startCluster(t *testing.T, o ...testenv.EtcdOptions) []*testenv.Etcd {
	t.Helper()
	members, err := testenv.StartEtcdCluster(3, o...)
	if errors.Is(err, testenv.ErrNoEtcd) || errors.Is(err, testenv.ErrNoEtcdVersion) {
		testenv.RequireEtcd(t, o...)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, m := range members {
			m.Close()
		}
	})
	return members
}

// TestLeaderKilled: on a 3-member cluster, given by every member's
// address, the leader first, the leader is stopped while a holder holds
// and a waiter waits.
// The cluster still has a majority, so it still holds the lock: the holder
// keeps it for two ttls more (its requests go to another member), the
// waiter keeps its place and gets the lock once, and only once, the holder
// lets go.
func TestLeaderKilled(t *testing.T) {
	testenv.RequireEtcd(t)
	members := startCluster(t)
	var endpoints []string
	for _, m := range members {
		endpoints = append(endpoints, m.Endpoint)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	leader := -1
	for i, m := range members {
		st, err := cli.Status(locktest.Context(t), m.Endpoint)
		if err != nil {
			t.Fatal(err)
		}
		if st.Leader == st.Header.MemberId {
			leader = i
		}
	}
	if leader < 0 {
		t.Fatal("no member says it leads")
	}
	// The leader first: withlock's requests go to it until it stops.
	ordered := append([]string{endpoints[leader]}, append(slices.Clone(endpoints[:leader]), endpoints[leader+1:]...)...)
	url := "etcd://" + strings.Join(ordered, ",")
	opts := lock.Options{TTL: 3 * time.Second, Grace: time.Second}
	holder := locktest.Open(t, url, opts)
	held, err := holder.Acquire(locktest.Context(t), "job")
	if err != nil {
		t.Fatal(err)
	}
	waiter := locktest.Open(t, url, opts)
	got := make(chan *lock.Held, 1)
	go func() {
		h, err := waiter.Acquire(locktest.Context(t), "job")
		if err != nil {
			t.Error(err)
		}
		got <- h
	}()
	// The waiter is queued once its key is there: two keys under job/.
	for {
		resp, err := cli.Get(locktest.Context(t), "job/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		if resp.Count == 2 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}

	if err := members[leader].Stop(); err != nil {
		t.Fatal(err)
	}
	t.Logf("stopped the leader, member %d", leader)

	// Two ttls: every renewal in them must find a member that serves.
	select {
	case <-held.Lost():
		t.Fatalf("the holder lost its lock when the leader stopped: %v", held.Err())
	case h := <-got:
		t.Fatalf("the waiter got the lock while the holder held it (%v)", h != nil)
	case <-time.After(2 * opts.TTL):
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := held.Release(ctx); err != nil {
		t.Fatalf("release: %v", err)
	}
	select {
	case h := <-got:
		if h == nil {
			t.Fatal("the waiter failed")
		}
		tok1, _ := held.Token()
		tok2, _ := h.Token()
		if tok2 <= tok1 {
			t.Errorf("tokens %d then %d; want them to grow", tok1, tok2)
		}
		h.Release(ctx)
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter did not get the lock within 10s of the release")
	}
}
