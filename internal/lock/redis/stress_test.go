package redis_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/withlock/withlock/internal/lock"
	"github.com/withlock/withlock/internal/lock/locktest"
	"github.com/withlock/withlock/internal/testenv"
)

// contender is one process of the stress test: its mode, and whether it
// sometimes stops renewing (a frozen or cut-off withlock).
type contender struct {
	mode   lock.Mode
	n      int // a semaphore's N
	stalls bool
	// idle is how long it waits between two holds (besides up to 20ms):
	// an exclusive contender that always waits keeps its writer mark up,
	// and with it the free places of a semaphore empty.
	idle time.Duration
}

// stint is one hold as its holder recorded it: from just after it was
// granted until just before it was given back or could expire. A lock that
// works never lets two incompatible stints overlap.
type stint struct {
	who         int
	mode        lock.Mode
	enter, exit time.Time
	stalled     bool // the holder stopped renewing; exit is its own deadline
	// lost: the keep loop gave the lock up (it could not confirm it in
	// time); exit is when it did.
	lost bool
	// unreleased: the release met an outage, and the lease was left to
	// run out (or was released without the answer arriving), or it reached
	// the server only after the lease had run out.
	unreleased bool
}

// stressTTL is short, so that stalled holders' leases run out within the
// run; every renewing holder also holds past one ttl now and then.
const (
	stressTTL = 2 * time.Second
	stressRun = 8 * time.Second
	maxRounds = 6 // of stressRun, until the run has tested what it should
)

// TestModesStress runs 16 contenders on one name against the real server,
// each recording its own stints, for shared and exclusive holders mixed,
// and for a semaphore of 3 with one exclusive contender. Some holders
// stop renewing and leave their lease to run out on the server. A sweep of
// the records checks that a semaphore never has N+1 holders and that
// shared and exclusive holders never hold at once; meanwhile a poller
// checks the same in what the server shows (Inspect).
func TestModesStress(t *testing.T) {
	r := testenv.RequireRedis(t)
	for _, tc := range stressCases() {
		t.Run(tc.desc, func(t *testing.T) {
			stints, polls := stressUntilTested(t, r.URL, locktest.Name(t), tc.cs, stressRun, maxRounds, 0)
			check(t, tc.cs, stints, polls, 0)
		})
	}
}

// stressCase is one mix of contenders on one name.
type stressCase struct {
	desc string
	cs   []contender
}

// stressCases are the mixes of the stress tests: shared and exclusive
// holders, and a semaphore of 3 with one exclusive contender.
func stressCases() []stressCase {
	return []stressCase{
		{"shared and exclusive", slices.Concat(
			repeat(9, contender{mode: lock.Shared}),
			repeat(2, contender{mode: lock.Shared, stalls: true}),
			repeat(4, contender{mode: lock.Exclusive}),
			repeat(1, contender{mode: lock.Exclusive, stalls: true}))},
		{"semaphore of 3", slices.Concat(
			repeat(12, contender{mode: lock.Semaphore, n: 3}),
			repeat(3, contender{mode: lock.Semaphore, n: 3, stalls: true}),
			repeat(1, contender{mode: lock.Exclusive, idle: 500 * time.Millisecond}))},
	}
}

// stressUntilTested runs the contenders on name for run, and again while
// the runs so far have not tested what they should (untested, with
// minEach), at most rounds times, and returns every stint and poll.
func stressUntilTested(t *testing.T, url, name string, cs []contender, run time.Duration, rounds, minEach int) ([]stint, int) {
	// A busy machine can run without the contention the check needs (two
	// shared holders at once, a full semaphore, a holder that stalled):
	// run again until it has happened.
	var stints []stint
	var polls int
	for round := 1; ; round++ {
		s, p := stress(t, url, name, cs, run)
		stints, polls = append(stints, s...), polls+p
		gaps := untested(cs, sweep(cs, stints), stints, minEach)
		if len(gaps) == 0 || round == rounds || t.Failed() {
			return stints, polls
		}
		t.Logf("%s: after %d runs of %s: %s; running again", name, round, run, strings.Join(gaps, "; "))
	}
}

func repeat(n int, c contender) []contender {
	cs := make([]contender, n)
	for i := range cs {
		cs[i] = c
	}
	return cs
}

