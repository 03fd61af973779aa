package redis_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/withlock/withlock/internal/lock"
	"github.com/withlock/withlock/internal/lock/locktest"
	"github.com/withlock/withlock/internal/lock/redis"
	stresstest "github.com/withlock/withlock/internal/stress"
	"github.com/withlock/withlock/internal/stress/faultproxy"
	"github.com/withlock/withlock/internal/testenv"
)

var (
	stressLong = flag.Bool("stress.long", false, "TestClusterStress: run each mix for -stress.for (make stress)")
	stressFor  = flag.Duration("stress.for", 2*time.Minute, "with -stress.long: how long TestClusterStress runs each mix")
)

// clusterStressRun is how long TestClusterStress runs each mix in make
// test, both names at once, so that it adds seconds, not minutes; again,
// up to clusterStressAgain more times, only while that did not test what
// it should (a busy machine, where the proxied side, black-holed for up to
// a ttl at a time, may take many runs to fill a semaphore of 3).
const (
	clusterStressRun   = 4 * time.Second
	clusterStressAgain = 10
)

// TestClusterStress runs the mixes of TestModesStress on a three-master
// cluster whose node 1 clients reach through a fault proxy only (it
// announces the proxy's address), on two names at once: one whose slot
// node 1 serves, one on another master. Meanwhile the proxy cuts every
// connection, or black-holes them for up to longer than the ttl, at random.
// (First, on the same cluster, answerLost.)
// For each name it checks what TestModesStress checks: no incompatible
// holders inside at once, in the records and in what the server shows; a
// loss only as the keep loop giving up on an unanswered lock, never the
// server saying it was gone; no error from an acquisition, and none from
// a release but an outage's or, for one held up for longer than the
// grace, the lease found gone; and that connections went through the
// proxy. It logs the losses and the hand-offs.
//
// With -stress.long (make stress) each mix runs for -stress.for, and every
// contender must have held the lock at least once per minute of it.
func TestClusterStress(t *testing.T) {
	const fronted = 1
	c, proxy := frontedCluster(t, fronted)
	t.Run("a lost answer is an outage", func(t *testing.T) { answerLost(t, c, proxy, fronted) })
	// A few seconds are too few for every one of sixteen contenders to get
	// in, where some hold for longer than the ttl and exclusive waiters
	// keep shared ones out; minutes are not.
	run, again, minEach := clusterStressRun, clusterStressAgain, 0
	if *stressLong {
		run, again, minEach = *stressFor, 0, max(1, int(*stressFor/time.Minute))
	}
	for _, m := range modesMixes() {
		t.Run(m.desc, func(t *testing.T) {
			base := locktest.Name(t)
			names := map[string]string{
				"proxied": nameOn(c, base, func(node int) bool { return node == fronted }),
				"direct":  nameOn(c, base, func(node int) bool { return node != fronted }),
			}
			s := modesStress(c.URL, m, "proxied", "direct")
			s.Names, s.EachName = names, true
			s.For, s.Again, s.MinEach = run, again, minEach
			// A release that met an outage leaves the lease to run out:
			// the holder is out all the same. The keep loop had not given
			// up, so the lease had at least Grace left on the server when
			// the release began: one held up for longer (a partition) may
			// find it ended. One that was not, and finds it gone, shows a
			// lease that vanished while held.
			s.ReleaseOK = func(cl *lock.Client, err error, took time.Duration) bool {
				return errors.Is(err, lock.ErrUnavailable) ||
					strings.Contains(err.Error(), "no longer ours at release") && took > cl.Options().Grace
			}

			var cut atomic.Int64
			in := stresstest.Injector{
				MinPause: 200 * time.Millisecond,
				MaxPause: time.Second,
				Faults: []stresstest.Fault{
					{Name: "cuts", Inject: func(context.Context, *rand.Rand) bool { cut.Add(int64(proxy.Cut())); return true }},
					stresstest.BlackHole(proxy, 200*time.Millisecond, stressTTL+time.Second),
				},
			}
			ctx, stop := context.WithCancel(context.Background())
			faults := make(chan map[string]int, 1)
			go func() { faults <- in.Run(ctx, rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))) }()
			// One cut halfway through the first run, whichever faults the
			// injector chose: the connections it resets went through the
			// proxy.
			halfway := make(chan struct{})
			go func() {
				defer close(halfway)
				timer := time.NewTimer(run / 2)
				defer timer.Stop()
				select {
				case <-timer.C:
					cut.Add(int64(proxy.Cut()))
				case <-ctx.Done():
				}
			}()
			stints := s.Run(t)
			stop()
			injected := <-faults
			<-halfway
			t.Logf("faults through node %d's proxy: %d cuts and one halfway (%d connections reset), %d black-holes", fronted, injected["cuts"], cut.Load(), injected["black-holes"])
			if cut.Load() == 0 {
				t.Errorf("no connection went through the proxy of node %d", fronted)
			}
			for _, short := range slices.Sorted(maps.Keys(names)) {
				name := names[short]
				t.Logf("%s: %q on node %d", short, name, c.NodeOf(redis.Slot(redis.Key(name))))
				if h := handoffs(short, stints); len(h) > 0 {
					t.Logf("%s: %d hand-offs after an exclusive release: median %v, 90th percentile %v, longest %v", short,
						len(h), h[len(h)/2].Round(time.Millisecond), h[len(h)*9/10].Round(time.Millisecond), h[len(h)-1].Round(time.Millisecond))
				}
			}
		})
	}
}

