package mongodb_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/withlock/withlock/internal/lock"
	"github.com/withlock/withlock/internal/lock/locktest"
	"github.com/withlock/withlock/internal/lock/mongodb"
	"github.com/withlock/withlock/internal/testenv"
)

// section is one holder's time inside the lock, on this process's clock:
// from when TryAcquire returned the lease until the holder stopped relying
// on it (at the latest, ttl after it sent its last successful attempt).
type section struct {
	client      int
	token       int64
	enter, exit time.Time
}

// TestHammer has 16 clients, each with its own connection, take one name
// over and over on the real server, with a lease so short that takeovers
// of expired leases happen all the time: some holders let go at once, some
// vanish without releasing, some renew at the last moment (racing the
// takeover of their lease) and some stop renewing but carry on until their
// lease's end. It checks what a user of the lock relies on: no two holders
// inside at once, tokens strictly increasing in the order of entry, and the
// same judged from every document of the chain.
//
// It runs until 80 acquisitions (WITHLOCK_HAMMER=N: N), or 90s on a machine
// too busy for that.
func TestHammer(t *testing.T) {
	m := testenv.RequireMongo(t)
	want := 80
	if n, err := strconv.Atoi(os.Getenv("WITHLOCK_HAMMER")); err == nil {
		want = n
	}
	const (
		clients = 16
		ttl     = 300 * time.Millisecond
		grace   = 60 * time.Millisecond
		maxRun  = 90 * time.Second
	)
	name := locktest.Name(t)
	ctx, cancel := context.WithTimeout(t.Context(), maxRun+30*time.Second)
	defer cancel()
	var (
		mu       sync.Mutex
		sections []section
		errs     = map[string]int{}
		wg       sync.WaitGroup
		done     atomic.Bool
	)
	start := time.Now()
	time.AfterFunc(maxRun, func() { done.Store(true) })
	// The watcher reads every document of the chain, in order, by _id; the
	// clients delete old documents as usual, but none it has not read.
	var (
		read, finished = atomic.Int64{}, atomic.Bool{}
		watched        = make(chan []doc, 1)
		c              = locks(t, m.URL)
	)
	go func() { watched <- watch(ctx, t, c, name, &read, &finished) }()
	for c := range clients {
		b := locktest.Open(t, m.URL, lock.Options{TTL: ttl, Grace: grace, Holder: lock.Holder{Host: fmt.Sprintf("client%d", c), PID: c + 1}})
		mongodb.SetGCFloor(b, func() int64 { return read.Load() })
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), uint64(c)))
			for !done.Load() {
				sent := time.Now()
				l, err := b.TryAcquire(ctx, name)
				if err != nil {
					if !errors.Is(err, lock.ErrHeld) {
						mu.Lock()
						errs[err.Error()]++
						mu.Unlock()
					}
					// Polls a little faster than lock.Acquire (50-100ms),
					// not so fast that the server does nothing else, but
					// be there when the holder's lease runs out: that is
					// when waiters race each other and the holder's last
					// renewal.
					pause := time.Duration(20+rng.IntN(30)) * time.Millisecond
					var held interface{ Remaining() time.Duration }
					if errors.As(err, &held) && held.Remaining() < pause {
						pause = held.Remaining() + time.Duration(rng.IntN(2000))*time.Microsecond
					}
					time.Sleep(pause)
					continue
				}
				s := section{client: c, token: l.(lock.Fenced).Token(), enter: time.Now()}
				until := sent.Add(ttl - grace) // what this holder may rely on, as lock.Held does
				if !s.enter.Before(until) {
					// Too late to use; lock.Held would give up at once.
					l.Release(ctx)
					continue
				}
				switch p := rng.IntN(10); {
				case p < 2: // a short job
					time.Sleep(time.Duration(rng.IntN(3)) * time.Millisecond)
					s.exit = time.Now()
					l.Release(ctx)
				case p < 5: // killed outright: its lease has to run out
					s.exit = time.Now()
				case p < 7: // stops renewing, carries on to the lease's end
					time.Sleep(time.Until(until))
					s.exit = until
					l.Keep(ctx) // too late to count; must not disturb others
					l.Release(ctx)
				default: // renews at the last moment, a few times
					for range 1 + rng.IntN(4) {
						time.Sleep(time.Until(until.Add(-time.Duration(rng.IntN(int(ttl / 8))))))
						sent := time.Now()
						err := l.Keep(ctx)
						if err != nil || time.Now().After(until) {
							break // lost, or the renewal came too late to count
						}
						until = sent.Add(ttl - grace)
					}
					s.exit = time.Now()
					l.Release(ctx)
				}
				if s.exit.After(until) {
					s.exit = until // it had to stop by then
				}
				mu.Lock()
				sections = append(sections, s)
				if len(sections) >= want {
					done.Store(true)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	finished.Store(true)
	for e, n := range errs {
		t.Logf("%d × %s", n, e)
	}

	// The holders' own view.
	slices.SortFunc(sections, func(a, b section) int { return a.enter.Compare(b.enter) })
	t.Logf("%d acquisitions by %d clients in %v", len(sections), clients, time.Since(start).Round(time.Millisecond))
	if len(sections) < want/4 {
		t.Errorf("only %d acquisitions in %v; the test needs many", len(sections), maxRun)
	}
	overlaps := 0
	for i := 1; i < len(sections); i++ {
		prev, s := sections[i-1], sections[i]
		if s.enter.Before(prev.exit) && overlaps < 10 {
			t.Errorf("two holders inside at once: client %d (token %d) entered %v before client %d (token %d) left",
				s.client, s.token, prev.exit.Sub(s.enter), prev.client, prev.token)
		}
		if s.enter.Before(prev.exit) {
			overlaps++
		}
		if s.token <= prev.token {
			t.Errorf("client %d entered with token %d after client %d's token %d", s.client, s.token, prev.client, prev.token)
		}
	}
	if overlaps > 0 {
		t.Errorf("%d overlaps in %d acquisitions", overlaps, len(sections))
	}

	// The chain's view: every document follows the one before it, at most
	// one holder at a time, a holder replaced only after its lease ran out
	// by the server's clock, and each holder's token the seq at which it
	// first appears.
	docs := <-watched
	takes, acquired := 0, map[int64]bool{}
	for i, d := range docs {
		if len(d.Holders) > 1 {
			t.Fatalf("document %s has %d holders", d.ID, len(d.Holders))
		}
		if i == 0 {
			if d.ID != name+"#0" || len(d.Holders) != 1 || d.Holders[0].Token != d.Seq {
				t.Fatalf("first document %+v", d)
			}
			acquired[d.Seq] = true
			continue
		}
		prev := docs[i-1]
		if d.Seq != prev.Seq+1 {
			t.Fatalf("document %s follows seq %d", d.ID, prev.Seq)
		}
		if len(d.Holders) == 0 {
			continue
		}
		h := d.Holders[0]
		if len(prev.Holders) == 1 && prev.Holders[0].ID == h.ID {
			if h.Token != prev.Holders[0].Token {
				t.Errorf("document %s: the holder's token changed from %d to %d", d.ID, prev.Holders[0].Token, h.Token)
			}
			continue
		}
		if h.Token != d.Seq {
			t.Errorf("document %s: a new holder with token %d", d.ID, h.Token)
		}
		acquired[d.Seq] = true
		if len(prev.Holders) == 1 {
			takes++
			if p := prev.Holders[0]; !d.At.After(p.ExpiresAt) {
				t.Errorf("document %s: %s took the lock at %v from %s, whose lease ran until %v",
					d.ID, h.Host, d.At, p.Host, p.ExpiresAt)
			}
		}
	}
	t.Logf("chain: %d documents, %d acquisitions, %d of them takeovers", len(docs), len(acquired), takes)
	held := map[int64]bool{}
	for _, s := range sections {
		held[s.token] = true
		if !acquired[s.token] {
			t.Errorf("client %d held with token %d, which the chain does not show as an acquisition", s.client, s.token)
		}
	}
	unused := 0
	for _, d := range docs {
		if acquired[d.Seq] && !held[d.Seq] {
			unused++
		}
	}
	// An attempt that timed out after its insert, or that came back too
	// late to use; the lock ran out or was renewed by the next attempt.
	t.Logf("%d acquisitions in the chain that no holder used", unused)
}

// watch reads the documents of name's chain one by one by _id, from the
// first ("NAME#0") on, storing in read the seq of the last one read, until
// done is set and it has read up to the newest.
func watch(ctx context.Context, t *testing.T, c *mongo.Collection, name string, read *atomic.Int64, done *atomic.Bool) []doc {
	var docs []doc
	id := name + "#0"
	for {
		var d doc
		err := c.FindOne(ctx, bson.D{{Key: "_id", Value: id}}).Decode(&d)
		switch {
		case err == nil:
			docs = append(docs, d)
			read.Store(d.Seq)
			id = name + "#" + strconv.FormatInt(d.Seq+1, 10)
			continue
		case !errors.Is(err, mongo.ErrNoDocuments):
			t.Errorf("watcher: %v", err)
			return docs
		case done.Load():
			// Finished once nothing is newer than the last one read.
			var last doc
			err := c.FindOne(ctx, bson.D{{Key: "name", Value: name}}, options.FindOne().SetSort(bson.D{{Key: "seq", Value: -1}})).Decode(&last)
			if err != nil && !errors.Is(err, mongo.ErrNoDocuments) {
				t.Errorf("watcher: %v", err)
			}
			if len(docs) > 0 && last.Seq == docs[len(docs)-1].Seq {
				return docs
			}
		}
		time.Sleep(time.Millisecond) // poll for the next one
	}
}
