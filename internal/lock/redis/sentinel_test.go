package redis_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/withlock/withlock/internal/lock"
	"github.com/withlock/withlock/internal/lock/locktest"
	"github.com/withlock/withlock/internal/lock/redis"
	"github.com/withlock/withlock/internal/testenv"
)

// TestSentinelConformance: the shared suite through a Sentinel URL.
func TestSentinelConformance(t *testing.T) {
	s := testenv.RequireRedisSentinel(t, testenv.RedisOptions{Password: "s3cret-pw"})
	locktest.Run(t, locktest.Config{
		Open: func(t *testing.T, opts lock.Options) *lock.Client { return locktest.Open(t, s.URL, opts) },
		Lease: &locktest.Lease{Break: func(t *testing.T, name string) {
			primary := s.Primary(locktest.Context(t))
			if n := do(t, primary.URL, "DEL", redis.Key(name)); n != "1" {
				t.Fatalf("DEL %s: %q", redis.Key(name), n)
			}
		}},
		Modes: locktest.Modes{RecordsN: true},
	})
}

// TestSentinelFailover: a failover while one holds the lock and another
// waits for it. The holder either keeps its lease (replicated, with
// wait_replicas=1, and renewed on the new primary) or loses it (a renewal
// refused by the demoted server); the waiter keeps waiting, with no
// refusal, and gets the lock on the new primary only once the holder has
// released or lost it.
func TestSentinelFailover(t *testing.T) {
	for _, query := range []string{"", "?wait_replicas=1"} {
		t.Run("URL"+query, func(t *testing.T) {
			s := testenv.RequireRedisSentinel(t, testenv.RedisOptions{Password: "s3cret-pw"})
			testSentinelFailover(t, s, s.URL+query)
		})
	}
}

