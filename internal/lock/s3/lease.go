package s3

import (
	"context"
	"strings"
	"time"

	"github.com/withlock/withlock/internal/lock"
)

var (
	_ lock.Expiring   = (*lease)(nil)
	_ lock.Detachable = (*backend)(nil)
)

// lease is a lock object we hold: rec and etag are what our last write
// left.
type lease struct {
	b    *backend
	name string
	key  string
	rec  record
	etag string
	sent time.Time // when the write that took the object was sent
	// token is rec.Token, which no write of the acquisition changes, kept
	// apart: Token is read while Keep writes rec.
	token int64
}

// Token is the fencing token of the acquisition.
func (l *lease) Token() int64 { return l.token }

// Keep renews the lease: the record written again with one more renewal,
// conditional on the ETag of our last write.
func (l *lease) Keep(ctx context.Context) error {
	_, err := l.write(ctx, l.renewal(l.b.opts.TTL), lock.ErrLost)
	return err
}

// renewal is our record written again, one renewal on, with the lease
// ttl from when the store records it.
func (l *lease) renewal(ttl time.Duration) record {
	next := l.rec
	next.Renewals++
	next.TTLMillis = max(ttl.Milliseconds(), 1)
	return next
}

// write writes next over our last write. A failed condition is lost (an
// error wrapping lost) unless the object is still ours: then a write of
// ours whose answer never came had landed; the object as it is now is
// adopted, so that the next write goes on its ETag, and the error wraps
// ErrUnavailable.
func (l *lease) write(ctx context.Context, next record, lost error) (adopted bool, err error) {
	etag, err := l.b.put(ctx, l.key, next, condition{ifMatch: l.etag})
	switch {
	case err == nil:
		l.rec, l.etag = next, etag
		return false, nil
	case !failed(err):
		return false, l.b.classify(err, "s3:PutObject")
	}
	cur, err := l.b.get(ctx, l.key)
	switch {
	case err != nil:
		return false, err
	case !cur.exists:
		return false, lock.Errorf(lost, "its object %s was deleted", l.key)
	case cur.rec.State == held && cur.rec.Owner == l.rec.Owner:
		l.rec, l.etag = cur.rec, cur.etag
		return true, lock.Errorf(lock.ErrUnavailable, "%s: its object %s changed under a write of its own whose answer was lost; writing again", l.b.where, l.key)
	case cur.rec.State == free:
		return false, lock.Errorf(lost, "its object %s was released by someone else (withlock release --force?)", l.key)
	}
	return false, lock.Errorf(lost, "its object %s was taken over by %s (pid %d)", l.key, cur.rec.Host, cur.rec.PID)
}

// Release writes a free body over our last write, and once more over a
// write of ours that landed though its answer was lost.
func (l *lease) Release(ctx context.Context) error {
	adopted, err := l.write(ctx, l.rec.freed(), lock.ErrNotOurs)
	if adopted {
		_, err = l.write(ctx, l.rec.freed(), lock.ErrNotOurs)
	}
	return err
}

// ReleaseAt lets the lease run out at until instead of now: one more
// renewal whose ttl is until less the moment it is sent. The store records
// the write after it was sent, so no contender takes the object before
// until; one can take it by until plus a second and what the write took to
// arrive.
func (l *lease) ReleaseAt(ctx context.Context, until time.Time) error {
	adopted, err := l.write(ctx, l.renewal(time.Until(until)+time.Millisecond), lock.ErrNotOurs)
	if adopted {
		_, err = l.write(ctx, l.renewal(time.Until(until)+time.Millisecond), lock.ErrNotOurs)
	}
	return err
}

// Ticket is the owner id of the acquisition and its object's key.
func (b *backend) Ticket(l lock.Lease) string {
	sl := l.(*lease)
	return sl.rec.Owner + " " + sl.key
}

// Resume takes up the lease that ticket names: its object must still be
// held by the ticket's owner. Its writes are conditional on the ETag read
// here.
func (b *backend) Resume(ctx context.Context, name, ticket string) (lock.Lease, error) {
	owner, key, ok := strings.Cut(ticket, " ")
	if !ok || owner == "" || key == "" {
		return nil, lock.Errorf(lock.ErrUsage, "s3: %q is not a lease's ticket", ticket)
	}
	o, err := b.get(ctx, key)
	switch {
	case err != nil:
		return nil, err
	case !o.exists:
		return nil, lock.Errorf(lock.ErrNotOurs, "s3: the object %s was deleted", key)
	case o.rec.State != held || o.rec.Owner != owner:
		return nil, lock.Errorf(lock.ErrNotOurs, "s3: the object %s is no longer held by this lease", key)
	}
	if _, left, ok := o.expiry(); ok && left <= 0 {
		return nil, lock.Errorf(lock.ErrNotOurs, "s3: the lease on %s ran out", key)
	}
	return &lease{b: b, name: name, key: key, rec: o.rec, etag: o.etag, sent: time.Now(), token: o.rec.Token}, nil
}
