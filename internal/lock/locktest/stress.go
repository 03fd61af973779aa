package locktest

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
)

// Stress describes a stress run of one backend: contenders that take locks
// of a few names again and again, in mixed modes, each through clients of
// its own (a connection of its own, as a long-running program's), while
// the backend's faults strike. Each holder records its stints from its own
// view: entered just after the lock was granted, left just before it is
// given back (or could run out), so the record is never more lenient than
// the truth.
type Stress struct {
	// URL is the backend's; every client is opened on it.
	URL string
	// Contenders are the goroutines of the run.
	Contenders []Contender
	// Names, if not nil, is the lock name of each Contender.Name (one on a
	// given server of a cluster, say); a Name it lacks gets a name of the
	// test's own.
	Names map[string]string
	// EachName checks what the run should have tested (see Untested and
	// MinEach) on each Contender.Name by itself, as if each were a run of
	// its own, and logs each one's figures.
	EachName bool
	// MinEach, if not zero, is how many holds every contender should have
	// made: a contender kept out for longer is something the run did not
	// test.
	MinEach int
	// Rounds is how many holds each contender makes; zero runs them for
	// For instead.
	Rounds int
	For    time.Duration
	// Again runs the contenders again, up to Again more times, when a run
	// did not test what it should (see Untested): a busy machine can run
	// For without the contention the check needs.
	Again int
	// TTL is the clients' lease length (zero: the default).
	TTL time.Duration
	// Holder is every client's holder; zero gives each client one of its
	// own, with a pid no other client has, host "stress".
	Holder lock.Holder
	// Hold is how long a holder holds the lock; nil: 5 to 30ms.
	Hold func(rng *rand.Rand, mode lock.Mode) time.Duration
	// Pause is how long at most a contender rests between two holds.
	Pause time.Duration
	// LostOK, if not nil, has a holder watch its lock while it holds it:
	// a loss ends its stint (Lost), and is an error unless LostOK accepts
	// it. The holder then releases the lock as withlock does, one try whose
	// error is not reported.
	LostOK func(err error) bool
	// ReleaseOK, if not nil, accepts some errors of a release by c that
	// took took from the end of its stint (an outage, a lease that ran out
	// while the release was held up): the stint is Unreleased, its lease
	// left to run out. Any other error of a release fails the run.
	ReleaseOK func(c *lock.Client, err error, took time.Duration) bool
	// Crash, if not nil, ends one hold in CrashOneIn (default 10) as if
	// its holder's host died, once it has left its critical section (as a
	// dead process does): c's session, or the lease with token, ends on
	// the server behind its back. The holder then waits until it knows
	// that it lost the lock, and releases nothing.
	Crash      func(t *testing.T, c *lock.Client, name string, token int64)
	CrashOneIn int
	// Take, if not nil, may take a contender's round in its own way (a
	// program other than withlock, a holder that stops renewing): it
	// returns the stint and true, or false to leave the round to
	// withlock's Acquire. c is the contender's client for the mode of its
	// round.
	Take func(ctx context.Context, r Round) (Stint, bool, error)
	// Poll, if not zero, has a checker read every name's holders through
	// Inspect about that often during the run: never more than the mode
	// allows, an exclusive holder alone, a semaphore's recorded N its own.
	Poll time.Duration
	// Tokens checks that an exclusive holder's fencing token is larger
	// than every token handed out on its name before (shared and semaphore
	// holders let in by the same release may enter in either order).
	Tokens bool
	// Untested lists what the run should have tested besides the modes'
	// contention, and did not.
	Untested func(stints []Stint) []string
}

// Contender is one goroutine of a stress run.
type Contender struct {
	// Name is its lock's: contenders of one Name contend.
	Name string
	// Options are its holds' Mode and MaxHolders.
	Options lock.Options
	// Exclusive, if not zero, makes one hold in Exclusive exclusive.
	Exclusive int
	// Idle is how long it rests between two holds, besides Stress.Pause:
	// an exclusive contender that always waits keeps its writer mark up,
	// and with it the free places of a semaphore empty.
	Idle time.Duration
}

// Round is one hold of a contender, for Stress.Take.
type Round struct {
	Who, N int
	Name   string
	Client *lock.Client
	Rng    *rand.Rand
}