func testSentinelFailover(t *testing.T, s *testenv.RedisSentinel, url string) {
	ctx := locktest.Context(t)
	name := locktest.Name(t)
	opts := lock.Options{TTL: 3 * time.Second, ConnectTimeout: 20 * time.Second}
	holder, err := locktest.Open(t, url, opts).Acquire(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	first, _ := holder.Token()
	type result struct {
		h   *lock.Held
		at  time.Time
		err error
	}
	got := make(chan result, 1)
	go func() {
		h, err := locktest.Open(t, url, opts).Acquire(ctx, name)
		got <- result{h, time.Now(), err}
	}()
	old := s.Primary(ctx)
	for do(t, old.URL, "PUBSUB", "NUMSUB", redis.Channel(name)) != redis.Channel(name)+"\n1" {
		time.Sleep(10 * time.Millisecond) // the waiter's subscription: it waits
	}
	promoted, err := s.Failover(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if promoted == old {
		t.Fatal("the failover kept the old primary")
	}
	// Two renewals' time (ttl/3 each) on the new primary, or a loss.
	select {
	case <-holder.Lost():
		t.Logf("the holder lost its lock in the failover: %v", holder.Err())
	case <-time.After(2 * time.Second):
	}
	select {
	case r := <-got:
		t.Fatalf("the waiter got %v, %v while the holder held the lock", r.h, r.err)
	default:
	}
	released := time.Now()
	holder.Release(ctx)
	r := <-got
	if r.err != nil {
		t.Fatalf("the waiter across the failover: %v", r.err)
	}
	defer r.h.Release(ctx)
	if r.at.Before(released) {
		t.Errorf("the waiter got the lock %v before the holder released it", released.Sub(r.at))
	}
	if tok, _ := r.h.Token(); tok <= first {
		t.Errorf("the waiter's token %d is not above the holder's %d", tok, first)
	}
	if do(t, promoted.URL, "EXISTS", redis.Key(name)) != "1" {
		t.Errorf("the waiter's lease is not on the new primary")
	}
}

// TestSentinelURL: what a redis+sentinel URL must say.
func TestSentinelURL(t *testing.T) {
	for _, u := range []string{
		"redis+sentinel://127.0.0.1:26379",
		"redis+sentinel://127.0.0.1:26379/",
		"redis+sentinel://127.0.0.1:26379/a/b",
		"redis+sentinel://127.0.0.1:26379/locks?db=x",
		"redis+sentinel://127.0.0.1:26379/locks?nosuch=1",
		"redis+sentinel://127.0.0.1:26379/locks?cacert=/ca.pem",
	} {
		if _, err := lock.Open(u, lock.Options{}); !errors.Is(err, lock.ErrUsage) {
			t.Errorf("%s: %v; want ErrUsage", u, err)
		}
	}
	for _, u := range []string{
		"redis+sentinel://:pw@127.0.0.1:26379,127.0.0.1,localhost:26380/locks?db=2&wait_replicas=1&sentinel_password=x",
	} {
		b, err := lock.Open(u, lock.Options{})
		if err != nil {
			t.Errorf("%s: %v", u, err)
			continue
		}
		b.Close()
	}
}

// TestSentinelFailoverStress: six exclusive contenders take turns on one
// name through Sentinel while the Sentinels fail over. Each records when
// it ran its critical section: from the grant until it gives the lock back,
// or until it learns that it lost it. Without wait_replicas a failover may
// lose a lease not yet replicated (docs/redis.md), and then two may run at
// once, but never longer than the loser's next renewal: under a ttl. The
// overlap measured is logged.
func TestSentinelFailoverStress(t *testing.T) {
	s := testenv.RequireRedisSentinel(t, testenv.RedisOptions{Password: "s3cret-pw"})
	const ttl = 3 * time.Second
	name := locktest.Name(t)
	ctx, cancel := context.WithCancel(locktest.Context(t))
	defer cancel()
	type span struct{ enter, exit time.Time }
	var (
		mu    sync.Mutex
		spans []span
		lost  int
		wg    sync.WaitGroup
	)
	for i := range 6 {
		c := locktest.Open(t, s.URL, lock.Options{TTL: ttl, ConnectTimeout: 30 * time.Second})
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				h, err := c.Acquire(ctx, name)
				if err != nil {
					if ctx.Err() == nil {
						t.Errorf("contender %d: %v", i, err)
					}
					return
				}
				sp := span{enter: time.Now()}
				select {
				case <-h.Lost():
					sp.exit = time.Now()
					mu.Lock()
					lost++
					mu.Unlock()
				case <-time.After(time.Duration(20+i*5) * time.Millisecond):
					sp.exit = time.Now()
				}
				h.Release(context.WithoutCancel(ctx))
				mu.Lock()
				spans = append(spans, sp)
				mu.Unlock()
			}
		}()
	}
	count := func() int { mu.Lock(); defer mu.Unlock(); return len(spans) }
	waitHolds := func(n int, what string) {
		for deadline := time.Now().Add(time.Minute); count() < n; {
			if time.Now().After(deadline) {
				cancel()
				wg.Wait()
				t.Fatalf("%d holds within a minute, not %d: %s", count(), n, what)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitHolds(20, "the contenders take turns")
	if _, err := s.Failover(ctx); err != nil {
		t.Fatal(err)
	}
	waitHolds(count()+40, "they go on on the new primary")
	cancel()
	wg.Wait()
	slices.SortFunc(spans, func(a, b span) int { return a.enter.Compare(b.enter) })
	var overlaps int
	var worst time.Duration
	for i := 1; i < len(spans); i++ {
		for j := 0; j < i; j++ {
			if d := spans[j].exit.Sub(spans[i].enter); d > 0 {
				overlaps++
				worst = max(worst, d)
			}
		}
	}
	t.Logf("%d holds across a failover, %d lost, %d overlaps, the longest %v", len(spans), lost, overlaps, worst)
	if worst >= ttl {
		t.Errorf("two ran at once for %v; want less than the ttl (%v)", worst, ttl)
	}
}

// TestSentinelACL: docs/redis.md's minimal ACL, on the primary and its
// replica, takes, waits for, releases, inspects and breaks locks through
// Sentinel.
func TestSentinelACL(t *testing.T) {
	s := testenv.RequireRedisSentinel(t)
	rule := strings.Fields(minimalACL)
	for _, r := range s.Servers {
		do(t, r.URL, append([]string{"ACL", "SETUSER", "locker", "on", ">pw"}, rule...)...)
	}
	url := strings.Replace(s.URL, "redis+sentinel://", "redis+sentinel://locker:pw@", 1)
	everyOperation(t, url, lock.Options{}, func(ctx context.Context, name string) {
		primary := s.Primary(ctx)
		testenv.WaitFor(t, "the waiter's subscription", func() bool {
			return do(t, primary.URL, "PUBSUB", "NUMSUB", redis.Channel(name)) == redis.Channel(name)+"\n1"
		})
	})
}
