package postgres

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"

	"github.com/jackc/pgx/v5"

	"github.com/withlock/withlock/internal/lock"
)

// A semaphore of N on NAME is three advisory locks per holder, all on the
// holder's own session:
//
//   - NAME's two keys, pg_advisory_lock_shared(k1, k2), as a --shared
//     holder takes them: so an exclusive holder of NAME (withlock's, or the
//     npm advisory-lock's) excludes every slot holder and they exclude it;
//   - its slot, pg_advisory_lock(bigint) on slot key i, 0 <= i < N: the
//     first free one, tried in order;
//   - NAME's mark of N, pg_advisory_lock_shared(bigint) on the mark key
//     of N, which every holder of NAME with the same N shares: a holder
//     with another N sees it in pg_locks and is refused (docs/modes.md).
//
// The bigint keys are made from bytes 8-21 of the SHA-256 of NAME (bytes
// 0-7 are k1 and k2): slot key i is bytes 8-11 (a little-endian uint32),
// then bytes 12-13 (a little-endian uint16), then i in 16 bits; the mark of
// N is bytes 16-19, then bytes 20-21, then N. So N is at most 65535. A
// bigint key never meets a two-key lock, whoever took it: pg_locks tells
// the two forms apart (objsubid 1 and 2), and so does the lock manager.
// Two names share slots only if 48 bits of their hashes agree, and even
// then nobody gets in beyond N: they would exclude each other more, never
// less.

// maxSlots is the largest N: the slot number and N have 16 bits each.
const maxSlots = 1<<16 - 1

// semaphore is the keys of a semaphore of n on one name.
type semaphore struct {
	n                  int
	slotHi, markHi     int64 // pg_locks.classid of the slot keys, of the mark
	slotMid, markMid   int64 // the upper 16 bits of their pg_locks.objid
	channel            string
	k1, k2             int32 // the name's own keys
	name               string
	slotBase, markBase int64
}

func newSemaphore(name string, n int) *semaphore {
	sum := sha256.Sum256([]byte(name))
	s := &semaphore{
		n:       n,
		name:    name,
		slotHi:  int64(binary.LittleEndian.Uint32(sum[8:12])),
		slotMid: int64(binary.LittleEndian.Uint16(sum[12:14])),
		markHi:  int64(binary.LittleEndian.Uint32(sum[16:20])),
		markMid: int64(binary.LittleEndian.Uint16(sum[20:22])),
		// A release and a check that finds a slot freed by a crash NOTIFY
		// it; waiters LISTEN.
		channel: "withlock " + hex.EncodeToString(sum[8:16]),
	}
	s.k1, s.k2 = Keys(name)
	s.slotBase = int64(uint64(s.slotHi)<<32 | uint64(s.slotMid)<<16)
	s.markBase = int64(uint64(s.markHi)<<32 | uint64(s.markMid)<<16)
	return s
}

// SlotKey is the pg_advisory_lock(bigint) key of slot i of a semaphore on
// name (see docs/modes.md).
func SlotKey(name string, i int) int64 { return newSemaphore(name, 1).slot(i) }

func (s *semaphore) slot(i int) int64 { return s.slotBase | int64(i) }
func (s *semaphore) mark() int64      { return s.markBase | int64(s.n) }

// thisDB limits pg_locks to the locks of the session's database: advisory
// locks of the same keys in two databases are two locks.
const thisDB = `database = (select oid from pg_catalog.pg_database where datname = pg_catalog.current_database())`

