package redis_test

import (
	"context"
	"errors"
	"fmt"
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

// TestClusterConformance: the shared suite on a three-master cluster, given
// by all its nodes (redis://...?addr=...&addr=...); its core also given by
// one node's URL (the other tests here use that form too).
func TestClusterConformance(t *testing.T) {
	c := testenv.RequireRedisCluster(t, testenv.RedisOptions{Password: "s3cret-pw"})
	for _, u := range []struct{ name, url string }{{"AllNodes", c.URL}, {"OneNode", c.Nodes[1].URL}} {
		t.Run(u.name, func(t *testing.T) {
			locktest.Run(t, locktest.Config{
				Open: func(t *testing.T, opts lock.Options) *lock.Client { return locktest.Open(t, u.url, opts) },
				Lease: &locktest.Lease{Break: func(t *testing.T, name string) {
					if n := do(t, c.URL, "DEL", redis.Key(name)); n != "1" {
						t.Fatalf("DEL %s: %q", redis.Key(name), n)
					}
				}},
				Modes:    locktest.Modes{RecordsN: true},
				CoreOnly: u.name == "OneNode",
			})
		})
	}
}

// TestClusterURLOptions: the URL that names every node takes the same
// options as one node's (wait_replicas here), and refuses an unknown one.
func TestClusterURLOptions(t *testing.T) {
	c := testenv.RequireRedisCluster(t)
	if !strings.Contains(c.URL, "?addr=") {
		t.Fatalf("the cluster's URL %s does not name its nodes with addr", c.URL)
	}
	l, err := locktest.Open(t, c.URL+"&wait_replicas=0", lock.Options{}).TryAcquire(locktest.Context(t), locktest.Name(t))
	if err != nil {
		t.Fatalf("with wait_replicas: %v", err)
	}
	if err := l.Release(locktest.Context(t)); err != nil {
		t.Fatal(err)
	}
	if _, err := lock.Open(c.URL+"&bogus=1", lock.Options{}); !errors.Is(err, lock.ErrUsage) {
		t.Errorf("an unknown option: %v; want a usage error", err)
	}
}

// TestClusterSlots: names spread over the masters; every key one NAME
// writes (its lock, fence and writer mark) is in the NAME's slot on the
// master that serves it, as the server itself hashes them; status with no
// NAME lists every master's locks; a per-slot fresh key that does not hold
// its master's run_id holds back that slot's NAMEs alone.
func TestClusterSlots(t *testing.T) {
	c := testenv.RequireRedisCluster(t)
	ctx := locktest.Context(t)
	cl := locktest.Open(t, c.Nodes[0].URL, lock.Options{TTL: time.Minute})
	base := locktest.Name(t)
	names := []string{base + "{a}", base + "-b", base + "%7B}{", "{" + base + "}"}
	for i := range 8 {
		names = append(names, fmt.Sprintf("%s-%d", base, i))
	}
	masters := map[int]bool{}
	for _, name := range names {
		// A shared holder, and an exclusive waiter's mark beside it.
		shared := locktest.Open(t, c.URL, lock.Options{Mode: lock.Shared, TTL: time.Minute})
		if _, err := shared.TryAcquire(ctx, name); err != nil {
			t.Fatalf("shared %q: %v", name, err)
		}
		if _, err := cl.TryAcquire(ctx, name); !errors.Is(err, lock.ErrHeld) {
			t.Fatalf("exclusive %q beside a shared holder: %v; want ErrHeld", name, err)
		}
		slot := redis.Slot(redis.Key(name))
		node := c.NodeOf(slot)
		masters[node] = true
		for _, key := range []string{redis.Key(name), redis.FenceKey(name), redis.WriterKey(name), redis.Channel(name)} {
			if got := do(t, c.Nodes[node].URL, "CLUSTER", "KEYSLOT", key); got != strconv.Itoa(slot) {
				t.Errorf("%q: %s is in slot %s; want %d, its lock's", name, key, got, slot)
			}
		}
		for _, key := range []string{redis.Key(name), redis.FenceKey(name), redis.WriterKey(name)} {
			if got := do(t, c.Nodes[node].URL, "EXISTS", key); got != "1" {
				t.Errorf("%q: %s is not on node %d, the master of slot %d", name, key, node, slot)
			}
		}
	}
	if len(masters) < 2 {
		t.Fatalf("the names fell on %d master(s); want at least 2", len(masters))
	}
	held, err := cl.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]bool{}
	for _, st := range held {
		listed[st.Name] = true
	}
	for _, name := range names {
		if !listed[name] {
			t.Errorf("status lists %d locks, not %q", len(held), name)
		}
	}

	// The fresh key of one name's slot, gone: that slot waits out its
	// master's uptime; another slot does not.
	name := base + "-fresh"
	do(t, c.URL, "DEL", redis.FreshKeyFor(redis.Slot(redis.Key(name))))
	if _, err := cl.TryAcquire(ctx, name); !errors.Is(err, lock.ErrUnsettled) {
		t.Errorf("TryAcquire without its slot's fresh key: %v; want ErrUnsettled", err)
	}
	for i := 0; ; i++ {
		other := fmt.Sprintf("%s-other%d", base, i)
		if redis.Slot(redis.Key(other)) != redis.Slot(redis.Key(name)) {
			if _, err := cl.TryAcquire(ctx, other); err != nil {
				t.Errorf("TryAcquire in another slot: %v", err)
			}
			break
		}
	}
}

