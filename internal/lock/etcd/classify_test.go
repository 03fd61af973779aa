package etcd

import (
	"errors"
	"testing"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"

	"github.com/withlock/withlock/internal/lock"
)

// A lease that ran out between an attempt's grant and its put (seen under
// make stress's black-holes) is an outage to retry, not a refusal (69).
func TestLeaseNotFoundIsRetried(t *testing.T) {
	b := &backend{addr: "127.0.0.1:2379"}
	for _, err := range []error{rpctypes.ErrLeaseNotFound, rpctypes.ErrGRPCLeaseNotFound} {
		if got := b.classify(err); !errors.Is(got, lock.ErrUnavailable) || errors.Is(got, lock.ErrRefused) {
			t.Errorf("classify(%v) = %v; want ErrUnavailable", err, got)
		}
	}
}