// stress runs the contenders for run and returns their stints, and how
// many times the poller read the lock.
func stress(t *testing.T, url, name string, cs []contender, run time.Duration) ([]stint, int) {
	clients := make([]*lock.Client, len(cs))
	for i, c := range cs {
		clients[i] = locktest.Open(t, url, lock.Options{Mode: c.mode, MaxHolders: c.n, TTL: stressTTL,
			Holder: lock.Holder{Host: "stress", PID: 1000 + i, Command: []string{"contender"}}})
	}
	stop := time.Now().Add(run)
	ctx, cancel := context.WithDeadline(t.Context(), stop)
	defer cancel()

	var (
		mu     sync.Mutex
		stints []stint
	)
	record := func(s stint) {
		mu.Lock()
		stints = append(stints, s)
		mu.Unlock()
	}
	var wg sync.WaitGroup
	for i, c := range cs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(i), uint64(time.Now().UnixNano())))
			for round := 0; ctx.Err() == nil; round++ {
				var err error
				if c.stalls && round%4 == 0 {
					err = holdStalled(ctx, clients[i], name, i, record)
				} else {
					err = holdRenewing(ctx, clients[i], name, i, rng, record)
				}
				if err != nil {
					t.Errorf("contender %d (%s): %v", i, c.mode, err)
					return
				}
				time.Sleep(c.idle + time.Duration(rng.IntN(20))*time.Millisecond) // let others in
			}
		}()
	}

	// The server's view, read meanwhile: never more holders than the mode
	// allows.
	var polls atomic.Int32
	pollDone := make(chan struct{})
	go func() {
		defer close(pollDone)
		c := clients[0]
		for ctx.Err() == nil {
			st, err := c.Inspect(ctx, name)
			if err == nil {
				polls.Add(1)
				if most := map[lock.Mode]int{lock.Exclusive: 1, lock.Semaphore: 3}[st.Mode]; most > 0 && len(st.Holders) > most {
					t.Errorf("the server shows %d %s holders: %+v", len(st.Holders), st.Mode, st.Holders)
				}
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	wg.Wait()
	<-pollDone
	return stints, int(polls.Load())
}

// holdRenewing takes the lock as withlock does (Acquire, then the keep
// loop), holds it for a moment or, now and then, past a lease length, and
// releases it.
func holdRenewing(ctx context.Context, c *lock.Client, name string, who int, rng *rand.Rand, record func(stint)) error {
	h, err := c.Acquire(ctx, name)
	if err != nil {
		if ctx.Err() != nil {
			return nil // the run is over
		}
		return err
	}
	s := stint{who: who, mode: c.Options().Mode, enter: time.Now()}
	hold := time.Duration(rng.IntN(100)) * time.Millisecond
	// Past a lease length now and then, to hold through renewals; rarely
	// for an exclusive holder, which keeps every other contender out.
	long := 12
	if s.mode == lock.Exclusive {
		long = 30
	}
	if rng.IntN(long) == 0 {
		hold = stressTTL + stressTTL/4
	}
	t := time.NewTimer(hold)
	defer t.Stop()
	select {
	case <-t.C:
		s.exit = time.Now()
		err := h.Release(context.Background())
		// A release that met an outage leaves the lease to run out: the
		// holder is out all the same.
		s.unreleased = errors.Is(err, lock.ErrUnavailable)
		// The keep loop had not given up, so the lease had at least Grace
		// left on the server when Release began: a release held up for
		// longer (a partition) may find it ended. One that was not, and
		// finds it gone, shows a lease that vanished while held.
		if err != nil && strings.Contains(err.Error(), "no longer ours at release") && time.Since(s.exit) > c.Options().Grace {
			s.unreleased = true
		}
		record(s)
		if s.unreleased {
			return nil
		}
		return err
	case <-h.Lost():
		// The keep loop gives up TTL-Grace after the last renewal it saw
		// succeed, before the lease can end: a command would stop now.
		s.exit, s.lost = time.Now(), true
		record(s)
		err := h.Err()
		h.Release(context.Background()) // as withlock does: one short try, not reported
		if !strings.Contains(err.Error(), "could not confirm") {
			// The server itself said the lease was gone while its holder
			// renewed it: a lock that two could hold.
			return err
		}
		return nil
	}
}

// holdStalled waits for the lock as Acquire does (woken by the release
// messages, or when the holders' leases end) and then never renews it nor
// gives it back, as a withlock that froze would: it counts itself inside
// until TTL-Grace after the attempt that took it was sent (when withlock
// stops a command that cannot renew), and leaves the lease to run out on
// the server.
func holdStalled(ctx context.Context, c *lock.Client, name string, who int, record func(stint)) error {
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
			s := stint{who: who, mode: c.Options().Mode, enter: time.Now(), stalled: true}
			s.exit = sent.Add(stressTTL - c.Options().Grace)
			record(s)
			time.Sleep(time.Until(s.exit))
			return nil
		}
		if ctx.Err() != nil {
			return nil
		}
		pause := time.Second
		switch d, ok := lock.Remaining(err); {
		case errors.Is(err, lock.ErrUnavailable):
			// A machine so busy that the server did not answer within
			// go-redis's timeout: try again, as Acquire would.
			pause = 100 * time.Millisecond
		case !errors.Is(err, lock.ErrHeld):
			return err
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

// sweepResult is what the stints show, swept in time order: each entry
// of a holder while an incompatible one was inside, and how many holders
// of each mode were inside at once at most.
type sweepResult struct {
	overlaps []string
	peak     map[lock.Mode]int
}

func sweep(cs []contender, stints []stint) sweepResult {
	type event struct {
		at    time.Time
		enter bool
		s     *stint
	}
	var events []event
	for i := range stints {
		s := &stints[i]
		events = append(events, event{s.enter, true, s}, event{s.exit, false, s})
	}
	slices.SortStableFunc(events, func(x, y event) int {
		if c := x.at.Compare(y.at); c != 0 {
			return c
		}
		if x.enter == y.enter {
			return 0
		}
		if !x.enter {
			return -1 // a stint that ends as another begins does not overlap it
		}
		return 1
	})
	inside := map[lock.Mode]int{}
	r := sweepResult{peak: map[lock.Mode]int{}}
	for _, e := range events {
		m := e.s.mode
		if !e.enter {
			inside[m]--
			continue
		}
		var bad bool
		switch m {
		case lock.Exclusive:
			bad = inside[lock.Exclusive]+inside[lock.Shared]+inside[lock.Semaphore] > 0
		case lock.Shared:
			bad = inside[lock.Exclusive] > 0 || inside[lock.Semaphore] > 0
		case lock.Semaphore:
			bad = inside[lock.Exclusive] > 0 || inside[lock.Shared] > 0 || inside[lock.Semaphore] >= cs[e.s.who].n
		}
		if bad {
			r.overlaps = append(r.overlaps, fmt.Sprintf("contender %d (%s%s) entered at %v while inside: %v", e.s.who, m, map[bool]string{true: ", stalled"}[e.s.stalled], e.at.Format("15:04:05.000"), inside))
		}
		inside[m]++
		r.peak[m] = max(r.peak[m], inside[m])
	}
	return r
}

// untested lists what the run should have tested and did not: with
// minEach, every contender must have held the lock that many times.
func untested(cs []contender, r sweepResult, stints []stint, minEach int) []string {
	var gaps []string
	if minEach > 0 {
		held := make([]int, len(cs))
		for _, s := range stints {
			held[s.who]++
		}
		for who, n := range held {
			if n < minEach {
				gaps = append(gaps, fmt.Sprintf("contender %d (%s) held the lock %d times, fewer than %d", who, cs[who].mode, n, minEach))
			}
		}
	}
	if !slices.ContainsFunc(stints, func(s stint) bool { return s.stalled }) {
		gaps = append(gaps, "no holder stopped renewing: the run did not test expiry")
	}
	if !slices.ContainsFunc(stints, func(s stint) bool { return s.mode == lock.Exclusive }) {
		gaps = append(gaps, "no exclusive acquisition: the exclusive contenders starved")
	}
	if slices.ContainsFunc(cs, func(c contender) bool { return c.mode == lock.Shared }) && r.peak[lock.Shared] < 2 {
		gaps = append(gaps, "never 2 shared holders at once: no contention")
	}
	if i := slices.IndexFunc(cs, func(c contender) bool { return c.mode == lock.Semaphore }); i >= 0 && r.peak[lock.Semaphore] != cs[i].n {
		gaps = append(gaps, fmt.Sprintf("at most %d semaphore holders at once, of %d: no contention", r.peak[lock.Semaphore], cs[i].n))
	}
	return gaps
}

// check fails t on any overlap of incompatible holders, and if the run
// did not test what it should (no contention, nobody stalled, a mode
// never taken, with minEach a contender that held the lock fewer times).
func check(t *testing.T, cs []contender, stints []stint, polls, minEach int) {
	r := sweep(cs, stints)
	for _, o := range r.overlaps {
		t.Error(o)
	}
	count := map[lock.Mode]int{}
	stalled, lost, unreleased := 0, 0, 0
	held := make([]int, len(cs))
	for _, s := range stints {
		count[s.mode]++
		held[s.who]++
		if s.stalled {
			stalled++
		}
		if s.lost {
			lost++
		}
		if s.unreleased {
			unreleased++
		}
	}
	t.Logf("%d contenders, %d acquisitions (%d exclusive, %d shared, %d semaphore; %d by holders that stopped renewing; %d to %d by one contender), %d lost, %d releases that met an outage or came after the lease ended, %d overlaps; peak inside at once: %d shared, %d semaphore; %d polls of the server",
		len(cs), len(stints), count[lock.Exclusive], count[lock.Shared], count[lock.Semaphore], stalled, slices.Min(held), slices.Max(held), lost, unreleased, len(r.overlaps), r.peak[lock.Shared], r.peak[lock.Semaphore], polls)
	for _, gap := range untested(cs, r, stints, minEach) {
		t.Error(gap)
	}
}
