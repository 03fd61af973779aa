package etcd

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"math"
	"net"
	"net/url"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"

	"github.com/withlock/withlock/internal/lock"
)

func init() {
	lock.Register("etcd", open)
	lock.Register("etcds", open)
}

// DefaultPort is the port of a HOST without one, as etcdctl assumes.
const DefaultPort = "2379"

// callTimeout bounds each request of an attempt, so that a server that
// does not answer is retried and reported instead of hanging the wait.
const callTimeout = 5 * time.Second

type backend struct {
	opts      lock.Options
	addr      string   // the URL's HOST:PORT list, for messages
	endpoints []string // http(s)://HOST:PORT, as the official client takes them
	ttl       int64    // the lease's TTL in seconds: opts.TTL rounded up
	cfg       clientv3.Config

	mu sync.Mutex
	c  *clientv3.Client // once connected (conn)

	auth    *tokens // the URL's user's, if it names one
	renewer renewer
	// waiting is a waiter's key kept for the next Acquire of the same
	// name, so that it waits in that place instead of queueing again at
	// the back (Close revokes it): after an attempt that found the lock
	// held, when the caller is to wait (queued is then the queue as the
	// attempt read it, and the wait starts from it without a request of
	// its own), or after a wait that the server's unavailability cut
	// short (queued is nil: the queue is read again).
	waiting *lease
	queued  []entry
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
	var user, password string
	if u.User != nil {
		user = u.User.Username()
		pw, ok := u.User.Password()
		if !ok || user == "" || pw == "" {
			return nil, lock.Errorf(lock.ErrUsage, "etcd URL: give both a user and a password (etcd://USER:PASSWORD@HOST:PORT)")
		}
		password = pw
	}
	tlsCfg, err := tlsConfig(u.Query(), secure)
	if err != nil {
		return nil, err
	}
	ttl := int64(math.Ceil(opts.TTL.Seconds()))
	b := &backend{opts: opts, addr: u.Host, endpoints: endpoints, ttl: max(ttl, 1)}
	b.cfg = clientv3.Config{
		Endpoints: endpoints,
		TLS:       tlsCfg,
		// Bounds the authentication that connecting with a user does.
		DialTimeout: callTimeout,
		// A connection whose peer is gone without a word (a partition, a
		// NAT that forgot it) fails within about 15s instead of the
		// kernel's hours; a waiter's watch and a holder's renewals wait
		// on one such connection.
		DialKeepAliveTime:    10 * time.Second,
		DialKeepAliveTimeout: 5 * time.Second,
		// The client's own log would write to withlock's stderr.
		Logger: zap.NewNop(),
		// gRPC waits longer and longer between attempts to connect to a
		// member that refuses connections, up to two minutes: a member
		// that restarts would be back long before a holder tried it
		// again. A second at most, as for an unreachable server in the
		// wait loop.
		DialOptions: []grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
			MinConnectTimeout: callTimeout,
		}), grpc.WithChainUnaryInterceptor(b.passLearners)},
	}
	if user != "" {
		b.auth = &tokens{user: user, password: password}
		b.cfg.DialOptions = append(b.cfg.DialOptions, grpc.WithPerRPCCredentials(b.auth), grpc.WithChainUnaryInterceptor(b.auth.dropRefused))
	}
	return b, nil
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
	cfg, err := lock.TLSFiles("etcd URL", q)
	if cfg == nil && err == nil {
		cfg = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	return cfg, err
}

// conn returns the client, making it on first use. That sends nothing: the
// connections are made, and the user authenticated (tokens), as requests
// need them. ctx ending cuts the wait for it short.
func (b *backend) conn(ctx context.Context) (*clientv3.Client, error) {
	c, err := b.client(ctx)
	if err != nil {
		return nil, err
	}
	return c, b.ready(ctx, c)
}

// ready waits until the client is connected to a member, and fails at once
// when it cannot connect to any (the official client would wait for one
// until the request's deadline, and then say only that time ran out).
func (b *backend) ready(ctx context.Context, c *clientv3.Client) error {
	conn := c.ActiveConnection()
	for {
		st := conn.GetState()
		switch st {
		case connectivity.Ready:
			return nil
		case connectivity.TransientFailure:
			return b.timedOut("etcd at "+b.addr, context.DeadlineExceeded)
		case connectivity.Idle:
			conn.Connect()
		}
		if !conn.WaitForStateChange(ctx, st) {
			return b.classify(context.Cause(ctx))
		}
	}
}

// client returns the official client, making it on first use.
func (b *backend) client(ctx context.Context) (*clientv3.Client, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.c != nil {
		return b.c, nil
	}
	type made struct {
		c   *clientv3.Client
		err error
	}
	ch := make(chan made, 1)
	go func() {
		c, err := clientv3.New(b.cfg)
		if err == nil && b.auth != nil {
			b.auth.cc = c.ActiveConnection()
		}
		ch <- made{c, err}
	}()
	select {
	case m := <-ch:
		if m.err != nil {
			return nil, b.classify(m.err)
		}
		b.c = m.c
		return m.c, nil
	case <-ctx.Done():
		go func() {
			if m := <-ch; m.c != nil {
				m.c.Close()
			}
		}()
		return nil, b.classify(context.Cause(ctx))
	}
}

