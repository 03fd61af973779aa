package lock

import (
	"time"

	"golang.org/x/sys/unix"
)

// bootClock reads CLOCK_BOOTTIME: like the monotonic clock, but it goes on
// counting while the host is suspended. Should the kernel refuse it, it
// reads zero, and the monotonic clock alone judges.
func bootClock() time.Duration {
	var ts unix.Timespec
	if unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts) != nil {
		return 0
	}
	return time.Duration(ts.Nano())
}
