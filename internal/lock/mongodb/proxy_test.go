package mongodb_test

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// proxy is a TCP proxy in front of a MongoDB-wire server that reads the
// client's messages one by one and lets a rule cut the connection at a
// chosen step, delay a message, or hold it until told.
type proxy struct {
	ln     net.Listener
	target string
	rule   func(m message) action
	conns  atomic.Int64 // connections accepted
	mu     sync.Mutex
	open   map[net.Conn]bool
	wg     sync.WaitGroup
}

// message is one message from a client.
type message struct {
	conn  int64  // the connection's number, from 1 in the order accepted
	index int    // the message's number on its connection, from 1 (the handshake)
	cmd   string // the command's name: "hello", "isMaster", "saslStart", "find", "insert", ...
}

// action is what the proxy does with a message.
type action struct {
	wait  <-chan struct{} // if not nil: forward only once this is closed
	delay time.Duration   // forward after this long
	cut   cut
}

type cut int

const (
	pass        cut = iota
	resetBefore     // reset the client's connection instead of forwarding
	closeBefore     // close it (EOF) instead of forwarding
	resetAfter      // forward, let the server answer, then reset instead of passing the answer on
	closeAfter      // the same, with a close
)

func (c cut) String() string {
	return [...]string{"pass", "reset before", "close before", "reset after the server's answer", "close after the server's answer"}[c]
}

// startProxy starts a proxy to target (host:port) and stops it when t ends.
// rule may be changed (under p.mu) at any time; nil passes everything.
func startProxy(t *testing.T, target string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, target: target, open: map[net.Conn]bool{}}
	p.wg.Go(p.serve)
	t.Cleanup(func() {
		ln.Close()
		p.mu.Lock()
		for c := range p.open {
			c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

// Addr is the proxy's host:port.
func (p *proxy) Addr() string { return p.ln.Addr().String() }

// setRule replaces the rule.
func (p *proxy) setRule(r func(m message) action) {
	p.mu.Lock()
	p.rule = r
	p.mu.Unlock()
}

func (p *proxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.open[c], p.open[s] = true, true
		p.mu.Unlock()
		n := p.conns.Add(1)
		var dropReply atomic.Bool
		// end cuts both sides; a reset makes the client see "connection
		// reset by peer" instead of EOF.
		end := func(reset bool) {
			if reset {
				c.(*net.TCPConn).SetLinger(0)
			}
			c.Close()
			s.Close()
		}
		p.wg.Go(func() { // server to client
			defer end(false)
			for {
				msg, err := readMessage(s)
				if err != nil {
					return
				}
				if dropReply.Load() {
					return
				}
				if _, err := c.Write(msg); err != nil {
					return
				}
			}
		})
		p.wg.Go(func() { // client to server
			defer end(false)
			for i := 1; ; i++ {
				msg, err := readMessage(c)
				if err != nil {
					return
				}
				p.mu.Lock()
				rule := p.rule
				p.mu.Unlock()
				var a action
				if rule != nil {
					a = rule(message{conn: n, index: i, cmd: command(msg)})
				}
				if a.wait != nil {
					<-a.wait
				}
				time.Sleep(a.delay)
				switch a.cut {
				case resetBefore, closeBefore:
					end(a.cut == resetBefore)
					return
				case resetAfter, closeAfter:
					// The server-to-client side drops the answer and
					// ends the connection; reset or close from here.
					dropReply.Store(true)
					if a.cut == resetAfter {
						c.(*net.TCPConn).SetLinger(0)
					}
				}
				if _, err := s.Write(msg); err != nil {
					return
				}
			}
		})
	}
}

// readMessage reads one wire-protocol message: a little-endian int32 length
// that counts itself, then the rest.
func readMessage(r io.Reader) ([]byte, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, err
	}
	n := int(binary.LittleEndian.Uint32(hdr[:]))
	if n < 16 || n > 48<<20 {
		return nil, errors.New("proxy: bad message length")
	}
	msg := make([]byte, n)
	copy(msg, hdr[:])
	_, err := io.ReadFull(r, msg[4:])
	return msg, err
}

// command returns the name of the command a message carries: the first key
// of an OP_MSG's body or an OP_QUERY's query; "" if it cannot tell.
func command(msg []byte) string {
	opCode := binary.LittleEndian.Uint32(msg[12:16])
	body := msg[16:]
	var doc []byte
	switch opCode {
	case 2013: // OP_MSG: flags, then a kind 0 section with the command
		if len(body) < 5 || body[4] != 0 {
			return ""
		}
		doc = body[5:]
	case 2004: // OP_QUERY: flags, collection name, skip, return, query
		if len(body) < 4 {
			return ""
		}
		i := 4
		for i < len(body) && body[i] != 0 {
			i++
		}
		i += 1 + 8
		if i >= len(body) {
			return ""
		}
		doc = body[i:]
	default:
		return ""
	}
	// A document: int32 length, then elements: a type byte, a NUL-ended key.
	if len(doc) < 6 {
		return ""
	}
	for i := 5; i < len(doc); i++ {
		if doc[i] == 0 {
			return string(doc[5:i])
		}
	}
	return ""
}
