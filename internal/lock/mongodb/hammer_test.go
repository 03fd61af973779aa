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
	mode        lock.Mode
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
	hammer(t, func(int) lock.Options { return lock.Options{} })
}

// hammerN is the N of TestHammerModes's semaphore holders.
const hammerN = 3

// TestHammerModes is TestHammer with exclusive, shared and semaphore
// holders (of N = 3) on one name: besides the lease's races, a mode's
// holders join those of their mode and exclusive waiters mark themselves
// against a stream of them. It checks that shared holders never are
// inside with an exclusive one, nor a semaphore's with another mode's, and
// that the semaphore never has N+1 holders: by the holders' clocks and in
// every document of the chain.
func TestHammerModes(t *testing.T) {
	hammer(t, func(c int) lock.Options {
		switch c % 3 {
		case 1:
			return lock.Options{Mode: lock.Shared}
		case 2:
			return lock.Options{Mode: lock.Semaphore, MaxHolders: hammerN}
		}
		return lock.Options{}
	})
}

// hammer runs the hammer with client c's mode from mode(c).
func hammer(t *testing.T, mode func(c int) lock.Options) {
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
	// The watcher has time of its own (6 minutes) to read the rest once
	// the clients stop: a FerretDB on a machine busy with other work fails or delays
	// many reads, and the chain waits for it (gcFloor).
	wctx, wcancel := context.WithCancel(t.Context())
	defer wcancel()
	go func() { watched <- watch(wctx, t, m.URL, c, name, &read, &finished) }()
	for c := range clients {
		opts := mode(c)
		opts.TTL, opts.Grace, opts.Holder = ttl, grace, lock.Holder{Host: fmt.Sprintf("client%d", c), PID: c + 1}
		b := locktest.Open(t, m.URL, opts)
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
				s := section{client: c, mode: opts.Mode, token: l.(lock.Expiring).Token(), enter: time.Now()}
				if s.mode == "" {
					s.mode = lock.Exclusive
				}
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
	time.AfterFunc(6*time.Minute, wcancel)
	for e, n := range errs {
		t.Logf("%d × %s", n, e)
	}

	// The holders' own view.
	slices.SortFunc(sections, func(a, b section) int { return a.enter.Compare(b.enter) })
	modes := map[lock.Mode]int{}
	for _, s := range sections {
		modes[s.mode]++
	}
	t.Logf("%d acquisitions by %d clients in %v: %v", len(sections), clients, time.Since(start).Round(time.Millisecond), modes)
	if len(sections) < want/4 {
		t.Errorf("only %d acquisitions in %v; the test needs many", len(sections), maxRun)
	}
	overlaps := 0
	for i, s := range sections {
		var inside []section // those that entered before s and were still inside
		for _, p := range sections[:i] {
			if s.enter.Before(p.exit) {
				inside = append(inside, p)
			}
		}
		for _, p := range inside {
			if !compatible(p.mode, s.mode) {
				overlaps++
				if overlaps <= 10 {
					t.Errorf("a %s holder inside with a %s one: client %d (token %d) entered %v before client %d (token %d) left",
						s.mode, p.mode, s.client, s.token, p.exit.Sub(s.enter), p.client, p.token)
				}
			}
		}
		if s.mode == lock.Semaphore && len(inside) >= hammerN {
			overlaps++
			t.Errorf("client %d (token %d) entered a semaphore of %d with %d holders inside", s.client, s.token, hammerN, len(inside))
		}
		// A holder that excludes an earlier one took the lock after that
		// one's lease, so with a larger token.
		for _, p := range sections[:i] {
			if !compatible(p.mode, s.mode) && s.token <= p.token {
				t.Errorf("client %d (%s) entered with token %d after client %d's (%s) token %d", s.client, s.mode, s.token, p.client, p.mode, p.token)
			}
		}
	}
	if overlaps > 0 {
		t.Errorf("%d overlaps in %d acquisitions", overlaps, len(sections))
	}

	// The chain's view: every document follows the one before it; its
	// holders all have its mode, one if exclusive, at most N of a
	// semaphore; a holder joins with the seq of the document as its
	// token and keeps it; and a document drops a holder only by its
	// release, by a break, or after its lease ran out by the server's
	// clock.
	docs := <-watched
	takes, marks, acquired := 0, 0, map[int64]bool{}
	for i, d := range docs {
		mode := lock.Mode(d.Mode)
		if mode == "" {
			mode = lock.Exclusive
		}
		switch {
		case mode == lock.Exclusive && len(d.Holders) > 1:
			t.Fatalf("document %s: %d exclusive holders", d.ID, len(d.Holders))
		case mode == lock.Semaphore && (d.Max != hammerN || len(d.Holders) > hammerN):
			t.Fatalf("document %s: %d holders of a semaphore of %d", d.ID, len(d.Holders), d.Max)
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
		joined, dropped := 0, 0
		for _, h := range d.Holders {
			j := slices.IndexFunc(prev.Holders, func(p holderDoc) bool { return p.ID == h.ID })
			switch {
			case j >= 0 && prev.Holders[j].Token != h.Token:
				t.Errorf("document %s: the holder's token changed from %d to %d", d.ID, prev.Holders[j].Token, h.Token)
			case j < 0 && h.Token != d.Seq:
				t.Errorf("document %s: a new holder with token %d", d.ID, h.Token)
			case j < 0:
				joined++
				acquired[d.Seq] = true
			}
		}
		for _, p := range prev.Holders {
			if slices.ContainsFunc(d.Holders, func(h holderDoc) bool { return h.ID == p.ID }) {
				continue
			}
			dropped++
			if d.Op != "release" && d.Op != "break" && !d.At.After(p.ExpiresAt) {
				t.Errorf("document %s (%s): %s was dropped at %v, but its lease ran until %v", d.ID, d.Op, p.Host, d.At, p.ExpiresAt)
			}
		}
		if joined > 1 || d.Op == "release" && dropped != 1 {
			t.Errorf("document %s (%s): %d holders joined and %d were dropped", d.ID, d.Op, joined, dropped)
		}
		if joined == 1 && d.Op == "take" {
			takes++
		}
		if w := prev.Writer; joined == 1 && mode != lock.Exclusive && w != nil && !d.At.After(w.Until) {
			t.Errorf("document %s: a %s holder joined while an exclusive waiter's mark was live (until %v)", d.ID, mode, w.Until)
		}
		if d.Writer != nil {
			marks++
		}
	}
	t.Logf("chain: %d documents, %d acquisitions, %d of them taking expired leases; %d documents with a writer-waiting mark", len(docs), len(acquired), takes, marks)
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

// compatible says whether holders of modes a and b may be inside at once.
func compatible(a, b lock.Mode) bool {
	return a == b && a != lock.Exclusive
}

// watch reads the documents of name's chain one by one by _id, from the
// first ("NAME#0") on, storing in read the seq of the last one read, until
// done is set and it has read up to the newest. url is the server's, for
// connecting again.
func watch(ctx context.Context, t *testing.T, url string, c *mongo.Collection, name string, read *atomic.Int64, done *atomic.Bool) []doc {
	var docs []doc
	id := name + "#0"
	failures := 0
	for {
		var d doc
		// Each read has 10s: once, a read on a busy FerretDB never came
		// back, and the watcher waited on it until its six minutes ran out.
		rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
		err := c.FindOne(rctx, bson.D{{Key: "_id", Value: id}}).Decode(&d)
		rcancel()
		switch {
		case err == nil:
			docs = append(docs, d)
			read.Store(d.Seq)
			id = name + "#" + strconv.FormatInt(d.Seq+1, 10)
			failures = 0
			continue
		case !errors.Is(err, mongo.ErrNoDocuments) && ctx.Err() == nil:
			// A busy FerretDB fails reads now and then ("interrupted": a
			// client that gave up on its own query can interrupt the
			// SQLite connection that the next query runs on); the
			// documents wait for us (gcFloor), so read again.
			if failures++; failures == 1 || failures%100 == 0 {
				t.Logf("watcher, reading %s again (%d failures): %v", id, failures, err)
			}
			if failures%50 == 0 || errors.Is(err, context.DeadlineExceeded) {
				// Once, on a busy machine, every read of one connection
				// failed so for a minute while the clients' reads went
				// through: read on a new connection.
				if nc, err := mongo.Connect(options.Client().ApplyURI(url)); err == nil {
					c.Database().Client().Disconnect(context.Background())
					c = nc.Database(mongodb.DefaultDatabase).Collection(mongodb.Collection)
					t.Cleanup(func() { nc.Disconnect(context.Background()) })
				}
			}
			time.Sleep(5 * time.Millisecond) // not to add to the server's trouble
			continue
		case !errors.Is(err, mongo.ErrNoDocuments):
			t.Errorf("watcher: %v", err)
			return docs
		case done.Load():
			// Finished once nothing is newer than the last one read.
			var last doc
			rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
			err := c.FindOne(rctx, bson.D{{Key: "name", Value: name}}, options.FindOne().SetSort(bson.D{{Key: "seq", Value: -1}})).Decode(&last)
			rcancel()
			if err != nil && !errors.Is(err, mongo.ErrNoDocuments) {
				if ctx.Err() != nil {
					t.Errorf("watcher: %v", err)
					return docs
				}
				// Fails on a busy FerretDB as the reads above do: ask again.
				t.Logf("watcher, asking for the newest again: %v", err)
				time.Sleep(5 * time.Millisecond)
				continue
			}
			if len(docs) > 0 && last.Seq == docs[len(docs)-1].Seq {
				return docs
			}
		}
		time.Sleep(time.Millisecond) // poll for the next one
	}
}
