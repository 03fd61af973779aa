package stress

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Run is one withlock process started by a contender, as the harness saw it.
// Times are CLOCK_MONOTONIC nanoseconds, comparable across processes.
type Run struct {
	Contender int
	Started   int64 // the harness started withlock
	Exited    int64 // the harness saw withlock exit: no earlier than its exit
	Status    int   // withlock's exit status; 128+S if it died of signal S

	Entered bool   // the section wrote its entry line
	Enter   int64  // when it entered
	Token   string // $WITHLOCK_TOKEN in the section, "" if none
	Ended   bool   // the section wrote its exit or stop line
	End     int64  // when it ended
	Stopped bool   // its end was a stop line: a signal (withlock's TERM) ended it

	LostAt int64  // when withlock's "lost the lock" line reached the harness; 0 if none
	Stderr string // the last lines withlock wrote on stderr (up to 3, joined by " ⏎ "), for reports

	Shared bool // withlock took the lock with --shared (Mixed mode)
	// FrozenFrom and FrozenTo, if set, are when the injector stopped this
	// run's withlock (SIGSTOP, not its command) while its section ran, and
	// when it let it go on (SIGCONT).
	FrozenFrom, FrozenTo int64
}

// end is when r's section stopped running: its own exit or stop line, or,
// when it was killed without a chance to write one (KILL), the exit of its
// withlock, which reaps its command before it exits.
func (r Run) end() int64 {
	if r.Ended {
		return r.End
	}
	return r.Exited
}

// stoppedInside reports whether r's section entered and did not run to its
// end: stopped by a signal, or killed.
func (r Run) stoppedInside() bool { return r.Entered && (r.Stopped || !r.Ended) }

// Overlap is a section that entered while another's was still running, in
// a way the mode forbids: alongside an exclusive section, as an exclusive
// section alongside any, or as one more than MaxHolders.
type Overlap struct {
	First, Second Run
	For           time.Duration // how long both ran
}

// Rules are what Check holds the runs of one backend and mode to.
type Rules struct {
	// Tokens: the backend gives fencing tokens. Every section must get one.
	// In entry order, a section's token must be larger than that of every
	// section that ended before it entered, if either of the two is
	// exclusive (the server held one of them alone, so it granted them in
	// that order); any two tokens must differ (every acquisition gets its
	// own, in every mode). Shared and semaphore sections that did not
	// overlap may have been granted in either order: a holder can be slow
	// to start its command.
	Tokens bool
	// MaxHolders is how many sections may run at once when none of them is
	// exclusive: 1 for an exclusive lock, N for a semaphore of N, and
	// unlimited (0) for shared holders, which Run.Shared marks.
	MaxHolders int
	// FrozenGrace is the window of a frozen holder (docs/failures.md):
	// a section whose withlock was frozen may run alongside later ones
	// from when its withlock was stopped until FrozenGrace after it was
	// let go on (withlock then stops it at once: TERM, KILL after
	// --kill-after). Such overlaps are counted, not failures.
	FrozenGrace time.Duration
}

// Report is what Check found in the runs of one backend.
type Report struct {
	Backend string
	Runs    int
	Entered int            // runs whose section entered
	Stopped int            // sections stopped by a signal (they wrote a stop line)
	Killed  int            // sections killed without a line: counted until their withlock exited
	Faults  map[string]int // faults injected, by kind
	Exits   map[int]int    // withlock's exit statuses
	Took    time.Duration
	Tokens  bool // the backend gives fencing tokens, and they were checked

	Overlaps []Overlap
	// FrozenOverlaps are overlaps within a frozen holder's window
	// (Rules.FrozenGrace): documented, so not failures.
	FrozenOverlaps []Overlap
	// Frozen counts the runs whose withlock was frozen.
	Frozen int
	// Mode names the mode for the report: "", "semaphore of 3", "mixed".
	Mode string
	// TokenErrors says, in entry order, each token that was not larger than
	// the one before it, and each section that got no token on a backend
	// that gives tokens.
	TokenErrors []string
	// Unexpected holds the stderr of one run for each exit status other
	// than 0 and 70.
	Unexpected map[int]string
	// Outlived are sections that ended after their withlock had exited: a
	// command that ran on without its withlock.
	Outlived []Run
	// Unfinished are exit-0 runs whose section did not run to its end:
	// withlock reported success for a command that did not complete.
	Unfinished []Run

	// WorstStop is the longest time from withlock's "lost the lock" line to
	// its exit, over the runs that lost the lock: how long stopping the
	// command took once withlock knew.
	WorstStop time.Duration
	// ClosestAfterStop is the shortest time from the end of a section
	// stopped inside to the next entry: how far a stopped holder stayed
	// clear of its successor. Negative when no section was stopped.
	ClosestAfterStop time.Duration
}

