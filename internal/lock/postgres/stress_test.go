package postgres_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/withlock/withlock/internal/lock"
	"github.com/withlock/withlock/internal/lock/locktest"
	"github.com/withlock/withlock/internal/testenv"
)

// event is one line of the contenders' own record: a holder entering or
// leaving its critical section, in the order the events happened (seq
// comes from one counter, taken after the lock was got and before it is
// let go, so the order of the record is never more lenient than the
// truth).
type event struct {
	seq   int64
	enter bool
	lock  string // "rw" or "sem"
	mode  lock.Mode
	who   int
}

// TestModesStress: 16 contenders, each with a client per mode (a
// connection of its own, as a long-running program's): 8 mix shared and
// exclusive holders of one name, 8 hold a semaphore of 3 on another, now
// and then exclusively; one acquisition in ten ends as if its host died
// (the session is killed, no release; the client then connects again). A checker replays the record: the semaphore never has 4
// holders, shared never overlaps exclusive, exclusive is always alone.
func TestModesStress(t *testing.T) {
	db := database(t, testenv.RequirePostgres(t))
	const (
		contenders = 16
		rounds     = 25
		n          = 3
	)
	rw, sem := locktest.Name(t)+"/rw", locktest.Name(t)+"/sem"
	var (
		seq     atomic.Int64
		mu      sync.Mutex
		events  []event
		crashes atomic.Int64
		fakePID atomic.Int64
	)
	fakePID.Store(100000)
	record := func(enter bool, name string, mode lock.Mode, who int) {
		e := event{seq: seq.Add(1), enter: enter, lock: name, mode: mode, who: who}
		mu.Lock()
		events = append(events, e)
		mu.Unlock()
	}
	start := time.Now()
	var wg sync.WaitGroup
	for who := range contenders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			clients := map[lock.Mode]*lock.Client{}
			defer func() {
				for _, c := range clients {
					c.Close()
				}
			}()
			for range rounds {
				// Half the contenders on each name, so that the semaphore is
				// always wanted by more than it holds.
				name, short := rw, "rw"
				opts := lock.Options{Mode: lock.Shared, TTL: 3 * time.Second}
				if rand.N(3) == 0 {
					opts.Mode = lock.Exclusive
				}
				if who%2 == 1 {
					name, short = sem, "sem"
					opts.Mode, opts.MaxHolders = lock.Semaphore, n
					if rand.N(8) == 0 {
						opts.Mode, opts.MaxHolders = lock.Exclusive, 0
					}
				}
				c := clients[opts.Mode]
				if c == nil {
					opts.Holder = lock.Holder{Host: "stress", PID: int(fakePID.Add(1)), Command: []string{"work"}}
					var err error
					if c, err = lock.Open(db, opts); err != nil {
						t.Error(err)
						return
					}
					clients[opts.Mode] = c
				}
				pid := c.Options().Holder.PID
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
				h, err := c.Acquire(ctx, name)
				cancel()
				if err != nil {
					t.Errorf("contender %d: Acquire(%s, %s): %v", who, short, opts.Mode, err)
					return
				}
				record(true, short, opts.Mode, who)
				time.Sleep(time.Duration(5+rand.N(25)) * time.Millisecond) // the critical section
				record(false, short, opts.Mode, who)
				if rand.N(10) == 0 {
					// The holder's host dies: its session ends, nobody releases
					// and nobody NOTIFYs. (It left its critical section first,
					// as a dead process does.)
					crashes.Add(1)
					query(t, db, fmt.Sprintf("select pg_terminate_backend(pid, 30000) from pg_stat_activity where application_name like 'withlock %d@%%'", pid))
					<-h.Lost()
				}
				h.Release(context.Background())
			}
		}()
	}
	wg.Wait()
	took := time.Since(start)

	// The checker.
	type count struct{ exclusive, shared, sem, peakShared, peakSem int }
	counts := map[string]*count{"rw": {}, "sem": {}}
	acquired := map[lock.Mode]int{}
	overlaps := 0
	sorted := make([]event, len(events))
	for _, e := range events {
		sorted[e.seq-1] = e
	}
	for _, e := range sorted {
		c := counts[e.lock]
		d := -1
		if e.enter {
			d = 1
			acquired[e.mode]++
		}
		switch e.mode {
		case lock.Exclusive:
			c.exclusive += d
		case lock.Shared:
			c.shared += d
		case lock.Semaphore:
			c.sem += d
		}
		c.peakShared, c.peakSem = max(c.peakShared, c.shared), max(c.peakSem, c.sem)
		if e.enter && (c.exclusive > 1 || c.exclusive == 1 && c.shared+c.sem > 0 || c.sem > n) {
			overlaps++
			t.Errorf("event %d: contender %d entered %s (%s): now %d exclusive, %d shared, %d of the semaphore", e.seq, e.who, e.lock, e.mode, c.exclusive, c.shared, c.sem)
		}
	}
	t.Logf("%d contenders, %d acquisitions in %v (exclusive %d, shared %d, semaphore of %d %d; %d ended by killing the session); overlaps %d; most shared holders at once %d, most semaphore holders at once %d",
		contenders, len(events)/2, took.Round(time.Millisecond), acquired[lock.Exclusive], acquired[lock.Shared], n, acquired[lock.Semaphore],
		crashes.Load(), overlaps, counts["rw"].peakShared, counts["sem"].peakSem)
	if len(events) != 2*contenders*rounds {
		t.Errorf("%d events; want %d", len(events), 2*contenders*rounds)
	}
	// The modes were exercised: else the absence of overlaps proves little.
	if counts["sem"].peakSem != n || counts["rw"].peakShared < 2 {
		t.Errorf("at most %d semaphore holders and %d shared holders at once; want %d and at least 2", counts["sem"].peakSem, counts["rw"].peakShared, n)
	}
}