// semTrySQL takes a slot in one round trip (it is lockSQL's %s; the
// parameters after lockSQL's are: N, the mark key, its classid and upper
// objid, the first slot key). Each step runs only when the one before it
// succeeded (CASE and coalesce evaluate in order). Its value: the slot
// taken; -1 when NAME is held exclusively, or an exclusive waiter is
// queued; -2 when every slot is taken; -3 when the mark is held
// exclusively (by some other tool); -4-N when holders with another N hold
// it. Whatever it took is let go on failure, by lockSQL.
const semTrySQL = `case when not pg_catalog.pg_try_advisory_lock_shared($1::pg_catalog.int4, $2::pg_catalog.int4) then -1
		when not pg_catalog.pg_try_advisory_lock_shared($7::pg_catalog.int8) then -3
		else coalesce(
			(select -4 - (objid::pg_catalog.int8 & 65535) from pg_catalog.pg_locks
				where locktype = 'advisory' and objsubid = 1 and granted and ` + thisDB + `
				and classid::pg_catalog.int8 = $8 and objid::pg_catalog.int8 >> 16 = $9 and objid::pg_catalog.int8 & 65535 <> $6 limit 1),
			(select i from pg_catalog.generate_series(0, $6::pg_catalog.int4 - 1) i where pg_catalog.pg_try_advisory_lock($10::pg_catalog.int8 + i) limit 1),
			-2)
		end`

// blocked is the ErrHeld of a semaphore's attempt: what was in its way,
// for the wait that follows.
type blocked struct{ what waitFor }

func (blocked) Error() string { return lock.ErrHeld.Error() }
func (blocked) Unwrap() error { return lock.ErrHeld }

// waitFor is a lock that a waiter waits to see freed: NAME's keys (an
// exclusive holder), the mark, or a slot (every slot taken).
type waitFor int

const (
	waitName waitFor = iota
	waitMark
	waitSlot
)

// detectSQL is a detector's statement: wait in the server's queue until
// the lock can be had, then let it go at once, in the same statement. $1
// is the key (the bigint ones), or $1, $2 (NAME's).
var detectSQL = map[waitFor]string{
	waitName: `select pg_catalog.pg_advisory_unlock_shared($1::pg_catalog.int4, $2::pg_catalog.int4) from (select pg_catalog.pg_advisory_lock_shared($1::pg_catalog.int4, $2::pg_catalog.int4) offset 0) w`,
	waitMark: `select pg_catalog.pg_advisory_unlock_shared($1::pg_catalog.int8) from (select pg_catalog.pg_advisory_lock_shared($1::pg_catalog.int8) offset 0) w`,
	waitSlot: `select pg_catalog.pg_advisory_unlock($1::pg_catalog.int8) from (select pg_catalog.pg_advisory_lock($1::pg_catalog.int8) offset 0) w`,
}

// acquireSlot waits for a slot of a semaphore.
//
// One session cannot wait for whichever of N locks frees first, so the
// wait is made of two: the lock connection LISTENs on NAME's channel,
// which a holder's release, release --force, and a holder's check that
// finds a slot free while someone waits (a holder that died frees its slot
// without a word) NOTIFY; and a second connection, the detector, waits in
// the server's queue for what the last attempt found in its way (a slot,
// chosen at random, or NAME while an exclusive holder has it), and lets it
// go the moment it gets it. Whichever comes first wakes the waiter to try
// again; it tries only when the server said something changed, never on a
// timer. If every holder died, the detector's slot came free too. Failures
// to reach the server are returned as they are (ErrUnavailable): the
// waiter never retries by itself.
func (b *backend) acquireSlot(ctx context.Context, name string) (lock.Lease, error) {
	sem := newSemaphore(name, b.opts.MaxHolders)
	var d detector
	defer d.stop()
	for {
		// The attempt comes first, so that its checks (a standby, a pooler)
		// speak before anything else is asked of the server.
		l, err := b.take(ctx, name, false)
		var in blocked
		if !errors.As(err, &in) {
			return l, err
		}
		if b.listening != sem.channel {
			// Then LISTEN, and try again: a release between the two attempts
			// is heard.
			if _, err := b.conn.Exec(ctx, "listen "+pgx.Identifier{sem.channel}.Sanitize()); err != nil {
				return nil, b.failed(err)
			}
			b.listening = sem.channel
			continue
		}
		if b.testHooks != nil && b.testHooks.blocked != nil {
			b.testHooks.blocked(&d)
		}
		if err := d.start(ctx, b, sem, in.what); err != nil {
			return nil, err
		}
		if err := b.sleep(ctx, name, &d); err != nil {
			return nil, err
		}
	}
}