// frontedCluster starts a three-master cluster whose node fronted clients
// reach only through the proxy it returns.
func frontedCluster(t *testing.T, fronted int) (*testenv.RedisCluster, *faultproxy.Proxy) {
	var proxy *faultproxy.Proxy
	c := testenv.RequireRedisCluster(t, testenv.RedisOptions{Front: func(node int, addr string) (string, error) {
		if node != fronted {
			return "", nil
		}
		p, err := faultproxy.Start(addr)
		if err != nil {
			return "", err
		}
		proxy = p
		t.Cleanup(func() { p.Close() })
		return p.Addr(), nil
	}})
	return c, proxy
}

// nameOn is the first of base-0, base-1, ... whose slot a master that on
// accepts serves.
func nameOn(c *testenv.RedisCluster, base string, on func(node int) bool) string {
	for i := 0; ; i++ {
		name := fmt.Sprintf("%s-%d", base, i)
		if on(c.NodeOf(redis.Slot(redis.Key(name)))) {
			return name
		}
	}
}

// handoffs are the times from each release of an exclusive holder of
// name (a Contender.Name) to the next entry of any holder of it, in
// increasing order: how long the lock stood free while others waited
// (sixteen contenders leave it no moment without a waiter).
func handoffs(name string, stints []locktest.Stint) []time.Duration {
	var on []locktest.Stint
	for _, s := range stints {
		if s.Name == name {
			on = append(on, s)
		}
	}
	byEntry := slices.Clone(on)
	slices.SortFunc(byEntry, func(x, y locktest.Stint) int { return x.Enter.Compare(y.Enter) })
	var gaps []time.Duration
	for _, s := range on {
		if s.Mode != lock.Exclusive || s.Kind != "" || s.Lost || s.Unreleased {
			continue
		}
		i, _ := slices.BinarySearchFunc(byEntry, s.Exit, func(x locktest.Stint, at time.Time) int { return x.Enter.Compare(at) })
		if i < len(byEntry) {
			gaps = append(gaps, byEntry[i].Enter.Sub(s.Exit))
		}
	}
	slices.Sort(gaps)
	return gaps
}

// answerLost: an acquisition or a release that the master ran but whose
// answer a cut connection lost is an outage. The cluster client must not
// send the script again: the acquire script would find the place its
// first run took and say the lock is held; the release script would find
// the holder gone (its first run deleted it) and say the lease was lost.
func answerLost(t *testing.T, c *testenv.RedisCluster, proxy *faultproxy.Proxy, fronted int) {
	ctx := locktest.Context(t)
	onFronted := func(node int) bool { return node == fronted }
	name, other := nameOn(c, locktest.Name(t)+"-a", onFronted), nameOn(c, locktest.Name(t)+"-b", onFronted)
	cl := locktest.Open(t, c.URL, lock.Options{TTL: time.Minute})
	// A first hold and release, so that the master knows both scripts and
	// runs each at its first sending.
	l, err := cl.TryAcquire(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}

	// lostAnswer runs f with answers coming back long after the master ran
	// the command, and cuts every connection once done(), read on the
	// master itself, says that it ran.
	lostAnswer := func(f func() error, done func() bool) error {
		proxy.SetLatency(time.Second)
		defer proxy.SetLatency(0)
		errc := make(chan error, 1)
		go func() { errc <- f() }()
		for !done() {
			time.Sleep(10 * time.Millisecond)
		}
		if proxy.Cut() == 0 {
			t.Errorf("no connection to node %d went through its proxy", fronted)
		}
		return <-errc
	}
	exists := func(name string) string { return do(t, c.Nodes[fronted].URL, "EXISTS", redis.Key(name)) }

	err = lostAnswer(func() error { _, err := cl.TryAcquire(ctx, name); return err },
		func() bool { return exists(name) == "1" })
	if !errors.Is(err, lock.ErrUnavailable) {
		t.Errorf("TryAcquire whose answer was lost: %v; want an outage (ErrUnavailable)", err)
	}

	if l, err = cl.TryAcquire(ctx, other); err != nil {
		t.Fatal(err)
	}
	err = lostAnswer(func() error { return l.Release(ctx) }, func() bool { return exists(other) == "0" })
	if !errors.Is(err, lock.ErrUnavailable) {
		t.Errorf("Release whose answer was lost: %v; want an outage (ErrUnavailable)", err)
	}
}
