package mysql_test

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
	lock  string // "x" or "sem"
	who   int
}

// TestModesStress: 16 contenders, each with one client (a connection of
// its own, as a long-running program's): 6 take one name exclusively, 10
// a semaphore of 3 on another (the modes this backend has). One
// acquisition in ten ends as if its host died: its session is killed with
// KILL, nobody releases, and the client connects again for its next
// round. A checker replays the record: the exclusive lock is never held
// twice, and the semaphore never has 4 holders.
func TestModesStress(t *testing.T) {
	m := testenv.RequireMariaDB(t)
	const (
		contenders = 16
		exclusives = 6
		rounds     = 25
		n          = 3
	)
	x, sem := locktest.Name(t)+"/x", locktest.Name(t)+"/sem"
	var (
		seq     atomic.Int64
		mu      sync.Mutex
		events  []event
		crashes atomic.Int64
	)
	record := func(enter bool, name string, who int) {
		e := event{seq: seq.Add(1), enter: enter, lock: name, who: who}
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
			name, short := x, "x"
			opts := lock.Options{TTL: 3 * time.Second, Holder: lock.Holder{Host: "stress", PID: 100000 + who, Command: []string{"work"}}}
			if who >= exclusives {
				name, short = sem, "sem"
				opts.Mode, opts.MaxHolders = lock.Semaphore, n
			}
			c, err := lock.Open(m.URL, opts)
			if err != nil {
				t.Error(err)
				return
			}
			defer c.Close()
			for range rounds {
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
				h, err := c.Acquire(ctx, name)
				cancel()
				if err != nil {
					t.Errorf("contender %d: Acquire(%s): %v", who, short, err)
					return
				}
				record(true, short, who)
				time.Sleep(time.Duration(5+rand.N(25)) * time.Millisecond) // the critical section
				record(false, short, who)
				if rand.N(10) == 0 {
					// The holder's host dies: its session ends and nobody
					// releases. (It left its critical section first, as a
					// dead process does.) Its session is the one whose
					// record names its pid.
					crashes.Add(1)
					ids, err := testenv.MySQLExec(locktest.Context(t), m.URL, fmt.Sprintf(`SELECT t.PROCESSLIST_ID
						FROM performance_schema.user_variables_by_thread v JOIN performance_schema.threads t USING (THREAD_ID)
						WHERE v.VARIABLE_NAME = 'withlock' AND JSON_VALUE(v.VARIABLE_VALUE, '$.pid') = %d`, opts.Holder.PID))
					if err != nil || len(ids) != 1 {
						t.Errorf("contender %d: its session: %q, %v", who, ids, err)
						return
					}
					if _, err := testenv.MySQLExec(locktest.Context(t), m.URL, "KILL "+ids[0]); err != nil {
						t.Errorf("contender %d: KILL %s: %v", who, ids[0], err)
						return
					}
					<-h.Lost()
				}
				h.Release(context.Background())
			}
		}()
	}
	wg.Wait()
	took := time.Since(start)

	// The checker.
	held := map[string]int{}
	peak := map[string]int{}
	acquired := map[string]int{}
	overlaps := 0
	sorted := make([]event, len(events))
	for _, e := range events {
		sorted[e.seq-1] = e
	}
	for _, e := range sorted {
		if !e.enter {
			held[e.lock]--
			continue
		}
		held[e.lock]++
		acquired[e.lock]++
		peak[e.lock] = max(peak[e.lock], held[e.lock])
		if held["x"] > 1 || held["sem"] > n {
			overlaps++
			t.Errorf("event %d: contender %d entered %s: now %d exclusive holders, %d of the semaphore of %d", e.seq, e.who, e.lock, held["x"], held["sem"], n)
		}
	}
	t.Logf("%d contenders, %d acquisitions in %v (exclusive %d, semaphore of %d %d; %d ended by killing the session); overlaps %d; most semaphore holders at once %d",
		contenders, len(events)/2, took.Round(time.Millisecond), acquired["x"], n, acquired["sem"], crashes.Load(), overlaps, peak["sem"])
	if len(events) != 2*contenders*rounds {
		t.Errorf("%d events; want %d", len(events), 2*contenders*rounds)
	}
	// The semaphore was full at times: else the absence of overlaps proves
	// little.
	if peak["sem"] != n {
		t.Errorf("at most %d semaphore holders at once; want %d", peak["sem"], n)
	}
}
