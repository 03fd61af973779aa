package etcd

import (
	"context"

	"github.com/withlock/withlock/internal/lock"
)

// Break revokes the leases of name's holders, which deletes their keys: a
// holder's next Keep finds its lease gone (ErrLost), and the waiters' turn
// comes. Revoking needs write permission on the lease's keys.
func (b *backend) Break(ctx context.Context, name string) ([]lock.Holder, error) {
	c := b.c
	hs, st, err := b.inspect(ctx, c, name)
	if err != nil {
		return nil, err
	}
	for _, e := range hs {
		if err := c.revoke(ctx, e.lease); err != nil && !is(err, msgLeaseNotFound) {
			if is(err, msgPermissionDenied) {
				return nil, lock.Errorf(lock.ErrRefused, "etcd at %s: permission denied to revoke the holder's lease; it needs write permission on %s", b.addr, Prefix(name))
			}
			return nil, b.classify(err)
		}
	}
	return st.Holders, nil
}
