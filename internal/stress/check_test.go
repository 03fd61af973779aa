package stress

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// ms is a monotonic time or duration in nanoseconds, written in ms.
func ms(n int64) int64 { return n * int64(time.Millisecond) }

// ran is a run whose section entered at enter and ran to its exit at end;
// its withlock exited 5ms later with status 0.
func ran(c int, enter, end int64, token string) Run {
	return Run{Contender: c, Started: ms(enter - 10), Exited: ms(end + 5), Status: 0,
		Entered: true, Enter: ms(enter), Token: token, Ended: true, End: ms(end)}
}

func TestCheckClean(t *testing.T) {
	runs := []Run{
		ran(2, 300, 400, "3"), // out of order on purpose: Check sorts by entry
		ran(1, 100, 200, "1"),
		ran(3, 200, 300, "2"), // entering exactly when the last left is no overlap
		{Contender: 4, Started: ms(0), Exited: ms(450), Status: 70}, // lost before its command entered
	}
	r := Check("x", runs, true)
	if f := r.Failures(); len(f) != 0 {
		t.Fatalf("failures in clean runs: %q", f)
	}
	if r.Runs != 4 || r.Entered != 3 || r.Exits[0] != 3 || r.Exits[70] != 1 || r.Stopped+r.Killed != 0 {
		t.Errorf("report = %+v", r)
	}
	if line := r.String(); !strings.Contains(line, "exits 3 × 0, 1 × 70 | overlaps 0 | token errors 0") {
		t.Errorf("String() = %q", line)
	}
}

func TestCheckOverlap(t *testing.T) {
	r := Check("x", []Run{ran(1, 100, 200, ""), ran(2, 150, 250, ""), ran(3, 300, 400, "")}, false)
	if len(r.Overlaps) != 1 {
		t.Fatalf("overlaps = %+v, want one", r.Overlaps)
	}
	o := r.Overlaps[0]
	if o.First.Contender != 1 || o.Second.Contender != 2 || o.For != 50*time.Millisecond {
		t.Errorf("overlap = %+v, want contender 2 inside contender 1's section for 50ms", o)
	}
	if f := r.Failures(); len(f) != 1 || !strings.Contains(f[0], "overlap: contender 2 entered") {
		t.Errorf("failures = %q", f)
	}
}

// A section contained in a long one overlaps it, and so does the next one
// that enters before the long one ends, though the short one has ended.
func TestCheckOverlapBehindALongSection(t *testing.T) {
	r := Check("x", []Run{ran(1, 100, 500, ""), ran(2, 150, 200, ""), ran(3, 300, 350, "")}, false)
	if len(r.Overlaps) != 2 || r.Overlaps[1].First.Contender != 1 || r.Overlaps[1].Second.Contender != 3 {
		t.Fatalf("overlaps = %+v, want 2 and 3 inside 1", r.Overlaps)
	}
}

func TestCheckTokens(t *testing.T) {
	runs := []Run{
		ran(1, 100, 200, "7"),
		ran(2, 200, 300, "9"),
		ran(3, 300, 400, "8"), // regression
		ran(4, 400, 500, "8"), // duplicate
		ran(5, 500, 600, ""),  // none on a backend that gives tokens
		ran(6, 600, 700, "10"),
	}
	r := Check("x", runs, true)
	want := []string{"8 after 9", "8 after 8", `no token ("") at entry 5`}
	if strings.Join(r.TokenErrors, "; ") != strings.Join(want, "; ") {
		t.Errorf("token errors = %q, want %q", r.TokenErrors, want)
	}
	if len(r.Overlaps) != 0 {
		t.Errorf("overlaps = %+v", r.Overlaps)
	}
	// Without tokens (PostgreSQL, file) nothing is checked.
	if r := Check("x", runs, false); len(r.TokenErrors) != 0 {
		t.Errorf("token errors without tokens: %q", r.TokenErrors)
	}
}

