package etcd

import (
	"context"
	"errors"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/withlock/withlock/internal/lock"
)

// Break revokes the leases of name's holders, which deletes their keys: a
// holder's next Keep finds its lease gone (ErrLost), and the waiters' turn
// comes. Revoking needs write permission on the lease's keys.
func (b *backend) Break(ctx context.Context, name string) ([]lock.Holder, error) {
	hs, st, err := b.inspect(ctx, name)
	if err != nil {
		return nil, err
	}
	for _, e := range hs {
		if err := b.revoke(ctx, clientv3.LeaseID(e.lease)); err != nil {
			if errors.Is(err, lock.ErrRefused) && strings.Contains(err.Error(), "permission denied") {
				return nil, lock.Errorf(lock.ErrRefused, "etcd at %s: permission denied to revoke the holder's lease; it needs write permission on %s", b.addr, Prefix(name))
			}
			return nil, err
		}
	}
	return st.Holders, nil
}