func (b *backend) Close() error {
	if l := b.waiting; l != nil {
		b.waiting, b.queued = nil, nil
		l.drop(context.Background())
	}
	b.renewer.close()
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.c != nil {
		b.c.Close()
		b.c = nil
	}
	return nil
}

// call is a context for one request of an attempt: ctx, bounded by
// callTimeout, and with several endpoints by half the renewal interval too:
// a member cut off from its peers may take a request and wait for answers
// that never come, and a waiter's next attempt, which the client sends to
// another member, must come in time to renew its lease.
func (b *backend) call(ctx context.Context) (context.Context, context.CancelFunc) {
	if len(b.endpoints) == 1 {
		return context.WithTimeout(ctx, callTimeout)
	}
	return context.WithTimeout(ctx, min(callTimeout, b.opts.KeepInterval()/2))
}

// classify sorts an error of the official client into lock's sentinels.
// Requests the server could not serve for now (no leader, timed out, too
// many requests), connections that failed, and an auth token to fetch
// again are ErrUnavailable; authentication and permission errors, a
// certificate we do not trust, and anything else the server answered are
// ErrRefused.
func (b *backend) classify(err error) error {
	what := "etcd at " + b.addr
	if errors.Is(err, lock.ErrUnavailable) || errors.Is(err, lock.ErrRefused) {
		return err // sorted already (conn's)
	}
	if errors.Is(err, context.Canceled) && !isStatus(err) {
		// The caller gave up (a signal, Release cutting a Keep off): that
		// says nothing about the server.
		return fmt.Errorf("%s: %w", what, context.Canceled)
	}
	ee := etcdError(err)
	switch {
	case errors.Is(ee, rpctypes.ErrAuthFailed):
		return lock.Errorf(lock.ErrRefused, "%s refused the user and password: %s", what, ee)
	case errors.Is(ee, rpctypes.ErrPermissionDenied):
		return lock.Errorf(lock.ErrRefused, "%s: permission denied; the user needs read and write permission on the lock's keys (NAME/)", what)
	case errors.Is(ee, rpctypes.ErrUserEmpty):
		return lock.Errorf(lock.ErrRefused, "%s has authentication on and no user was given: give one in the URL (etcd://USER:PASSWORD@HOST:PORT), or a client certificate whose Common Name is the user", what)
	case errors.Is(ee, rpctypes.ErrInvalidAuthToken), errors.Is(ee, rpctypes.ErrAuthOldRevision):
		// The client fetches a new token for the next request.
		return lock.Errorf(lock.ErrUnavailable, "%s: %s", what, ee)
	case errors.Is(ee, rpctypes.ErrLeaseNotFound):
		// The lease an attempt took ran out before the attempt could use
		// it (the network stalled for longer than the ttl in between): the
		// next attempt takes a new one. Keep and a waiter's renewal, where
		// a lease gone means a lock gone, say so before they get here.
		return lock.Errorf(lock.ErrUnavailable, "%s: the lease this attempt took ran out before it could use it (%s)", what, ee)
	case errors.Is(ee, rpctypes.ErrNoSpace):
		return lock.Errorf(lock.ErrRefused, "%s is out of space (alarm NOSPACE): compact and defragment it, then disarm the alarm", what)
	case errors.Is(ee, rpctypes.ErrTooManyRequests):
		return lock.Errorf(lock.ErrUnavailable, "%s is busy: %s", what, ee)
	case errors.Is(ee, errLearner) && len(b.endpoints) > 1:
		// The client sends the next request to another member.
		return lock.Unreachable(what, "a learner answered, which serves no lock")
	case errors.Is(ee, errLearner):
		return lock.Errorf(lock.ErrRefused, "%s answered as a learner, which serves no lock: name the cluster's voting members in the URL", what)
	}
	if r, ok := tlsReason(err); ok {
		return lock.Errorf(lock.ErrRefused, "%s: %s", what, r)
	}
	if errors.Is(err, context.DeadlineExceeded) || status.Code(err) == codes.DeadlineExceeded {
		return b.timedOut(what, err)
	}
	if s, ok := status.FromError(err); ok && s.Code() == codes.Unknown && (s.Message() == context.DeadlineExceeded.Error() || s.Message() == context.Canceled.Error()) {
		// The server's own word that the request's time ran out there (a
		// member of etcd 3.4 that waited for a leader it cannot reach).
		return lock.Unreachable(what, "timed out")
	}
	switch status.Code(err) {
	case codes.Unavailable, codes.Canceled, codes.Aborted, codes.ResourceExhausted, codes.Internal:
		return lock.Unreachable(what, reason(err))
	case codes.Unknown:
		if _, ok := status.FromError(err); !ok {
			// Not an answer at all: a connection that failed.
			return lock.Unreachable(what, reason(err))
		}
	case codes.Unimplemented:
		return lock.Errorf(lock.ErrRefused, "%s does not serve etcd's v3 API (%s): is it etcd 3.4 or later, on its client port?", what, reason(err))
	}
	return lock.Errorf(lock.ErrRefused, "%s refused: %s", what, reason(err))
}

