package file_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/withlock/withlock/internal/lock"
	"github.com/withlock/withlock/internal/lock/locktest"
)

// TestStress runs the modes at scale, all at once: 16 contenders on "rw",
// 12 shared and 4 exclusive, and 16 on "sem", 13 holders of a semaphore of
// 3 and 3 exclusive contenders. Each takes its lock again and again through
// Client.Acquire, as withlock does (waiting in flock(2), or woken through
// Notify), and holds it a moment so that holders meet.
//
// Each holder notes in a log, from its own view, that it entered (after
// Acquire returned) and is leaving (before Release). Replaying the log, a
// semaphore never has 4 holders, shared never coexists with exclusive, and
// exclusive is alone. Meanwhile a checker reads the holders' records
// through Inspect, which must obey the same rules. The shared holders keep
// the lock busy without a gap; the exclusive contenders still get through
// (the writer-waiting mark), or the test times out.
func TestStress(t *testing.T) {
	const rounds = 8
	dir := t.TempDir()
	type event struct {
		name  string
		mode  lock.Mode
		enter bool
	}
	var (
		mu     sync.Mutex
		events []event
	)
	note := func(e event) {
		mu.Lock()
		events = append(events, e)
		mu.Unlock()
	}
	groups := []struct {
		name string
		opts lock.Options
		n    int
	}{
		{"rw", lock.Options{Mode: lock.Shared}, 12},
		{"rw", lock.Options{Mode: lock.Exclusive}, 4},
		{"sem", lock.Options{Mode: lock.Semaphore, MaxHolders: 3}, 13},
		{"sem", lock.Options{Mode: lock.Exclusive}, 3},
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	longestX := make(chan time.Duration, 64)
	contenders := 0
	for _, g := range groups {
		for i := range g.n {
			contenders++
			opts := g.opts
			opts.Holder = me("contender", g.name, string(g.opts.Mode), fmt.Sprint(i))
			c := locktest.Open(t, "file://"+dir, opts)
			wg.Go(func() {
				var longest time.Duration
				for range rounds {
					start := time.Now()
					h, err := c.Acquire(ctx, g.name)
					if err != nil {
						t.Errorf("%s contender on %q: %v", g.opts.Mode, g.name, err)
						return
					}
					longest = max(longest, time.Since(start))
					note(event{g.name, g.opts.Mode, true})
					time.Sleep(2 * time.Millisecond) // hold it, so that holders meet
					note(event{g.name, g.opts.Mode, false})
					if err := h.Release(ctx); err != nil {
						t.Errorf("Release: %v", err)
					}
				}
				if g.opts.Mode == lock.Exclusive {
					longestX <- longest
				}
			})
		}
	}

	// The checker: status, from the holders' records and /proc/locks.
	inspector := locktest.Open(t, "file://"+dir, lock.Options{})
	done := make(chan struct{})
	var samples, badSamples int
	var checker sync.WaitGroup
	checker.Go(func() {
		for {
			select {
			case <-done:
				return
			default:
			}
			for _, name := range []string{"rw", "sem"} {
				st, err := inspector.Inspect(ctx, name)
				if err != nil {
					t.Errorf("Inspect(%q): %v", name, err)
					return
				}
				samples++
				switch {
				case st.Mode == lock.Exclusive && len(st.Holders) != 1,
					name == "sem" && len(st.Holders) > 3,
					name == "sem" && st.Mode == lock.Semaphore && st.MaxHolders != 3:
					badSamples++
					t.Errorf("Inspect(%q) during the run: mode %q (of %d), %d holders", name, st.Mode, st.MaxHolders, len(st.Holders))
				}
			}
			time.Sleep(time.Millisecond) // a sample every millisecond or so
		}
	})
	wg.Wait()
	close(done)
	checker.Wait()
	close(longestX)

	// Replay the holders' own log.
	type count struct{ shared, excl, sem, maxShared, maxSem int }
	counts := map[string]*count{"rw": {}, "sem": {}}
	overlaps, acquisitions := 0, 0
	for i, e := range events {
		c := counts[e.name]
		d := -1
		if e.enter {
			d = 1
			acquisitions++
			bad := false
			switch e.mode {
			case lock.Exclusive:
				bad = c.shared+c.excl+c.sem > 0
			case lock.Shared:
				bad = c.excl > 0
			case lock.Semaphore:
				bad = c.excl > 0 || c.sem >= 3
			}
			if bad {
				overlaps++
				t.Errorf("event %d: a %s holder entered %q beside %d shared, %d exclusive, %d semaphore holders", i, e.mode, e.name, c.shared, c.excl, c.sem)
			}
		}
		switch e.mode {
		case lock.Exclusive:
			c.excl += d
		case lock.Shared:
			c.shared += d
		case lock.Semaphore:
			c.sem += d
		}
		c.maxShared, c.maxSem = max(c.maxShared, c.shared), max(c.maxSem, c.sem)
	}
	var longest time.Duration
	for d := range longestX {
		longest = max(longest, d)
	}
	t.Logf("mode stress: %d contenders, %d acquisitions, %d overlaps; at most %d shared holders at once and %d semaphore holders (N=3); %d status samples, %d wrong; longest exclusive wait %s",
		contenders, acquisitions, overlaps, counts["rw"].maxShared, counts["sem"].maxSem, samples, badSamples, longest.Round(time.Millisecond))
	if want := contenders * rounds; acquisitions != want {
		t.Errorf("%d acquisitions; want %d", acquisitions, want)
	}
	// The run must have been able to fail: holders did meet.
	if counts["sem"].maxSem != 3 || counts["rw"].maxShared < 2 {
		t.Errorf("holders never met: at most %d semaphore holders and %d shared at once", counts["sem"].maxSem, counts["rw"].maxShared)
	}
}