// TestClusterFreshKeys: withlock's per-slot fresh keys (with which testenv
// marks a new cluster) are each in its slot as the server hashes it, every
// one of them.
func TestClusterFreshKeys(t *testing.T) {
	r := testenv.RequireRedis(t, testenv.RedisOptions{Cluster: true})
	c := client(t, r.URL)
	slots := make([]*goredis.IntCmd, redis.NumSlots)
	if _, err := c.Pipelined(locktest.Context(t), func(p goredis.Pipeliner) error {
		for slot := range slots {
			slots[slot] = p.ClusterKeySlot(locktest.Context(t), redis.FreshKeyFor(slot))
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for slot, got := range slots {
		if key := redis.FreshKeyFor(slot); got.Val() != int64(slot) || redis.Slot(key) != slot {
			t.Fatalf("%s: the server's slot %d, Slot %d; want %d", key, got.Val(), redis.Slot(key), slot)
		}
	}
	for _, key := range []string{"a{b}c", "{}x", "a{", "}{b}", "{{x}}", "x{y}z{w}"} {
		if got := do(t, r.URL, "CLUSTER", "KEYSLOT", key); got != strconv.Itoa(redis.Slot(key)) {
			t.Errorf("Slot(%q) = %d; the server says %s", key, redis.Slot(key), got)
		}
	}
}

// TestClusterURL: a cluster's URL has no database but 0.
func TestClusterURL(t *testing.T) {
	c := testenv.RequireRedisCluster(t)
	_, err := locktest.Open(t, strings.Replace(c.Nodes[0].URL, "/0", "/1", 1), lock.Options{}).TryAcquire(locktest.Context(t), "job")
	if !errors.Is(err, lock.ErrUsage) || !strings.Contains(err.Error(), "only database 0") {
		t.Errorf("a node's URL with /1: %v; want ErrUsage, only database 0", err)
	}
	if _, err := lock.Open(c.URL+"&x=1", lock.Options{}); !errors.Is(err, lock.ErrUsage) {
		t.Errorf("an unknown option: %v; want ErrUsage", err)
	}
}

// TestClusterACL: docs/redis.md's minimal ACL with the cluster's additions
// takes, waits for, releases, inspects and breaks locks on a cluster.
func TestClusterACL(t *testing.T) {
	c := testenv.RequireRedisCluster(t)
	rule := strings.Fields(minimalACL + " +cluster|slots +spublish +ssubscribe")
	for _, n := range c.Nodes {
		do(t, n.URL, append([]string{"ACL", "SETUSER", "locker", "on", ">pw"}, rule...)...)
	}
	url := strings.Replace(c.Nodes[2].URL, "redis://", "redis://locker:pw@", 1)
	everyOperation(t, url, lock.Options{TTL: 3 * time.Second}, nil)
}

// minimalACL is docs/redis.md's minimal ACL rule for withlock's user.
const minimalACL = "~withlock:* ~withlock-* &withlock:released:* +eval +evalsha +info +time +type +pttl +hgetall +hget +hset +hdel +hexists +del +set +get +pexpireat +publish +subscribe +ping +client|setname +multi +exec +scan"

// everyOperation takes, waits for, releases, inspects, lists and breaks a
// lock through url, with clients of opts. waiting, if not nil, waits
// until the waiter waits for name.
func everyOperation(t *testing.T, url string, opts lock.Options, waiting func(ctx context.Context, name string)) {
	t.Helper()
	ctx := locktest.Context(t)
	a, b := locktest.Open(t, url, opts), locktest.Open(t, url, opts)
	name := locktest.Name(t)
	held, err := a.Acquire(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		h, err := b.Acquire(ctx, name)
		if err == nil {
			err = h.Release(ctx)
		}
		got <- err
	}()
	if waiting != nil {
		waiting(ctx, name)
	}
	if st, err := a.Inspect(ctx, name); err != nil || len(st.Holders) != 1 {
		t.Errorf("Inspect: %+v, %v", st, err)
	}
	if _, err := a.List(ctx); err != nil {
		t.Errorf("List: %v", err)
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("the waiter: %v", err)
	}
	if _, err := a.TryAcquire(ctx, name); err != nil {
		t.Fatal(err)
	}
	if hs, err := b.Break(ctx, name); err != nil || len(hs) != 1 {
		t.Errorf("Break: %v, %v", hs, err)
	}
}

// TestClusterSlotNotServed: a NAME whose slot no master serves is an
// outage (CLUSTERDOWN), retried, not a refusal.
func TestClusterSlotNotServed(t *testing.T) {
	r := testenv.RequireRedis(t, testenv.RedisOptions{Cluster: true})
	name := locktest.Name(t)
	slot := strconv.Itoa(redis.Slot(redis.Key(name)))
	do(t, r.URL, "CLUSTER", "DELSLOTSRANGE", slot, slot)
	_, err := locktest.Open(t, r.URL, lock.Options{}).TryAcquire(locktest.Context(t), name)
	if !errors.Is(err, lock.ErrUnavailable) {
		t.Fatalf("TryAcquire in a slot nobody serves: %v; want ErrUnavailable", err)
	}
	if !strings.Contains(err.Error(), "CLUSTERDOWN") {
		t.Errorf("%v; want it to say CLUSTERDOWN", err)
	}
}

// TestClusterSlotMoves: a NAME's slot moves to another master while its
// lock is held (its keys migrated, as redis-cli --cluster reshard does):
// the holder renews and releases there, following MOVED, and a waiter
// takes the lock there.
func TestClusterSlotMoves(t *testing.T) {
	c := testenv.RequireRedisCluster(t)
	ctx := locktest.Context(t)
	name := locktest.Name(t)
	slot := redis.Slot(redis.Key(name))
	from := c.Nodes[c.NodeOf(slot)]
	to := c.Nodes[(c.NodeOf(slot)+1)%len(c.Nodes)]
	holder := locktest.Open(t, c.URL, lock.Options{TTL: time.Minute})
	l, err := holder.TryAcquire(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	fromID, toID := do(t, from.URL, "CLUSTER", "MYID"), do(t, to.URL, "CLUSTER", "MYID")
	s := strconv.Itoa(slot)
	do(t, to.URL, "CLUSTER", "SETSLOT", s, "IMPORTING", fromID)
	do(t, from.URL, "CLUSTER", "SETSLOT", s, "MIGRATING", toID)
	keys := strings.Split(do(t, from.URL, "CLUSTER", "GETKEYSINSLOT", s, "100"), "\n")
	do(t, from.URL, append([]string{"MIGRATE", "127.0.0.1", strconv.Itoa(to.Port), "", "0", "5000", "KEYS"}, keys...)...)
	for _, n := range c.Nodes {
		do(t, n.URL, "CLUSTER", "SETSLOT", s, "NODE", toID)
	}
	if got := do(t, to.URL, "EXISTS", redis.Key(name)); got != "1" {
		t.Fatalf("%s not migrated (keys %q)", redis.Key(name), keys)
	}
	// The slot's fresh key came along with the old master's run_id; the
	// new master, as young as the test, would otherwise be waited out.
	_, after, _ := strings.Cut(do(t, to.URL, "INFO", "server"), "run_id:")
	runID, _, _ := strings.Cut(after, "\r\n")
	do(t, to.URL, "SET", redis.FreshKeyFor(slot), runID)
	if err := l.Keep(ctx); err != nil {
		t.Fatalf("Keep after the slot moved: %v", err)
	}
	if _, err := locktest.Open(t, c.URL, lock.Options{}).TryAcquire(ctx, name); !errors.Is(err, lock.ErrHeld) || errors.Is(err, lock.ErrUnsettled) {
		t.Fatalf("TryAcquire on the new master while held: %v; want ErrHeld", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatalf("Release after the slot moved: %v", err)
	}
	l2, err := locktest.Open(t, c.Nodes[0].URL, lock.Options{}).TryAcquire(ctx, name)
	if err != nil {
		t.Fatalf("TryAcquire after the release: %v", err)
	}
	if tokenOf(l2) <= tokenOf(l) {
		t.Errorf("token %d after the move, %d before; want it to grow", tokenOf(l2), tokenOf(l))
	}
}
