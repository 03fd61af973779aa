package lock

import "time"

// A clock reads the time that the loops judge a lease's life by.
type clock interface {
	now() instant
}

// An instant is one reading of two clocks. mono is time.Now, whose
// monotonic clock stops while the host is suspended (a laptop asleep, a VM
// suspended to disk), so that a host that wakes past its lease would go on
// trusting a lease that someone else may have taken meanwhile. boot counts
// suspended time too (bootClock), so the time between two instants is the
// longer of the two: a lease runs out on the server whether or not this
// host was awake.
type instant struct {
	mono time.Time
	boot time.Duration
}

// to is how long passed from i to j, on whichever clock moved more.
func (i instant) to(j instant) time.Duration {
	return max(j.mono.Sub(i.mono), j.boot-i.boot)
}

// systemClock reads time.Now and the boot clock.
type systemClock struct{}

func (systemClock) now() instant {
	return instant{mono: time.Now(), boot: bootClock()}
}

// A Reading is one reading of the clocks that the loops judge a lease's
// life by, for a backend that must judge the same way how long ago it did
// something: Since counts suspended time too.
type Reading struct{ at instant }

// Read reads the clocks now.
func Read() Reading { return Reading{systemClock{}.now()} }

// Since is how long passed since r, on whichever clock moved more.
func (r Reading) Since() time.Duration { return r.at.to(systemClock{}.now()) }
