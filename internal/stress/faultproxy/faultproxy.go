// Package faultproxy is a TCP proxy for tests. It stands on 127.0.0.1 between
// a client (withlock) and a server, and on command breaks the network the way
// production networks break: it cuts every connection (RST), black-holes all
// traffic (a partition), or delays it (latency). It is test-only code; nothing
// in the product imports it.
package faultproxy

import (
	"errors"
	"io"
	"net"
	"sync"
	"time"
)

// Proxy forwards every connection made to Addr to the target, byte for byte,
// until told otherwise. Its methods are safe for concurrent use.
type Proxy struct {
	ln     *net.TCPListener
	target string

	mu      sync.Mutex
	links   map[*link]struct{}
	gate    chan struct{} // closed while traffic flows; open (blocking) while black-holed
	latency time.Duration
	closed  bool
	wg      sync.WaitGroup
}

// link is one proxied connection: the client's side, and the server's once
// dialled.
type link struct {
	client *net.TCPConn
	server *net.TCPConn // nil until dialled; guarded by Proxy.mu
	done   chan struct{}
	once   sync.Once
}

// Start listens on a free port of 127.0.0.1 and forwards to target
// (host:port). The caller must Close the proxy.
func Start(target string) (*Proxy, error) {
	return StartAt("127.0.0.1:0", target)
}

// StartAt is Start listening on addr: a port of a proxy closed before, to
// bring a "server" back where its clients expect it.
func StartAt(addr, target string) (*Proxy, error) {
	a, err := net.ResolveTCPAddr("tcp", addr)
	if err != nil {
		return nil, err
	}
	ln, err := net.ListenTCP("tcp", a)
	if err != nil {
		return nil, err
	}
	flowing := make(chan struct{})
	close(flowing)
	p := &Proxy{ln: ln, target: target, links: map[*link]struct{}{}, gate: flowing}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the proxy's host:port, to put in the client's URL in place of the
// server's.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Cut resets every connection the proxy holds, in both directions: each side
// gets an RST (SO_LINGER 0, then close), as when a middlebox or a peer's
// kernel drops the connection. Connections accepted during a black-hole and
// not yet dialled are reset too. New connections are accepted as before. Cut
// returns how many connections it reset.
func (p *Proxy) Cut() int {
	p.mu.Lock()
	links := make([]*link, 0, len(p.links))
	for l := range p.links {
		links = append(links, l)
	}
	p.mu.Unlock()
	for _, l := range links {
		p.reset(l)
	}
	return len(links)
}

// BlackHole stops all traffic until Heal, as a network partition does:
// connections stay open and nothing is forwarded in either direction; new
// connections are accepted (by the kernel, as the proxy's listener is local)
// and never answered, because the server is not dialled until Heal. Bytes
// sent meanwhile are held and delivered after Heal, as TCP retransmission
// delivers them when a short partition ends. Bytes already on their way out
// when BlackHole is called may still arrive.
func (p *Proxy) BlackHole() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.gate:
		p.gate = make(chan struct{})
	default: // already black-holed
	}
}

// Heal ends a black-hole: held traffic flows on and waiting connections are
// dialled to the server. It does nothing when traffic flows already.
func (p *Proxy) Heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.gate:
	default:
		close(p.gate)
	}
}

// SetLatency delays every chunk of data in either direction by d from when
// the proxy read it (so a round trip takes at least 2d). Zero turns it off.
func (p *Proxy) SetLatency(d time.Duration) {
	p.mu.Lock()
	p.latency = d
	p.mu.Unlock()
}

// Close stops listening, resets every connection and waits for the proxy's
// goroutines. It is safe to call twice.
func (p *Proxy) Close() error {
	p.mu.Lock()
	already := p.closed
	p.closed = true
	p.mu.Unlock()
	if already {
		return nil
	}
	err := p.ln.Close()
	p.Cut()
	p.wg.Wait()
	return err
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.AcceptTCP()
		if err != nil {
			return // closed
		}
		l := &link{client: c, done: make(chan struct{})}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			rst(c)
			continue
		}
		p.links[l] = struct{}{}
		p.wg.Add(1)
		p.mu.Unlock()
		go p.serve(l)
	}
}

