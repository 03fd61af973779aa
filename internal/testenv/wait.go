package testenv

import (
	"testing"
	"time"
)

// WaitFor polls ready every 10ms until it reports true, and fails t if it
// has not within a minute: the readiness wait of every test (a waiter seen
// by the server, a process gone, a connection accepted) in place of a
// fixed sleep. The bound is generous because the machines that run the
// tests are slow and shared; what says what is awaited, for the failure.
// ready runs on t's goroutine, so it may call t.Fatal.
func WaitFor(t testing.TB, what string, ready func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !ready() {
		if time.Now().After(deadline) {
			t.Fatalf("waited a minute for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
