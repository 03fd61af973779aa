package mongodb

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/withlock/withlock/internal/lock"
)

var (
	_ lock.Expiring   = (*lease)(nil)
	_ lock.Detachable = (*backend)(nil)
)

type lease struct {
	b     *backend
	name  string
	id    string // our holder id
	token int64
	last  state // the newest state we know that lists us: we write after it
}

func (l *lease) Token() int64 { return l.token }

// Keep renews the lease for another TTL from the server's now. An
// exclusive holder writes the state after its last one without reading
// first: that is the newest unless the lock was taken from it. A shared or
// semaphore holder, whose peers write too, first reads the states written
// since by _id, as a poll does. If the _id is taken, it reads on from
// there and writes after the newest. Our entry need not be live: if nobody
// wrote a state without it, nobody took the lock over.
func (l *lease) Keep(ctx context.Context) error {
	return l.extend(ctx, opRenew, l.b.opts.TTL)
}

// extend writes a state in which our lease ends ttl after the server's now,
// and reads the chain back (see the package doc).
func (l *lease) extend(ctx context.Context, op string, ttl time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, attemptTimeout)
	defer cancel()
	if l.b.opts.Mode != lock.Exclusive {
		// The other holders write too: read what they wrote since our last
		// state rather than lose the race for its successor's _id (on
		// FerretDB, a failed insert waits for SQLite's write lock as a
		// successful one does).
		if err := l.catchUp(ctx); err != nil {
			return err
		}
	}
	// Read after the state we write after (see TryAcquire).
	now, err := l.b.serverTime(ctx)
	if err != nil {
		return err
	}
	base := l.last.Seq
	limit := rounds + len(l.last.Holders)
	for round := 1; ; round++ {
		n := l.last.renewed(l.name, op, l.id, now, ttl)
		n.Base = base
		expires := n.holder(l.id).ExpiresAt
		ok, err := l.b.insert(ctx, &n)
		if err != nil {
			return err
		}
		if !ok {
			if err := l.catchUp(ctx); err != nil {
				return err
			}
		} else {
			docs, _, err := l.b.chain(ctx, l.name)
			if err != nil {
				return err
			}
			top := first(docs)
			switch {
			case top == nil:
				return l.lost(nil)
			case counts(top, l.id, expires):
				if docs[len(docs)-1].Seq == n.Seq {
					// Our insert began a chain of its own: end it, so that
					// the next client need not wait for this lease to run
					// out.
					free := top.released(l.name, opRelease, l.id)
					l.b.insert(ctx, &free)
					return lock.Errorf(lock.ErrLost, "the documents of the lock %q in %s.%s were deleted (or dropped)", l.name, l.b.dbName, Collection)
				}
				l.last = *top
				l.b.collect(ctx, l.name, docs, now)
				return nil
			case top.holder(l.id) == nil:
				return l.lost(l.why(docs))
			}
			// Our insert landed on a deleted _id, below the newest state,
			// which still lists us: write after that one.
			l.last = *top
		}
		if round >= limit {
			return lock.Errorf(lock.ErrUnavailable, "mongodb at %s: %d writes to the lock %q in a row lost the race to others", l.b.addr, round, l.name)
		}
	}
}

// catchUp makes the newest state the one to write after, once our write
// lost the race for its _id: read by _id from our last state on (advance),
// if it still lists us (another holder's write, or our own earlier one
// whose answer was lost); else the whole chain says whether we are gone
// (follow).
func (l *lease) catchUp(ctx context.Context) error {
	s, err := l.b.advance(ctx, l.name, &l.last)
	if err != nil {
		return err
	}
	if s.holder(l.id) == nil {
		return l.follow(ctx)
	}
	l.last = *s
	return nil
}

// follow reads the chain: an error wrapping ErrLost unless the newest state
// still lists us, which then becomes the state to write after.
func (l *lease) follow(ctx context.Context) error {
	docs, _, err := l.b.chain(ctx, l.name)
	if err != nil {
		return err
	}
	top := first(docs)
	if top.holder(l.id) == nil {
		if top != nil {
			top = l.why(docs)
		}
		return l.lost(top)
	}
	l.last = *top
	return nil
}