// Check verifies the runs of one backend with an exclusive lock: no two
// sections ran at once, the fencing tokens grew strictly in entry order (if
// tokens is set), and withlock exited only 0 (the command's status) or 70
// (lock lost, command stopped). Runs may be in any order.
func Check(backend string, runs []Run, tokens bool) Report {
	return CheckRules(backend, runs, Rules{Tokens: tokens, MaxHolders: 1})
}

// CheckRules is Check for any mode, and for frozen holders: see Rules.
func CheckRules(backend string, runs []Run, rules Rules) Report {
	r := Report{
		Backend:          backend,
		Runs:             len(runs),
		Exits:            map[int]int{},
		Unexpected:       map[int]string{},
		Tokens:           rules.Tokens,
		ClosestAfterStop: -1,
	}
	var entered []Run
	for _, run := range runs {
		r.Exits[run.Status]++
		if run.Status != 0 && run.Status != 70 {
			if _, ok := r.Unexpected[run.Status]; !ok {
				r.Unexpected[run.Status] = run.Stderr
			}
		}
		if run.FrozenFrom != 0 {
			r.Frozen++
		}
		if run.LostAt != 0 {
			stop := time.Duration(run.Exited - run.LostAt)
			if run.FrozenTo > run.LostAt {
				// Said before the freeze took hold: withlock could act
				// only once it was let go on.
				stop = time.Duration(run.Exited - run.FrozenTo)
			}
			r.WorstStop = max(r.WorstStop, stop)
		}
		if run.Status == 0 && (!run.Ended || run.Stopped) {
			r.Unfinished = append(r.Unfinished, run)
		}
		if !run.Entered {
			continue
		}
		entered = append(entered, run)
		switch {
		case !run.Ended:
			r.Killed++
		case run.Stopped:
			r.Stopped++
		}
		if run.Ended && run.End > run.Exited {
			r.Outlived = append(r.Outlived, run)
		}
	}
	r.Entered = len(entered)
	slices.SortFunc(entered, func(a, b Run) int { return cmp.Compare(a.Enter, b.Enter) })

	// Sweep in entry order, keeping the sections still running: one that
	// enters alongside them must be allowed to by the mode.
	// An exclusive section may run alongside no other.
	excl := func(x Run) bool { return !x.Shared && rules.MaxHolders <= 1 }
	var (
		active  []Run // sections entered and not yet ended, by entry
		lastEnd Run   // the section that ended last so far
		ended   bool  // lastEnd is set
	)
	for _, run := range entered {
		active = slices.DeleteFunc(active, func(a Run) bool {
			if a.end() <= run.Enter {
				if !ended || a.end() > lastEnd.end() {
					lastEnd, ended = a, true
				}
				return true
			}
			return false
		})
		// Those running alongside split into the ones a frozen holder's
		// window excuses and the others.
		var excused, others []Run
		for _, a := range active {
			if frozenWindow(a, run, rules.FrozenGrace) {
				excused = append(excused, a)
			} else {
				others = append(others, a)
			}
		}
		overlap := func(a Run) Overlap {
			return Overlap{First: a, Second: run, For: time.Duration(min(a.end(), run.end()) - run.Enter)}
		}
		for _, a := range others {
			if excl(a) || excl(run) {
				r.Overlaps = append(r.Overlaps, overlap(a))
			}
		}
		for _, a := range excused {
			if excl(a) || excl(run) {
				r.FrozenOverlaps = append(r.FrozenOverlaps, overlap(a))
			}
		}
		if n := rules.MaxHolders; n > 1 && len(active)+1 > n {
			// One more than a semaphore allows: named with the first
			// of those running that entered, excused if the others
			// alone were few enough.
			if len(others)+1 > n {
				r.Overlaps = append(r.Overlaps, overlap(others[0]))
			} else {
				r.FrozenOverlaps = append(r.FrozenOverlaps, overlap(excused[0]))
			}
		}
		if len(active) == 0 && ended && lastEnd.stoppedInside() && excl(run) {
			gap := time.Duration(run.Enter - lastEnd.end())
			if r.ClosestAfterStop < 0 || gap < r.ClosestAfterStop {
				r.ClosestAfterStop = gap
			}
		}
		active = append(active, run)
	}
	if rules.Tokens {
		r.TokenErrors = checkTokens(entered, excl)
	}
	return r
}

// frozenWindow says whether b's entry alongside a is within a frozen
// holder's window (Rules.FrozenGrace): a's withlock was frozen before b
// entered, and a's section ended by grace after its withlock went on.
func frozenWindow(a, b Run, grace time.Duration) bool {
	return a.FrozenFrom != 0 && b.Enter >= a.FrozenFrom && a.end() <= a.FrozenTo+int64(grace)
}

