// Package etcd is the etcd:// and etcds:// backend: etcd's own mutex recipe
// (go.etcd.io/etcd/client/v3/concurrency), on the keys `etcdctl lock NAME`
// uses, so that the two tools exclude each other on the same NAME.
//
// Each holder and each waiter has a lease of --ttl and a key NAME/<lease ID
// in lower-case hex> attached to it, put only if absent. The keys of NAME,
// in the order of their create revisions, are its queue: the first key
// holds an exclusive lock, and a waiter watches the key just before its own
// until it is deleted, so that a hand-off needs no polling. A key's create
// revision grows with every acquisition and is the fencing token.
//
// The key's value is the holder's record (JSON: mode, N, host, pid,
// command, when it acquired). A key without one, such as etcdctl's, is an
// exclusive holder. A shared holder waits only for the earlier keys that are
// not shared, and a semaphore holder of N until fewer than N keys are before
// its own; `etcdctl lock` waits for every earlier key, so it still excludes
// and is excluded by both.
//
// concurrency.Mutex itself is not used: it needs a concurrency.Session,
// which keeps its lease alive with a loop of its own (client.KeepAlive), and
// its Lock deletes its key on failure with a context without deadline.
// withlock's lease is kept by lock.Held alone, one KeepAlive request per
// Keep, so that one loop decides when the lock is lost. The requests are
// those of Mutex.TryLock and Mutex.Lock.
package etcd

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/grpclog"
	"google.golang.org/grpc/status"

	"github.com/withlock/withlock/internal/lock"
)

func init() {
	lock.Register("etcd", open)
	lock.Register("etcds", open)
	// gRPC logs connection failures on stderr by itself (and the etcd
	// client makes it log more when ETCD_CLIENT_DEBUG is set); withlock's
	// stderr is its own, and those errors reach us as return values anyway.
	grpclog.SetLoggerV2(grpclog.NewLoggerV2(io.Discard, io.Discard, io.Discard))
}

// DefaultPort is the port of a HOST without one, as etcdctl assumes.
const DefaultPort = "2379"

// callTimeout bounds each request of an attempt, so that a server that
// does not answer is retried and reported instead of hanging the wait.
const callTimeout = 5 * time.Second

type backend struct {
	opts   lock.Options
	cfg    clientv3.Config
	addr   string // the URL's HOST:PORT list, for messages
	ttl    int64  // the lease's TTL in seconds: opts.TTL rounded up
	client *clientv3.Client
	// orphans are leases of keys that were to be deleted when a wait or an
	// attempt failed, but could not be: the next attempt revokes them.
	orphans []clientv3.LeaseID
}

func open(u *url.URL, opts lock.Options) (lock.Backend, error) {
	secure := strings.EqualFold(u.Scheme, "etcds")
	if u.Host == "" {
		return nil, lock.Errorf(lock.ErrUsage, "etcd URL: no HOST:PORT; write etcd://HOST:PORT[,HOST:PORT...]")
	}
	if u.Path != "" && u.Path != "/" {
		return nil, lock.Errorf(lock.ErrUsage, "etcd URL: unexpected path %q; write etcd://HOST:PORT[,HOST:PORT...]", u.Path)
	}
	scheme := "http://"
	if secure {
		scheme = "https://"
	}
	var endpoints []string
	for _, hp := range strings.Split(u.Host, ",") {
		host, port, err := net.SplitHostPort(hp)
		if err != nil {
			host, port = hp, DefaultPort
		}
		if host == "" || strings.ContainsAny(host, "[]") {
			return nil, lock.Errorf(lock.ErrUsage, "etcd URL: %q is not HOST:PORT", hp)
		}
		endpoints = append(endpoints, scheme+net.JoinHostPort(host, port))
	}
	cfg := clientv3.Config{
		Endpoints: endpoints,
		// DialTimeout bounds what the client does while it is created:
		// fetching an auth token.
		DialTimeout: min(callTimeout, opts.ConnectTimeout),
		// Pings find a connection whose peer is gone without a word (a
		// partition), so that a cluster's other members are used.
		DialKeepAliveTime:    10 * time.Second,
		DialKeepAliveTimeout: 5 * time.Second,
		Logger:               zap.NewNop(),
		// One attempt per request: lock.Client.Acquire and lock.Held are
		// the retry loops.
		MaxUnaryRetries: 1,
	}
	cs := newConns()
	cfg.DialOptions = []grpc.DialOption{
		grpc.WithContextDialer(cs.dial),
		grpc.WithChainUnaryInterceptor(cs.unary),
		grpc.WithChainStreamInterceptor(cs.stream),
	}
	if u.User != nil {
		cfg.Username = u.User.Username()
		pw, ok := u.User.Password()
		if !ok || cfg.Username == "" {
			return nil, lock.Errorf(lock.ErrUsage, "etcd URL: give both a user and a password (etcd://USER:PASSWORD@HOST:PORT)")
		}
		cfg.Password = pw
	}
	tlsCfg, err := tlsConfig(u.Query(), secure)
	if err != nil {
		return nil, err
	}
	cfg.TLS = tlsCfg
	ttl := int64(math.Ceil(opts.TTL.Seconds()))
	return &backend{opts: opts, cfg: cfg, addr: u.Host, ttl: max(ttl, 1)}, nil
}

