package k8s

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"time"
)

// LeaseObject is the part of a coordination.k8s.io/v1 Lease that withlock
// reads and writes. Written with PUT, the object replaces the stored one,
// so a field left out here (holderIdentity on release) is cleared; the fields
// other tools set (labels, annotations, ownerReferences, finalizers,
// strategy, preferredHolder) are here so that they are written back.
type LeaseObject struct {
	APIVersion string     `json:"apiVersion"`
	Kind       string     `json:"kind"`
	Metadata   ObjectMeta `json:"metadata"`
	Spec       LeaseSpec  `json:"spec"`

	// served is the API server's clock when it sent this copy: the Date
	// of its answer, in whole seconds (truncated); zero if it gave none.
	served time.Time
}

// ObjectMeta is a Lease's metadata.
type ObjectMeta struct {
	Name            string            `json:"name"`
	Namespace       string            `json:"namespace,omitempty"`
	ResourceVersion string            `json:"resourceVersion,omitempty"`
	Labels          map[string]string `json:"labels,omitempty"`
	Annotations     map[string]string `json:"annotations,omitempty"`
	// Kept as read, for tools that share the Lease.
	OwnerReferences json.RawMessage `json:"ownerReferences,omitempty"`
	Finalizers      []string        `json:"finalizers,omitempty"`
	// ManagedFields is read only: the server keeps its own when a write
	// leaves it out, and every write does (see send).
	ManagedFields []ManagedFields `json:"managedFields,omitempty"`
}

// ManagedFields is one entry of a Lease's metadata.managedFields: which
// fields a field manager last set, and when, by the API server's clock in
// whole seconds.
type ManagedFields struct {
	Manager   string          `json:"manager"`
	Operation string          `json:"operation"`
	Time      string          `json:"time"`
	FieldsV1  json.RawMessage `json:"fieldsV1,omitempty"`
}

// LeaseSpec is a Lease's spec. The times are MicroTime: RFC 3339 with
// microseconds.
type LeaseSpec struct {
	HolderIdentity       string `json:"holderIdentity,omitempty"`
	LeaseDurationSeconds int32  `json:"leaseDurationSeconds,omitempty"`
	AcquireTime          string `json:"acquireTime,omitempty"`
	RenewTime            string `json:"renewTime,omitempty"`
	LeaseTransitions     int32  `json:"leaseTransitions,omitempty"`
	// Kept as read: how a coordinated leader election picks its leader.
	Strategy        string `json:"strategy,omitempty"`
	PreferredHolder string `json:"preferredHolder,omitempty"`
}

// microTime is metav1.MicroTime's format.
const microTime = "2006-01-02T15:04:05.000000Z07:00"

func formatMicro(t time.Time) string { return t.UTC().Format(microTime) }

func parseMicro(s string) time.Time {
	t, _ := time.Parse(time.RFC3339Nano, s)
	return t
}

type leaseList struct {
	Metadata struct {
		ResourceVersion string `json:"resourceVersion"`
	} `json:"metadata"`
	Items []LeaseObject `json:"items"`
}

// status is the API server's metav1.Status, the body of its errors.
type status struct {
	Message string `json:"message"`
	Reason  string `json:"reason"`
	Details struct {
		Name  string `json:"name"`
		Group string `json:"group"`
		Kind  string `json:"kind"`
	} `json:"details"`
	Code int `json:"code"`
}

// apiError is an answer of the API server other than 2xx.
type apiError struct {
	code   int
	status status
}

func (e *apiError) Error() string {
	if e.status.Message != "" {
		return e.status.Message
	}
	return fmt.Sprintf("HTTP %d %s", e.code, http.StatusText(e.code))
}

// client makes single REST calls to one API server, in one namespace.
type client struct {
	cfg    *config
	dialer *dialer
	// http is the current HTTP client: replaced by one that trusts the
	// new CA when the CA file changes (refresh).
	http atomic.Pointer[http.Client]
}

// callTimeout bounds a call whose caller gave no deadline.
const callTimeout = 10 * time.Second

func newClient(cfg *config) *client {
	c := &client{cfg: cfg, dialer: &dialer{
		d:     net.Dialer{Timeout: 5 * time.Second, KeepAlive: 15 * time.Second},
		conns: map[*trackedConn]struct{}{},
	}}
	if cfg.auth.exec != nil {
		cfg.auth.exec.rotated = c.dialer.closeAll
	}
	c.http.Store(c.newHTTP(cfg.tls))
	return c
}

