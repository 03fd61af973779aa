package redis

import (
	"context"
	"strconv"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/withlock/withlock/internal/lock"
)

var (
	_ lock.Expiring   = (*lease)(nil)
	_ lock.Detachable = (*backend)(nil)
)

type lease struct {
	b     *backend
	name  string
	token string
	fence int64
}

func (l *lease) Token() int64 { return l.fence }

// Keep renews the lease for another TTL, judged by the server's clock. With
// wait_replicas, a renewal counts only once the replicas have it.
func (l *lease) Keep(ctx context.Context) error {
	cmd, acks, err := l.b.run(ctx, renewScript, []string{Key(l.name)}, l.token, l.b.opts.TTL.Milliseconds())
	if err != nil {
		if goredis.HasErrorPrefix(err, "READONLY") {
			return lock.Errorf(lock.ErrLost, "redis at %s became a replica (a failover?), where the lease can no longer be renewed", l.b.addr)
		}
		return l.b.classifyIn(err, renewScript, Key(l.name))
	}
	if err := l.renewed(cmd.Val()); err != nil {
		return err
	}
	if acks >= 0 && acks < int64(l.b.waitReplicas) {
		return lock.Errorf(lock.ErrUnavailable, "redis at %s: %d of the %d replicas that wait_replicas asks for acknowledged the renewal", l.b.addr, acks, l.b.waitReplicas)
	}
	return nil
}

// Release deletes this holder's place. It frees the lock even when the user
// may not publish the release to the waiters: they poll.
func (l *lease) Release(ctx context.Context) error {
	reply, err := releaseScript.get().Run(ctx, l.b.client, []string{Key(l.name), Channel(l.name)}, l.token, l.b.publish()).Result()
	if err != nil {
		return l.b.classifyIn(err, releaseScript, Key(l.name), Channel(l.name))
	}
	switch r := reply.(type) {
	case int64:
		if r == 0 {
			return lock.Errorf(lock.ErrNotOurs, "redis: the lease was no longer ours at release")
		}
		return nil
	case []any:
		if len(r) == 2 && r[0] == int64(2) {
			l.b.opts.Log.Debug("released; the waiters were not told, and find out at their next poll", "lock", l.name, "publish", r[1])
			return nil
		}
	}
	return l.b.unexpected("release", reply)
}

// ReleaseAt lets the lease run out at until instead of deleting it now. The
// server's clock decides, so the time left is sent, not the time of day.
func (l *lease) ReleaseAt(ctx context.Context, until time.Time) error {
	left := time.Until(until)
	reply, err := renewScript.get().Run(ctx, l.b.client, []string{Key(l.name)}, l.token, left.Milliseconds()).Result()
	if err != nil {
		return l.b.classifyIn(err, renewScript, Key(l.name))
	}
	if err := l.renewed(reply); err != nil {
		return lock.Errorf(lock.ErrNotOurs, "redis: the lease was no longer ours at release: %v", err)
	}
	return nil
}

// renewed sorts the reply of the renew script: nil when it renewed,
// ErrLost when the lease is no longer ours, saying why it may be gone.
func (l *lease) renewed(reply any) error {
	switch r := reply.(type) {
	case int64:
		switch r {
		case 1:
			return nil
		case -1:
			return lock.Errorf(lock.ErrLost, "redis at %s became a replica (a failover?), where the lease can no longer be renewed", l.b.addr)
		}
	case []any:
		if len(r) == 2 {
			// An evicted lease is one that another may have taken.
			return lock.Errorf(lock.ErrLost, "the lease key %s is gone: redis at %s evicts keys when full (maxmemory-policy %v), which may be why; set noeviction", Key(l.name), l.b.addr, r[1])
		}
		if len(r) == 1 {
			return lock.Errorf(lock.ErrLost, "the lease key %s expired, was deleted or was taken by another holder", Key(l.name))
		}
	}
	return l.b.unexpected("renew", reply)
}

// Ticket is the lease's holder token and fencing token.
func (b *backend) Ticket(l lock.Lease) string {
	rl := l.(*lease)
	return rl.token + ":" + strconv.FormatInt(rl.fence, 10)
}

// Resume takes up the lease that ticket names. The renew and release
// scripts check the holder token, so nothing is read here.
func (b *backend) Resume(ctx context.Context, name, ticket string) (lock.Lease, error) {
	token, fence, ok := strings.Cut(ticket, ":")
	n, err := strconv.ParseInt(fence, 10, 64)
	if !ok || err != nil || token == "" {
		return nil, lock.Errorf(lock.ErrUsage, "redis: %q is not a lease's ticket", ticket)
	}
	if err := b.connect(ctx); err != nil {
		return nil, err
	}
	return &lease{b: b, name: name, token: token, fence: n}, nil
}