// tlsConfig reads the URL's TLS options: cacert (the CA to trust instead of
// the system's), cert and key (a client certificate), as etcdctl's flags of
// the same names. They need etcds://.
func tlsConfig(q url.Values, secure bool) (*tls.Config, error) {
	for k := range q {
		switch k {
		case "cacert", "cert", "key":
			if !secure {
				return nil, lock.Errorf(lock.ErrUsage, "etcd URL: %s is a TLS option; use etcds:// for TLS", k)
			}
		default:
			return nil, lock.Errorf(lock.ErrUsage, "etcd URL: unknown option %q; etcds:// URLs take cacert, cert and key", k)
		}
	}
	if !secure {
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if f := q.Get("cacert"); f != "" {
		pem, err := os.ReadFile(f)
		if err != nil {
			return nil, lock.Errorf(lock.ErrUsage, "etcd URL: cacert: %v", err)
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, lock.Errorf(lock.ErrUsage, "etcd URL: cacert: no PEM certificate in %s", f)
		}
	}
	cert, key := q.Get("cert"), q.Get("key")
	if (cert == "") != (key == "") {
		return nil, lock.Errorf(lock.ErrUsage, "etcd URL: give both cert and key for a client certificate")
	}
	if cert != "" {
		pair, err := tls.LoadX509KeyPair(cert, key)
		if err != nil {
			return nil, lock.Errorf(lock.ErrUsage, "etcd URL: cert and key: %v", err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg, nil
}

// conns makes each request one connection attempt, with the help of gRPC
// interceptors and a dialer of its own. A request fails at once, with the
// reason, when no endpoint can be reached ("connection refused"), instead of
// waiting for a connection until its deadline, as the etcd client asks
// gRPC to do (WaitForReady). And a connection that failed is tried again
// at once when a request comes: gRPC would otherwise wait before it tries
// again (backing off up to 2 minutes), and every request meanwhile would
// fail with the old reason, even once the server is back, so that a
// holder's release after a restart of etcd would fail.
type conns struct {
	mu     sync.Mutex
	failed chan struct{} // closed, and replaced, when a dial fails
}

func newConns() *conns { return &conns{failed: make(chan struct{})} }

func (c *conns) dial(ctx context.Context, addr string) (net.Conn, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		c.mu.Lock()
		close(c.failed)
		c.failed = make(chan struct{})
		c.mu.Unlock()
	}
	return conn, err
}

// unary and stream run after the etcd client's own interceptor, so their
// WaitForReady(false) comes last and wins.
func (c *conns) unary(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	c.ready(ctx, cc)
	return invoker(ctx, method, req, reply, cc, append(opts, grpc.WaitForReady(false))...)
}

func (c *conns) stream(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	c.ready(ctx, cc)
	return streamer(ctx, desc, cc, method, append(opts, grpc.WaitForReady(false))...)
}

// ready makes cc connect again now if its connection attempts failed, and
// waits until it is connected or a new attempt fails (gRPC keeps saying
// TransientFailure while it tries again), so that the request that follows
// sees that attempt's outcome.
func (c *conns) ready(ctx context.Context, cc *grpc.ClientConn) {
	if cc.GetState() != connectivity.TransientFailure {
		return
	}
	c.mu.Lock()
	failed := c.failed
	c.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	go func() {
		select {
		case <-failed:
			cancel()
		case <-ctx.Done():
		}
	}()
	cc.ResetConnectBackoff()
	cc.WaitForStateChange(ctx, connectivity.TransientFailure)
}

// connect returns the client, creating it on first use. Creating it does
// not connect, except to fetch an auth token when the URL has a user; that
// is bounded by ctx, and by DialTimeout for the client's own sake.
func (b *backend) connect(ctx context.Context) (*clientv3.Client, error) {
	if b.client != nil {
		return b.client, nil
	}
	type result struct {
		c   *clientv3.Client
		err error
	}
	done := make(chan result, 1)
	go func() {
		c, err := clientv3.New(b.cfg)
		done <- result{c, err}
	}()
	select {
	case r := <-done:
		if r.err != nil {
			return nil, b.classify(r.err)
		}
		b.client = r.c
		return r.c, nil
	case <-ctx.Done():
		// The client being made is closed when it is ready.
		go func() {
			if r := <-done; r.err == nil {
				r.c.Close()
			}
		}()
		return nil, b.classify(ctx.Err())
	}
}

func (b *backend) Close() error {
	if b.client == nil {
		return nil
	}
	err := b.client.Close()
	b.client = nil
	if errors.Is(err, context.Canceled) {
		return nil // the client's own context, which Close ends
	}
	return err
}

// call is a context for one request of an attempt: ctx, bounded by
// callTimeout.
func call(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, callTimeout)
}

// classify sorts an etcd client error into lock's sentinels. Requests the
// server could not serve for now (no leader, timed out, too many requests),
// connections that failed, and an auth token to fetch again are
// ErrUnavailable; authentication and permission errors, a certificate we do
// not trust, and anything else the server answered are ErrRefused.
func (b *backend) classify(err error) error {
	what := "etcd at " + b.addr
	code, msg := codes.Unknown, err.Error()
	var ee rpctypes.EtcdError
	if errors.As(err, &ee) {
		code, msg = ee.Code(), ee.Error()
	} else if s, ok := status.FromError(err); ok {
		code, msg = s.Code(), s.Message()
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded) || code == codes.DeadlineExceeded:
		return lock.Unreachable(what, "timed out")
	case errors.Is(err, context.Canceled) || code == codes.Canceled:
		// The caller gave up (a signal, Release cutting a Keep off): that
		// says nothing about the server.
		return fmt.Errorf("%s: %w", what, context.Canceled)
	case errors.Is(err, rpctypes.ErrAuthFailed):
		return lock.Errorf(lock.ErrRefused, "%s refused the user and password: %s", what, msg)
	case errors.Is(err, rpctypes.ErrPermissionDenied):
		return lock.Errorf(lock.ErrRefused, "%s: permission denied; the user needs read and write permission on the lock's keys (NAME/)", what)
	case errors.Is(err, rpctypes.ErrInvalidAuthToken), errors.Is(err, rpctypes.ErrAuthOldRevision):
		// The client fetched a new token; the next attempt has it.
		return lock.Errorf(lock.ErrUnavailable, "%s: %s", what, msg)
	case errors.Is(err, rpctypes.ErrLeaseNotFound) || msg == rpctypes.ErrLeaseNotFound.Error():
		// The lease an attempt took ran out before the attempt could use
		// it (the network stalled for longer than the ttl in between): the
		// next attempt takes a new one. Keep and a waiter's renewal, where
		// a lease gone means a lock gone, say so before they get here.
		return lock.Errorf(lock.ErrUnavailable, "%s: the lease this attempt took ran out before it could use it (%s)", what, msg)
	case errors.Is(err, rpctypes.ErrNoSpace):
		return lock.Errorf(lock.ErrRefused, "%s is out of space (alarm NOSPACE): compact and defragment it, then disarm the alarm", what)
	case code == codes.Unavailable && strings.Contains(msg, "handshake failed") && (strings.Contains(msg, "x509:") || strings.Contains(msg, "tls:")):
		return lock.Errorf(lock.ErrRefused, "%s: %s", what, tlsReason(msg))
	case code == codes.Unavailable:
		return lock.Unreachable(what, transportReason(msg))
	case code == codes.ResourceExhausted && errors.Is(err, rpctypes.ErrTooManyRequests):
		return lock.Errorf(lock.ErrUnavailable, "%s is busy: %s", what, msg)
	case code == codes.Unknown && !strings.HasPrefix(msg, "etcdserver:"):
		// Not an answer of the server: a client-side failure.
		return lock.Unreachable(what, msg)
	}
	return lock.Errorf(lock.ErrRefused, "%s refused: %s", what, msg)
}

// transportReason is the end of a gRPC transport error, for messages:
// "connection refused" of `connection error: desc = "transport: Error while
// dialing: dial tcp 127.0.0.1:1: connect: connection refused"`. The
// server's own words (etcdserver: no leader) are kept whole.
func transportReason(msg string) string {
	if strings.HasPrefix(msg, "etcdserver:") {
		return msg
	}
	msg = strings.TrimRight(msg, `"`)
	if i := strings.LastIndex(msg, ": "); i >= 0 {
		msg = msg[i+2:]
	}
	return msg
}

// tlsReason is the TLS part of a failed handshake's message.
func tlsReason(msg string) string {
	msg = strings.TrimRight(msg, `"`)
	for _, p := range []string{"x509: ", "tls: "} {
		if i := strings.Index(msg, p); i >= 0 {
			return "TLS: " + msg[i:]
		}
	}
	return msg
}