// Stint is one hold as its holder recorded it.
type Stint struct {
	Who         int
	Name        string
	Mode        lock.Mode
	Enter, Exit time.Time
	Token       int64
	// Kind names a stint that Stress.Take made ("" for withlock's).
	Kind string
	// Lost: the holder's keep loop gave the lock up (Stress.LostOK); Exit
	// is when it did.
	Lost bool
	// Unreleased: its release failed as Stress.ReleaseOK accepts.
	Unreleased bool

	waited time.Duration // how long an exclusive holder waited
}

// Run runs s, checks its stints and returns them: no two incompatible
// holders at once, a semaphore never over its N, fencing tokens that grow
// (with Tokens), and progress: every round done, or with For, every mode
// taken with holders that met. It fails t on what it finds.
func (s Stress) Run(t *testing.T) []Stint {
	t.Helper()
	var (
		stints  []Stint
		polls   int
		crashes int
		took    time.Duration
	)
	names := map[string]string{}
	for _, c := range s.Contenders {
		if names[c.Name] == "" {
			names[c.Name] = s.Names[c.Name]
		}
		if names[c.Name] == "" {
			names[c.Name] = Name(t) + "/" + c.Name
		}
	}
	for run := 0; ; run++ {
		start := time.Now()
		st, p, c := s.run(t, names)
		took += time.Since(start)
		stints, polls, crashes = append(stints, st...), polls+p, crashes+c
		gaps := s.untested(stints)
		if len(gaps) == 0 || run == s.Again || t.Failed() {
			break
		}
		t.Logf("after %d runs of %s: %s; running again", run+1, s.For, strings.Join(gaps, "; "))
	}
	for _, o := range s.sweep(stints).overlaps {
		t.Error(o)
	}
	t.Logf("%s; in %v, %d ended by a crash, %d polls of the server", s.figures("", stints), took.Round(time.Millisecond), crashes, polls)
	if s.EachName {
		for _, part := range s.parts() {
			t.Logf("%s: %s", part, s.figures(part, s.only(part, stints)))
		}
	}
	if s.Rounds > 0 && len(stints) != len(s.Contenders)*s.Rounds {
		t.Errorf("%d acquisitions; want %d", len(stints), len(s.Contenders)*s.Rounds)
	}
	for _, gap := range s.untested(stints) {
		t.Error(gap)
	}
	return stints
}

// figures describes stints, those of part's contenders (see parts):
// acquisitions by mode and by contender, losses and releases that failed
// as ReleaseOK accepts, overlaps, the most inside at once and the longest
// exclusive wait.
func (s Stress) figures(part string, stints []Stint) string {
	r := s.sweep(stints)
	count := map[lock.Mode]int{}
	held := make([]int, len(s.Contenders))
	lost, unreleased := 0, 0
	for _, st := range stints {
		count[st.Mode]++
		held[st.Who]++
		if st.Lost {
			lost++
		}
		if st.Unreleased {
			unreleased++
		}
	}
	n, least, most := 0, len(stints), 0
	for who := range s.Contenders {
		if s.in(part, who) {
			n, least, most = n+1, min(least, held[who]), max(most, held[who])
		}
	}
	f := fmt.Sprintf("%d contenders, %d acquisitions (exclusive %d, shared %d, semaphore %d; %d to %d by one contender), %d overlaps; most inside at once: %d shared, %d semaphore; longest exclusive wait %v",
		n, len(stints), count[lock.Exclusive], count[lock.Shared], count[lock.Semaphore], least, most,
		len(r.overlaps), r.peak[lock.Shared], r.peak[lock.Semaphore], r.longestX.Round(time.Millisecond))
	if s.LostOK != nil || s.ReleaseOK != nil {
		f += fmt.Sprintf("; %d lost, %d releases that failed as accepted", lost, unreleased)
	}
	return f
}

// parts are the groups of contenders whose runs are checked each by
// itself: each Name's with EachName, else all of them as one (name "").
func (s Stress) parts() []string {
	if !s.EachName {
		return []string{""}
	}
	var names []string
	for _, c := range s.Contenders {
		if !slices.Contains(names, c.Name) {
			names = append(names, c.Name)
		}
	}
	slices.Sort(names)
	return names
}

// in says whether contender who is one of part's (see parts).
func (s Stress) in(part string, who int) bool {
	return part == "" || s.Contenders[who].Name == part
}