// newHTTP makes an HTTP client whose connections use tlsConfig.
func (c *client) newHTTP(tlsConfig *tls.Config) *http.Client {
	proxy := http.ProxyFromEnvironment
	if c.cfg.proxy != nil {
		proxy = http.ProxyURL(c.cfg.proxy)
	}
	tr := &http.Transport{
		Proxy:               proxy,
		DialContext:         c.dialer.DialContext,
		TLSClientConfig:     tlsConfig,
		TLSHandshakeTimeout: 5 * time.Second,
		MaxIdleConnsPerHost: 4,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  c.cfg.disableCompression,
		// HTTP/2 would put the watch and the renewals on one connection;
		// HTTP/1.1 keeps a stuck watch from holding up a renewal.
		ForceAttemptHTTP2: false,
		TLSNextProto:      map[string]func(string, *tls.Conn) http.RoundTripper{},
	}
	return &http.Client{Transport: tr}
}

// refresh reads again the CA and client certificate files that changed
// (credFiles). A new CA makes a new HTTP client that trusts it, and the
// old one's idle connections are closed: the connections open still
// verified the server when they were made. A new client certificate
// closes every connection, as an exec plugin's does: a TLS connection
// keeps the certificate of its handshake.
func (c *client) refresh() {
	roots, certChanged := c.cfg.files.refresh()
	if roots != nil {
		tlsConfig := c.cfg.tls.Clone()
		tlsConfig.RootCAs = roots
		c.http.Swap(c.newHTTP(tlsConfig)).CloseIdleConnections()
	}
	if certChanged {
		c.dialer.closeAll()
	}
}

// do sends req with the current HTTP client.
func (c *client) do(req *http.Request) (*http.Response, error) {
	return c.http.Load().Do(req)
}

// dialer dials the API server and keeps a set of the connections it made
// that are still open, so that a new client certificate can close them
// all, as client-go does on rotation: a TLS connection keeps the
// certificate of its handshake, and the pool reuses an idle one for as
// long as requests come within IdleConnTimeout of each other, past the old
// certificate's expiry.
type dialer struct {
	d     net.Dialer
	mu    sync.Mutex
	conns map[*trackedConn]struct{}
}

func (d *dialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	conn, err := d.d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	tc := &trackedConn{Conn: conn, d: d}
	d.mu.Lock()
	d.conns[tc] = struct{}{}
	d.mu.Unlock()
	return tc, nil
}

// closeAll closes every open connection: requests in flight on them fail
// (and are retried like any outage), and new ones dial afresh.
func (d *dialer) closeAll() {
	d.mu.Lock()
	conns := make([]*trackedConn, 0, len(d.conns))
	for c := range d.conns {
		conns = append(conns, c)
	}
	d.mu.Unlock()
	for _, c := range conns {
		c.Close()
	}
}

type trackedConn struct {
	net.Conn
	d *dialer
}

func (c *trackedConn) Close() error {
	c.d.mu.Lock()
	delete(c.d.conns, c)
	c.d.mu.Unlock()
	return c.Conn.Close()
}

func (c *client) leasesPath(ns string) string {
	return "/apis/coordination.k8s.io/v1/namespaces/" + url.PathEscape(ns) + "/leases"
}

// request makes req with the credentials, its body encoded from in.
func (c *client) request(ctx context.Context, method, path string, query url.Values, in any) (*http.Request, error) {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return nil, err
		}
		body = bytes.NewReader(b)
	}
	u := c.cfg.server + path
	if len(query) > 0 {
		u += "?" + query.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/json")
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("User-Agent", "withlock")
	c.refresh()
	if err := c.cfg.auth.apply(ctx, req); err != nil {
		var pe *pluginError
		if !errors.As(err, &pe) {
			err = &pluginError{err.Error()}
		}
		return nil, err
	}
	return req, nil
}

// call makes one call and decodes a 2xx answer into out. It returns the
// answer's status code and the time the API server stamped on it: its
// Date header, the server's clock in whole seconds (zero without one).
// Errors are an *apiError (the server answered otherwise), a
// *pluginError, or the transport's.
func (c *client) call(ctx context.Context, method, path string, query url.Values, in, out any) (int, time.Time, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, callTimeout)
		defer cancel()
	}
	var (
		resp *http.Response
		date time.Time
		body []byte
	)
	for retried := false; ; retried = true {
		req, err := c.request(ctx, method, path, query, in)
		if err != nil {
			return 0, time.Time{}, err
		}
		if resp, err = c.do(req); err != nil {
			return 0, time.Time{}, err
		}
		date, _ = http.ParseTime(resp.Header.Get("Date"))
		body, err = io.ReadAll(io.LimitReader(resp.Body, 16<<20))
		resp.Body.Close()
		if err != nil {
			return 0, time.Time{}, err
		}
		// A 401 may be credentials gone stale in a cache (a plugin's token
		// revoked before its expiry, a token file replaced just after it
		// was read): once, with fresh ones.
		if resp.StatusCode != http.StatusUnauthorized || retried || !c.cfg.auth.unauthorized() {
			break
		}
	}
	if resp.StatusCode/100 != 2 {
		e := &apiError{code: resp.StatusCode}
		json.Unmarshal(body, &e.status)
		return resp.StatusCode, date, e
	}
	if out != nil {
		if err := json.Unmarshal(body, out); err != nil {
			return resp.StatusCode, date, fmt.Errorf("the API server's answer is not JSON: %v", err)
		}
	}
	return resp.StatusCode, date, nil
}

