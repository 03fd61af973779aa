package locktest

import (
	"context"
	"errors"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/withlock/withlock/internal/lock"
)

// Operators says what the backend under test records of a holder, and how
// a broken holder learns that it lost the lock.
type Operators struct {
	// NoCommand says the backend cannot record the holder's command.
	NoCommand bool
	// OwnProcess says the backend records the process that holds the lock
	// (its host name and pid), not Options.Holder's, because Break finds
	// and signals that very process (file): the holders are then expected
	// to be this test process, with Options.Holder's command.
	OwnProcess bool
	// Lost waits until l, broken by Break, knows it is lost, and returns
	// the error that says so (for a lease, Keep's; for a session, Watch's or
	// Keep's). Nil means: Keep must say ErrLost at once.
	Lost func(t *testing.T, l lock.Lease) error
}

// runOperators runs what withlock status and release --force need from
// every backend (lock.Inspector and lock.Breaker): holder records, the list
// of held locks, and breaking a lock so that its holder finds it lost. A
// lease backend's holders also show the lease's end and token.
func runOperators(t *testing.T, open OpenFunc, o Operators, leases bool) {
	holder := func(n int) lock.Holder {
		h := lock.Holder{Host: "host-" + string(rune('a'+n)), PID: 1000 + n, Command: []string{"sh", "-c", "echo it's \"quoted\"; exit 0"}}
		if o.OwnProcess {
			h.Host, h.PID = lock.Hostname(), os.Getpid()
		}
		return h
	}
	inspect := func(t *testing.T, c *lock.Client, name string) lock.State {
		t.Helper()
		st, err := c.Inspect(Context(t), name)
		if err != nil {
			t.Fatalf("Inspect(%q): %v", name, err)
		}
		if st.Name != name {
			t.Errorf("Inspect(%q).Name = %q", name, st.Name)
		}
		return st
	}
	checkHolder := func(t *testing.T, got, want lock.Holder, token int64) {
		t.Helper()
		if got.Host != want.Host || got.PID != want.PID {
			t.Errorf("holder %q pid %d; want %q pid %d", got.Host, got.PID, want.Host, want.PID)
		}
		if !o.NoCommand && !slices.Equal(got.Command, want.Command) {
			t.Errorf("holder's command %q; want %q", got.Command, want.Command)
		}
		if d := time.Since(got.AcquiredAt); got.AcquiredAt.IsZero() || d < -time.Minute || d > time.Minute {
			t.Errorf("holder acquired at %v; want about now", got.AcquiredAt)
		}
		if leases && !got.ExpiresAt.After(got.AcquiredAt) {
			t.Errorf("lease expires at %v, acquired at %v; want an end after the start", got.ExpiresAt, got.AcquiredAt)
		}
		if leases && got.Token != token {
			t.Errorf("holder's token %d; want the lease's, %d", got.Token, token)
		}
	}
	token := func(l lock.Lease) int64 {
		if f, ok := l.(lock.Expiring); ok {
			return f.Token()
		}
		return 0
	}

	t.Run("InspectFree", func(t *testing.T) {
		c, name := open(t, lock.Options{}), Name(t)
		if st := inspect(t, c, name); len(st.Holders) != 0 {
			t.Errorf("a lock never taken has holders: %+v", st.Holders)
		}
	})
	t.Run("InspectHeld", func(t *testing.T) {
		a, b, name := open(t, lock.Options{Holder: holder(0)}), open(t, lock.Options{}), Name(t)
		l := mustTry(t, a, name)
		st := inspect(t, b, name)
		if len(st.Holders) != 1 || st.Mode != lock.Exclusive {
			t.Fatalf("Inspect of a held lock: mode %q, %d holders; want exclusive, 1", st.Mode, len(st.Holders))
		}
		checkHolder(t, st.Holders[0], holder(0), token(l))
		mustRelease(t, l)
		if st := inspect(t, b, name); len(st.Holders) != 0 {
			t.Errorf("a released lock has holders: %+v", st.Holders)
		}
	})
	t.Run("List", func(t *testing.T) {
		a, b, name := open(t, lock.Options{Holder: holder(1)}), open(t, lock.Options{}), Name(t)
		l := mustTry(t, a, name)
		all, err := b.List(Context(t))
		if err != nil {
			t.Fatalf("List: %v", err)
		}
		i := slices.IndexFunc(all, func(st lock.State) bool { return st.Name == name })
		if i < 0 {
			t.Fatalf("List does not show the held lock %q: %+v", name, all)
		}
		if len(all[i].Holders) != 1 {
			t.Fatalf("List shows %q with %d holders", name, len(all[i].Holders))
		}
		checkHolder(t, all[i].Holders[0], holder(1), token(l))
		mustRelease(t, l)
		all, err = b.List(Context(t))
		if err != nil {
			t.Fatalf("List: %v", err)
		}
		if slices.ContainsFunc(all, func(st lock.State) bool { return st.Name == name }) {
			t.Errorf("List still shows %q after its release", name)
		}
	})
	t.Run("BreakFree", func(t *testing.T) {
		c, name := open(t, lock.Options{}), Name(t)
		broken, err := c.Break(Context(t), name)
		if err != nil || len(broken) != 0 {
			t.Errorf("Break of a free lock: %v, %v; want nothing broken and no error", broken, err)
		}
	})
	t.Run("Break", func(t *testing.T) {
		a, b, c, name := open(t, lock.Options{Holder: holder(2)}), open(t, lock.Options{}), open(t, lock.Options{}), Name(t)
		l := mustTry(t, a, name)
		before := token(l)
		broken, err := b.Break(Context(t), name)
		if err != nil {
			t.Fatalf("Break: %v", err)
		}
		if len(broken) != 1 {
			t.Fatalf("Break returned %d holders; want the one", len(broken))
		}
		checkHolder(t, broken[0], holder(2), before)
		lostErr := errors.New("no Lost function")
		if o.Lost != nil {
			lostErr = o.Lost(t, l)
		} else {
			lostErr = l.Keep(Context(t))
		}
		if !errors.Is(lostErr, lock.ErrLost) {
			t.Errorf("the broken holder's check: %v; want ErrLost", lostErr)
		}
		if st := inspect(t, c, name); len(st.Holders) != 0 {
			t.Errorf("a broken lock still has holders: %+v", st.Holders)
		}
		l2 := mustTry(t, c, name)
		if leases && token(l2) <= before {
			t.Errorf("token after a break %d; want more than the broken holder's %d", token(l2), before)
		}
		// The broken holder's late release does not touch the new holder.
		ctx, cancel := context.WithTimeout(Context(t), 5*time.Second)
		l.Release(ctx)
		cancel()
		if err := l2.Keep(Context(t)); err != nil {
			t.Errorf("the new holder lost its lock to the broken holder's release: %v", err)
		}
		mustRelease(t, l2)
	})
}
