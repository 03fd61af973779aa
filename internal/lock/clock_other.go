//go:build !linux

package lock

import "time"

// started is the origin of bootClock.
var started = time.Now()

// bootClock is the monotonic clock where no clock that counts suspended
// time is read: there the monotonic clock alone judges a lease's life.
func bootClock() time.Duration { return time.Since(started) }
