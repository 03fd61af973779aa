package etcd

import (
	"context"
	"errors"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/withlock/withlock/internal/lock"
)

// listPage is how many keys List reads at a time.
const listPage = 1000

// Inspect reads name's queue and returns the keys that hold the lock.
func (b *backend) Inspect(ctx context.Context, name string) (lock.State, error) {
	_, st, err := b.inspect(ctx, name)
	return st, err
}

func (b *backend) inspect(ctx context.Context, name string) ([]entry, lock.State, error) {
	c, err := b.conn(ctx)
	if err != nil {
		return nil, lock.State{}, err
	}
	resp, err := c.Get(ctx, Prefix(name), queueOpts()...)
	if err != nil {
		return nil, lock.State{}, b.classify(err)
	}
	hs := holders(name, queue(name, resp.Kvs))
	st := lock.State{Name: name}
	if len(hs) == 0 {
		return nil, st, nil
	}
	st.Mode = hs[0].mode()
	if st.Mode == lock.Semaphore {
		st.MaxHolders = hs[0].rec.MaxHolders
	}
	for _, e := range hs {
		h, err := b.holder(ctx, c, e)
		if err != nil {
			return nil, lock.State{}, err
		}
		st.Holders = append(st.Holders, h)
	}
	return hs, st, nil
}

// holder is what the key e records, and when its lease runs out by the
// server's count of the seconds it has left.
func (b *backend) holder(ctx context.Context, c *clientv3.Client, e entry) (lock.Holder, error) {
	h := lock.Holder{Token: e.rev}
	if r := e.rec; r != nil {
		h.Host, h.PID, h.Command, h.AcquiredAt = r.Host, r.PID, r.Command, r.AcquiredAt
	}
	resp, err := c.TimeToLive(ctx, clientv3.LeaseID(e.lease))
	if err != nil {
		return lock.Holder{}, b.classify(err)
	}
	if resp.TTL >= 0 {
		h.ExpiresAt = time.Now().Add(time.Duration(resp.TTL) * time.Second).Truncate(time.Second)
	}
	return h, nil
}

// List reads the whole key space, keys only, a page at a time at one
// revision, and returns the state of every name that has lock keys (those
// of etcdctl lock and etcd elections too: they are the same recipe) and a
// holder.
func (b *backend) List(ctx context.Context) ([]lock.State, error) {
	c, err := b.conn(ctx)
	if err != nil {
		return nil, err
	}
	var names []string
	seen := map[string]bool{}
	from, rev := "\x00", int64(0)
	for {
		resp, err := c.Get(ctx, from, clientv3.WithFromKey(), clientv3.WithKeysOnly(), clientv3.WithLimit(listPage), clientv3.WithRev(rev))
		if err != nil {
			if errors.Is(rpctypes.Error(err), rpctypes.ErrPermissionDenied) {
				return nil, lock.Errorf(lock.ErrRefused, "etcd at %s: permission denied; withlock status without NAME reads every key (keys only), which needs read permission on the whole key space; name the lock instead", b.addr)
			}
			return nil, b.classify(err)
		}
		rev = resp.Header.Revision
		for _, kv := range resp.Kvs {
			k := string(kv.Key)
			i := strings.LastIndexByte(k, '/')
			// A keys-only read does not say whether a key has a lease
			// (etcd 3.7 leaves it out): a key that looks like a lock key
			// names a lock to look at, and inspect, which reads the
			// leases, tells.
			if i < 0 || !lockID(k[i+1:]) || seen[k[:i]] {
				continue
			}
			seen[k[:i]] = true
			names = append(names, k[:i])
		}
		if !resp.More || len(resp.Kvs) == 0 {
			break
		}
		from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
	var all []lock.State
	for _, name := range names {
		_, st, err := b.inspect(ctx, name)
		if err != nil {
			return nil, err
		}
		if len(st.Holders) == 0 {
			continue
		}
		if lock.CheckName(name) != nil {
			// Not a name withlock could take: say where it is instead.
			st.Name, st.Key = "", Prefix(name)
		}
		all = append(all, st)
	}
	return all, nil
}
