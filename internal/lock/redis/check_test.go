package redis_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/withlock/withlock/internal/lock"
	"github.com/withlock/withlock/internal/lock/locktest"
	"github.com/withlock/withlock/internal/testenv"
)

// TestCheck: withlock check on a real redis-server reads eviction and
// durability from INFO (and CONFIG where allowed), and leaves no key of its
// probe behind.
func TestCheck(t *testing.T) {
	r := testenv.RequireRedis(t)
	do := func(args ...string) string {
		t.Helper()
		out, err := testenv.RedisDo(locktest.Context(t), r.URL, args...)
		if err != nil {
			t.Fatalf("%q: %v", args, err)
		}
		return out
	}
	check := func(url string) map[string]lock.Finding {
		t.Helper()
		c := locktest.Open(t, url, lock.Options{})
		findings, err := c.Check(locktest.Context(t))
		if err != nil {
			t.Fatal(err)
		}
		byName := map[string]lock.Finding{}
		for _, f := range findings {
			byName[f.Name] = f
		}
		if byName["probe lock"].Status != lock.Ok {
			t.Errorf("probe lock: %+v", byName["probe lock"])
		}
		if keys := do("KEYS", "*"+lock.ProbePrefix+"*"); keys != "" {
			t.Errorf("left behind: %q", keys)
		}
		return byName
	}
	want := func(f lock.Finding, status lock.Status, says string) {
		t.Helper()
		if f.Status != status || !strings.Contains(f.Detail, says) {
			t.Errorf("%s: %s %s; want %s, saying %q", f.Name, f.Status, f.Detail, status, says)
		}
	}

	// The test server: noeviction, no memory limit, no persistence.
	got := check(r.URL)
	want(got["eviction"], lock.Ok, "never evicts")
	want(got["durability"], lock.Warn, "has no persistence")
	do("CONFIG", "SET", "maxmemory-policy", "allkeys-lru")
	want(check(r.URL)["eviction"], lock.Ok, "has no memory limit")

	do("CONFIG", "SET", "maxmemory", "100mb")
	do("CONFIG", "SET", "maxmemory-policy", "volatile-lru")
	got = check(r.URL)
	want(got["eviction"], lock.Warn, "among the first to go")
	if !strings.Contains(got["eviction"].Fix, "noeviction") {
		t.Errorf("eviction fix: %q", got["eviction"].Fix)
	}
	do("CONFIG", "SET", "maxmemory-policy", "noeviction")
	want(check(r.URL)["eviction"], lock.Ok, "never evicts")

	do("CONFIG", "SET", "save", "3600 1")
	want(check(r.URL)["durability"], lock.Warn, "keeps only snapshots")
	do("CONFIG", "SET", "appendonly", "yes")
	want(check(r.URL)["durability"], lock.Ok, "append-only file")
	sep := "?"
	if strings.Contains(r.URL, "?") {
		sep = "&"
	}
	want(check(r.URL + sep + "wait_replicas=0")["durability"], lock.Ok, "append-only file")
}

// TestCheckCluster: a node of a Redis Cluster, given alone, is found to be
// one, locks are taken there, and withlock check reports every master.
func TestCheckCluster(t *testing.T) {
	r := testenv.RequireRedis(t, testenv.RedisOptions{Cluster: true})
	c := locktest.Open(t, r.URL, lock.Options{})
	l, err := c.TryAcquire(locktest.Context(t), "job")
	if err != nil {
		t.Fatalf("TryAcquire on a cluster node: %v", err)
	}
	l.Release(locktest.Context(t))
	findings, err := c.Check(locktest.Context(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range findings {
		if f.Status == lock.Fail {
			t.Errorf("%+v; want no failed check", f)
		}
	}

	three := testenv.RequireRedisCluster(t)
	findings, err = locktest.Open(t, three.URL, lock.Options{}).Check(locktest.Context(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, node := range three.Nodes {
		addr := fmt.Sprintf("127.0.0.1:%d", node.Port)
		n := 0
		for _, f := range findings {
			if strings.Contains(f.Detail, addr) {
				n++
			}
		}
		if n != 2 {
			t.Errorf("%d findings about master %s; want 2 (eviction, durability): %+v", n, addr, findings)
		}
	}
}
