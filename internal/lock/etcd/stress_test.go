package etcd_test

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/withlock/withlock/internal/lock"
	"github.com/withlock/withlock/internal/lock/etcd"
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
	mutex bool  // concurrency.Mutex, the recipe of etcdctl lock
	token int64 // the key's create revision, when entering
}

// TestModesStress: 16 contenders against the real server, each with a
// client per mode (a connection of its own, as a long-running program's):
// 8 mix shared and exclusive holders of one name, one of them always
// through concurrency.Mutex (what etcdctl lock runs), and 8 hold a
// semaphore of 3 on another name, now and then exclusively. One
// acquisition in ten ends as if its holder's host died: its lease is
// revoked behind its back (as release --force does) and it only learns of
// it from its keep loop. A checker replays the record: the semaphore never
// has 4 holders, shared never overlaps exclusive, exclusive is always
// alone, and every token is larger than those handed out before it on the
// same name.
func TestModesStress(t *testing.T) {
	e := testenv.RequireEtcd(t)
	admin := client(t, e)
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
	)
	record := func(ev event) {
		mu.Lock()
		defer mu.Unlock()
		ev.seq = seq.Add(1)
		events = append(events, ev)
	}
	// crash revokes the lease of name's key with create revision token.
	crash := func(name string, token int64) {
		resp, err := admin.Get(context.Background(), etcd.Prefix(name), clientv3.WithPrefix())
		if err != nil {
			t.Error(err)
			return
		}
		for _, kv := range resp.Kvs {
			if kv.CreateRevision == token {
				if _, err := admin.Revoke(context.Background(), clientv3.LeaseID(kv.Lease)); err != nil {
					t.Error(err)
				}
				crashes.Add(1)
				return
			}
		}
		t.Errorf("no key of %s with create revision %d", name, token)
	}
	critical := func() { time.Sleep(time.Duration(5+rand.N(25)) * time.Millisecond) }

	start := time.Now()
	var wg sync.WaitGroup
	for who := range contenders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if who == 0 {
				// etcdctl lock's recipe, taking rw exclusively.
				s, err := concurrency.NewSession(admin, concurrency.WithTTL(3))
				if err != nil {
					t.Error(err)
					return
				}
				defer s.Close()
				m := concurrency.NewMutex(s, rw)
				for range rounds {
					ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
					err := m.Lock(ctx)
					cancel()
					if err != nil {
						t.Errorf("Mutex.Lock: %v", err)
						return
					}
					// Its token as withlock's: its key's create revision.
					resp, err := admin.Get(context.Background(), m.Key())
					if err != nil || len(resp.Kvs) != 1 {
						t.Errorf("the Mutex's key: %v, %v", resp, err)
						return
					}
					record(event{enter: true, lock: "rw", mode: lock.Exclusive, who: who, mutex: true, token: resp.Kvs[0].CreateRevision})
					critical()
					record(event{lock: "rw", mode: lock.Exclusive, who: who, mutex: true})
					if err := m.Unlock(context.Background()); err != nil {
						t.Errorf("Mutex.Unlock: %v", err)
						return
					}
				}
				return
			}
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
					opts.Holder = lock.Holder{Host: "stress", PID: 100000 + who, Command: []string{"work"}}
					var err error
					if c, err = lock.Open(e.URL, opts); err != nil {
						t.Error(err)
						return
					}
					clients[opts.Mode] = c
				}
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
				h, err := c.Acquire(ctx, name)
				cancel()
				if err != nil {
					t.Errorf("contender %d: Acquire(%s, %s): %v", who, short, opts.Mode, err)
					return
				}
				token, _ := h.Token()
				record(event{enter: true, lock: short, mode: opts.Mode, who: who, token: token})
				critical()
				record(event{lock: short, mode: opts.Mode, who: who})
				if rand.N(10) == 0 {
					// The holder's host dies: its lease is gone, nobody
					// releases. (It left its critical section first, as a
					// dead process does.)
					crash(name, token)
					select {
					case <-h.Lost():
					case <-time.After(30 * time.Second):
						t.Errorf("contender %d: a revoked lease not noticed in 30s", who)
					}
				}
				h.Release(context.Background())
			}
		}()
	}
	wg.Wait()
	took := time.Since(start)

	// The checker.
	type count struct {
		exclusive, shared, sem, peakShared, peakSem int
		maxToken                                    int64
	}
	counts := map[string]*count{"rw": {}, "sem": {}}
	acquired := map[lock.Mode]int{}
	mutexes, overlaps := 0, 0
	sorted := make([]event, len(events))
	for _, ev := range events {
		sorted[ev.seq-1] = ev
	}
	for _, ev := range sorted {
		c := counts[ev.lock]
		d := -1
		if ev.enter {
			d = 1
			acquired[ev.mode]++
			if ev.mutex {
				mutexes++
			}
		}
		switch ev.mode {
		case lock.Exclusive:
			c.exclusive += d
		case lock.Shared:
			c.shared += d
		case lock.Semaphore:
			c.sem += d
		}
		c.peakShared, c.peakSem = max(c.peakShared, c.shared), max(c.peakSem, c.sem)
		if ev.enter && (c.exclusive > 1 || c.exclusive == 1 && c.shared+c.sem > 0 || c.sem > n) {
			overlaps++
			t.Errorf("event %d: contender %d entered %s (%s): now %d exclusive, %d shared, %d of the semaphore", ev.seq, ev.who, ev.lock, ev.mode, c.exclusive, c.shared, c.sem)
		}
		// An exclusive holder's token is larger than every token handed
		// out on its name before it (shared and semaphore holders let in
		// by the same release may enter in either order).
		if ev.enter && ev.mode == lock.Exclusive && ev.token <= c.maxToken {
			t.Errorf("event %d: contender %d entered %s exclusively with token %d, not above the %d handed out before", ev.seq, ev.who, ev.lock, ev.token, c.maxToken)
		}
		if ev.enter {
			c.maxToken = max(c.maxToken, ev.token)
		}
	}
	t.Logf("%d contenders, %d acquisitions in %v (exclusive %d, %d of them by concurrency.Mutex; shared %d; semaphore of %d %d; %d ended by revoking the lease); overlaps %d; most shared holders at once %d, most semaphore holders at once %d",
		contenders, len(events)/2, took.Round(time.Millisecond), acquired[lock.Exclusive], mutexes, acquired[lock.Shared], n, acquired[lock.Semaphore],
		crashes.Load(), overlaps, counts["rw"].peakShared, counts["sem"].peakSem)
	if len(events) != 2*contenders*rounds {
		t.Errorf("%d events; want %d", len(events), 2*contenders*rounds)
	}
	// The modes were exercised: else the absence of overlaps proves little.
	if counts["sem"].peakSem != n || counts["rw"].peakShared < 2 || mutexes != rounds {
		t.Errorf("at most %d semaphore holders and %d shared holders at once, %d Mutex acquisitions; want %d, at least 2, %d", counts["sem"].peakSem, counts["rw"].peakShared, mutexes, n, rounds)
	}
}
