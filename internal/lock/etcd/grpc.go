package etcd

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/net/http2"
)

// Transactions go over gRPC, the protocol that etcd's client port speaks to
// etcdctl and the official client, when the endpoints are plain HTTP; every
// other request goes through the JSON gateway. A transaction is on the
// hand-off path: a holder's release is one, and the next holder starts when
// it lands. Through the gateway it crosses a hop inside etcd first (HTTP
// and JSON in, then a gRPC call of the gateway to its own server), which
// made withlock's hand-off slower than etcdctl's. Over TLS the gateway
// keeps the transactions too: gRPC is HTTP/2, which would need a connection
// of its own, and a second TLS handshake in every process costs more than
// the hop saves (docs/design.md).
//
// A gRPC call here is one HTTP/2 request (h2c: HTTP/2 without TLS, as the
// client port takes it): the message framed as gRPC frames it, the auth
// token as the "token" metadata the server reads, and the answer's status
// in the trailers.

// newH2 returns the client of the gRPC calls, over HTTP/2 without TLS, and
// its connections, which dial dials.
func newH2(dial func(ctx context.Context, network, addr string) (net.Conn, error)) (*http.Client, *h2Pool) {
	t := &http2.Transport{AllowHTTP: true, DisableCompression: true}
	pool := &h2Pool{t: t, dial: dial, conns: map[string]*http2.ClientConn{}}
	t.ConnPool = pool
	return &http.Client{Transport: t}, pool
}

// h2Pool keeps the HTTP/2 connections of the gRPC calls, one per endpoint,
// open for as long as the process holds or waits (with no idle timeout: a
// holder's release, after a hold of any length, should find its connection
// ready; TCP keep-alives find a dead one). It is Go's HTTP/2 pool but for
// one thing: a connection the server sends GOAWAY on (the member is
// stopping) is shut down as soon as its requests are done (MarkDead), where
// Go's leaves it open, idle, and etcd's graceful stop waits for it until its
// deadline, a second: a rolling restart of etcd would last that much longer
// for every holder connected, and a holder with a short ttl could lose its
// lock in it.
type h2Pool struct {
	t    *http2.Transport
	dial func(ctx context.Context, network, addr string) (net.Conn, error)

	mu    sync.Mutex
	conns map[string]*http2.ClientConn // by HOST:PORT
}

func (p *h2Pool) GetClientConn(req *http.Request, addr string) (*http2.ClientConn, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if cc := p.conns[addr]; cc != nil {
		if cc.CanTakeNewRequest() {
			return cc, nil
		}
		delete(p.conns, addr)
		go cc.Shutdown(context.Background())
	}
	conn, err := p.dial(req.Context(), "tcp", addr)
	if err != nil {
		return nil, err
	}
	cc, err := p.t.NewClientConn(conn)
	if err != nil {
		conn.Close()
		return nil, err
	}
	p.conns[addr] = cc
	return cc, nil
}

// MarkDead is called by the transport on a GOAWAY from the server, or once
// cc has failed.
func (p *h2Pool) MarkDead(cc *http2.ClientConn) {
	p.mu.Lock()
	for addr, c := range p.conns {
		if c == cc {
			delete(p.conns, addr)
		}
	}
	p.mu.Unlock()
	go cc.Shutdown(context.Background()) // ends once its requests have
}

// closeIdle closes the connections that no request uses.
func (p *h2Pool) closeIdle() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for addr, cc := range p.conns {
		if cc.State().StreamsActive == 0 {
			cc.Close()
			delete(p.conns, addr)
		}
	}
}

// txnMethod is the gRPC method of a transaction. A path that begins with
// "/etcdserverpb." is a gRPC method; the gateway's begin with "/v3/".
const txnMethod = "/etcdserverpb.KV/Txn"

func isGRPC(path string) bool { return strings.HasPrefix(path, "/etcdserverpb.") }