// only returns the stints of part's contenders.
func (s Stress) only(part string, stints []Stint) []Stint {
	var sts []Stint
	for _, st := range stints {
		if s.in(part, st.Who) {
			sts = append(sts, st)
		}
	}
	return sts
}

// run runs the contenders once, on the lock names names gives their
// Names; it returns their stints, the polls of the server and the crashes.
func (s Stress) run(t *testing.T, names map[string]string) ([]Stint, int, int) {
	ctx := context.Background()
	if s.Rounds == 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(Context(t), s.For)
		defer cancel()
	}
	var (
		mu      sync.Mutex
		stints  []Stint
		crashes atomic.Int64
		pid     atomic.Int64
	)
	record := func(st Stint) {
		mu.Lock()
		stints = append(stints, st)
		mu.Unlock()
	}
	open := func(opts lock.Options) (*lock.Client, error) {
		opts.TTL, opts.Holder = s.TTL, s.Holder
		if opts.Holder.PID == 0 {
			opts.Holder = lock.Holder{Host: "stress", PID: 100000 + int(pid.Add(1)), Command: []string{"work"}}
		}
		return lock.Open(s.URL, opts)
	}
	var wg sync.WaitGroup
	for who, con := range s.Contenders {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(who), uint64(time.Now().UnixNano())))
			clients := map[lock.Mode]*lock.Client{}
			defer func() {
				for _, c := range clients {
					c.Close()
				}
			}()
			name := names[con.Name]
			for round := 0; s.Rounds == 0 && ctx.Err() == nil || round < s.Rounds; round++ {
				opts := lock.Options{Mode: con.Options.Mode, MaxHolders: con.Options.MaxHolders}
				if con.Exclusive > 0 && rng.IntN(con.Exclusive) == 0 {
					opts = lock.Options{Mode: lock.Exclusive}
				}
				c := clients[opts.Mode]
				if c == nil {
					var err error
					if c, err = open(opts); err != nil {
						t.Error(err)
						return
					}
					clients[opts.Mode] = c
				}
				st, crashed, err := s.hold(ctx, t, Round{Who: who, N: round, Name: name, Client: c, Rng: rng})
				if !st.Enter.IsZero() {
					st.Who, st.Name = who, con.Name
					record(st)
				}
				if crashed {
					crashes.Add(1)
				}
				if err != nil {
					t.Errorf("contender %d (%s on %s): %v", who, opts.Mode, con.Name, err)
					return
				}
				if st.Enter.IsZero() { // the run is over
					return
				}
				time.Sleep(con.Idle + time.Duration(rng.Int64N(int64(s.Pause)+1)))
			}
		})
	}
	var polls int
	if s.Poll > 0 {
		done := make(chan struct{})
		var poller sync.WaitGroup
		poller.Go(func() { polls = s.poll(ctx, t, names, done) })
		wg.Wait()
		close(done)
		poller.Wait()
	} else {
		wg.Wait()
	}
	return stints, polls, int(crashes.Load())
}

// hold takes the lock once, as Take or withlock does, holds it and lets
// it go, or crashes. A zero Stint and no error: the run ended first.
func (s Stress) hold(ctx context.Context, t *testing.T, r Round) (st Stint, crashed bool, err error) {
	if s.Take != nil {
		if st, ok, err := s.Take(ctx, r); ok {
			return st, false, err
		}
	}
	c := r.Client
	actx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	asked := time.Now()
	h, err := c.Acquire(actx, r.Name)
	cancel()
	if err != nil {
		if s.Rounds == 0 && ctx.Err() != nil {
			return Stint{}, false, nil
		}
		return Stint{}, false, fmt.Errorf("Acquire: %w", err)
	}
	st = Stint{Mode: c.Options().Mode, Enter: time.Now()}
	st.Token, _ = h.Token()
	if st.Mode == lock.Exclusive {
		st.waited = st.Enter.Sub(asked)
	}
	d := 5*time.Millisecond + time.Duration(r.Rng.IntN(25))*time.Millisecond
	if s.Hold != nil {
		d = s.Hold(r.Rng, st.Mode)
	}
	if s.LostOK == nil {
		time.Sleep(d) // the critical section
	} else {
		timer := time.NewTimer(d)
		defer timer.Stop()
		select {
		case <-timer.C:
		case <-h.Lost():
			// The keep loop gave up before the lease could end: a command
			// would stop now.
			st.Exit, st.Lost = time.Now(), true
			err := h.Err()
			h.Release(context.Background()) // as withlock does: one try, not reported
			if !s.LostOK(err) {
				return st, false, err
			}
			return st, false, nil
		}
	}
	st.Exit = time.Now()
	if s.Crash != nil && r.Rng.IntN(orDefault(s.CrashOneIn, 10)) == 0 {
		s.Crash(t, c, r.Name, st.Token)
		select {
		case <-h.Lost():
		case <-time.After(2 * time.Minute):
			return st, true, errors.New("a crashed holder did not learn within 2 minutes that it lost its lock")
		}
		h.Release(context.Background())
		return st, true, nil
	}
	err = h.Release(context.Background())
	if err != nil && s.ReleaseOK != nil && s.ReleaseOK(c, err, time.Since(st.Exit)) {
		st.Unreleased, err = true, nil
	}
	return st, false, err
}

