package lock

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// ErrUnsafe means the backend answered, but a lock taken there would not
// exclude everyone who uses it: a hot standby, a read-only replica, a
// pooler that shares sessions between clients. It matches ErrRefused too,
// so that acquisition refuses it like any refusal; withlock check reports
// it as a failed check. Make one with Unsafe.
var ErrUnsafe = fmt.Errorf("%w: a lock there would not exclude everyone", ErrRefused)

// Unsafe returns an error matching ErrUnsafe that reads "detail; fix":
// what makes the backend unsafe, and what to do about it, in one sentence
// each. The same error serves acquisition, which refuses with it, and
// withlock check, which reports both parts.
func Unsafe(detail, fix string) error {
	return &unsafeError{detail: detail, fix: fix}
}

type unsafeError struct{ detail, fix string }

func (e *unsafeError) Error() string { return e.detail + "; " + e.fix }
func (e *unsafeError) Unwrap() error { return ErrUnsafe }

// Status is a check's verdict.
type Status string

const (
	// Ok: nothing wrong found.
	Ok Status = "ok"
	// Warn: a lock works, but something weakens it (a restart can forget
	// it, eviction can drop it) or cannot be told.
	Warn Status = "warn"
	// Fail: a lock here would not exclude everyone.
	Fail Status = "fail"
)

// Finding is the outcome of one check of a backend (withlock check).
type Finding struct {
	Name   string // what was checked, in a few words: "probe lock", "eviction"
	Status Status
	Detail string // what was found
	Fix    string // what to do about it, one sentence; empty when nothing is to be done
}

// ProbePrefix begins the name of the probe lock that Client.Check takes.
const ProbePrefix = "withlock-check-"

// Check answers, before anything depends on it, whether a lock on the
// Client's backend would exclude everyone who uses it. It takes and
// releases a probe lock on a name of its own (ProbePrefix and a random
// suffix), through the same code that acquisition uses, so that every
// refusal acquisition makes (ErrUnsafe) is a failed check here; then it
// adds the backend's own checks (Backend.Findings).
//
// It returns an error, and no findings, when the backend cannot be
// reached or refuses us for any other reason than ErrUnsafe
// (authentication, permission): nothing can be told then.
func (c *Client) Check(ctx context.Context) ([]Finding, error) {
	name := ProbePrefix + NewToken()[:12]
	start := time.Now()
	lease, err := c.Backend.TryAcquire(ctx, name)
	// A server that cannot vouch yet that a lock is free (ErrUnsettled)
	// is waited for, within ConnectTimeout, as Acquire does.
	for left, _ := Remaining(err); errors.Is(err, ErrUnsettled) && time.Since(start)+left <= c.opts.ConnectTimeout; left, _ = Remaining(err) {
		t := time.NewTimer(max(left, time.Millisecond))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, context.Cause(ctx)
		case <-t.C:
		}
		lease, err = c.Backend.TryAcquire(ctx, name)
	}
	took := time.Since(start)
	var unsafe *unsafeError
	switch {
	case errors.As(err, &unsafe):
		return []Finding{{Name: "probe lock", Status: Fail, Detail: unsafe.detail, Fix: unsafe.fix}}, nil
	case errors.Is(err, ErrUnsettled):
		// Nothing is wrong with the server; it is only young.
		findings := []Finding{{Name: "probe lock", Status: Warn, Detail: fmt.Sprintf("not taken: %v", err),
			Fix: "nothing to fix: until then withlock waits for it within --connect-timeout (give check a longer one to wait it out)"}}
		more, err := c.Backend.Findings(ctx, name)
		if err != nil {
			return nil, err
		}
		return append(findings, more...), nil
	case errors.Is(err, ErrHeld):
		// A random name nobody holds: the backend answers "held" to
		// everything, or a stale lease of an earlier check is there.
		return []Finding{{Name: "probe lock", Status: Fail, Detail: fmt.Sprintf("the probe lock %s, a name nobody uses, was held: %v", name, err),
			Fix: "look at what holds it (withlock status " + name + ")"}}, nil
	case err != nil:
		return nil, err
	}
	start = time.Now()
	err = lease.Release(ctx)
	released := time.Since(start)
	if err != nil {
		return nil, fmt.Errorf("releasing the probe lock %s: %w", name, err)
	}
	findings := []Finding{{Name: "probe lock", Status: Ok,
		Detail: fmt.Sprintf("took and released %s (take %s, connecting included; release %s)", name, round(took), round(released))}}
	more, err := c.Backend.Findings(ctx, name)
	if err != nil {
		return nil, err
	}
	return append(findings, more...), nil
}

// round rounds a short duration for people: 3.2ms, 840µs.
func round(d time.Duration) time.Duration {
	switch {
	case d >= 10*time.Millisecond:
		return d.Round(time.Millisecond)
	case d >= time.Millisecond:
		return d.Round(100 * time.Microsecond)
	}
	return d.Round(10 * time.Microsecond)
}