// serve dials the server once traffic flows, then forwards both ways until
// both sides have closed, or either failed or was cut.
func (p *Proxy) serve(l *link) {
	defer p.wg.Done()
	defer p.forget(l)
	if !p.wait(l, time.Time{}) {
		return
	}
	s, err := net.DialTimeout("tcp", p.target, 10*time.Second)
	if err != nil {
		p.reset(l) // the server is down: the client sees a reset, as from a closed port
		return
	}
	p.mu.Lock()
	select {
	case <-l.done: // cut while dialling
		p.mu.Unlock()
		rst(s.(*net.TCPConn))
		return
	default:
		l.server = s.(*net.TCPConn)
	}
	p.mu.Unlock()
	var halves sync.WaitGroup
	halves.Add(2)
	go func() { defer halves.Done(); p.pump(l, l.server, l.client) }()
	go func() { defer halves.Done(); p.pump(l, l.client, l.server) }()
	halves.Wait()
	select {
	case <-l.done: // reset
	default:
		l.once.Do(func() { close(l.done) })
		l.client.Close()
		l.server.Close()
	}
}

// chunk is data read from one side, or the error (io.EOF: a FIN) that
// ended the reading, with when it was read.
type chunk struct {
	data []byte
	err  error
	at   time.Time
}

// pump forwards src to dst: a reader that takes data as it comes, and a
// writer that passes it on through the gate and the latency, in order.
func (p *Proxy) pump(l *link, dst, src *net.TCPConn) {
	chunks := make(chan chunk, 16)
	go func() {
		for {
			buf := make([]byte, 32<<10)
			n, err := src.Read(buf)
			c := chunk{data: buf[:n], err: err, at: time.Now()}
			select {
			case chunks <- c:
			case <-l.done:
				return
			}
			if err != nil {
				return
			}
		}
	}()
	for {
		var c chunk
		select {
		case c = <-chunks:
		case <-l.done:
			return
		}
		if !p.wait(l, c.at) {
			return
		}
		if len(c.data) > 0 {
			if _, err := dst.Write(c.data); err != nil {
				p.reset(l)
				return
			}
		}
		switch {
		case errors.Is(c.err, io.EOF):
			dst.CloseWrite() // pass the FIN on; the other direction may go on
			return
		case c.err != nil:
			p.reset(l) // a reset or error on one side resets the other
			return
		}
	}
}

// wait blocks while the proxy is black-holed and until the latency after
// at has passed. It returns false if the link was reset meanwhile.
func (p *Proxy) wait(l *link, at time.Time) bool {
	for {
		p.mu.Lock()
		gate, latency := p.gate, p.latency
		p.mu.Unlock()
		select {
		case <-gate:
		case <-l.done:
			return false
		}
		if d := time.Until(at.Add(latency)); latency > 0 && d > 0 {
			t := time.NewTimer(d)
			select {
			case <-t.C:
			case <-l.done:
				t.Stop()
				return false
			}
			continue // a black-hole may have begun while we waited
		}
		return true
	}
}

// reset sends an RST to both sides of l and ends it.
func (p *Proxy) reset(l *link) {
	l.once.Do(func() {
		close(l.done)
		p.mu.Lock()
		s := l.server
		p.mu.Unlock()
		rst(l.client)
		if s != nil {
			rst(s)
		}
	})
}

func (p *Proxy) forget(l *link) {
	p.mu.Lock()
	delete(p.links, l)
	p.mu.Unlock()
}

// rst closes c with an RST instead of a FIN: SO_LINGER 0 discards unsent
// data and resets the connection.
func rst(c *net.TCPConn) {
	c.SetLinger(0)
	c.Close()
}
