package cmd

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/withlock/withlock/internal/lock"
)

// whoAsk bounds one question to the backend about who holds a lock, for a
// message; whoEvery is how often -v says it again during a wait.
const (
	whoAsk   = 5 * time.Second
	whoEvery = 30 * time.Second
)

// heldBy says who holds name, for a message, as withlock status would:
// "held (exclusive) by web-1 pid 4242 since ...: migrate up", or "held
// elsewhere" when the backend cannot tell. c must be idle (its Acquire
// returned).
func heldBy(c *lock.Client, name string) string {
	ctx, cancel := context.WithTimeout(context.Background(), min(whoAsk, c.Options().ConnectTimeout))
	defer cancel()
	st, err := c.Inspect(ctx, name)
	if err != nil || len(st.Holders) == 0 {
		return "held elsewhere"
	}
	return heldText(st)
}

// sayWhoHolds logs, at -v, who holds name when the wait begins (start
// called) and every whoEvery after, through a client of its own (open),
// since the waiting client is busy; stop ends it and returns at once.
func sayWhoHolds(log *slog.Logger, open func() (*lock.Client, error), name string) (start, stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	begun := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
			return
		case <-begun:
		}
		c, err := open()
		if err != nil {
			return
		}
		defer c.Close()
		t := time.NewTicker(whoEvery)
		defer t.Stop()
		for {
			actx, acancel := context.WithTimeout(ctx, whoAsk)
			st, err := c.Inspect(actx, name)
			acancel()
			if ctx.Err() != nil {
				return
			}
			if err == nil && len(st.Holders) > 0 {
				log.Debug("waiting", "lock", name, "holder", heldText(st))
			}
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	var once sync.Once
	return func() { once.Do(func() { close(begun) }) }, cancel
}

// restated is err with a message of withlock's own.
type restated struct {
	msg string
	err error
}

func (e restated) Error() string { return e.msg }
func (e restated) Unwrap() error { return e.err }
