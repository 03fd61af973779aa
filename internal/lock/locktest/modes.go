package locktest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/withlock/withlock/internal/lock"
)

// Modes says which of the modes' cases apply to the backend under test.
type Modes struct {
	// NoShared says the backend has no Shared mode (MySQL's GET_LOCK), so
	// the shared cases do not apply; the backend's own tests check that
	// its Opener refuses the mode with ErrUsage.
	NoShared bool
	// RecordsN says the backend records a semaphore's N, so that a holder
	// with another N is refused with ErrUsage naming the recorded N, and
	// Inspect reports MaxHolders.
	RecordsN bool
}

// runModes runs what docs/behaviour.md (Modes) asks of every backend:
// shared locks that exclude and are excluded by exclusive ones, and
// semaphores of N holders. leases says the backend's fencing tokens must
// grow.
func runModes(t *testing.T, open OpenFunc, o Modes, leases bool) {
	shared := lock.Options{Mode: lock.Shared}
	sem := func(n int) lock.Options { return lock.Options{Mode: lock.Semaphore, MaxHolders: n} }
	token := func(l lock.Lease) int64 {
		if f, ok := l.(lock.Expiring); ok {
			return f.Token()
		}
		return 0
	}

	if !o.NoShared {
		t.Run("SharedTogether", func(t *testing.T) {
			a, b, x, name := open(t, shared), open(t, shared), open(t, lock.Options{}), Name(t)
			la := mustTry(t, a, name)
			lb := mustTry(t, b, name)
			mustBeHeld(t, x, name)
			if leases && token(lb) <= token(la) {
				t.Errorf("second shared holder's token %d, first's %d; want it to grow", token(lb), token(la))
			}
			st, err := x.Inspect(Context(t), name)
			if err != nil {
				t.Fatalf("Inspect: %v", err)
			}
			if st.Mode != lock.Shared || len(st.Holders) != 2 {
				t.Errorf("Inspect of two shared holders: mode %q, %d holders", st.Mode, len(st.Holders))
			}
			mustRelease(t, la)
			mustBeHeld(t, x, name)
			mustRelease(t, lb)
			mustRelease(t, mustTry(t, x, name))
		})
		t.Run("ExclusiveExcludesShared", func(t *testing.T) {
			a, b, name := open(t, lock.Options{}), open(t, shared), Name(t)
			la := mustTry(t, a, name)
			mustBeHeld(t, b, name)
			mustRelease(t, la)
			mustRelease(t, mustTry(t, b, name))
		})
		t.Run("SharedWaiterGetsLock", func(t *testing.T) {
			a, b, name := open(t, lock.Options{}), open(t, shared), Name(t)
			la := mustTry(t, a, name)
			got := acquireInBackground(t, b, name)
			mustBlockHeld(t, got)
			mustRelease(t, la)
			mustGet(t, got)
		})
		t.Run("BreakShared", func(t *testing.T) {
			a, b, c, name := open(t, shared), open(t, shared), open(t, lock.Options{}), Name(t)
			mustTry(t, a, name)
			mustTry(t, b, name)
			broken, err := c.Break(Context(t), name)
			if err != nil || len(broken) != 2 {
				t.Fatalf("Break of two shared holders: %d broken, %v; want both", len(broken), err)
			}
			mustRelease(t, mustTry(t, c, name))
		})
	}

	t.Run("SemaphoreN", func(t *testing.T) {
		a, b, c, name := open(t, sem(2)), open(t, sem(2)), open(t, sem(2)), Name(t)
		la := mustTry(t, a, name)
		lb := mustTry(t, b, name)
		mustBeHeld(t, c, name)
		st, err := c.Inspect(Context(t), name)
		if err != nil {
			t.Fatalf("Inspect: %v", err)
		}
		if st.Mode != lock.Semaphore || len(st.Holders) != 2 {
			t.Errorf("Inspect of a full semaphore: mode %q, %d holders; want semaphore, 2", st.Mode, len(st.Holders))
		}
		if o.RecordsN && st.MaxHolders != 2 {
			t.Errorf("Inspect: MaxHolders %d; want the recorded 2", st.MaxHolders)
		}
		mustRelease(t, la)
		lc := mustTry(t, c, name)
		if leases && token(lc) <= token(lb) {
			t.Errorf("token %d after %d; want it to grow", token(lc), token(lb))
		}
		mustRelease(t, lb)
		mustRelease(t, lc)
	})
	t.Run("SemaphoreWaiterGetsSlot", func(t *testing.T) {
		a, b, c, name := open(t, sem(2)), open(t, sem(2)), open(t, sem(2)), Name(t)
		la := mustTry(t, a, name)
		mustTry(t, b, name)
		got := acquireInBackground(t, c, name)
		mustBlockHeld(t, got)
		mustRelease(t, la)
		mustGet(t, got)
	})
	t.Run("SemaphoreExcludesExclusive", func(t *testing.T) {
		a, x, name := open(t, sem(3)), open(t, lock.Options{}), Name(t)
		la := mustTry(t, a, name)
		if _, err := x.TryAcquire(Context(t), name); err == nil {
			t.Fatal("an exclusive holder got a lock a semaphore holder holds")
		}
		mustRelease(t, la)
	})
	if o.RecordsN {
		t.Run("SemaphoreOtherN", func(t *testing.T) {
			a, b, name := open(t, sem(2)), open(t, sem(3)), Name(t)
			la := mustTry(t, a, name)
			_, err := b.TryAcquire(Context(t), name)
			if !errors.Is(err, lock.ErrUsage) {
				t.Errorf("a semaphore of 3 on one recorded as 2: %v; want ErrUsage naming 2", err)
			}
			mustRelease(t, la)
		})
	}
	t.Run("BreakSemaphore", func(t *testing.T) {
		a, b, c, name := open(t, sem(2)), open(t, sem(2)), open(t, sem(2)), Name(t)
		mustTry(t, a, name)
		mustTry(t, b, name)
		broken, err := c.Break(Context(t), name)
		if err != nil || len(broken) != 2 {
			t.Fatalf("Break of a full semaphore: %d broken, %v; want both", len(broken), err)
		}
		mustRelease(t, mustTry(t, c, name))
	})
}

