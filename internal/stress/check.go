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

// Overlap is a section that entered while another's was still running.
type Overlap struct {
	First, Second Run
	For           time.Duration // how long both ran
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

// Check verifies the runs of one backend: no two sections ran at once, the
// fencing tokens grew strictly in entry order (if tokens is set), and
// withlock exited only 0 (the command's status) or 70 (lock lost, command
// stopped). Runs may be in any order.
func Check(backend string, runs []Run, tokens bool) Report {
	r := Report{
		Backend:          backend,
		Runs:             len(runs),
		Exits:            map[int]int{},
		Unexpected:       map[int]string{},
		Tokens:           tokens,
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
		if run.LostAt != 0 {
			r.WorstStop = max(r.WorstStop, time.Duration(run.Exited-run.LostAt))
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

	// Sweep in entry order, keeping the section that ends last so far: a
	// section that enters before that end overlaps it.
	var (
		last      Run
		lastToken int64
		haveToken bool
	)
	for i, run := range entered {
		if i > 0 {
			switch {
			case run.Enter < last.end():
				r.Overlaps = append(r.Overlaps, Overlap{First: last, Second: run, For: time.Duration(min(last.end(), run.end()) - run.Enter)})
			case last.stoppedInside():
				gap := time.Duration(run.Enter - last.end())
				if r.ClosestAfterStop < 0 || gap < r.ClosestAfterStop {
					r.ClosestAfterStop = gap
				}
			}
		}
		if i == 0 || run.end() > last.end() {
			last = run
		}
		if !tokens {
			continue
		}
		t, err := strconv.ParseInt(run.Token, 10, 64)
		if err != nil {
			r.TokenErrors = append(r.TokenErrors, fmt.Sprintf("no token (%q) at entry %d", run.Token, i+1))
			continue
		}
		if haveToken && t <= lastToken {
			r.TokenErrors = append(r.TokenErrors, fmt.Sprintf("%d after %d", t, lastToken))
		}
		lastToken, haveToken = t, true
	}
	return r
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
	fmt.Fprintf(&b, "%-8s | runs %d in %v, %d entered, %d stopped inside", r.Backend, r.Runs, r.Took.Round(time.Second), r.Entered, r.Stopped+r.Killed)
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
