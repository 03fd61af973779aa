package cmd

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"github.com/withlock/withlock/internal/lock"
)

// The status line's timing: it appears once withlock has waited
// waitLineAfter, its time is brought up to date every waitLineTick, and who
// holds the lock is asked again every waitLineAsk.
const (
	waitLineAfter = time.Second
	waitLineTick  = time.Second
	waitLineAsk   = 3 * time.Second
)

// startWaitLine shows a person at a terminal what withlock waits for: one
// line on stderr, from a second into the wait on, that says how long it has
// waited and who holds name (from the same holder records as withlock
// status, through a client of its own that open returns), updated in place.
// stop erases the line and returns at once, whatever the client is doing:
// the command must not wait for it.
//
// The caller shows it only where a person sees it: stderr is a terminal,
// the log format is text, and -v is off (its lines already say what
// happens, and would scroll the status line away).
func startWaitLine(out *redactor, open func() (*lock.Client, error), name string, width int) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		start := time.Now()
		t := time.NewTimer(waitLineAfter)
		defer t.Stop()
		var client *lock.Client
		defer func() {
			if client != nil {
				client.Close()
			}
		}()
		var who string
		var asked time.Time
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if time.Since(asked) >= waitLineAsk {
				asked = time.Now()
				who = holders(ctx, &client, open, name)
			}
			if ctx.Err() != nil {
				return
			}
			waited := time.Since(start).Truncate(time.Second)
			out.setLine(fit(fmt.Sprintf("withlock: waiting %s; %s", waited, who), width))
			t.Reset(waitLineTick)
		}
	}()
	return func() {
		cancel()
		<-finished
		out.setLine("")
	}
}

// holders says who holds name, as withlock status does on one line.
func holders(ctx context.Context, client **lock.Client, open func() (*lock.Client, error), name string) string {
	if *client == nil {
		c, err := open()
		if err != nil {
			return name + ": cannot tell who holds it"
		}
		*client = c
	}
	ctx, cancel := context.WithTimeout(ctx, waitLineAsk)
	defer cancel()
	st, err := (*client).Inspect(ctx, name)
	if err != nil {
		return name + ": cannot tell who holds it"
	}
	return describe(st)
}

// fit cuts s to width-1 characters, so that the line never wraps (a
// wrapped line could not be erased in place).
func fit(s string, width int) string {
	if utf8.RuneCountInString(s) < width {
		return s
	}
	r := []rune(s)
	return string(r[:max(width-2, 0)]) + "…"
}

// terminalWidth is the width of the terminal on f, or 0 when f is not a
// terminal.
func terminalWidth(f *os.File) int {
	ws, err := unix.IoctlGetWinsize(int(f.Fd()), unix.TIOCGWINSZ)
	if err != nil {
		return 0
	}
	if ws.Col == 0 {
		return 80 // a terminal that does not say
	}
	return int(ws.Col)
}

// quietLogger discards everything: the status line's client says nothing.
var quietLogger = slog.New(slog.DiscardHandler)