// etcdError is err as rpctypes has etcd's errors, if it is one: the
// server's answer, or its words inside another error's message (a token
// that could not be fetched fails its request with gRPC's own status).
func etcdError(err error) error {
	ee := rpctypes.Error(err)
	if _, ok := ee.(rpctypes.EtcdError); ok {
		return ee
	}
	msg := err.Error()
	if i := strings.Index(msg, "etcdserver: "); i >= 0 {
		return rpctypes.Error(status.Error(codes.Unknown, strings.TrimRight(msg[i:], `"`)))
	}
	return ee
}

// passLearners is a unary interceptor that sends a request a learner
// refused on to the next member (the balancer's next pick), as the
// official client does only for etcd 3.5 and later's form of that answer:
// the learner refused it before doing anything, so even a transaction can
// be sent again.
func (b *backend) passLearners(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	for range len(b.endpoints) - 1 {
		err := invoker(ctx, method, req, reply, cc, opts...)
		if err == nil || !errors.Is(etcdError(err), errLearner) || ctx.Err() != nil {
			return err
		}
	}
	return invoker(ctx, method, req, reply, cc, opts...)
}

// errLearner is a learner's answer to a request only voting members serve.
var errLearner = rpctypes.Error(rpctypes.ErrGRPCNotSupportedForLearner)

// isStatus reports whether err is a gRPC status: the server's answer, or
// gRPC's own word about the connection.
func isStatus(err error) bool {
	_, ok := status.FromError(err)
	return ok
}

// timedOut is the error of a request that got no answer in time. The
// client waits for a connection until the request's deadline and then says
// only that time ran out; one short dial of each endpoint says why, where
// it can: none listening, or a TLS certificate that is not trusted (a
// refusal, not an outage).
func (b *backend) timedOut(what string, err error) error {
	if s, ok := status.FromError(err); ok {
		if _, after, found := strings.Cut(s.Message(), "latest balancer error: "); found {
			if r, ok := tlsReason(errors.New(after)); ok {
				return lock.Errorf(lock.ErrRefused, "%s: %s", what, r)
			}
			return lock.Unreachable(what, innermost(after))
		}
	}
	var why string
	for _, ep := range b.endpoints {
		host := ep[strings.Index(ep, "://")+3:]
		d := &net.Dialer{Timeout: time.Second}
		var c net.Conn
		var derr error
		if b.cfg.TLS != nil {
			cfg := b.cfg.TLS.Clone()
			if cfg.ServerName == "" {
				cfg.ServerName, _, _ = net.SplitHostPort(host)
			}
			c, derr = tls.DialWithDialer(d, "tcp", host, cfg)
		} else {
			c, derr = d.Dial("tcp", host)
		}
		if derr == nil {
			c.Close()
			return lock.Unreachable(what, "timed out")
		}
		if r, ok := tlsReason(derr); ok {
			return lock.Errorf(lock.ErrRefused, "%s: %s", what, r)
		}
		if why == "" {
			why = lock.Reason(derr)
		}
	}
	if why == "" {
		why = "timed out"
	}
	return lock.Unreachable(what, why)
}

// reason is what a gRPC error says, without gRPC's framing: "connection
// refused" of `rpc error: code = Unavailable desc = connection error: desc
// = "transport: Error while dialing: dial tcp 127.0.0.1:1: connect:
// connection refused"`.
func reason(err error) string {
	msg := err.Error()
	if s, ok := status.FromError(err); ok {
		msg = s.Message()
	}
	return innermost(msg)
}

// innermost is the last part of a chain of "doing: doing: why".
func innermost(msg string) string {
	msg = strings.Trim(strings.TrimSpace(msg), `"`)
	if strings.Contains(msg, "transport: Error while dialing") || strings.HasPrefix(msg, "connection error") {
		if i := strings.LastIndex(msg, ": "); i >= 0 {
			return strings.Trim(msg[i+2:], `"`)
		}
	}
	return msg
}

// tlsReason is the TLS part of an error of a failed handshake, if it is one.
func tlsReason(err error) (string, bool) {
	msg := err.Error()
	for _, p := range []string{"x509: ", "tls: "} {
		if i := strings.Index(msg, p); i >= 0 {
			return "TLS: " + strings.Trim(msg[i:], `"`), true
		}
	}
	return "", false
}