// A section killed inside (no exit or stop line) counts as running until its
// withlock exited; a section stopped by a signal until its stop line.
func TestCheckKilledInside(t *testing.T) {
	killed := Run{Contender: 1, Started: ms(0), Exited: ms(300), Status: 70,
		Entered: true, Enter: ms(100), Token: "1", LostAt: ms(280)}
	stopped := Run{Contender: 3, Started: ms(400), Exited: ms(700), Status: 70,
		Entered: true, Enter: ms(500), Token: "3", Ended: true, Stopped: true, End: ms(550), LostAt: ms(540)}

	r := Check("x", []Run{killed, ran(2, 250, 350, "2")}, true)
	if len(r.Overlaps) != 1 || r.Overlaps[0].For != 50*time.Millisecond {
		t.Errorf("an entry before the killed section's withlock exited: overlaps %+v, want one of 50ms", r.Overlaps)
	}
	if r.Killed != 1 || r.Stopped != 0 {
		t.Errorf("killed %d, stopped %d; want 1, 0", r.Killed, r.Stopped)
	}

	r = Check("x", []Run{killed, ran(2, 310, 350, "2"), stopped, ran(4, 560, 600, "4")}, true)
	if f := r.Failures(); len(f) != 0 {
		t.Errorf("entries after the killed section's withlock exit and after the stop line: failures %q", f)
	}
	if r.Killed != 1 || r.Stopped != 1 {
		t.Errorf("killed %d, stopped %d; want 1, 1", r.Killed, r.Stopped)
	}
	if r.ClosestAfterStop != 10*time.Millisecond {
		t.Errorf("closest entry after a stop = %v, want 10ms", r.ClosestAfterStop)
	}
	if r.WorstStop != 160*time.Millisecond {
		t.Errorf("worst lost→exit = %v, want 160ms", r.WorstStop)
	}
	if !strings.Contains(r.String(), "2 stopped inside (1 killed)") {
		t.Errorf("String() = %q", r.String())
	}
}

func TestCheckExits(t *testing.T) {
	unavailable := Run{Contender: 2, Exited: ms(10), Status: 69, Stderr: "withlock: postgres at 127.0.0.1:1: unexpected EOF"}
	runs := []Run{ran(1, 100, 200, ""), unavailable, unavailable, {Contender: 3, Status: 64}}
	r := Check("x", runs, false)
	f := r.Failures()
	if len(f) != 2 ||
		f[0] != "exit 64 × 1, want only 0 or 70; one said: " ||
		f[1] != "exit 69 × 2, want only 0 or 70; one said: withlock: postgres at 127.0.0.1:1: unexpected EOF" {
		t.Errorf("failures = %q", f)
	}
	if !strings.Contains(r.String(), "exits 1 × 0, 1 × 64, 2 × 69") {
		t.Errorf("String() = %q", r.String())
	}
}

func TestCheckSectionWithoutWithlock(t *testing.T) {
	outlived := ran(1, 100, 200, "")
	outlived.Exited = ms(150) // withlock gone while its section ran on
	unfinished := Run{Contender: 2, Exited: ms(400), Status: 0, Entered: true, Enter: ms(300)}
	r := Check("x", []Run{outlived, unfinished}, false)
	if len(r.Outlived) != 1 || len(r.Unfinished) != 1 || len(r.Failures()) != 2 {
		t.Errorf("outlived %v, unfinished %v, failures %q", r.Outlived, r.Unfinished, r.Failures())
	}
}

func TestReadSection(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		name, data string
		want       Run
	}{
		{"ran", "enter 5 7\nexit 9\n", Run{Entered: true, Enter: 5, Token: "7", Ended: true, End: 9}},
		{"stopped", "enter 5 -\nstopped 6\n", Run{Entered: true, Enter: 5, Ended: true, End: 6, Stopped: true}},
		{"killed", "enter 5 12\n", Run{Entered: true, Enter: 5, Token: "12"}},
		{"empty", "", Run{}}, // killed between creating the file and writing
	} {
		name := filepath.Join(dir, c.name)
		if err := os.WriteFile(name, []byte(c.data), 0o644); err != nil {
			t.Fatal(err)
		}
		var got Run
		if err := readSection(name, &got); err != nil || got != c.want {
			t.Errorf("%s: %+v, %v; want %+v", c.name, got, err, c.want)
		}
	}
	var got Run
	if err := readSection(filepath.Join(dir, "none"), &got); err != nil || got != (Run{}) {
		t.Errorf("no file: %+v, %v; want nothing entered", got, err)
	}
	os.WriteFile(filepath.Join(dir, "bad"), []byte("enter x\n"), 0o644)
	if err := readSection(filepath.Join(dir, "bad"), &got); err == nil {
		t.Error("a malformed line was accepted")
	}
}

