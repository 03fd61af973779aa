package lock

import (
	"sync/atomic"
	"time"
)

// TestClock is the system's clock moved on by hand: Suspend moves the boot
// clock alone, as a host that slept sees it on waking; Stop moves both, as
// a process stopped (SIGSTOP) while its host ran sees it.
type TestClock struct {
	boot, mono atomic.Int64 // nanoseconds added to each
	reads      atomic.Int64
}

func (c *TestClock) now() instant {
	c.reads.Add(1)
	return instant{
		mono: time.Now().Add(time.Duration(c.mono.Load())),
		boot: bootClock() + time.Duration(c.boot.Load()),
	}
}

// Reads is how often the clock was read.
func (c *TestClock) Reads() int64 { return c.reads.Load() }

// Suspend makes it look as though the host had been suspended for d.
func (c *TestClock) Suspend(d time.Duration) { c.boot.Add(int64(d)) }

// Stop makes it look as though the process had been stopped for d.
func (c *TestClock) Stop(d time.Duration) {
	c.mono.Add(int64(d))
	c.boot.Add(int64(d))
}

// WithClock returns o with the loops judging time by c.
func WithClock(o Options, c *TestClock) Options {
	o.clock = c
	return o
}

// ReadClock is one reading of the system's clock, for benchmarks.
func ReadClock() { systemClock{}.now() }
