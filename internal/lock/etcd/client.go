package etcd

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// client speaks etcd's v3 API as JSON over HTTP: the gRPC gateway that
// every member serves on its client port, under /v3/, since etcd 3.4; and
// its transactions as gRPC itself over plain HTTP (grpc.go). It is a client
// of the few requests the lock needs, written here so that withlock does
// not link the official client: its gRPC, protobuf and zap packages
// initialise themselves in every withlock process, whatever its backend
// (docs/design.md).
//
// Keys and values are bytes, which encoding/json writes in base64, as the
// gateway wants them; int64 fields are JSON strings (the ",string" tags).
// Each method is one request: no retries (a backend makes one attempt per
// call, as lock.Backend says), with two exceptions that are not a second attempt of
// the same request: the next endpoint is tried when one cannot be dialled
// (the request never left), and a request refused for its auth token
// (expired, or older than the server's auth store) is sent again with a new
// token, at most tokenSends times in all (the server refused it before
// doing anything).
type client struct {
	endpoints      []string // base URLs: http(s)://HOST:PORT
	user, password string
	hc             *http.Client
	h2             *http.Client // gRPC over h2c; nil over TLS (grpc.go)
	h2Conns        *h2Pool      // h2's connections
	noHTTP2        atomic.Bool  // an endpoint answered HTTP/2 in HTTP/1.1

	mu    sync.Mutex
	cur   int    // the endpoint that answered last: tried first
	token string // the auth token, once fetched
}

// dialTimeout bounds a connection attempt to one endpoint of several, so
// that one that does not answer leaves time for the others.
const dialTimeout = 2 * time.Second

func newClient(endpoints []string, user, password string, tlsCfg *tls.Config) *client {
	d := &net.Dialer{
		Timeout: callTimeout,
		// A connection whose peer is gone without a word (a partition, a
		// NAT that forgot it) fails within about 25s instead of the
		// kernel's hours, as the official client's gRPC pings do; a
		// waiter's watch waits on one such connection.
		KeepAliveConfig: net.KeepAliveConfig{Enable: true, Idle: 10 * time.Second, Interval: 5 * time.Second, Count: 3},
	}
	if len(endpoints) > 1 {
		d.Timeout = dialTimeout
	}
	tr := &http.Transport{
		// No proxy from the environment: etcd is reached directly, as the
		// official client (gRPC with a dialer of its own) reaches it.
		Proxy:               nil,
		DialContext:         d.DialContext,
		TLSClientConfig:     tlsCfg,
		TLSHandshakeTimeout: callTimeout,
		MaxIdleConnsPerHost: 4,
		IdleConnTimeout:     time.Minute,
		DisableCompression:  true,
	}
	c := &client{endpoints: endpoints, user: user, password: password, hc: &http.Client{Transport: tr}}
	if tlsCfg == nil {
		c.h2, c.h2Conns = newH2(d.DialContext)
	}
	return c
}

// close drops the idle connections; requests in flight end with their
// contexts.
func (c *client) close() {
	c.hc.CloseIdleConnections()
	if c.h2 != nil {
		c.h2Conns.closeIdle()
	}
}

// serverError is an error etcd answered: its gRPC code and its message,
// which is etcdserver's error text ("etcdserver: requested lease not
// found"), as rpctypes has them.
type serverError struct {
	code   int // gRPC status code
	msg    string
	status int // the HTTP status, 0 inside a stream
	// foreign is an answer without the gateway's JSON: not etcd's v3 API.
	foreign bool
}

func (e *serverError) Error() string { return e.msg }

// gRPC status codes the errors are sorted by.
const (
	codeCanceled          = 1
	codeUnknown           = 2
	codeDeadlineExceeded  = 4
	codeNotFound          = 5
	codePermissionDenied  = 7
	codeResourceExhausted = 8
	codeUnavailable       = 14
)

