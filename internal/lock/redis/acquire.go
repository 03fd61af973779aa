package redis

import (
	"context"
	"fmt"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/withlock/withlock/internal/lock"
)

var _ lock.Notifier = (*backend)(nil)

// markTTL is how long an exclusive waiter's mark keeps new shared and
// semaphore holders out. The waiter sets it again at each attempt, and a
// waiter that is notified of releases still polls (lock.Notifier), so the
// mark lasts as long as the waiter keeps trying; the mark of a waiter that
// was killed outright ends by itself this soon.
const markTTL = 3 * time.Second

// TryAcquire takes a place among name's holders in the client's mode: the
// only place for an exclusive lock, one of any number for a shared one, one
// of N for a semaphore.
func (b *backend) TryAcquire(ctx context.Context, name string) (lock.Lease, error) {
	if err := b.connect(ctx); err != nil {
		return nil, err
	}
	token := lock.NewToken()
	// Only a waiter marks: a --no-wait attempt gives up at once, and its
	// mark would only keep shared holders out for nothing.
	var mark int64
	if !b.opts.NoWait {
		mark = markTTL.Milliseconds()
	}
	keys := []string{Key(name), FenceKey(name), b.freshKey(name), WriterKey(name)}
	cmd, acks, err := b.run(ctx, acquireScript, keys,
		token, b.opts.TTL.Milliseconds(), string(b.opts.Mode), b.opts.MaxHolders, b.record, b.id, mark)
	if err != nil {
		if cmd.Err() == nil {
			// The lease may be ours but WAIT did not answer: give it back
			// if the connection still lets us.
			releaseScript.get().Run(ctx, b.client, []string{Key(name), Channel(name)}, token, b.publish())
		}
		return nil, b.classifyIn(err, acquireScript, keys...)
	}
	reply, err := cmd.Slice()
	if err != nil || len(reply) < 2 {
		return nil, lock.Errorf(lock.ErrRefused, "redis at %s: unexpected reply %v to the acquire script", b.addr, reply)
	}
	code, _ := reply[0].(int64)
	switch code {
	case replyAcquired:
		if b.marked == name {
			b.marked = "" // the script cleared our mark
		}
		fence, _ := reply[1].(int64)
		l := &lease{b: b, name: name, token: token, fence: fence}
		if acks >= 0 && acks < int64(b.waitReplicas) {
			l.Release(ctx)
			return nil, lock.Errorf(lock.ErrUnavailable, "redis at %s: %d of the %d replicas that wait_replicas asks for acknowledged the lock within %s; it was given back",
				b.addr, acks, b.waitReplicas, b.waitTimeout(ctx).Round(time.Millisecond))
		}
		return l, nil
	case replyHeld:
		left, _ := reply[1].(int64)
		if len(reply) > 2 && reply[2] == int64(1) {
			b.marked = name
		}
		return nil, lock.HeldFor(time.Duration(left) * time.Millisecond)
	case replyOtherN:
		n, _ := reply[1].(int64)
		return nil, lock.Errorf(lock.ErrUsage, "%q is a semaphore of %d (--max-holders %d); this holder asked for %d", name, n, n, b.opts.MaxHolders)
	case replyForeign:
		kind, _ := reply[1].(string)
		var pttl int64 = -1
		if len(reply) > 2 {
			pttl, _ = reply[2].(int64)
		}
		switch {
		case kind == "string" && pttl >= 0:
			// The lease of a withlock from before shared locks, which kept
			// an exclusive holder's token in a string.
			return nil, lock.HeldFor(time.Duration(pttl) * time.Millisecond)
		case kind == "string":
			// No withlock writes a key without expiry: someone else's. It
			// is never freed by expiry, so no early retry.
			return nil, lock.Errorf(lock.ErrHeld, "redis at %s: %s exists without an expiry; it is not a withlock lease", b.addr, Key(name))
		}
		return nil, lock.Errorf(lock.ErrHeld, "redis at %s: %s is a %s, not a withlock lock; it counts as held until someone deletes it", b.addr, Key(name), kind)
	case replyTooYoung:
		wait, _ := reply[1].(int64)
		var up int64
		if len(reply) > 2 {
			up, _ = reply[2].(int64)
		}
		return nil, b.tooYoung(name, time.Duration(up)*time.Second, time.Duration(wait)*time.Millisecond)
	case replyReplica:
		role, _ := reply[1].(string)
		if b.sentinel {
			return nil, b.demoted("role:" + role)
		}
		return nil, lock.Unsafe(fmt.Sprintf("redis at %s is a replica (role:%s), where a lock excludes nobody", b.addr, role), "point withlock at the primary")
	}
	return nil, lock.Errorf(lock.ErrRefused, "redis at %s: unexpected reply %v to the acquire script", b.addr, reply)
}

// tooYoung is the error of an attempt on a server that started less than
// ttl ago. It matches lock.ErrUnsettled (and so lock.ErrHeld), with wait
// as its Remaining.
func (b *backend) tooYoung(name string, uptime, wait time.Duration) error {
	if !b.saidTooYoung {
		b.saidTooYoung = true
		b.opts.Log.Debug("redis has been up for less than the ttl and may have lost a lease still in use; waiting until its uptime reaches the ttl",
			"lock", name, "addr", b.addr, "uptime", uptime, "ttl", b.opts.TTL, "wait", wait)
	}
	return unsettledError{
		msg: fmt.Sprintf("redis at %s has been up for %s, less than --ttl (%s), so it may have lost a lease still in use; locks can be taken there in %s",
			b.addr, uptime, b.opts.TTL, wait.Round(100*time.Millisecond)),
		remaining: wait,
	}
}

// unsettledError is ErrUnsettled with the time until the server can be
// trusted (Remaining, as lock.ErrUnsettled names it).
type unsettledError struct {
	msg       string
	remaining time.Duration
}

func (e unsettledError) Error() string            { return e.msg }
func (e unsettledError) Unwrap() error            { return lock.ErrUnsettled }
func (e unsettledError) Remaining() time.Duration { return e.remaining }

// Notify subscribes to the name's release channel: in a cluster, as a
// sharded channel, on the master of the name's slot.
func (b *backend) Notify(ctx context.Context, name string) (<-chan struct{}, func(), error) {
	if err := b.connect(ctx); err != nil {
		return nil, nil, err
	}
	var sub *goredis.PubSub
	if b.cluster != nil {
		sub = b.cluster.SSubscribe(ctx, Channel(name))
	} else {
		sub = b.client.Subscribe(ctx, Channel(name))
	}
	if _, err := sub.Receive(ctx); err != nil {
		sub.Close()
		return nil, nil, b.classifyIn(err, nil, Channel(name))
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