func (c *client) get(ctx context.Context, ns, name string) (*LeaseObject, error) {
	l := &LeaseObject{}
	_, date, err := c.call(ctx, http.MethodGet, c.leasesPath(ns)+"/"+url.PathEscape(name), nil, nil, l)
	if err != nil {
		return nil, err
	}
	l.served = date
	return l, nil
}

// fieldManager names withlock's writes in a Lease's managedFields.
const fieldManager = "withlock"

// send is l as a write sends it: typed, and without managedFields, which
// the server then keeps and updates itself.
func send(l *LeaseObject) *LeaseObject {
	out := *l
	out.APIVersion, out.Kind = "coordination.k8s.io/v1", "Lease"
	out.Metadata.ManagedFields = nil
	return &out
}

func (c *client) create(ctx context.Context, ns string, l *LeaseObject) (*LeaseObject, error) {
	out := &LeaseObject{}
	q := url.Values{"fieldManager": {fieldManager}}
	_, date, err := c.call(ctx, http.MethodPost, c.leasesPath(ns), q, send(l), out)
	if err != nil {
		return nil, err
	}
	out.served = date
	return out, nil
}

// update replaces the Lease if its resourceVersion is still l's (else a
// 409 Conflict). Leases allow create-on-update: a PUT of a Lease that no
// longer exists creates it, whatever resourceVersion it names (the API
// server checks the version only against a stored object). created says
// that this happened (201 Created instead of 200 OK).
func (c *client) update(ctx context.Context, ns string, l *LeaseObject) (out *LeaseObject, created bool, err error) {
	return c.updateAs(ctx, ns, l, fieldManager)
}

// updateAs is update recorded in managedFields under the field manager
// manager.
func (c *client) updateAs(ctx context.Context, ns string, l *LeaseObject, manager string) (out *LeaseObject, created bool, err error) {
	out = &LeaseObject{}
	q := url.Values{"fieldManager": {manager}}
	code, date, err := c.call(ctx, http.MethodPut, c.leasesPath(ns)+"/"+url.PathEscape(l.Metadata.Name), q, send(l), out)
	if err != nil {
		return nil, false, err
	}
	out.served = date
	return out, code == http.StatusCreated, nil
}

// list returns the Leases that query selects, each with the time the
// server sent the list.
func (c *client) list(ctx context.Context, ns string, query url.Values) (*leaseList, error) {
	var l leaseList
	_, date, err := c.call(ctx, http.MethodGet, c.leasesPath(ns), query, nil, &l)
	if err != nil {
		return nil, err
	}
	for i := range l.Items {
		l.Items[i].served = date
	}
	return &l, nil
}

// watchEvent is one line of a watch.
type watchEvent struct {
	Type   string          `json:"type"`
	Object json.RawMessage `json:"object"`
}

// watch watches the Leases that selector (a fieldSelector or a
// labelSelector) picks, from resourceVersion rv, and sends a value on
// changed at every event, until ctx ends or the server ends the watch. It
// returns once the watch is open (or could not be opened); the watch runs
// on in a goroutine that closes done when it ends, and tells seen the type
// of each event.
func (c *client) watch(ctx context.Context, ns string, selector url.Values, rv string, changed chan<- struct{}, seen func(event string)) (done <-chan struct{}, err error) {
	q := url.Values{"watch": {"1"}, "resourceVersion": {rv}, "timeoutSeconds": {"300"}}
	for k, v := range selector {
		q[k] = v
	}
	req, err := c.request(ctx, http.MethodGet, c.leasesPath(ns), q, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode/100 != 2 {
		defer resp.Body.Close()
		e := &apiError{code: resp.StatusCode}
		json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&e.status)
		return nil, e
	}
	d := make(chan struct{})
	go func() {
		defer close(d)
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 64<<10), 4<<20)
		for sc.Scan() {
			var ev watchEvent
			if json.Unmarshal(sc.Bytes(), &ev) != nil {
				continue
			}
			seen(ev.Type)
			select {
			case changed <- struct{}{}:
			default: // one pending wake-up is enough
			}
			if ev.Type == "ERROR" {
				return // "too old resource version": the watch ends (see Notify)
			}
		}
	}()
	return d, nil
}