// etcdserver's error texts that withlock tells apart (rpctypes).
const (
	msgLeaseNotFound    = "etcdserver: requested lease not found"
	msgAuthFailed       = "etcdserver: authentication failed, invalid user ID or password"
	msgPermissionDenied = "etcdserver: permission denied"
	msgInvalidToken     = "etcdserver: invalid auth token"
	msgAuthOldRevision  = "etcdserver: revision of auth store is old"
	msgNoSpace          = "etcdserver: mvcc: database space exceeded"
	msgTooManyRequests  = "etcdserver: too many requests"
)

// msgGatewayCN is the gateway's plain-text answer (HTTP 400) to any request
// whose client certificate has a Common Name, once the server asks for
// client certificates (--client-cert-auth) and authentication is on: it
// cannot pass the name on as the user, and refuses rather than serve the
// request as another user. The request's auth token does not change that.
const msgGatewayCN = "CommonName of client sending a request against gateway will be ignored and not used as expected"

// is reports whether err is the server's error with message msg.
func is(err error, msg string) bool {
	var se *serverError
	return errors.As(err, &se) && se.msg == msg
}

// errorBody is an error in the gateway's JSON. A unary request's answer
// is {"code", "message"} (and "error", the same message, from the
// grpc-gateway of etcd 3.4 and 3.5); a streaming request's (watch, lease
// keep-alive) is {"error": {...}}, whether the HTTP status is 200 (the
// stream had begun) or not, with "code" (etcd 3.6 and later) or
// "grpc_code" and "http_code" (3.5) inside.
type errorBody struct {
	Code     *int            `json:"code"`
	GRPCCode *int            `json:"grpc_code"`
	Message  string          `json:"message"`
	Error    json.RawMessage `json:"error"`
}

// parseError reads an error body in either shape; ok is false if body is
// not one.
func parseError(body []byte, status int) (e *serverError, ok bool) {
	var b errorBody
	if json.Unmarshal(body, &b) != nil {
		return nil, false
	}
	if len(b.Error) > 0 && b.Error[0] == '{' {
		return parseError(b.Error, status)
	}
	msg := b.Message
	if msg == "" && len(b.Error) > 0 {
		json.Unmarshal(b.Error, &msg)
	}
	if msg == "" {
		return nil, false
	}
	e = &serverError{code: codeUnknown, msg: msg, status: status}
	if b.GRPCCode != nil {
		e.code = *b.GRPCCode
	} else if b.Code != nil {
		e.code = *b.Code
	}
	return e, true
}

// httpError reads the error of an answer that is not 200. One without the
// gateway's JSON is not etcd's v3 API speaking: a 5xx is a server (or a
// proxy in front of it) that cannot serve now; anything else is a refusal.
func httpError(resp *http.Response) error {
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return err
	}
	if e, ok := parseError(body, resp.StatusCode); ok {
		return e
	}
	if resp.StatusCode == http.StatusBadRequest && strings.TrimSpace(string(body)) == msgGatewayCN {
		return &serverError{code: codePermissionDenied, msg: msgGatewayCN, status: resp.StatusCode}
	}
	e := &serverError{code: codeUnknown, status: resp.StatusCode, foreign: true,
		msg: fmt.Sprintf("HTTP %s to %s, not an answer of etcd's v3 API (etcd 3.4 or later serves it on its client port)", resp.Status, resp.Request.URL.Path)}
	if resp.StatusCode >= 500 {
		e.code = codeUnavailable
	}
	return e
}

// tokenRefused reports whether err is the server refusing the auth token a
// request to path sent, rather than the user: a token that expired (JWT
// tokens have a TTL, simple tokens one of their own), that a restart or a
// change of the user's password invalidated, or that is older than a change
// of any user or role ("revision of auth store is old"). The server refused
// it before doing anything, so the request can be sent again with a new
// token. etcd 3.4 cancels a watch with "permission denied" for a token it
// no longer knows; there, a denial that new tokens meet too is a real one.
func tokenRefused(err error, path string) bool {
	return is(err, msgInvalidToken) || is(err, msgAuthOldRevision) || path == watchPath && is(err, msgPermissionDenied)
}

