package faultproxy

import (
	"bufio"
	"errors"
	"io"
	"net"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/withlock/withlock/internal/testenv"
)

// echoServer is a TCP peer on 127.0.0.1 that echoes every line back; it
// counts the connections it accepted and reports how each one ended.
type echoServer struct {
	ln       net.Listener
	accepted atomic.Int64
	ended    chan error // one per connection: nil for EOF, else the read error
}

func startEcho(t *testing.T) *echoServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e := &echoServer{ln: ln, ended: make(chan error, 16)}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			e.accepted.Add(1)
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						if errors.Is(err, io.EOF) {
							err = nil
						}
						e.ended <- err
						return
					}
					c.Write([]byte(line))
				}
			}()
		}
	}()
	return e
}

func startProxy(t *testing.T, target string) *Proxy {
	t.Helper()
	p, err := Start(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func dial(t *testing.T, p *Proxy) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, bufio.NewReader(c)
}

// roundTrip sends line and returns the echo, failing t after 10s.
func roundTrip(t *testing.T, c net.Conn, r *bufio.Reader, line string) string {
	t.Helper()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	defer c.SetDeadline(time.Time{})
	if _, err := c.Write([]byte(line + "\n")); err != nil {
		t.Fatal(err)
	}
	got, err := r.ReadString('\n')
	if err != nil {
		t.Fatalf("echo of %q: %v", line, err)
	}
	return got[:len(got)-1]
}

func TestPass(t *testing.T) {
	e := startEcho(t)
	p := startProxy(t, e.ln.Addr().String())
	c, r := dial(t, p)
	for _, s := range []string{"one", "two"} {
		if got := roundTrip(t, c, r, s); got != s {
			t.Fatalf("echo %q, want %q", got, s)
		}
	}
	// A FIN passes through: the server sees EOF, not a reset.
	c.(*net.TCPConn).CloseWrite()
	if err := <-e.ended; err != nil {
		t.Fatalf("server saw %v after the client's FIN, want EOF", err)
	}
}

func TestCutResetsBothSides(t *testing.T) {
	e := startEcho(t)
	p := startProxy(t, e.ln.Addr().String())
	c, r := dial(t, p)
	roundTrip(t, c, r, "before")
	if n := p.Cut(); n != 1 {
		t.Fatalf("Cut reset %d connections, want 1", n)
	}
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := r.ReadByte(); !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("client read after Cut: %v, want ECONNRESET", err)
	}
	if err := <-e.ended; !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("server read after Cut: %v, want ECONNRESET", err)
	}
	// New connections work as before.
	c2, r2 := dial(t, p)
	if got := roundTrip(t, c2, r2, "after"); got != "after" {
		t.Fatalf("echo after Cut: %q", got)
	}
}

func TestBlackHole(t *testing.T) {
	e := startEcho(t)
	p := startProxy(t, e.ln.Addr().String())
	c, r := dial(t, p)
	roundTrip(t, c, r, "before")

	p.BlackHole()
	if _, err := c.Write([]byte("held\n")); err != nil {
		t.Fatal(err)
	}
	// A new connection during the black-hole is accepted, and reaches
	// nothing.
	c2, r2 := dial(t, p)
	if _, err := c2.Write([]byte("new\n")); err != nil {
		t.Fatal(err)
	}
	// Checks that nothing happens, so it must wait a while: 300ms without an
	// answer on either connection, and no connection to the server.
	for _, cr := range []struct {
		c net.Conn
		r *bufio.Reader
	}{{c, r}, {c2, r2}} {
		cr.c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
		if b, err := cr.r.ReadByte(); !errors.Is(err, syscall.ETIMEDOUT) && !isTimeout(err) {
			t.Fatalf("read during a black-hole: %q, %v; want a timeout", b, err)
		}
	}
	if n := e.accepted.Load(); n != 1 {
		t.Fatalf("server accepted %d connections during the black-hole, want only the first", n)
	}

	p.Heal()
	for _, cr := range []struct {
		c    net.Conn
		r    *bufio.Reader
		want string
	}{{c, r, "held"}, {c2, r2, "new"}} {
		cr.c.SetReadDeadline(time.Now().Add(10 * time.Second))
		got, err := cr.r.ReadString('\n')
		if err != nil || got != cr.want+"\n" {
			t.Fatalf("after Heal: %q, %v; want %q delivered", got, err, cr.want)
		}
	}
}

// A Cut during a black-hole resets the connections that wait to be
// dialled, too.
func TestCutDuringBlackHole(t *testing.T) {
	e := startEcho(t)
	p := startProxy(t, e.ln.Addr().String())
	p.BlackHole()
	c, r := dial(t, p)
	testenv.WaitFor(t, "the held connection", func() bool { p.mu.Lock(); defer p.mu.Unlock(); return len(p.links) == 1 })
	if n := p.Cut(); n != 1 {
		t.Fatalf("Cut reset %d connections, want 1", n)
	}
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := r.ReadByte(); !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("client read after Cut: %v, want ECONNRESET", err)
	}
	p.Heal()
	if n := e.accepted.Load(); n != 0 {
		t.Errorf("server accepted %d connections, want 0", n)
	}
}

func TestLatency(t *testing.T) {
	e := startEcho(t)
	p := startProxy(t, e.ln.Addr().String())
	c, r := dial(t, p)
	roundTrip(t, c, r, "warm")
	const d = 100 * time.Millisecond
	p.SetLatency(d)
	start := time.Now()
	roundTrip(t, c, r, "slow")
	if took := time.Since(start); took < 2*d {
		t.Errorf("round trip with %v latency took %v, want at least %v", d, took, 2*d)
	}
	p.SetLatency(0)
	roundTrip(t, c, r, "fast")
}

func TestServerDown(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	p := startProxy(t, addr)
	c, err := net.Dial("tcp", p.Addr())
	if err == nil {
		defer c.Close()
		_, err = c.Read(make([]byte, 1))
	}
	// The reset may come so soon that connect itself reports it.
	if !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("through a proxy to a closed port: %v, want ECONNRESET", err)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