// checkTokens checks the tokens of sections in entry order; see
// Rules.Tokens. excl says whether a section held the lock alone.
func checkTokens(entered []Run, excl func(Run) bool) []string {
	var errs []string
	tokens := make([]int64, len(entered))
	seen := map[int64]bool{}
	for i, run := range entered {
		t, err := strconv.ParseInt(run.Token, 10, 64)
		if err != nil {
			errs = append(errs, fmt.Sprintf("no token (%q) at entry %d", run.Token, i+1))
			tokens[i] = -1
			continue
		}
		tokens[i] = t
		if i > 0 && excl(run) && excl(entered[i-1]) {
			// Two exclusive sections in a row: the server granted them
			// in entry order, whether or not they overlapped (that is
			// the overlap check's).
			if tokens[i-1] >= 0 && t <= tokens[i-1] {
				errs = append(errs, fmt.Sprintf("%d after %d", t, tokens[i-1]))
			}
			seen[t] = true
			continue
		}
		if seen[t] {
			errs = append(errs, fmt.Sprintf("token %d given twice", t))
		}
		seen[t] = true
		// Every section that ended before this one entered, where either
		// is exclusive, was granted before it.
		var before int64 = -1
		for j := range i {
			if a := entered[j]; tokens[j] > before && a.end() <= run.Enter && (excl(a) || excl(run)) {
				before = tokens[j]
			}
		}
		if before >= 0 && t <= before {
			errs = append(errs, fmt.Sprintf("%d after %d", t, before))
		}
	}
	return errs
}

// Failures lists what makes r a failed run, one line each; none when the
// backend held: no overlap, tokens strictly increasing, exits only 0 and 70,
// no section that outlived its withlock or was reported done unfinished.
func (r Report) Failures() []string {
	var fs []string
	for _, o := range r.Overlaps {
		fs = append(fs, fmt.Sprintf("overlap: contender %d entered (token %q) while contender %d's section (token %q, withlock exit %d) still ran, both for %v",
			o.Second.Contender, o.Second.Token, o.First.Contender, o.First.Token, o.First.Status, o.For))
	}
	for _, e := range r.TokenErrors {
		fs = append(fs, "fencing token: "+e)
	}
	for _, s := range slices.Sorted(maps.Keys(r.Unexpected)) {
		fs = append(fs, fmt.Sprintf("exit %d × %d, want only 0 or 70; one said: %s", s, r.Exits[s], r.Unexpected[s]))
	}
	for _, run := range r.Outlived {
		fs = append(fs, fmt.Sprintf("contender %d's section ended %v after its withlock exited", run.Contender, time.Duration(run.End-run.Exited)))
	}
	for _, run := range r.Unfinished {
		fs = append(fs, fmt.Sprintf("contender %d: withlock exited 0 but its section did not run to its end (entered %v, stopped %v)", run.Contender, run.Entered, run.Stopped))
	}
	return fs
}

// String is r on one line: runs, faults, exits, overlaps, tokens, and the
// timing of stops.
func (r Report) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%-8s", r.Backend)
	if r.Mode != "" {
		fmt.Fprintf(&b, " | %-11s", r.Mode)
	}
	fmt.Fprintf(&b, " | runs %d in %v, %d entered, %d stopped inside", r.Runs, r.Took.Round(time.Second), r.Entered, r.Stopped+r.Killed)
	if r.Killed > 0 {
		fmt.Fprintf(&b, " (%d killed)", r.Killed)
	}
	total := 0
	var kinds []string
	for _, k := range slices.Sorted(maps.Keys(r.Faults)) {
		total += r.Faults[k]
		kinds = append(kinds, fmt.Sprintf("%d %s", r.Faults[k], k))
	}
	fmt.Fprintf(&b, " | faults %d", total)
	if len(kinds) > 0 {
		fmt.Fprintf(&b, " (%s)", strings.Join(kinds, ", "))
	}
	var exits []string
	for _, s := range slices.Sorted(maps.Keys(r.Exits)) {
		exits = append(exits, fmt.Sprintf("%d × %d", r.Exits[s], s))
	}
	fmt.Fprintf(&b, " | exits %s | overlaps %d", strings.Join(exits, ", "), len(r.Overlaps))
	if r.Frozen > 0 {
		exit0 := 0
		for _, o := range r.FrozenOverlaps {
			if o.First.Status == 0 {
				exit0++
			}
		}
		fmt.Fprintf(&b, " (%d holders frozen, %d overlaps in their window, %d of whose withlock exited 0)", r.Frozen, len(r.FrozenOverlaps), exit0)
	}
	if r.Tokens {
		fmt.Fprintf(&b, " | token errors %d", len(r.TokenErrors))
	} else {
		b.WriteString(" | tokens -")
	}
	if r.WorstStop > 0 {
		fmt.Fprintf(&b, " | lost→exit worst %v", r.WorstStop.Round(time.Millisecond))
	}
	if r.ClosestAfterStop >= 0 {
		fmt.Fprintf(&b, " | next entry after a stop ≥ %v", r.ClosestAfterStop.Round(time.Millisecond))
	}
	return b.String()
}