func orDefault(n, otherwise int) int {
	if n > 0 {
		return n
	}
	return otherwise
}

// poll reads every name's holders until done; it returns how many times.
func (s Stress) poll(ctx context.Context, t *testing.T, names map[string]string, done <-chan struct{}) int {
	c, err := lock.Open(s.URL, lock.Options{})
	if err != nil {
		t.Error(err)
		return 0
	}
	defer c.Close()
	n := map[string]int{}
	for _, con := range s.Contenders {
		if con.Options.Mode == lock.Semaphore {
			n[con.Name] = con.Options.MaxHolders
		}
	}
	polls := 0
	for {
		for short, name := range names {
			st, err := c.Inspect(Context(t), name)
			if errors.Is(err, lock.ErrUnavailable) {
				continue // a machine too busy for the server to answer in time
			}
			if err != nil {
				t.Errorf("Inspect(%s): %v", short, err)
				return polls
			}
			polls++
			if st.Mode == lock.Exclusive && len(st.Holders) != 1 ||
				st.Mode == lock.Semaphore && (len(st.Holders) > n[short] || st.MaxHolders != 0 && st.MaxHolders != n[short]) {
				t.Errorf("Inspect(%s) during the run: mode %q (of %d), %d holders: %+v", short, st.Mode, st.MaxHolders, len(st.Holders), st.Holders)
			}
		}
		select {
		case <-done:
			return polls
		case <-ctx.Done():
			<-done
			return polls
		case <-time.After(s.Poll):
		}
	}
}

// sweepResult is what the stints show, swept in time order: each entry
// of a holder while an incompatible one was inside, how many holders of
// each mode were inside at once at most, and the longest wait of an
// exclusive holder.
type sweepResult struct {
	overlaps []string
	peak     map[lock.Mode]int
	longestX time.Duration
}

