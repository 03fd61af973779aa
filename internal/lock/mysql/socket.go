package mysql

import (
	"context"
	"errors"
	"net"
	"os"
	"sync"
	"time"
)

// socket is a connection's TCP socket, beneath the driver and its TLS. It
// does two things the driver cannot:
//
//   - It bounds and interrupts statements by socket deadlines. The driver
//     closes the connection when a statement's context ends, which would
//     end the session and its lock at the first cancelled Keep; so
//     statements get contexts that never end, and the real context's
//     deadline and cancellation act on the socket (bound).
//   - It lets the lease read the idle connection (watch), so that a
//     session the server ends (KILL, wait_timeout, a restart) is noticed at
//     once, not at the next Keep. Bytes read there are kept for the driver,
//     which reads them first.
type socket struct {
	net.Conn

	mu      sync.Mutex
	pending []byte // read by watch, not yet by the driver
}

func (s *socket) Read(p []byte) (int, error) {
	s.mu.Lock()
	if len(s.pending) > 0 {
		n := copy(p, s.pending)
		s.pending = s.pending[n:]
		s.mu.Unlock()
		return n, nil
	}
	s.mu.Unlock()
	return s.Conn.Read(p)
}

// longAgo is a deadline in the past: it fails a blocked read or write at
// once.
var longAgo = time.Unix(1, 0)

// bound makes every read and write of the socket fail once ctx is done (its
// deadline, or its cancellation), until the returned stop is called. A
// statement cut off so breaks the connection: the driver then closes it.
func (s *socket) bound(ctx context.Context) (stop func()) {
	d, _ := ctx.Deadline()
	s.SetDeadline(d)
	cut := make(chan struct{})
	cancel := context.AfterFunc(ctx, func() {
		s.SetDeadline(longAgo)
		close(cut)
	})
	return func() {
		if !cancel() {
			<-cut // or it could cut the next statement
		}
		s.SetDeadline(time.Time{})
	}
}

// errClosed is watch's error when the server closed the idle connection.
var errClosed = errors.New("the server closed the connection")

// watch reads the idle connection until ctx is done (nil) or the server
// closes it (an error: errClosed, or the socket's own, such as a reset).
// The driver must not use the connection meanwhile. A server sends nothing
// on an idle connection except, from some versions, an error packet just
// before it closes it; whatever it sends is kept for the driver.
func (s *socket) watch(ctx context.Context) error {
	stop := s.bound(ctx)
	defer stop()
	buf := make([]byte, 256)
	for {
		n, err := s.Conn.Read(buf)
		if n > 0 {
			s.mu.Lock()
			s.pending = append(s.pending, buf[:n]...)
			s.mu.Unlock()
		}
		switch {
		case err == nil:
			continue // read on until the server closes
		case errors.Is(err, os.ErrDeadlineExceeded):
			return nil // ctx ended (its deadline may beat ctx.Err by a moment)
		case ctx.Err() != nil:
			return nil
		case n == 0 && isEOF(err):
			return errClosed
		}
		return err
	}
}
