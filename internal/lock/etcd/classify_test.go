package etcd

import (
	"context"
	"errors"
	"strings"
	"testing"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/withlock/withlock/internal/lock"
)

// The official client's errors are sorted into lock's sentinels: what the
// server or the connection could not do for now is worth retrying; a
// refusal of the user, its rights or the request is not.
func TestClassify(t *testing.T) {
	b := &backend{addr: "127.0.0.1:2379", endpoints: []string{"http://127.0.0.1:2379"}}
	for _, tc := range []struct {
		err  error
		want error
		says string
	}{
		{rpctypes.ErrGRPCAuthFailed, lock.ErrRefused, "refused the user and password"},
		{rpctypes.ErrGRPCPermissionDenied, lock.ErrRefused, "permission denied"},
		{rpctypes.ErrGRPCUserEmpty, lock.ErrRefused, "no user was given"},
		{rpctypes.ErrGRPCInvalidAuthToken, lock.ErrUnavailable, "invalid auth token"},
		{rpctypes.ErrGRPCAuthOldRevision, lock.ErrUnavailable, "revision of auth store is old"},
		// A lease that ran out between an attempt's grant and its put
		// (seen under make stress's black-holes) is an outage to retry.
		{rpctypes.ErrGRPCLeaseNotFound, lock.ErrUnavailable, "ran out before it could use it"},
		{rpctypes.ErrGRPCNoLeader, lock.ErrUnavailable, "no leader"},
		{rpctypes.ErrGRPCTimeout, lock.ErrUnavailable, "request timed out"},
		{rpctypes.ErrGRPCRequestTooManyRequests, lock.ErrUnavailable, "busy"},
		{rpctypes.ErrGRPCNoSpace, lock.ErrRefused, "out of space"},
		{rpctypes.ErrGRPCNotSupportedForLearner, lock.ErrRefused, "learner"},
		{status.Error(codes.Unknown, "context deadline exceeded"), lock.ErrUnavailable, "(timed out)"},
		{rpctypes.ErrGRPCEmptyKey, lock.ErrRefused, "key is not provided"},
		{status.Error(codes.Unavailable, `connection error: desc = "transport: Error while dialing: dial tcp 127.0.0.1:1: connect: connection refused"`), lock.ErrUnavailable, "(connection refused)"},
		{status.Error(codes.Unavailable, "error reading from server: EOF"), lock.ErrUnavailable, "EOF"},
		{status.Error(codes.DeadlineExceeded, `latest balancer error: connection error: desc = "transport: Error while dialing: dial tcp 127.0.0.1:1: connect: connection refused"`), lock.ErrUnavailable, "(connection refused)"},
		{status.Error(codes.Unavailable, `connection error: desc = "transport: authentication handshake failed: tls: failed to verify certificate: x509: certificate signed by unknown authority"`), lock.ErrRefused, "TLS: x509: certificate signed by unknown authority"},
		// A token that could not be fetched fails its request with the
		// answer to the request for it, where gRPC allows its code, or
		// with Internal and the answer in its message.
		{status.Error(codes.Unavailable, "etcdserver: leader changed"), lock.ErrUnavailable, "leader changed"},
		{status.Error(codes.Internal, "transport: received per-RPC creds error with illegal status: rpc error: code = InvalidArgument desc = etcdserver: authentication failed, invalid user ID or password"), lock.ErrRefused, "refused the user and password"},
		{status.Error(codes.Unimplemented, "unknown service etcdserverpb.KV"), lock.ErrRefused, "does not serve etcd's v3 API"},
	} {
		got := b.classify(tc.err)
		if !errors.Is(got, tc.want) || !strings.Contains(got.Error(), tc.says) {
			t.Errorf("%v: %v; want %v saying %q", tc.err, got, tc.want, tc.says)
		}
	}
	// With several members, a learner's answer is worth sending on to
	// another.
	several := &backend{addr: "a:2379,b:2379", endpoints: []string{"http://a:2379", "http://b:2379"}}
	if got := several.classify(rpctypes.ErrGRPCNotSupportedForLearner); !errors.Is(got, lock.ErrUnavailable) {
		t.Errorf("a learner's answer, several endpoints: %v; want ErrUnavailable", got)
	}
	// An error sorted already (the connection's) is kept as it is, not
	// wrapped in its own words again.
	sorted := lock.Unreachable("etcd at 127.0.0.1:2379", "connection refused")
	if got := b.classify(sorted); got != sorted {
		t.Errorf("classify(%v) = %v; want it unchanged", sorted, got)
	}
	// The caller's own cancellation says nothing about the server.
	if got := b.classify(context.Canceled); !errors.Is(got, context.Canceled) || errors.Is(got, lock.ErrUnavailable) {
		t.Errorf("classify(context.Canceled) = %v; want context.Canceled alone", got)
	}
}
