// Command section is the critical section of the stress test
// (internal/stress): the command that withlock runs under the lock. It
// appends to the file named by $WITHLOCK_STRESS_OUT one line when it enters,
//
//	enter NANOSECONDS TOKEN
//
// then holds for $WITHLOCK_STRESS_HOLD (a Go duration) and appends
//
//	exit NANOSECONDS
//
// and exits 0; or, if withlock stops it with TERM (or INT, HUP) first, it
// appends
//
//	stopped NANOSECONDS
//
// and exits 143 at once, as a well-behaved command stops. NANOSECONDS is
// CLOCK_MONOTONIC, the same clock for every process on the host, so the
// harness can compare the lines of different runs; TOKEN is $WITHLOCK_TOKEN,
// or "-" when withlock gave none. A section killed without a chance to write
// (KILL) leaves neither line: the harness then counts it as running until
// its withlock exited.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

func main() {
	// Catch the signals first: a signal before this kills the section
	// before it enters, and it leaves no line at all.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	if err := run(sigs); err != nil {
		fmt.Fprintln(os.Stderr, "section:", err)
		os.Exit(2)
	}
}

func run(sigs <-chan os.Signal) error {
	hold, err := time.ParseDuration(os.Getenv("WITHLOCK_STRESS_HOLD"))
	if err != nil {
		return fmt.Errorf("WITHLOCK_STRESS_HOLD: %w", err)
	}
	token := os.Getenv("WITHLOCK_TOKEN")
	if token == "" {
		token = "-"
	}
	f, err := os.OpenFile(os.Getenv("WITHLOCK_STRESS_OUT"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	// One write per line: a line is either whole in the file or absent.
	// The entry is timed before it is written, and the exit after the hold:
	// the recorded section covers everything the section does.
	if _, err := fmt.Fprintf(f, "enter %d %s\n", now(), token); err != nil {
		return err
	}
	t := time.NewTimer(hold)
	select {
	case <-t.C:
		_, err = fmt.Fprintf(f, "exit %d\n", now())
		return err
	case <-sigs:
		if _, err := fmt.Fprintf(f, "stopped %d\n", now()); err != nil {
			return err
		}
		os.Exit(128 + int(syscall.SIGTERM))
	}
	return nil
}

func now() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		panic(err)
	}
	return ts.Nano()
}
