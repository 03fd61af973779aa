package faultproxy_test

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/withlock/withlock/internal/stress/faultproxy"
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

func startProxy(t *testing.T, target string) *faultproxy.Proxy {
	t.Helper()
	p, err := faultproxy.Start(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func dial(t *testing.T, p *faultproxy.Proxy) (net.Conn, *bufio.Reader) {
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
	testenv.WaitFor(t, "the held connection", func() bool { return faultproxy.Links(p) == 1 })
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

// lines is a faultproxy.Split of the echo protocol: a message is a line,
// named by its first word.
func lines(r *bufio.Reader) (string, []byte, error) {
	line, err := r.ReadBytes('\n')
	kind, _, _ := strings.Cut(strings.TrimSpace(string(line)), " ")
	return kind, line, err
}

// TestRule: a rule sees each line as a message, numbered by connection and
// in the connection, and cuts, holds or passes it as it says.
func TestRule(t *testing.T) {
	e := startEcho(t)
	p := startProxy(t, e.ln.Addr().String())
	p.SetSplit(func() faultproxy.Split { return lines })
	var (
		mu   sync.Mutex
		seen []faultproxy.Message
	)
	held := make(chan struct{})
	p.SetRule(func(m faultproxy.Message) faultproxy.Action {
		mu.Lock()
		seen = append(seen, m)
		mu.Unlock()
		switch m.Kind {
		case "reset":
			return faultproxy.Action{Cut: faultproxy.ResetBefore}
		case "close":
			return faultproxy.Action{Cut: faultproxy.CloseBefore}
		case "half":
			return faultproxy.Action{Cut: faultproxy.CloseAfter, Answer: 3}
		case "held":
			return faultproxy.Action{Wait: held}
		}
		return faultproxy.Action{}
	})

	c, r := dial(t, p)
	if got := roundTrip(t, c, r, "pass it"); got != "pass it" {
		t.Fatalf("echo %q through a rule that passes it", got)
	}
	if _, err := c.Write([]byte("held\nafter\n")); err != nil {
		t.Fatal(err)
	}
	// Checks that nothing arrives, so it must wait a while.
	c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if b, err := r.ReadByte(); !isTimeout(err) {
		t.Fatalf("read while the rule holds the message: %q, %v; want a timeout", b, err)
	}
	close(held)
	for _, want := range []string{"held\n", "after\n"} {
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if got, err := r.ReadString('\n'); err != nil || got != want {
			t.Fatalf("once the rule let it go: %q, %v; want %q", got, err, want)
		}
	}

	for _, tc := range []struct {
		line, want string // the answer the client gets before the connection ends
		reset      bool
	}{
		{"reset", "", true},
		{"close", "", false},
		{"half of it", "hal", false},
	} {
		c, r := dial(t, p)
		before := p.RuleCuts()
		if _, err := c.Write([]byte(tc.line + "\n")); err != nil {
			t.Fatal(err)
		}
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		got, err := io.ReadAll(r)
		if string(got) != tc.want {
			t.Errorf("%s: the client got %q; want %q", tc.line, got, tc.want)
		}
		if tc.reset != errors.Is(err, syscall.ECONNRESET) {
			t.Errorf("%s: the client's read ended with %v; want a reset: %v", tc.line, err, tc.reset)
		}
		if n := p.RuleCuts() - before; n != 1 {
			t.Errorf("%s: RuleCuts grew by %d; want 1", tc.line, n)
		}
	}

	mu.Lock()
	defer mu.Unlock()
	var got []string
	for _, m := range seen {
		got = append(got, fmt.Sprintf("%d.%d %s %q", m.Conn, m.Index, m.Kind, m.Data))
	}
	want := []string{`1.1 pass "pass it\n"`, `1.2 held "held\n"`, `1.3 after "after\n"`, `2.1 reset "reset\n"`, `3.1 close "close\n"`, `4.1 half "half of it\n"`}
	if !slices.Equal(got, want) {
		t.Errorf("the rule saw %q; want %q", got, want)
	}
}
