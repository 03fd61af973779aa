package redis_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/withlock/withlock/internal/lock"
	"github.com/withlock/withlock/internal/lock/locktest"
	"github.com/withlock/withlock/internal/testenv"
)

// stressTTL is short, so that stalled holders' leases run out within the
// run; every renewing holder also holds past one ttl now and then.
const stressTTL = 2 * time.Second

// group is n contenders alike; stalls says that they sometimes stop
// renewing (a frozen or cut-off withlock).
type group struct {
	n      int
	c      locktest.Contender
	stalls bool
}

// TestModesStress runs 16 contenders on one name against the real server
// for 8s (again, up to 5 more times, until the run has tested what it
// should), for shared and exclusive holders mixed, and for a semaphore of
// 3 with one exclusive contender. Some holders stop renewing and leave
// their lease to run out on the server. A semaphore never has N+1 holders
// and shared and exclusive holders never hold at once, in the holders'
// records and in what the server shows (Inspect).
func TestModesStress(t *testing.T) {
	r := testenv.RequireRedis(t)
	for _, m := range modesMixes() {
		t.Run(m.desc, func(t *testing.T) {
			s := modesStress(r.URL, m, "lock")
			s.For, s.Again = 8*time.Second, 5
			s.Run(t)
		})
	}
}

// mix is one mix of contenders of the stress tests, on one name.
type mix struct {
	desc   string
	groups []group
}

// modesMixes are the mixes of the stress tests: shared and exclusive
// holders, and a semaphore of 3 with one exclusive contender.
func modesMixes() []mix {
	// Exclusive is named, not left to the zero Mode: the run checks that
	// each mode it names was taken.
	excl := lock.Options{Mode: lock.Exclusive}
	shared, sem := lock.Options{Mode: lock.Shared}, lock.Options{Mode: lock.Semaphore, MaxHolders: 3}
	return []mix{
		{"shared and exclusive", []group{
			{9, locktest.Contender{Options: shared}, false},
			{2, locktest.Contender{Options: shared}, true},
			{4, locktest.Contender{Options: excl}, false},
			{1, locktest.Contender{Options: excl}, true}}},
		{"semaphore of 3", []group{
			{12, locktest.Contender{Options: sem}, false},
			{3, locktest.Contender{Options: sem}, true},
			// An exclusive contender that always waits keeps its writer
			// mark up, and with it the free places of the semaphore
			// empty.
			{1, locktest.Contender{Options: excl, Idle: 500 * time.Millisecond}, false}}},
	}
}

// modesStress is a stress run of m's contenders on each of names, but for
// its length (For, Again): holds of a moment and now and then past a lease
// length, holders that stop renewing, the server's view polled.
func modesStress(url string, m mix, names ...string) locktest.Stress {
	var cs []locktest.Contender
	var stalls []bool
	for _, name := range names {
		for _, g := range m.groups {
			g.c.Name = name
			cs = append(cs, locktest.Repeat(g.n, g.c)...)
			for range g.n {
				stalls = append(stalls, g.stalls)
			}
		}
	}
	return locktest.Stress{
		URL:        url,
		Contenders: cs,
		TTL:        stressTTL,
		Hold:       locktest.MomentOrPast(stressTTL),
		Pause:      20 * time.Millisecond,
		Poll:       20 * time.Millisecond,
		// The keep loop gives up TTL-Grace after the last renewal it saw
		// succeed, before the lease can end. Any other loss is the server
		// saying that the lease was gone while its holder renewed it: a
		// lock that two could hold.
		LostOK: func(err error) bool { return strings.Contains(err.Error(), "could not confirm") },
		Take: func(ctx context.Context, r locktest.Round) (locktest.Stint, bool, error) {
			if !stalls[r.Who] || r.N%4 != 0 {
				return locktest.Stint{}, false, nil
			}
			s, err := holdStalled(ctx, r.Client, r.Name)
			return s, true, err
		},
		Untested: func(stints []locktest.Stint) []string {
			for _, s := range stints {
				if s.Kind == "stalled" {
					return nil
				}
			}
			return []string{"no holder stopped renewing: the run did not test expiry"}
		},
	}
}

// holdStalled waits for the lock as Acquire does (woken by the release
// messages, or when the holders' leases end) and then never renews it nor
// gives it back, as a withlock that froze would: it counts itself inside
// until TTL-Grace after the attempt that took it was sent (when withlock
// stops a command that cannot renew), and leaves the lease to run out on
// the server. A zero Stint: the run ended first.
func holdStalled(ctx context.Context, c *lock.Client, name string) (locktest.Stint, error) {
	// Without a subscription (a server too busy to answer in time), it
	// polls, as Acquire does.
	released, stop, err := c.Backend.(lock.Notifier).Notify(ctx, name)
	if err == nil {
		defer stop()
	}
	for {
		sent := time.Now()
		_, err := c.TryAcquire(ctx, name)
		if err == nil {
			s := locktest.Stint{Mode: c.Options().Mode, Kind: "stalled", Enter: time.Now()}
			s.Exit = sent.Add(stressTTL - c.Options().Grace)
			time.Sleep(time.Until(s.Exit))
			return s, nil
		}
		if ctx.Err() != nil {
			return locktest.Stint{}, nil
		}
		pause := time.Second
		switch d, ok := lock.Remaining(err); {
		case errors.Is(err, lock.ErrUnavailable):
			// A machine so busy that the server did not answer within
			// go-redis's timeout: try again, as Acquire would.
			pause = 100 * time.Millisecond
		case !errors.Is(err, lock.ErrHeld) && !errors.Is(err, lock.ErrUnsettled):
			// Held, or a master that cannot vouch yet (one that
			// restarted, a slot that moved): wait as Acquire would.
			return locktest.Stint{}, err
		case ok && d < pause:
			pause = d
		}
		t := time.NewTimer(pause)
		select {
		case <-released:
		case <-t.C:
		case <-ctx.Done():
		}
		t.Stop()
	}
}