// post sends body to path on the endpoint that answered last, or the next
// one while they cannot be dialled, with the auth token, and returns the
// answer if it is 200 and read, which reads its first message (nil: none),
// accepts it. A request whose token is refused, by the HTTP status or by
// that first message, is sent again with a new token (tokenSends).
func (c *client) post(ctx context.Context, path string, body []byte, header http.Header, read func(*http.Response) error) (*http.Response, error) {
	c.mu.Lock()
	first := c.cur
	c.mu.Unlock()
	var err error
	for i := range c.endpoints {
		ep := (first + i) % len(c.endpoints)
		var resp *http.Response
		resp, err = c.postTo(ctx, ep, path, body, header, read)
		if err == nil {
			c.mu.Lock()
			c.cur = ep
			c.mu.Unlock()
			return resp, nil
		}
		if dialFailed(err) && ctx.Err() == nil {
			continue
		}
		if len(c.endpoints) > 1 && cannotServe(err) {
			// The request may have been served, so it is not sent
			// elsewhere; but the next one goes to the next endpoint, as
			// the official client's balancer would have sent it: a member
			// cut off from its leader answers, but cannot serve.
			c.mu.Lock()
			if c.cur == ep {
				c.cur = (ep + 1) % len(c.endpoints)
			}
			c.mu.Unlock()
		}
		return nil, err
	}
	return nil, err
}

// cannotServe reports whether err says that the endpoint cannot serve
// for now: no answer in time, a connection that broke, or the server's
// "unavailable" (no leader, request timed out).
func cannotServe(err error) bool {
	var se *serverError
	if errors.As(err, &se) {
		return se.code == codeUnavailable || se.code == codeDeadlineExceeded
	}
	return !errors.Is(err, context.Canceled)
}

// tokenSends bounds the sends of one request whose auth token the server
// refuses, each with a new token: the first new token can itself be refused
// when a change of a user or role lands between its issue and its use, and
// a request renewing a lease must not fail for that.
const tokenSends = 3

// postTo is post to one endpoint: authenticating first when the URL has a
// user and there is no token yet.
func (c *client) postTo(ctx context.Context, ep int, path string, body []byte, header http.Header, read func(*http.Response) error) (*http.Response, error) {
	for sends := 1; ; sends++ {
		token, err := c.authToken(ctx, ep)
		if err != nil {
			return nil, err
		}
		resp, err := c.send(ctx, ep, path, body, header, token)
		if err == nil && read != nil {
			if err = read(resp); err != nil {
				resp.Body.Close()
			}
		}
		if err == nil {
			return resp, nil
		}
		if c.user != "" && sends < tokenSends && tokenRefused(err, path) {
			c.dropToken(token)
			continue
		}
		return nil, err
	}
}

// resendable are the requests that mean the same if the server gets them
// twice: reads, renewals and revocations (a lease revoked twice is "not
// found", which every caller takes as gone). Not a txn or a grant: a
// release's guarded delete, sent again after it ran, would say the key was
// no longer ours; a grant would leave a lease behind.
var resendable = map[string]bool{
	"/v3/kv/range":            true,
	"/v3/lease/revoke":        true,
	"/v3/lease/timetolive":    true,
	"/v3/lease/keepalive":     true,
	watchPath:                 true,
	"/v3/cluster/member/list": true,
	"/v3/maintenance/status":  true,
	"/v3/auth/authenticate":   true,
}

