package s3_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/withlock/withlock/internal/lock"
	"github.com/withlock/withlock/internal/lock/locktest"
	"github.com/withlock/withlock/internal/testenv"
)

// stressTTL is short, so that stalled holders' leases run out within the
// run; every renewing holder also holds past one ttl now and then.
const stressTTL = 2 * time.Second

// TestStress runs 16 contenders on one name against the real store, for
// an exclusive lock and for a semaphore of 3,
// for 8s (again, up to 5 more times, until the run tested what it should).
// Some holders stop renewing and leave their lease to run out by the
// store's clock. Never two exclusive holders, never a fourth in the
// semaphore, and the tokens grow, in the holders' records and in what the
// store shows (Inspect).
func TestStress(t *testing.T) {
	s := testenv.RequireS3(t)
	u := s.URL(s.Bucket(t))
	excl, sem := lock.Options{Mode: lock.Exclusive}, lock.Options{Mode: lock.Semaphore, MaxHolders: 3}
	for _, m := range []struct {
		desc   string
		cs     []locktest.Contender
		stalls int // the first stalls contenders stop renewing now and then
	}{
		{"exclusive", locktest.Repeat(16, locktest.Contender{Name: "lock", Options: excl}), 3},
		// One mode per NAME (docs/modes.md): an exclusive holder takes
		// slot 0 only, as on Kubernetes.
		{"semaphore of 3", locktest.Repeat(16, locktest.Contender{Name: "lock", Options: sem}), 3},
	} {
		t.Run(m.desc, func(t *testing.T) {
			st := locktest.Stress{
				URL:        u,
				Contenders: m.cs,
				TTL:        stressTTL,
				Hold:       locktest.MomentOrPast(stressTTL),
				Pause:      20 * time.Millisecond,
				Poll:       50 * time.Millisecond,
				Tokens:     true,
				For:        8 * time.Second,
				Again:      5,
				// The keep loop gives up TTL-Grace after the last renewal
				// it saw succeed, before the lease can end. Any other loss
				// is the store saying that the lease was gone while its
				// holder renewed it: a lock that two could hold.
				LostOK: func(err error) bool { return strings.Contains(err.Error(), "could not confirm") },
				Take: func(ctx context.Context, r locktest.Round) (locktest.Stint, bool, error) {
					if r.Who >= m.stalls || r.N%4 != 3 {
						return locktest.Stint{}, false, nil
					}
					s, err := holdStalled(ctx, r.Client, r.Name)
					return s, true, err
				},
				Untested: func(stints []locktest.Stint) []string {
					if slices.ContainsFunc(stints, func(s locktest.Stint) bool { return s.Kind == "stalled" }) {
						return nil
					}
					return []string{"no holder stopped renewing: the run did not test expiry"}
				},
			}
			st.Run(t)
		})
	}
}

// holdStalled polls for the lock as Acquire does and then never renews it
// nor gives it back, as a withlock that froze would: it counts itself
// inside until TTL-Grace after the attempt that took it was sent (when
// withlock stops a command that cannot renew), and leaves the lease to run
// out on the store. A zero Stint: the run ended first.
func holdStalled(ctx context.Context, c *lock.Client, name string) (locktest.Stint, error) {
	for {
		sent := time.Now()
		l, err := c.TryAcquire(ctx, name)
		if err == nil {
			s := locktest.Stint{Mode: c.Options().Mode, Kind: "stalled", Enter: time.Now(), Token: l.(lock.Expiring).Token()}
			s.Exit = sent.Add(stressTTL - c.Options().Grace)
			time.Sleep(time.Until(s.Exit))
			return s, nil
		}
		if ctx.Err() != nil {
			return locktest.Stint{}, nil
		}
		pause := 50 * time.Millisecond
		switch d, ok := lock.Remaining(err); {
		case errors.Is(err, lock.ErrUnavailable):
			pause = 100 * time.Millisecond
		case !errors.Is(err, lock.ErrHeld):
			return locktest.Stint{}, err
		case ok && d < pause:
			pause = d
		}
		t := time.NewTimer(pause)
		select {
		case <-t.C:
		case <-ctx.Done():
		}
		t.Stop()
	}
}

// TestTwoGateways: two gateway processes serve one directory, as two
// replicas of a store behind a load balancer do; 16 holders, half through
// each, take one lock again and again, and no two are ever inside at once.
// Each records its time inside on this host's clock, which all share, and
// the tokens order the holds.
func TestTwoGateways(t *testing.T) {
	s := testenv.RequireS3(t)
	s2, err := s.Second()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s2.Close() })
	bucket := s.Bucket(t)
	urls := []string{s.URL(bucket), s2.URL(bucket)}
	name := locktest.Name(t)
	type stint struct {
		who         int
		token       int64
		enter, exit time.Time
	}
	var (
		mu     sync.Mutex
		stints []stint
		wg     sync.WaitGroup
	)
	ctx, cancel := context.WithTimeout(locktest.Context(t), 10*time.Second)
	defer cancel()
	perGateway := map[int]int{}
	for who := range 16 {
		c := locktest.Open(t, urls[who%2], lock.Options{TTL: 5 * time.Second})
		wg.Go(func() {
			for ctx.Err() == nil {
				l, err := c.TryAcquire(ctx, name)
				if err != nil {
					if !errors.Is(err, lock.ErrHeld) && ctx.Err() == nil {
						t.Errorf("client %d: %v", who, err)
						return
					}
					time.Sleep(time.Duration(rand.IntN(20)) * time.Millisecond)
					continue
				}
				st := stint{who: who, token: l.(lock.Expiring).Token(), enter: time.Now()}
				time.Sleep(time.Duration(rand.IntN(10)) * time.Millisecond)
				st.exit = time.Now()
				if err := l.Release(context.WithoutCancel(ctx)); err != nil {
					t.Errorf("client %d: release: %v", who, err)
				}
				mu.Lock()
				stints = append(stints, st)
				perGateway[who%2]++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	slices.SortFunc(stints, func(a, b stint) int { return a.enter.Compare(b.enter) })
	for i := 1; i < len(stints); i++ {
		p, s := stints[i-1], stints[i]
		if s.enter.Before(p.exit) {
			t.Errorf("client %d entered %v before client %d left", s.who, p.exit.Sub(s.enter), p.who)
		}
		if s.token <= p.token {
			t.Errorf("client %d entered with token %d after client %d's %d", s.who, s.token, p.who, p.token)
		}
	}
	t.Logf("%d holds, %v through each gateway", len(stints), perGateway)
	if perGateway[0] < 5 || perGateway[1] < 5 {
		t.Errorf("holds per gateway %v: the test needs both to serve many", perGateway)
	}
}
