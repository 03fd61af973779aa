package redis

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"syscall"
	"time"
)

// A wrong scheme for the port costs a whole --connect-timeout otherwise: a
// Redis that speaks plaintext waits for the end of a line that a TLS
// ClientHello seldom holds, and a TLS-only Redis drops a plaintext client
// without a word, which looks like an outage. dialer tells both apart on
// the first attempt, by asking the port once in the other protocol, only
// when the expected one fails or is slow.

// probeAfter is how long a TLS handshake may take before the port is asked,
// on a second connection, whether it speaks plaintext Redis. Handshakes on a
// reachable server take milliseconds; a slow one loses nothing by the probe.
const probeAfter = 500 * time.Millisecond

// probeTimeout bounds one probe.
const probeTimeout = time.Second

// wrongProtocolError says that the server at addr speaks the other protocol
// than the URL's scheme asks for; it is a refusal, and trying again will not
// change it.
type wrongProtocolError struct {
	addr string
	tls  bool // the server speaks TLS (and the URL said redis://)
}

func (e wrongProtocolError) Error() string {
	if e.tls {
		return fmt.Sprintf("the server at %s expects TLS (use rediss://)", e.addr)
	}
	return fmt.Sprintf("the server at %s does not speak TLS (use redis://)", e.addr)
}

// dialer is go-redis's Dialer: a TCP connection, with TLS when cfg is not
// nil, each step bounded by timeout, telling a server of the other protocol
// from an unreachable one.
func dialer(cfg *tls.Config, timeout time.Duration) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		ctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		// go-redis's own dialer's keep-alive, so that a dead peer is noticed
		// as soon as without this dialer.
		d := net.Dialer{KeepAliveConfig: net.KeepAliveConfig{Enable: true, Idle: 30 * time.Second, Interval: 5 * time.Second, Count: 3}}
		conn, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		if cfg == nil {
			return &plainConn{Conn: conn, network: network, addr: addr}, nil
		}
		return handshake(ctx, tls.Client(conn, cfg), network, addr)
	}
}

// handshake completes the TLS handshake of conn, and if it is slow asks
// the port whether it speaks plaintext Redis instead.
func handshake(ctx context.Context, conn *tls.Conn, network, addr string) (net.Conn, error) {
	hctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	done := make(chan error, 1)
	go func() { done <- conn.HandshakeContext(hctx) }()
	probe := time.NewTimer(probeAfter)
	defer probe.Stop()
	for {
		select {
		case err := <-done:
			if err == nil {
				return conn, nil
			}
			conn.Close()
			var header tls.RecordHeaderError
			if errors.As(err, &header) && isRESP(header.RecordHeader[0]) {
				return nil, wrongProtocolError{addr: addr}
			}
			if cause := context.Cause(hctx); errors.As(cause, new(wrongProtocolError)) {
				return nil, cause
			}
			return nil, err
		case <-probe.C:
			go func() {
				if speaksPlaintext(ctx, network, addr) {
					cancel(wrongProtocolError{addr: addr})
				}
			}()
		}
	}
}

// isRESP reports whether b can begin a Redis reply (RESP 2 or 3), which
// never begins a TLS record (types 20 to 24).
func isRESP(b byte) bool {
	return bytes.IndexByte([]byte("+-:$*_#,(!=%~>|"), b) >= 0
}

// probe asks the port at addr, on a connection of its own, what ask
// answers of it, all within probeTimeout. It reports false when the port
// cannot be reached.
func probe(ctx context.Context, network, addr string, ask func(ctx context.Context, conn net.Conn) bool) bool {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	var d net.Dialer
	conn, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return false
	}
	defer conn.Close()
	return ask(ctx, conn)
}

// speaksPlaintext reports whether the server at addr answers an inline PING
// as plaintext Redis does (+PONG, or an error such as -NOAUTH).
func speaksPlaintext(ctx context.Context, network, addr string) bool {
	return probe(ctx, network, addr, func(ctx context.Context, conn net.Conn) bool {
		deadline, _ := ctx.Deadline()
		conn.SetDeadline(deadline)
		if _, err := conn.Write([]byte("PING\r\n")); err != nil {
			return false
		}
		var b [1]byte
		n, _ := conn.Read(b[:])
		return n == 1 && (b[0] == '+' || b[0] == '-')
	})
}

// speaksTLS reports whether the server at addr answers a TLS ClientHello
// with a TLS record (a handshake or an alert). Nothing it sends is trusted
// or used: only the record's type is looked at.
func speaksTLS(network, addr string) bool {
	return probe(context.Background(), network, addr, func(ctx context.Context, conn net.Conn) bool {
		first := &firstByte{Conn: conn}
		tls.Client(first, &tls.Config{InsecureSkipVerify: true}).HandshakeContext(ctx)
		return first.n > 0 && (first.b == 21 || first.b == 22) // alert, handshake
	})
}

// firstByte is a connection that remembers the first byte it read.
type firstByte struct {
	net.Conn
	b byte
	n int
}

func (c *firstByte) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if c.n == 0 && n > 0 {
		c.b, c.n = p[0], n
	}
	return n, err
}

// plainConn is a plaintext connection that, if the server closes it before
// saying anything, asks the port once whether it expects TLS, so that the
// error says so instead of a bare EOF or reset.
type plainConn struct {
	net.Conn
	network, addr string
	once          sync.Once
	heard         bool // a byte has come from the server
	tls           bool
}

func (c *plainConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		if !c.heard && (p[0] == 21 || p[0] == 22) {
			return 0, wrongProtocolError{addr: c.addr, tls: true}
		}
		c.heard = true
	}
	if err != nil && !c.heard && (errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET)) {
		c.once.Do(func() { c.tls = speaksTLS(c.network, c.addr) })
		if c.tls {
			return n, wrongProtocolError{addr: c.addr, tls: true}
		}
	}
	return n, err
}

// SyscallConn gives go-redis the socket, as a plain TCP connection does, so
// that it still finds an idle pooled connection that the server closed
// before using it.
func (c *plainConn) SyscallConn() (syscall.RawConn, error) {
	if sc, ok := c.Conn.(syscall.Conn); ok {
		return sc.SyscallConn()
	}
	return nil, errors.ErrUnsupported
}
