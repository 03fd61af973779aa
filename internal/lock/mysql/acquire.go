package mysql

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/withlock/withlock/internal/lock"
)

var _ lock.Waiter = (*backend)(nil)

// waitSeconds is how long one server-side wait (Waiter.Acquire) for an
// exclusive lock lasts; a wait that runs out returns ErrHeld, as a lock
// found held does. The socket gives up waitSlack later: by then the server
// or the network is gone.
//
// slotWaitSeconds is the same for a semaphore, whose waiter waits in one
// slot only: a slot freed while nobody waits in it is found by the next
// attempt, so this bounds the hand-off to about a second (docs/behaviour.md,
// Acquiring: a waiter learns promptly that the lock is free). It is
// whole seconds because MySQL reads GET_LOCK's timeout as an integer
// (MariaDB would take 0.5).
const (
	waitSeconds     = 30
	slotWaitSeconds = 1
	waitSlack       = 10 * time.Second
)

// cancelWait bounds how long a cancelled wait waits for the server to act
// on KILL QUERY before the connection is cut.
const cancelWait = time.Second

// lockSQL takes the first free slot of those in order (slot numbers; their
// keys are its first parameters, in that order), waiting up to the seconds
// of the parameter that follows them for the last (the others: not at all),
// in the same statement that checks that the server is not read-only, so
// that a replica's GET_LOCK is not even tried: a replica grants it, but
// only on itself. read_only covers super_read_only (which sets it), and
// innodb_read_only is how Aurora's readers say that they are readers.
// Columns: the connection's id, read-only, the slot number taken (NULL:
// read-only, nothing tried; -1: none free).
//
// The statement after it, in the same packet, sets the session's
// wait_timeout to the ttl, so that a silent holder's session ends (the
// server-side bound of docs/mysql.md), and the holder's record; it runs
// after GET_LOCK returns, so @withlock_at is when the lock was granted.
// Then recheck (detectSQL or readOnlySQL) reads the server again, after
// the grant and still in the same round trip: a wait can end in a grant
// on a server that meanwhile became read-only (a failover demoted it) or
// joined a Galera cluster, and that lock must not be used.
func lockSQL(order []int, recheck string) string {
	var s strings.Builder
	s.WriteString("SELECT CONNECTION_ID(), @@global.read_only OR @@global.innodb_read_only,\n")
	s.WriteString("  CASE WHEN @@global.read_only OR @@global.innodb_read_only THEN NULL")
	for j, i := range order {
		if j == len(order)-1 {
			fmt.Fprintf(&s, "\n  WHEN GET_LOCK(?, ?) THEN %d", i)
		} else {
			fmt.Fprintf(&s, "\n  WHEN GET_LOCK(?, 0) THEN %d", i)
		}
	}
	s.WriteString("\n  ELSE -1 END;\nSET SESSION wait_timeout = ?, @withlock = ?, @withlock_at = UTC_TIMESTAMP(6);\n")
	s.WriteString(recheck)
	return s.String()
}

// take makes one attempt to take a slot, trying them in order 0 to n-1,
// except that slot last is tried last, and waited for up to wait seconds.
func (b *backend) take(ctx context.Context, name string, wait, last int) (*lease, bool, error) {
	if err := b.connect(ctx); err != nil {
		return nil, false, err
	}
	order := make([]int, 0, b.n)
	for i := range b.n {
		if i != last {
			order = append(order, i)
		}
	}
	order = append(order, last)
	args := make([]any, 0, b.n+3)
	for _, i := range order {
		args = append(args, SlotKey(name, i))
	}
	args = append(args, wait, sessionTimeout(b.opts.TTL), b.recordFor(name))
	var (
		id       int64
		readOnly bool
		slot     sql.NullInt64
		server   Server
	)
	qctx := ctx
	if wait > 0 {
		// The wait's own bound; ctx's end is KILL QUERY's business (see
		// Acquire).
		var cancel context.CancelFunc
		qctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), time.Duration(wait)*time.Second+waitSlack)
		defer cancel()
	}
	read := func(rows *sql.Rows) (err error) {
		server, err = readServer(rows, false)
		return err
	}
	full := b.recheckSQL() == detectSQL
	err := b.queryRow(qctx, lockSQL(order, b.recheckSQL()), args, read, &id, &readOnly, &slot)
	if err != nil {
		err = b.failed(qctx, err)
		// A statement after GET_LOCK may have failed: the session may hold
		// a slot that nobody will use. Closing it releases that.
		b.drop()
		return nil, false, err
	}
	b.id = id
	server.ReadOnly = server.ReadOnly || readOnly
	if full {
		b.server = &server
	}
	if err := server.Refusal(b.addr); err != nil {
		// Granted or not, nothing of it may be used. A slot granted is
		// given back at once, so that the next client is not refused for
		// a lock that the server frees only once it has ended the session;
		// closing the session releases it anyway.
		if slot.Valid && slot.Int64 >= 0 {
			var released sql.NullInt64
			b.queryRow(ctx, "SELECT RELEASE_LOCK(?)", []any{SlotKey(name, int(slot.Int64))}, nil, &released)
		}
		b.drop()
		return nil, false, err
	}
	if slot.Int64 < 0 {
		return nil, false, nil
	}
	if w := server.Warning(b.addr); w != "" && !b.warned {
		b.warned = true
		b.opts.Log.Warn(w)
	}
	i := int(slot.Int64)
	return &lease{b: b, key: SlotKey(name, i), slot: i}, true, nil
}

