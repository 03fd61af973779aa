package lock

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"syscall"
	"time"
)

// Errorf returns an error whose message is format's alone but which also
// matches kind (one of this package's sentinels) under errors.Is, so that
// users read "cannot reach postgres at db:5432 (connection refused)" and not
// the sentinel's text.
func Errorf(kind error, format string, args ...any) error {
	return &kindError{kinds: []error{kind}, err: fmt.Errorf(format, args...)}
}

type kindError struct {
	kinds []error
	err   error
}

func (e *kindError) Error() string   { return e.err.Error() }
func (e *kindError) Unwrap() []error { return append(e.kinds[:len(e.kinds):len(e.kinds)], e.err) }

// timedOut is Reason's word for any timeout.
const timedOut = "timed out"

// errTimedOut marks an Unreachable error that says only that time ran out.
var errTimedOut = errors.New("lock: timed out")

// Unreachable is the ErrUnavailable error of a server that could not be
// reached: "cannot reach WHAT (REASON)", reason being Reason's summary of
// the driver's error or the server's own words. When the reason is only
// that time ran out ("timed out"), the error says nothing about the server
// if it was the caller's own deadline that ended the attempt: Client.Acquire
// then reports a plain timeout, not an unavailable backend.
func Unreachable(what, reason string) error {
	e := &kindError{kinds: []error{ErrUnavailable}, err: fmt.Errorf("cannot reach %s (%s)", what, reason)}
	if reason == timedOut {
		e.kinds = append(e.kinds, errTimedOut)
	}
	return e
}

// HeldError is an error matching ErrHeld (or ErrUnsettled) that also says
// how long until the lock may be taken: the time left of the holder's
// lease, or of any other wait the backend knows the end of. Client.Acquire
// tries again no later than then. HeldFor makes the plain one; a backend's
// own error type that says more implements it too (ErrUnsettled's reason,
// say).
type HeldError interface {
	error
	Remaining() time.Duration
}

// HeldFor returns a HeldError of remaining.
func HeldFor(remaining time.Duration) error { return heldError{remaining} }

type heldError struct{ remaining time.Duration }

func (e heldError) Error() string            { return ErrHeld.Error() }
func (e heldError) Unwrap() error            { return ErrHeld }
func (e heldError) Remaining() time.Duration { return e.remaining }

// Remaining reports how long until the lock of an ErrHeld or ErrUnsettled
// error may be taken, where a HeldError in err's chain says so.
func Remaining(err error) (time.Duration, bool) {
	var h HeldError
	if errors.As(err, &h) {
		return h.Remaining(), true
	}
	return 0, false
}

// Reason is the innermost useful part of a network error, for messages:
// "connection refused", not the whole dial chain; "timed out" for any
// timeout. Backends use it in their ErrUnavailable messages.
func Reason(err error) string {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return errno.Error()
	}
	var dnsErr *net.DNSError
	if errors.As(err, &dnsErr) {
		return dnsErr.Error()
	}
	var netErr net.Error
	if errors.Is(err, context.DeadlineExceeded) || errors.As(err, &netErr) && netErr.Timeout() {
		return timedOut
	}
	return err.Error()
}

// Redact returns rawURL with any password (of the user part, or a
// password= option, in any case) replaced by "xxxxx", for messages. A value
// that does not parse as a URL with a scheme is not shown at all: where a
// password stands in it cannot be known ("postgres//u:pw@db", a typo, has
// no scheme, and its user part is just path).
func Redact(rawURL string) string {
	u, err := url.Parse(rawURL)
	if err != nil || u.Scheme == "" {
		return "(not shown: not a URL)"
	}
	q := u.Query()
	hid := false
	for k := range q {
		if strings.EqualFold(k, "password") {
			q[k] = []string{"xxxxx"}
			hid = true
		}
	}
	if hid {
		u.RawQuery = q.Encode()
	}
	u.Fragment, u.RawFragment = "", ""
	return u.Redacted()
}