type heldResult struct {
	held *lock.Held
	err  error
}

// acquireInBackground waits for name through c on a goroutine. When t
// ends, the wait is stopped and what it got (unless a test took it off the
// channel) is released, before c is closed.
func acquireInBackground(t *testing.T, c *lock.Client, name string) <-chan heldResult {
	ctx, cancel := context.WithTimeout(Context(t), long)
	done := make(chan heldResult, 1)
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		h, err := c.Acquire(ctx, name)
		done <- heldResult{h, err}
	}()
	t.Cleanup(func() {
		cancel()
		<-finished
		select {
		case r := <-done:
			if r.err == nil {
				r.held.Release(context.Background())
			}
		default:
		}
	})
	return done
}

// mustBlockHeld checks that a waiter is still waiting a moment later.
func mustBlockHeld(t *testing.T, c <-chan heldResult) {
	t.Helper()
	select {
	case r := <-c:
		t.Fatalf("Acquire returned while the lock was held: %v", r.err)
	case <-time.After(300 * time.Millisecond): // it must not return, so a wait is the check
	}
}

// mustGet checks that a waiter gets the lock soon after it was freed, and
// releases it.
func mustGet(t *testing.T, c <-chan heldResult) {
	t.Helper()
	select {
	case r := <-c:
		if r.err != nil {
			t.Fatalf("Acquire after the lock was freed: %v", r.err)
		}
		if err := r.held.Release(Context(t)); err != nil {
			t.Errorf("Release: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Acquire did not get the freed lock within 10s")
	}
}