// send is one HTTP request, or a gRPC call if path is a gRPC method.
func (c *client) send(ctx context.Context, ep int, path string, body []byte, header http.Header, token string) (*http.Response, error) {
	if isGRPC(path) {
		return c.sendGRPC(ctx, ep, path, body, token)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.endpoints[ep]+path, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	for k, v := range header {
		req.Header[k] = v
	}
	req.Header.Set("Content-Type", "application/json")
	if resendable[path] {
		// Go's transport sends a request again, on a new connection, when
		// a kept-alive connection it was sent on turns out closed or reset
		// before the answer began (the server, or a proxy or load balancer
		// in between, dropped it as idle), but only a request marked
		// idempotent; a nil value marks it without sending the header.
		req.Header["Idempotency-Key"] = nil
	}
	if token != "" {
		// The gateway passes Authorization on as the gRPC metadata the
		// server reads the token from.
		req.Header.Set("Authorization", token)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		return nil, httpError(resp)
	}
	return resp, nil
}

// authToken returns the token to send, fetching one from endpoint ep if
// the URL has a user and there is none.
func (c *client) authToken(ctx context.Context, ep int) (string, error) {
	if c.user == "" {
		return "", nil
	}
	c.mu.Lock()
	token := c.token
	c.mu.Unlock()
	if token != "" {
		return token, nil
	}
	body, _ := json.Marshal(authRequest{Name: c.user, Password: c.password})
	resp, err := c.send(ctx, ep, "/v3/auth/authenticate", body, nil, "")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var r authResponse
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		return "", err
	}
	if r.Token == "" {
		return "", &serverError{code: codeUnknown, msg: "etcd answered the authentication without a token"}
	}
	c.mu.Lock()
	c.token = r.Token
	c.mu.Unlock()
	return r.Token, nil
}

// dropToken forgets token, if it is still the one in use, so that the next
// request fetches a new one.
func (c *client) dropToken(token string) {
	c.mu.Lock()
	if c.token == token {
		c.token = ""
	}
	c.mu.Unlock()
}

// dialFailed reports whether err is a connection that could not be made:
// the request never left.
func dialFailed(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// timedOut reports whether err is a request that got no answer in time.
func timedOut(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout()
}

// do sends in to path and decodes the answer into out.
func (c *client) do(ctx context.Context, path string, in, out any) error {
	body, err := json.Marshal(in)
	if err != nil {
		return err
	}
	resp, err := c.post(ctx, path, body, nil, nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("reading etcd's answer: %w", err)
	}
	// Read to the end (a newline, a chunked answer's last chunk), so
	// that the connection is used again.
	io.Copy(io.Discard, resp.Body)
	return nil
}

// stream is the answer of a streaming request (watch, lease keep-alive):
// one JSON object per message, {"result": ...} or {"error": ...}.
type stream struct {
	body io.ReadCloser
	dec  *json.Decoder
}

// errStreamEnded is a stream that the server ended without an error.
var errStreamEnded = errors.New("the stream ended")

// openStream sends in to path, a streaming request, and reads the first
// message with first, which returns its error (the server's refusal of the
// token too: the request is then sent again with a new one). The
// gateway reads the request's body as the messages to send, so the one
// message is all of it; the server goes on answering after the body's end.
func (c *client) openStream(ctx context.Context, path string, in any, header http.Header, first func(*stream) error) (*stream, error) {
	body, err := json.Marshal(in)
	if err != nil {
		return nil, err
	}
	var s *stream
	_, err = c.post(ctx, path, body, header, func(resp *http.Response) error {
		s = &stream{body: resp.Body, dec: json.NewDecoder(resp.Body)}
		return first(s)
	})
	if err != nil {
		return nil, err
	}
	return s, nil
}

// next decodes the next message into out.
func (s *stream) next(out any) error {
	var m struct {
		Result json.RawMessage `json:"result"`
		Error  json.RawMessage `json:"error"`
	}
	if err := s.dec.Decode(&m); err != nil {
		if errors.Is(err, io.EOF) {
			return errStreamEnded
		}
		return err
	}
	if m.Error != nil {
		if e, ok := parseError(m.Error, 0); ok {
			return e
		}
		return fmt.Errorf("etcd sent a stream error that withlock cannot read: %.200s", m.Error)
	}
	if m.Result == nil {
		return errors.New("etcd sent a stream message without a result")
	}
	return json.Unmarshal(m.Result, out)
}

// close ends the stream. One that the server has ended is read to its end
// first, so that its connection can be used again.
func (s *stream) close() {
	io.Copy(io.Discard, io.LimitReader(s.body, 64<<10))
	s.body.Close()
}

// abort ends a stream that is still going (a watch): its connection is
// closed.
func (s *stream) abort() { s.body.Close() }
