// Package redis is the redis:// and rediss:// backend: a lease key
// withlock:NAME holding the holder's random token, with an expiry that the
// server keeps. Every write is a script that acts only while the key still
// holds our token, so only the holder can renew or release its lease.
//
// A fencing counter withlock:NAME:fence, incremented in the same script that
// takes the lease, gives every acquisition a larger token. A release
// publishes on withlock:released:NAME, which waiters subscribe to.
//
// The keys of one name are not in one hash slot, so Redis Cluster is not
// supported; use a single server or a Sentinel-managed primary.
package redis

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/withlock/withlock/internal/lock"
)

func init() {
	lock.Register("redis", open)
	lock.Register("rediss", open)
}

// maxDial bounds one connection attempt, so that an unreachable host is
// retried and reported instead of hanging the wait.
const maxDial = 5 * time.Second

// Key names. Exported for tests and for anyone who inspects a server.
func Key(name string) string      { return "withlock:" + name }
func FenceKey(name string) string { return "withlock:" + name + ":fence" }
func Channel(name string) string  { return "withlock:released:" + name }

var (
	// acquire takes the lease if it is free and bumps the fence counter in
	// the same step. It returns the new fence, or the remaining lifetime of
	// the holder's lease (in ms, negated) when the key is taken.
	acquireScript = goredis.NewScript(`
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return redis.call('INCR', KEYS[2])
end
return -redis.call('PTTL', KEYS[1])`)

	// renew extends the lease by ARGV[2] ms if it is still ours.
	renewScript = goredis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0`)

	// release deletes the lease if it is still ours and tells the waiters.
	releaseScript = goredis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', KEYS[2], '')
  return 1
end
return 0`)
)

type backend struct {
	client *goredis.Client
	addr   string
	opts   lock.Options
}

func open(u *url.URL, opts lock.Options) (lock.Backend, error) {
	ropts, err := goredis.ParseURL(u.String())
	if err != nil {
		return nil, lock.Errorf(lock.ErrUsage, "redis URL: %v", err)
	}
	ropts.DialTimeout = min(maxDial, opts.ConnectTimeout)
	// Every command is bounded by its context: the wait and keep loops in
	// package lock decide how long to wait and when to retry.
	ropts.ContextTimeoutEnabled = true
	ropts.MaxRetries = -1
	ropts.PoolSize = 2
	ropts.ClientName = fmt.Sprintf("withlock-%d", opts.Holder.PID)
	// go-redis would send CLIENT SETINFO on every new connection; old
	// servers and some proxies refuse it.
	ropts.DisableIdentity = true
	return &backend{client: goredis.NewClient(ropts), addr: ropts.Addr, opts: opts}, nil
}

func (b *backend) Close() error { return b.client.Close() }

func (b *backend) TryAcquire(ctx context.Context, name string) (lock.Lease, error) {
	token := lock.NewToken()
	ttl := b.opts.TTL.Milliseconds()
	n, err := acquireScript.Run(ctx, b.client, []string{Key(name), FenceKey(name)}, token, ttl).Int64()
	if err != nil {
		return nil, b.classify(err)
	}
	if n <= 0 {
		// -PTTL: -1 would be a key without expiry, which no withlock writes.
		return nil, lock.HeldFor(time.Duration(-n) * time.Millisecond)
	}
	return &lease{b: b, name: name, token: token, fence: n}, nil
}

// Notify subscribes to the name's release channel.
func (b *backend) Notify(ctx context.Context, name string) (<-chan struct{}, func(), error) {
	sub := b.client.Subscribe(ctx, Channel(name))
	if _, err := sub.Receive(ctx); err != nil {
		sub.Close()
		return nil, nil, b.classify(err)
	}
	released := make(chan struct{}, 1)
	stop := make(chan struct{})
	go func() {
		msgs := sub.Channel()
		for {
			select {
			case <-stop:
				return
			case _, ok := <-msgs:
				if !ok {
					return
				}
				select {
				case released <- struct{}{}:
				default: // one pending wake-up is enough
				}
			}
		}
	}()
	return released, func() { close(stop); sub.Close() }, nil
}

// classify sorts a go-redis error into lock's sentinels.
func (b *backend) classify(err error) error {
	msg := err.Error()
	switch {
	case strings.HasPrefix(msg, "NOAUTH"), strings.HasPrefix(msg, "WRONGPASS"),
		strings.HasPrefix(msg, "NOPERM"), strings.Contains(msg, "invalid password"),
		strings.Contains(msg, "invalid username-password"):
		return lock.Errorf(lock.ErrRefused, "redis at %s refused: %s", b.addr, msg)
	case strings.Contains(msg, "tls:"), strings.Contains(msg, "x509"):
		return lock.Errorf(lock.ErrRefused, "redis at %s: %s", b.addr, msg)
	}
	return lock.Errorf(lock.ErrUnavailable, "cannot reach redis at %s (%s)", b.addr, lock.Reason(err))
}

type lease struct {
	b     *backend
	name  string
	token string
	fence int64
}

func (l *lease) Token() int64 { return l.fence }

// Keep renews the lease for another TTL, judged by the server's clock.
func (l *lease) Keep(ctx context.Context) error {
	n, err := renewScript.Run(ctx, l.b.client, []string{Key(l.name)}, l.token, l.b.opts.TTL.Milliseconds()).Int64()
	if err != nil {
		return l.b.classify(err)
	}
	if n == 0 {
		return lock.Errorf(lock.ErrLost, "the lease key %s expired, was deleted or was taken by another holder", Key(l.name))
	}
	return nil
}

func (l *lease) Release(ctx context.Context) error {
	n, err := releaseScript.Run(ctx, l.b.client, []string{Key(l.name), Channel(l.name)}, l.token).Int64()
	if err != nil {
		return l.b.classify(err)
	}
	if n == 0 {
		return errors.New("redis: the lease was no longer ours at release")
	}
	return nil
}

// ReleaseAt lets the lease run out at until instead of deleting it now. The
// server's clock decides, so the time left is sent, not the time of day.
func (l *lease) ReleaseAt(ctx context.Context, until time.Time) error {
	left := time.Until(until)
	if left < time.Millisecond {
		return l.Release(ctx)
	}
	n, err := renewScript.Run(ctx, l.b.client, []string{Key(l.name)}, l.token, left.Milliseconds()).Int64()
	if err != nil {
		return l.b.classify(err)
	}
	if n == 0 {
		return errors.New("redis: the lease was no longer ours at release")
	}
	return nil
}