// why is the state that dropped us: the first of docs (newest first) after
// our last state without our entry; the newest if none is left.
func (l *lease) why(docs []state) *state {
	for i := len(docs) - 1; i >= 0; i-- {
		if docs[i].Seq > l.last.Seq && docs[i].holder(l.id) == nil {
			return &docs[i]
		}
	}
	return &docs[0]
}

// lost is the loss error for state s, the one that does not list us.
func (l *lease) lost(s *state) error {
	switch {
	case s == nil:
		return lock.Errorf(lock.ErrLost, "the lock %q has no documents in %s.%s any more (deleted or dropped)", l.name, l.b.dbName, Collection)
	case s.Op == opBreak && s.By != nil:
		return lock.Errorf(lock.ErrLost, "the lock was broken by withlock release --force on %s (pid %d)", s.By.Host, s.By.PID)
	case len(s.Holders) > 0:
		o := s.Holders[len(s.Holders)-1]
		return lock.Errorf(lock.ErrLost, "the lease ran out and %s (pid %d) took the lock over", o.Host, o.PID)
	}
	return lock.Errorf(lock.ErrLost, "the lock was released by someone else (%s)", s.Op)
}

// Release writes a state without our entry after the newest one, found as
// Keep finds it. No check follows: a late insert means that the lock was
// not ours anyway, and it misleads no reader.
func (l *lease) Release(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, attemptTimeout)
	defer cancel()
	notOurs := func(err error) error {
		if errors.Is(err, lock.ErrLost) {
			return lock.Errorf(lock.ErrNotOurs, "mongodb: the lock was no longer ours at release: %w", err)
		}
		return err
	}
	if l.b.opts.Mode != lock.Exclusive {
		if err := l.catchUp(ctx); err != nil { // as Keep does
			return notOurs(err)
		}
	}
	limit := rounds + len(l.last.Holders)
	for round := 1; ; round++ {
		n := l.last.released(l.name, opRelease, l.id)
		ok, err := l.b.insert(ctx, &n)
		if err != nil || ok {
			return err
		}
		if err := l.catchUp(ctx); err != nil {
			return notOurs(err)
		}
		if round >= limit {
			return lock.Errorf(lock.ErrUnavailable, "mongodb at %s: %d writes to the lock %q in a row lost the race to others", l.b.addr, round, l.name)
		}
	}
}

// ReleaseAt lets the lease run out at until (as the time left, counted by
// the server's clock) instead of releasing it now. The time left is rounded
// up to the millisecond: the server's time read is rounded down, and the
// lock must not end before until.
func (l *lease) ReleaseAt(ctx context.Context, until time.Time) error {
	left := time.Until(until)
	return l.extend(ctx, opLinger, left.Truncate(time.Millisecond)+time.Millisecond)
}

// Ticket is the lease's holder id and fencing token.
func (b *backend) Ticket(l lock.Lease) string {
	ml := l.(*lease)
	return ml.id + ":" + strconv.FormatInt(ml.token, 10)
}

// Resume takes up the lease that ticket names: the newest state of the
// chain must still list its holder id (follow), and is the one the next
// write goes after.
func (b *backend) Resume(ctx context.Context, name, ticket string) (lock.Lease, error) {
	id, token, ok := strings.Cut(ticket, ":")
	n, err := strconv.ParseInt(token, 10, 64)
	if !ok || err != nil || id == "" {
		return nil, lock.Errorf(lock.ErrUsage, "mongodb: %q is not a lease's ticket", ticket)
	}
	if err := b.connect(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, attemptTimeout)
	defer cancel()
	l := &lease{b: b, name: name, id: id, token: n}
	if err := l.follow(ctx); err != nil {
		if errors.Is(err, lock.ErrLost) {
			return nil, lock.Errorf(lock.ErrNotOurs, "mongodb: %w", err)
		}
		return nil, err
	}
	return l, nil
}
