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
	"strings"
	"time"

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
	opts lock.Options
	addr string // the URL's HOST:PORT list, for messages
	ttl  int64  // the lease's TTL in seconds: opts.TTL rounded up
	c    *client
	// orphans are leases of keys that were to be deleted when a wait or an
	// attempt failed, but could not be: the next attempt revokes them.
	orphans []int64
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
		if !ok || user == "" {
			return nil, lock.Errorf(lock.ErrUsage, "etcd URL: give both a user and a password (etcd://USER:PASSWORD@HOST:PORT)")
		}
		password = pw
	}
	tlsCfg, err := tlsConfig(u.Query(), secure)
	if err != nil {
		return nil, err
	}
	ttl := int64(math.Ceil(opts.TTL.Seconds()))
	return &backend{opts: opts, addr: u.Host, ttl: max(ttl, 1), c: newClient(endpoints, user, password, tlsCfg)}, nil
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

func (b *backend) Close() error {
	b.c.close()
	return nil
}

// call is a context for one request of an attempt: ctx, bounded by
// callTimeout.
func call(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, callTimeout)
}

// classify sorts an error of the client into lock's sentinels. Requests
// the server could not serve for now (no leader, timed out, too many
// requests), connections that failed, and an auth token to fetch again are
// ErrUnavailable; authentication and permission errors, a certificate we
// do not trust, and anything else the server answered are ErrRefused.
func (b *backend) classify(err error) error {
	what := "etcd at " + b.addr
	var se *serverError
	if !errors.As(err, &se) {
		return b.classifyTransport(what, err)
	}
	msg := se.msg
	switch {
	case se.foreign && se.code == codeUnavailable:
		return lock.Unreachable(what, msg)
	case se.foreign:
		return lock.Errorf(lock.ErrRefused, "%s refused: %s", what, msg)
	case se.code == codeDeadlineExceeded:
		return lock.Unreachable(what, "timed out")
	case se.code == codeCanceled:
		// Not the caller's cancellation, which ends the request on our
		// side (classifyTransport): the gateway's own gRPC connection to
		// its server was closing ("grpc: the client connection is
		// closing"), as it is while etcd stops.
		return lock.Unreachable(what, msg)
	case msg == msgGatewayCN:
		return lock.Errorf(lock.ErrRefused, "%s refused the client certificate: with client certificates and authentication on, etcd's JSON gateway (which withlock speaks) refuses every certificate that has a Common Name, as it cannot take that name as the user; use a client certificate without a Common Name and give the user in the URL (etcds://USER:PASSWORD@HOST:PORT?cert=...&key=...)", what)
	case msg == msgAuthFailed:
		return lock.Errorf(lock.ErrRefused, "%s refused the user and password: %s", what, msg)
	case msg == msgPermissionDenied:
		return lock.Errorf(lock.ErrRefused, "%s: permission denied; the user needs read and write permission on the lock's keys (NAME/)", what)
	case msg == msgInvalidToken || msg == msgAuthOldRevision:
		// The client fetches a new token for the next request.
		return lock.Errorf(lock.ErrUnavailable, "%s: %s", what, msg)
	case msg == msgLeaseNotFound:
		// The lease an attempt took ran out before the attempt could use
		// it (the network stalled for longer than the ttl in between): the
		// next attempt takes a new one. Keep and a waiter's renewal, where
		// a lease gone means a lock gone, say so before they get here.
		return lock.Errorf(lock.ErrUnavailable, "%s: the lease this attempt took ran out before it could use it (%s)", what, msg)
	case msg == msgNoSpace:
		return lock.Errorf(lock.ErrRefused, "%s is out of space (alarm NOSPACE): compact and defragment it, then disarm the alarm", what)
	case se.code == codeUnavailable:
		return lock.Unreachable(what, msg)
	case se.code == codeResourceExhausted && msg == msgTooManyRequests:
		return lock.Errorf(lock.ErrUnavailable, "%s is busy: %s", what, msg)
	case se.code == codeUnknown && !strings.HasPrefix(msg, "etcdserver:"):
		// Not the server's answer but its gateway's, about reaching the
		// server behind it.
		return lock.Unreachable(what, msg)
	}
	return lock.Errorf(lock.ErrRefused, "%s refused: %s", what, msg)
}

// classifyTransport sorts an error that is not the server's answer: the
// caller's context, TLS, and connections that failed.
func (b *backend) classifyTransport(what string, err error) error {
	var (
		verify  *tls.CertificateVerificationError
		unknown x509.UnknownAuthorityError
		invalid x509.CertificateInvalidError
		host    x509.HostnameError
		record  tls.RecordHeaderError
		alert   tls.AlertError
	)
	switch {
	case errors.Is(err, context.Canceled):
		// The caller gave up (a signal, Release cutting a Keep off): that
		// says nothing about the server.
		return fmt.Errorf("%s: %w", what, context.Canceled)
	case timedOut(err):
		return lock.Unreachable(what, "timed out")
	case errors.As(err, &verify), errors.As(err, &unknown), errors.As(err, &invalid), errors.As(err, &host),
		errors.As(err, &record), errors.As(err, &alert):
		return lock.Errorf(lock.ErrRefused, "%s: %s", what, tlsReason(err.Error()))
	case errors.Is(err, errStreamEnded), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return lock.Unreachable(what, "the server closed the connection")
	}
	return lock.Unreachable(what, transportReason(err))
}

// transportReason is the end of a transport error, for messages:
// "connection refused" of `Post "http://127.0.0.1:1/v3/lease/grant": dial
// tcp 127.0.0.1:1: connect: connection refused`.
func transportReason(err error) string {
	for {
		u := errors.Unwrap(err)
		if u == nil {
			break
		}
		err = u
	}
	return err.Error()
}

// tlsReason is the TLS part of a failed handshake's message.
func tlsReason(msg string) string {
	for _, p := range []string{"x509: ", "tls: "} {
		if i := strings.Index(msg, p); i >= 0 {
			return "TLS: " + msg[i:]
		}
	}
	return msg
}