func (s Stress) sweep(stints []Stint) sweepResult {
	type event struct {
		at    time.Time
		enter bool
		s     *Stint
	}
	n := map[string]int{}
	for _, con := range s.Contenders {
		if con.Options.Mode == lock.Semaphore {
			n[con.Name] = con.Options.MaxHolders
		}
	}
	var events []event
	for i := range stints {
		st := &stints[i]
		events = append(events, event{st.Enter, true, st}, event{st.Exit, false, st})
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
	inside := map[string]map[lock.Mode]int{}
	maxToken := map[string]int64{}
	r := sweepResult{peak: map[lock.Mode]int{}}
	for _, e := range events {
		st, m := e.s, e.s.Mode
		in := inside[st.Name]
		if in == nil {
			in = map[lock.Mode]int{}
			inside[st.Name] = in
		}
		if !e.enter {
			in[m]--
			continue
		}
		r.longestX = max(r.longestX, st.waited)
		var bad bool
		switch m {
		case lock.Exclusive:
			bad = in[lock.Exclusive]+in[lock.Shared]+in[lock.Semaphore] > 0
		case lock.Shared:
			bad = in[lock.Exclusive] > 0 || in[lock.Semaphore] > 0
		case lock.Semaphore:
			bad = in[lock.Exclusive] > 0 || in[lock.Shared] > 0 || in[lock.Semaphore] >= n[st.Name]
		}
		if bad {
			r.overlaps = append(r.overlaps, fmt.Sprintf("contender %d (%s %s) entered %s at %v while inside: %v", st.Who, m, st.Kind, st.Name, e.at.Format("15:04:05.000000"), in))
		}
		if s.Tokens && m == lock.Exclusive && st.Token <= maxToken[st.Name] {
			r.overlaps = append(r.overlaps, fmt.Sprintf("contender %d entered %s exclusively with token %d, not above the %d handed out before", st.Who, st.Name, st.Token, maxToken[st.Name]))
		}
		maxToken[st.Name] = max(maxToken[st.Name], st.Token)
		in[m]++
		r.peak[m] = max(r.peak[m], in[m])
	}
	return r
}

// untested lists what the run should have tested and did not, on each of
// parts: holders of each mode that met (two shared at once, a full
// semaphore), an exclusive holder, with MinEach every contender's holds,
// and what s.Untested adds.
func (s Stress) untested(stints []Stint) []string {
	var gaps []string
	for _, part := range s.parts() {
		for _, gap := range s.untestedOn(part, s.only(part, stints)) {
			if part != "" {
				gap = part + ": " + gap
			}
			gaps = append(gaps, gap)
		}
	}
	return gaps
}

// untestedOn is untested for part's contenders, and their stints.
func (s Stress) untestedOn(part string, stints []Stint) []string {
	r := s.sweep(stints)
	var gaps []string
	var cs []Contender
	for who, c := range s.Contenders {
		if s.in(part, who) {
			cs = append(cs, c)
		}
	}
	hasMode := func(m lock.Mode) bool {
		return slices.ContainsFunc(cs, func(c Contender) bool { return c.Options.Mode == m || m == lock.Exclusive && c.Exclusive > 0 })
	}
	if hasMode(lock.Exclusive) && !slices.ContainsFunc(stints, func(st Stint) bool { return st.Mode == lock.Exclusive }) {
		gaps = append(gaps, "no exclusive acquisition: the exclusive contenders starved")
	}
	if hasMode(lock.Shared) && r.peak[lock.Shared] < 2 {
		gaps = append(gaps, "never 2 shared holders at once: no contention")
	}
	if i := slices.IndexFunc(cs, func(c Contender) bool { return c.Options.Mode == lock.Semaphore }); i >= 0 && r.peak[lock.Semaphore] != cs[i].Options.MaxHolders {
		gaps = append(gaps, fmt.Sprintf("at most %d semaphore holders at once, of %d: no contention", r.peak[lock.Semaphore], cs[i].Options.MaxHolders))
	}
	if s.MinEach > 0 {
		held := make([]int, len(s.Contenders))
		for _, st := range stints {
			held[st.Who]++
		}
		for who, c := range s.Contenders {
			if s.in(part, who) && held[who] < s.MinEach {
				gaps = append(gaps, fmt.Sprintf("contender %d (%s) held the lock %d times, fewer than %d", who, c.Options.Mode, held[who], s.MinEach))
			}
		}
	}
	if s.Untested != nil {
		gaps = append(gaps, s.Untested(stints)...)
	}
	return gaps
}

// MomentOrPast is a Stress.Hold: a moment (under 100ms) or, now and then,
// past the lease length ttl, to hold through renewals; rarely for an
// exclusive holder, which keeps every other contender out.
func MomentOrPast(ttl time.Duration) func(rng *rand.Rand, mode lock.Mode) time.Duration {
	return func(rng *rand.Rand, mode lock.Mode) time.Duration {
		long := 12
		if mode == lock.Exclusive {
			long = 30
		}
		if rng.IntN(long) == 0 {
			return ttl + ttl/4
		}
		return time.Duration(rng.IntN(100)) * time.Millisecond
	}
}

// Repeat returns n copies of c.
func Repeat(n int, c Contender) []Contender {
	cs := make([]Contender, n)
	for i := range cs {
		cs[i] = c
	}
	return cs
}

// Mixed are 16 contenders, half on each of two names, so that the
// semaphore is always wanted by more than it holds: on "rw", shared
// holders that are exclusive one hold in three; on "sem", holders of a
// semaphore of 3 that are exclusive one hold in eight.
func Mixed() []Contender {
	var cs []Contender
	for range 8 {
		cs = append(cs,
			Contender{Name: "rw", Options: lock.Options{Mode: lock.Shared}, Exclusive: 3},
			Contender{Name: "sem", Options: lock.Options{Mode: lock.Semaphore, MaxHolders: 3}, Exclusive: 8})
	}
	return cs
}