// A semaphore of 2: two sections at once are fine, a third is an overlap;
// tokens need only differ between sections that ran at once.
func TestCheckSemaphore(t *testing.T) {
	rules := Rules{Tokens: true, MaxHolders: 2}
	two := []Run{ran(1, 100, 300, "2"), ran(2, 150, 350, "1"), ran(3, 320, 400, "3")}
	if r := CheckRules("x", two, rules); len(r.Failures()) != 0 {
		t.Errorf("two at once in a semaphore of 2: %q", r.Failures())
	}
	three := append(two, ran(4, 200, 250, "4"))
	r := CheckRules("x", three, rules)
	if len(r.Overlaps) != 1 || r.Overlaps[0].Second.Contender != 4 {
		t.Errorf("a third section in a semaphore of 2: overlaps %+v, want contender 4's", r.Overlaps)
	}
	dup := []Run{ran(1, 100, 300, "5"), ran(2, 150, 350, "5")}
	if r := CheckRules("x", dup, rules); len(r.TokenErrors) != 1 {
		t.Errorf("one token given twice: token errors %q", r.TokenErrors)
	}
}

// Shared sections may overlap each other, never an exclusive one; an
// exclusive section's token is larger than those of every section that
// ended before it entered, and smaller than those of every one that entered
// after it ended.
func TestCheckMixed(t *testing.T) {
	rules := Rules{Tokens: true, MaxHolders: 1}
	shared := func(c int, enter, end int64, token string) Run {
		r := ran(c, enter, end, token)
		r.Shared = true
		return r
	}
	clean := []Run{shared(1, 100, 300, "2"), shared(2, 150, 250, "1"), ran(3, 300, 400, "3"), shared(4, 400, 500, "4")}
	if r := CheckRules("x", clean, rules); len(r.Failures()) != 0 {
		t.Errorf("shared, then exclusive, then shared: %q", r.Failures())
	}
	r := CheckRules("x", []Run{shared(1, 100, 300, "1"), ran(2, 200, 350, "2"), shared(3, 320, 400, "3")}, rules)
	if len(r.Overlaps) != 2 {
		t.Errorf("an exclusive section among shared ones: overlaps %+v, want 2", r.Overlaps)
	}
	r = CheckRules("x", []Run{ran(1, 100, 200, "5"), shared(2, 300, 400, "4")}, rules)
	if len(r.TokenErrors) != 1 {
		t.Errorf("a shared section after an exclusive one with a smaller token: token errors %q", r.TokenErrors)
	}
}

// A section whose withlock was frozen may run alongside later ones until
// FrozenGrace after its withlock went on: counted apart, not a failure.
// Longer, or alongside a section that entered before the freeze, it is an
// overlap.
func TestCheckFrozenWindow(t *testing.T) {
	rules := Rules{MaxHolders: 1, FrozenGrace: 100 * time.Millisecond}
	frozen := ran(1, 100, 1050, "")
	frozen.Status, frozen.FrozenFrom, frozen.FrozenTo = 70, ms(200), ms(1000)
	r := CheckRules("x", []Run{frozen, ran(2, 900, 1200, "")}, rules)
	if len(r.Failures()) != 0 || len(r.FrozenOverlaps) != 1 || r.Frozen != 1 {
		t.Errorf("within the window: failures %q, frozen overlaps %d", r.Failures(), len(r.FrozenOverlaps))
	}
	if !strings.Contains(r.String(), "overlaps 0 (1 holders frozen, 1 overlaps in their window, 0 of whose withlock exited 0)") {
		t.Errorf("String() = %q", r.String())
	}
	late := frozen
	late.End = ms(1150) // 150ms after it went on
	if r := CheckRules("x", []Run{late, ran(2, 900, 1200, "")}, rules); len(r.Overlaps) != 1 {
		t.Errorf("past the window: overlaps %+v, want 1", r.Overlaps)
	}
	if r := CheckRules("x", []Run{frozen, ran(2, 150, 1200, "")}, rules); len(r.Overlaps) != 1 {
		t.Errorf("an entry before the freeze: overlaps %+v, want 1", r.Overlaps)
	}
	// In a semaphore of 2, a frozen holder and one more are no overlap at
	// all; a third is one only the window excuses.
	sem := Rules{MaxHolders: 2, FrozenGrace: 100 * time.Millisecond}
	r = CheckRules("x", []Run{frozen, ran(2, 900, 1200, "")}, sem)
	if len(r.Overlaps) != 0 || len(r.FrozenOverlaps) != 0 {
		t.Errorf("two in a semaphore of 2: overlaps %+v, frozen overlaps %+v", r.Overlaps, r.FrozenOverlaps)
	}
	r = CheckRules("x", []Run{frozen, ran(2, 900, 1200, ""), ran(3, 950, 1100, "")}, sem)
	if len(r.Overlaps) != 0 || len(r.FrozenOverlaps) != 1 {
		t.Errorf("three in a semaphore of 2, one frozen: overlaps %+v, frozen overlaps %+v", r.Overlaps, r.FrozenOverlaps)
	}
}