// sleep waits until a NOTIFY arrives on the lock connection, the detector's
// wait ends, or ctx does.
func (b *backend) sleep(ctx context.Context, name string, d *detector) error {
	select {
	case <-b.notified: // arrived during the attempt
		return nil
	default:
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func(done <-chan struct{}) {
		select {
		case <-done:
			cancel()
		case <-wctx.Done():
		}
	}(d.done)
	err := b.conn.PgConn().WaitForNotification(wctx)
	select {
	case <-b.notified:
	default:
	}
	switch {
	case ctx.Err() != nil:
		return fmt.Errorf("postgres: wait for %q: %w", name, context.Cause(ctx))
	case err != nil && wctx.Err() == nil:
		return b.failed(err)
	}
	return d.failed()
}

// semaphoreTestHooks let a test (semaphore_test.go) hold a waiter at the
// points where its races are.
type semaphoreTestHooks struct {
	blocked   func(*detector) // after an attempt found its way blocked
	slot      func(n int) int // picks the slot the detector waits for
	detectSQL string          // the detector's statement for a slot
}

// detector is the second connection of a semaphore's waiter.
type detector struct {
	b      *backend
	on     waitFor
	done   chan struct{} // closed when the wait ends; nil when none runs
	err    error         // why it ended, when not because the lock came free
	cancel context.CancelFunc
}

// start has the detector wait for what, unless it already does. A wait
// for what that ended during the attempt is kept, not replaced: the
// attempt may have found the detector itself in the slot, in the moment
// between its grant and its unlock, and nobody else would wake us for that
// slot; sleep returns at once on it, and the waiter tries again.
func (d *detector) start(ctx context.Context, b *backend, sem *semaphore, what waitFor) error {
	if d.done != nil {
		if d.on == what {
			return nil
		}
		d.end()
	}
	if d.b == nil {
		d.b = b.sibling()
	}
	conn, err := d.b.connect(ctx, sem.name)
	if err != nil {
		return err
	}
	pick := rand.N[int]
	if b.testHooks != nil && b.testHooks.slot != nil {
		pick = b.testHooks.slot
	}
	args := []any{sem.slot(pick(sem.n))}
	switch what {
	case waitName:
		args = []any{sem.k1, sem.k2}
	case waitMark:
		args = []any{sem.mark()}
	}
	wctx, cancel := context.WithCancel(ctx)
	d.on, d.done, d.err, d.cancel = what, make(chan struct{}), nil, cancel
	d.b.cancelOnServer.Store(true) // a stopped wait must leave the server's queue
	go func(done chan struct{}) {
		defer close(done)
		sql := detectSQL[what]
		if b.testHooks != nil && b.testHooks.detectSQL != "" {
			sql = b.testHooks.detectSQL
		}
		if _, err := conn.Exec(wctx, sql, args...); err != nil && wctx.Err() == nil {
			d.err = err
		}
	}(d.done)
	return nil
}

// failed is the error that ended the detector's wait, sorted; nil if it
// ended because its lock came free, or still runs. A wait that ended is
// done with: the next one starts afresh.
func (d *detector) failed() error {
	if d.done == nil {
		return nil
	}
	select {
	case <-d.done:
	default:
		return nil
	}
	var err error
	switch {
	case d.err != nil && waitCut(d.err):
		// The statement may have been cut between its lock and its unlock,
		// so its session goes too.
		d.b.drop()
		err = d.b.cutWait(d.err)
	case d.err != nil:
		err = d.b.failed(d.err)
	}
	d.end()
	return err
}

// end stops the running wait. A wait that was cut short drops its
// connection: the cancel request could otherwise reach its next statement.
func (d *detector) end() {
	if d.done == nil {
		return
	}
	select {
	case <-d.done:
	default:
		d.cancel()
		<-d.done
		d.b.drop()
	}
	d.cancel()
	d.done = nil
}

// stop ends the detector and its connection.
func (d *detector) stop() {
	d.end()
	if d.b != nil {
		d.b.drop()
	}
}
