package postgres

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
)

// TLS is negotiated here, as libpq does it, instead of by pgx: with
// sslmode=prefer (libpq's default) pgx asks for TLS and, when the server
// says no, gives up that connection and opens a second one, so that every
// start costs the server a second backend, and a second connection cut by
// the network read as a TLS refusal. Here the answer 'N' continues in
// plaintext on the same connection.

// tlsMode is how the connection to one host negotiates TLS.
type tlsMode int

const (
	tlsOff     tlsMode = iota // sslmode=disable, or a unix socket
	tlsPrefer                 // no sslmode, prefer or allow: TLS if the server offers it
	tlsRequire                // require, verify-ca, verify-full: TLS or nothing
)

// host is one server of the URL.
type host struct {
	host string
	port uint16
	addr string // host:port, as dialled and as messages show it
	mode tlsMode
	tls  *tls.Config
	// direct (sslnegotiation=direct) starts TLS at once, without asking.
	direct bool
	// certRequired (sslcertmode=require): the server must ask for our
	// client certificate, and we must have sent one.
	certRequired bool
}

// hosts lists the servers of config (its Host and Fallbacks, in order),
// one per host:port, each with the TLS it negotiates. pgx lists a host
// twice for prefer (TLS, then plaintext) and allow (the other way round).
func hosts(config *pgconn.Config) []*host {
	all := append([]*pgconn.FallbackConfig{{Host: config.Host, Port: config.Port, TLSConfig: config.TLSConfig}}, config.Fallbacks...)
	var hs []*host
	byAddr := map[string]*host{}
	plain := map[string]bool{}
	for _, fb := range all {
		addr := net.JoinHostPort(fb.Host, fmt.Sprint(fb.Port))
		h := byAddr[addr]
		if h == nil {
			h = &host{host: fb.Host, port: fb.Port, addr: addr, direct: config.SSLNegotiation == "direct", certRequired: config.SSLCertMode == "require"}
			byAddr[addr] = h
			hs = append(hs, h)
		}
		if fb.TLSConfig == nil {
			plain[addr] = true
		} else {
			h.tls = fb.TLSConfig
		}
	}
	for _, h := range hs {
		switch {
		case h.tls == nil:
			h.mode = tlsOff
		case plain[h.addr]:
			h.mode = tlsPrefer
		default:
			h.mode = tlsRequire
		}
	}
	return hs
}

// dialer dials the hosts of one URL and negotiates TLS on the new
// connection. It is pgx's DialFunc, so it also dials the connections that
// carry cancel requests, which pgx addresses by the server's IP: those get
// the TLS of the host that IP served.
type dialer struct {
	dial  pgconn.DialFunc // pgx's, which honours connect_timeout
	hosts []*host

	mu     sync.Mutex
	served map[string]*host // remote IP:port -> its host, for cancel requests
}

func (d *dialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	h := d.host(addr)
	conn, err := d.dial(ctx, network, addr)
	if err != nil || h == nil || h.mode == tlsOff {
		return conn, err
	}
	d.mu.Lock()
	d.served[conn.RemoteAddr().String()] = h
	d.mu.Unlock()
	return h.negotiate(ctx, conn)
}

func (d *dialer) host(addr string) *host {
	for _, h := range d.hosts {
		if h.addr == addr {
			return h
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.served[addr]
}

// sslRequest asks a PostgreSQL server for TLS: length 8, code 80877103.
var sslRequest = []byte{0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f}

// errNoTLS: the server answered 'N' to SSLRequest, and sslmode requires TLS.
var errNoTLS = errors.New("the server does not offer TLS, which the URL's sslmode requires")

// tlsError is a TLS handshake that failed for another reason than a cut
// connection (a certificate, a protocol version, a server that does not
// speak TLS): trying again will not help.
type tlsError struct{ err error }

func (e *tlsError) Error() string { return "TLS handshake: " + e.err.Error() }
func (e *tlsError) Unwrap() error { return e.err }

// negotiate asks for TLS on conn and returns the connection to speak the
// PostgreSQL protocol on: TLS, or conn itself when the server answered 'N'
// and h allows plaintext. It closes conn on failure.
func (h *host) negotiate(ctx context.Context, conn net.Conn) (_ net.Conn, err error) {
	if d, ok := ctx.Deadline(); ok {
		conn.SetDeadline(d)
	}
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	defer func() {
		if !stop() && err == nil {
			err = ctx.Err()
		}
		if err != nil {
			conn.Close()
			return
		}
		conn.SetDeadline(time.Time{})
	}()
	if !h.direct {
		if _, err := conn.Write(sslRequest); err != nil {
			return nil, err
		}
		var answer [1]byte
		if _, err := io.ReadFull(conn, answer[:]); err != nil {
			return nil, err
		}
		switch answer[0] {
		case 'S':
		case 'N':
			if h.mode == tlsRequire {
				return nil, errNoTLS
			}
			return conn, nil
		case 'E':
			return nil, readError(conn)
		default:
			return nil, &tlsError{fmt.Errorf("the server answered %q to the request for TLS: is it PostgreSQL?", answer[0])}
		}
	}
	config := h.tls
	var asked, sent bool
	if h.certRequired {
		config = config.Clone()
		config.ClientSessionCache = nil // a resumed session shows no certificate
		config.GetClientCertificate = func(cri *tls.CertificateRequestInfo) (*tls.Certificate, error) {
			asked = true
			for i := range h.tls.Certificates {
				if cri.SupportsCertificate(&h.tls.Certificates[i]) == nil {
					sent = true
					return &h.tls.Certificates[i], nil
				}
			}
			return new(tls.Certificate), nil
		}
	}
	tc := tls.Client(conn, config)
	if err := tc.HandshakeContext(ctx); err != nil {
		if cut(err) {
			return nil, err
		}
		return nil, &tlsError{err}
	}
	switch {
	case h.certRequired && !asked:
		return nil, &tlsError{errors.New("the server did not ask for a client certificate (sslcertmode=require)")}
	case h.certRequired && !sent:
		return nil, &tlsError{errors.New("no client certificate to send (sslcertmode=require)")}
	}
	return tc, nil
}

// readError reads the ErrorResponse that a server sends instead of an
// answer to SSLRequest (it could not start a backend, say).
func readError(conn net.Conn) error {
	var head [4]byte
	if _, err := io.ReadFull(conn, head[:]); err != nil {
		return err
	}
	n := int64(binary.BigEndian.Uint32(head[:])) - 4
	if n < 0 || n > 64<<10 {
		return &tlsError{fmt.Errorf("the server answered the request for TLS with an error message of %d bytes", n)}
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(conn, body); err != nil {
		return err
	}
	var msg pgproto3.ErrorResponse
	if err := msg.Decode(body); err != nil {
		return &tlsError{err}
	}
	return pgconn.ErrorResponseToPgError(&msg)
}

// cut reports whether err is the network failing (closed, reset, timed
// out, cancelled) rather than a server or a TLS peer saying no. crypto/tls
// reports the peer's alerts as a *net.OpError too, "remote error".
func cut(err error) bool {
	var opErr *net.OpError
	if errors.As(err, &opErr) && opErr.Op == "remote error" {
		return false
	}
	var netErr net.Error
	return errors.As(err, &netErr) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) ||
		errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}
