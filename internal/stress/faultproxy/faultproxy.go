// Package faultproxy is a TCP proxy for tests. It stands on 127.0.0.1 between
// a client (withlock) and a server, and on command breaks the network the way
// production networks break: it cuts every connection (RST), black-holes all
// traffic (a partition), or delays it (latency). A test that needs a cut at
// one step of a protocol gives the proxy a Split, which cuts what a client
// sends into the protocol's messages, and a rule, which holds, delays or
// cuts the connection at a chosen message. It is test-only code; nothing in
// the product imports it.
package faultproxy

import (
	"bufio"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
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
	split   func() Split
	rule    func(Message) Action
	closed  bool
	wg      sync.WaitGroup

	accepted atomic.Int64 // connections accepted, to number them
	ruleCuts atomic.Int64 // connections a rule cut
}

// Split reads the next message of a client's protocol from r, the bytes the
// client sends on one connection, and returns it whole with a name for it
// (a command, a step of the start-up; "" if it names nothing). An error ends
// the connection: io.EOF passes the client's FIN on, any other resets it.
type Split func(r *bufio.Reader) (kind string, data []byte, err error)

// Message is one message a client sent through the proxy: a Split's, or
// without one, the bytes of one read.
type Message struct {
	Conn  int64  // the connection's number, from 1 in the order accepted
	Index int    // the message's number on its connection, from 1
	Kind  string // the Split's name for it
	Data  []byte
}

// Cut is how a rule ends a connection at a message.
type Cut int

const (
	Pass        Cut = iota // forward the message
	ResetBefore            // reset both sides (RST) instead of forwarding it
	CloseBefore            // close both sides (FIN) instead of forwarding it
	ResetAfter             // forward it, and reset both sides when the server answers, instead of passing the answer on
	CloseAfter             // the same, with a close
)

func (c Cut) String() string {
	return [...]string{"pass", "reset before", "close before", "reset after the server's answer", "close after the server's answer"}[c]
}

// Action is what the proxy does with one message, in this order: it waits
// for Wait to be closed (if not nil), then Delay, then forwards or cuts.
// Everything the client sends after the message waits behind it.
type Action struct {
	Wait  <-chan struct{}
	Delay time.Duration
	Cut   Cut
	// Answer is, for ResetAfter and CloseAfter, how many bytes of the
	// server's answer pass before the cut: a cut in the middle of it.
	Answer int
}

// link is one proxied connection: the client's side, and the server's once
// dialled.
type link struct {
	client *net.TCPConn
	server *net.TCPConn // nil until dialled; guarded by Proxy.mu
	done   chan struct{}
	once   sync.Once
	n      int64      // the connection's number
	split  Split      // nil: messages are the bytes of one read
	answer *answerCut // set by a rule's ResetAfter or CloseAfter; guarded by Proxy.mu
}

// answerCut is a cut at the server's answer: after left more bytes.
type answerCut struct {
	reset bool
	left  int
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

// SetSplit makes the proxy cut what clients send on the connections it
// accepts from now on into messages with a Split that newSplit returns, one
// for each connection (a Split may keep the state of its connection). Nil
// makes a message of each read.
func (p *Proxy) SetSplit(newSplit func() Split) {
	p.mu.Lock()
	p.split = newSplit
	p.mu.Unlock()
}

// SetRule has rule decide, from now on, what happens to each message a
// client sends; nil forwards every one. The rule is called on the
// connection's goroutine, one message at a time, in order; it may be
// called for several connections at once.
func (p *Proxy) SetRule(rule func(Message) Action) {
	p.mu.Lock()
	p.rule = rule
	p.mu.Unlock()
}

// RuleCuts is how many connections a rule has cut so far: a test can check
// that the cut it set up took place.
func (p *Proxy) RuleCuts() int { return int(p.ruleCuts.Load()) }

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
		l := &link{client: c, done: make(chan struct{}), n: p.accepted.Add(1)}
		p.mu.Lock()
		if p.split != nil {
			l.split = p.split()
		}
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
	go func() { defer halves.Done(); p.pump(l, l.server, l.client, true) }()
	go func() { defer halves.Done(); p.pump(l, l.client, l.server, false) }()
	halves.Wait()
	select {
	case <-l.done: // reset
	default:
		l.once.Do(func() { close(l.done) })
		l.client.Close()
		l.server.Close()
	}
}

// chunk is data read from one side (a message of the client's, as the
// link's Split cut it), or the error (io.EOF: a FIN) that ended the
// reading, with when it was read.
type chunk struct {
	kind string
	data []byte
	err  error
	at   time.Time
}

// pump forwards src to dst: a reader that takes data as it comes, and a
// writer that passes it on through the rule (for what the client sends),
// the gate and the latency, in order.
func (p *Proxy) pump(l *link, dst, src *net.TCPConn, fromClient bool) {
	chunks := make(chan chunk, 16)
	read := func() chunk {
		buf := make([]byte, 32<<10)
		n, err := src.Read(buf)
		return chunk{data: buf[:n], err: err}
	}
	if fromClient && l.split != nil {
		r := bufio.NewReaderSize(src, 32<<10)
		read = func() chunk {
			kind, data, err := l.split(r)
			return chunk{kind: kind, data: data, err: err}
		}
	}
	go func() {
		for {
			c := read()
			c.at = time.Now()
			select {
			case chunks <- c:
			case <-l.done:
				return
			}
			if c.err != nil {
				return
			}
		}
	}()
	index := 0
	for {
		var c chunk
		select {
		case c = <-chunks:
		case <-l.done:
			return
		}
		var a Action
		if fromClient && len(c.data) > 0 {
			index++
			p.mu.Lock()
			rule := p.rule
			p.mu.Unlock()
			if rule != nil {
				a = rule(Message{Conn: l.n, Index: index, Kind: c.kind, Data: c.data})
			}
			if !l.hold(a) {
				return
			}
		}
		if !p.wait(l, c.at) {
			return
		}
		switch a.Cut {
		case ResetBefore, CloseBefore:
			p.ruleCuts.Add(1)
			p.end(l, a.Cut == ResetBefore)
			return
		case ResetAfter, CloseAfter:
			p.mu.Lock()
			l.answer = &answerCut{reset: a.Cut == ResetAfter, left: a.Answer}
			p.mu.Unlock()
		}
		if !fromClient && len(c.data) > 0 {
			p.mu.Lock()
			cut := l.answer
			p.mu.Unlock()
			if cut != nil && len(c.data) >= cut.left {
				dst.Write(c.data[:cut.left])
				p.ruleCuts.Add(1)
				p.end(l, cut.reset)
				return
			}
			if cut != nil {
				cut.left -= len(c.data)
			}
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

// hold waits as a rule's action says. It returns false if the link was
// reset meanwhile.
func (l *link) hold(a Action) bool {
	if a.Wait != nil {
		select {
		case <-a.Wait:
		case <-l.done:
			return false
		}
	}
	if a.Delay > 0 {
		t := time.NewTimer(a.Delay)
		defer t.Stop()
		select {
		case <-t.C:
		case <-l.done:
			return false
		}
	}
	return true
}

// end ends l as a rule says: with an RST to both sides, or a FIN.
func (p *Proxy) end(l *link, reset bool) {
	if reset {
		p.reset(l)
		return
	}
	l.once.Do(func() {
		close(l.done)
		p.mu.Lock()
		s := l.server
		p.mu.Unlock()
		l.client.Close()
		if s != nil {
			s.Close()
		}
	})
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