// recordFor is the holder's record with the lock's name.
func (b *backend) recordFor(name string) string {
	r := b.holder
	r.Name = name
	rec, _ := json.Marshal(r)
	return string(rec)
}

// sessionTimeout is wait_timeout for a ttl: whole seconds, rounded up.
func sessionTimeout(ttl time.Duration) int64 {
	return int64((ttl + time.Second - 1) / time.Second)
}

func (b *backend) TryAcquire(ctx context.Context, name string) (lock.Lease, error) {
	l, ok, err := b.take(ctx, name, 0, b.n-1)
	switch {
	case err != nil:
		return nil, err
	case !ok:
		return nil, lock.ErrHeld
	}
	return l, nil
}

// Acquire waits in GET_LOCK on the server, which hands the lock over the
// moment its holder lets go, for up to waitSeconds (then ErrHeld: the
// caller asks again). A semaphore's waiter first tries every slot, then
// waits in one chosen at random for up to slotWaitSeconds: waiters spread
// over the slots, and one of them is handed a slot the moment it frees.
// When ctx ends first, a second connection sends KILL QUERY, so that the
// wait leaves the server's queue at once; if the lock was granted
// meanwhile, or the server does not answer, the connection is closed,
// which releases it.
// The session holds the lock from the grant on, and the grant's answer has
// just arrived: the lock's life counts from then.
func (b *backend) Acquire(ctx context.Context, name string) (lock.Lease, time.Time, error) {
	l, err := b.wait(ctx, name)
	return l, time.Now(), err
}

func (b *backend) wait(ctx context.Context, name string) (lock.Lease, error) {
	wait, last := waitSeconds, 0
	if b.n > 1 {
		wait, last = slotWaitSeconds, rand.N(b.n)
	}
	if b.id == 0 {
		// A new connection: its id, which KILL QUERY needs, comes from a
		// first attempt (which may take the lock at once).
		if l, err := b.TryAcquire(ctx, name); !errors.Is(err, lock.ErrHeld) {
			return l, err
		}
	}
	id, sock := b.id, b.sock
	done := make(chan struct{})
	killed := make(chan struct{})
	go func() {
		defer close(killed)
		select {
		case <-done:
			return
		case <-ctx.Done():
		}
		b.kill(id, sock, done)
	}()
	l, ok, err := b.take(ctx, name, wait, last)
	close(done)
	<-killed
	switch {
	case ctx.Err() != nil:
		// Granted or not, the session may still get the KILL QUERY (it can
		// land on a later statement): it is not reused.
		b.drop()
		return nil, fmt.Errorf("mysql: wait for %q: %w", name, context.Cause(ctx))
	case err != nil:
		return nil, err
	case !ok:
		return nil, lock.ErrHeld
	}
	return l, nil
}

// kill ends the wait of connection id with KILL QUERY from another
// connection; if that does not end it within cancelWait (the server is
// unreachable, or the statement had not begun), it cuts sock.
func (b *backend) kill(id int64, sock *socket, done <-chan struct{}) {
	ctx, cancel := context.WithTimeout(context.Background(), cancelWait)
	defer cancel()
	if err := b.auxExec(ctx, "KILL QUERY ?", id); err != nil {
		b.opts.Log.Debug("KILL QUERY failed; cutting the connection", "err", err)
	}
	select {
	case <-done:
	case <-ctx.Done():
		sock.SetDeadline(longAgo)
	}
}