// sendGRPC is one unary gRPC call of method with the message msg, on its
// own HTTP/2 stream. The answer it returns has the answer's message as its
// body. A status other than OK is a serverError with the server's code and
// message, as the gateway would have answered it.
func (c *client) sendGRPC(ctx context.Context, ep int, method string, msg []byte, token string) (*http.Response, error) {
	// A gRPC message: not compressed, its length, itself.
	frame := binary.BigEndian.AppendUint32([]byte{0}, uint32(len(msg)))
	frame = append(frame, msg...)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.endpoints[ep]+method, bytes.NewReader(frame))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/grpc")
	req.Header.Set("Te", "trailers")
	if token != "" {
		req.Header.Set("Token", token)
	}
	resp, err := c.h2.Do(req)
	if err != nil {
		if strings.Contains(err.Error(), "http2: frame too large") {
			// The first bytes back were no HTTP/2 frame but, read as one,
			// too long for one: "HTTP/1.1 400 Bad Request", the answer of
			// a server or proxy that speaks only HTTP/1.1 to HTTP/2's
			// preface. It forwarded nothing.
			return nil, fmt.Errorf("%w: %w", errNoHTTP2, err)
		}
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	// An error without a message comes as headers only; otherwise the
	// status follows the message, in the trailers.
	status, text := resp.Trailer.Get("Grpc-Status"), resp.Trailer.Get("Grpc-Message")
	if status == "" {
		status, text = resp.Header.Get("Grpc-Status"), resp.Header.Get("Grpc-Message")
	}
	if resp.StatusCode != http.StatusOK || status == "" {
		e := &serverError{code: codeUnknown, status: resp.StatusCode, foreign: true,
			msg: fmt.Sprintf("HTTP %s to %s without a gRPC status, not an answer of etcd's gRPC API (etcd serves it on its client port)", resp.Status, method)}
		if resp.StatusCode >= 500 {
			e.code = codeUnavailable
		}
		return nil, e
	}
	if status != "0" {
		code, err := strconv.Atoi(status)
		if err != nil {
			code = codeUnknown
		}
		// gRPC percent-encodes the message; a plus sign is a plus sign.
		if t, err := url.PathUnescape(text); err == nil {
			text = t
		}
		return nil, &serverError{code: code, msg: text}
	}
	if len(body) < 5 || body[0] != 0 || uint64(binary.BigEndian.Uint32(body[1:5])) != uint64(len(body)-5) {
		return nil, fmt.Errorf("etcd answered %s with %d bytes that are not one uncompressed gRPC message", method, len(body))
	}
	resp.Body = io.NopCloser(bytes.NewReader(body[5:]))
	return resp, nil
}

// errNoHTTP2 is an endpoint that answered HTTP/2 in HTTP/1.1: a proxy in
// front of etcd that speaks only HTTP/1.1, which never passed the request on.
var errNoHTTP2 = errors.New("the endpoint does not speak HTTP/2")

// txn sends a transaction: over gRPC when the endpoints are plain HTTP, as
// JSON through the gateway over TLS, or once an endpoint has answered
// HTTP/2 in HTTP/1.1 (that transaction too: it was not passed on).
func (c *client) txn(ctx context.Context, r *txnRequest) (*txnResponse, error) {
	var resp txnResponse
	if c.h2 == nil || c.noHTTP2.Load() {
		return &resp, c.do(ctx, "/v3/kv/txn", r, &resp)
	}
	msg, err := r.marshalProto()
	if err != nil {
		return &resp, err
	}
	hr, err := c.post(ctx, txnMethod, msg, nil, nil)
	if errors.Is(err, errNoHTTP2) {
		c.noHTTP2.Store(true)
		return c.txn(ctx, r)
	}
	if err != nil {
		return &resp, err
	}
	defer hr.Body.Close()
	body, _ := io.ReadAll(hr.Body)
	if err := resp.unmarshalProto(body); err != nil {
		return &resp, fmt.Errorf("reading etcd's answer: %w", err)
	}
	return &resp, nil
}
