package postgres

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/withlock/withlock/internal/lock"
)

var _ lock.Waiter = (*backend)(nil)

func (b *backend) TryAcquire(ctx context.Context, name string) (lock.Lease, error) {
	return b.take(ctx, name, false)
}

// Acquire waits in pg_advisory_lock (or pg_advisory_lock_shared), so that
// PostgreSQL hands the lock over the moment its holder lets go, in the
// order the requests came. A semaphore's waiter waits as acquireSlot says.
// The session holds the lock from the grant on, and the grant's answer has
// just arrived: the lock's life counts from then.
func (b *backend) Acquire(ctx context.Context, name string) (lock.Lease, time.Time, error) {
	var l lock.Lease
	var err error
	if b.opts.Mode == lock.Semaphore {
		l, err = b.acquireSlot(ctx, name)
	} else {
		l, err = b.take(ctx, name, true)
	}
	return l, time.Now(), err
}

// lockSQL takes NAME's keys ($1, $2), in the same statement that checks
// that the session can hold a lock for everyone, so that the checks cost
// no round trip:
//
//   - a hot standby grants advisory locks, but only on itself;
//   - a fresh session holds no advisory lock, and carries no other
//     connection's mark: each connection marks its server session with a
//     token of its own ($3, the setting withlock.session). Behind a pooler
//     in transaction mode, clients take turns on the same server sessions,
//     and a session lock taken in one is granted again (re-entrantly) to
//     whichever client's statement lands there next. A session-mode pooler
//     resets a server session (DISCARD ALL) before handing it to the next
//     client, which clears both. Whether the session holds advisory locks
//     is asked only behind a pooler (%[5]s, heldSQL): on a connection that
//     the server process itself answered, the session began with it and
//     holds nothing, and reading the server's lock table (pg_lock_status)
//     costs a new server process more than taking the lock does;
//   - the server process is one of $4: on a new connection, the one that
//     answered it (its pid from BackendKeyData). Poolers answer connections
//     themselves, with a pid of their own; see take.
//
// It also turns transaction_timeout (PostgreSQL 17) off before it takes
// the lock (see sessionSettings): set inside the transaction it would end,
// the setting stops that transaction's timer too; a wait it still ended
// would be waited again (waitCut).
//
// Otherwise it takes nothing and returns a null lock column. It marks the
// session either way, so that a holder whose session another client used
// learns of it at its next check. "offset 0" keeps each subquery from being
// merged into the one around it, so that the checks read the session before
// the lock and the mark change it, and the time is read after the lock is
// granted. These checks are the same in every mode; %[1]s is the mode's lock.
//
// Its first value is the holder's record ($5; see record.go), so that
// pg_stat_activity shows it from the moment the statement starts. Columns:
// the record, pid, standby, why the session is shared (or null), the lock
// (null: not attempted; 0 or, for a semaphore, the slot: taken; negative:
// not taken, see semTrySQL), the server's time after the lock, the
// release of whatever a failed semaphore attempt took on its way, the
// session's mark, and the server-side bound (boundSQL; %[2]s is the first
// of its three parameters, boundArgs).
const lockSQL = `select $5::pg_catalog.text as withlock, x.pid, x.standby, x.shared, x.v, pg_catalog.clock_timestamp(),
	case when x.v < 0 then pg_catalog.pg_advisory_unlock_all() end,
	pg_catalog.set_config('withlock.session', $3, false),
	case when x.v >= 0 then ` + boundSQL + ` end
from (select s.*, case when s.standby or s.shared is not null or s.pid <> all($4::pg_catalog.int8[]) then null
		else %[1]s end as v
	from (select pg_catalog.pg_backend_pid() as pid, pg_catalog.pg_is_in_recovery() as standby,
			case when coalesce(pg_catalog.current_setting('withlock.session', true), '') not in ('', $3)
				then 'another connection had used this server session'
			%[5]s
			end as shared,
			case when pg_catalog.current_setting('transaction_timeout', true) is not null
				then pg_catalog.set_config('transaction_timeout', '0', false) end
		offset 0) s
	offset 0) x`

// heldSQL is lockSQL's check, behind a pooler, that the session holds no
// advisory lock.
const heldSQL = `when exists(select 1 from pg_catalog.pg_lock_status() l where l.locktype = 'advisory' and l.pid = pg_catalog.pg_backend_pid())
				then 'this server session already held advisory locks'`

// lockStatement is the lock statement of a mode: a single attempt, or
// (wait) a wait in the server's queue; pooled, it also asks whether the
// session holds advisory locks (heldSQL). A semaphore has no wait
// statement; see acquireSlot. The statements are built at first use, as
// every statement put together with Sprintf here: package init runs in
// every withlock start, whatever the backend (docs/design.md, A small
// binary, started often).
func lockStatement(mode lock.Mode, wait, pooled bool) string {
	return lockSQLs()[mode][b2i(pooled)][b2i(wait)]
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// lockSQLs are lockStatement's statements, by mode, pooled and wait.
var lockSQLs = sync.OnceValue(func() map[lock.Mode][2][2]string {
	// build fills lockSQL in with a mode's lock statements (an empty one
	// is left empty) and the first of boundSQL's parameters.
	build := func(try, wait string, bound int) (s [2][2]string) {
		for p, held := range []string{"", heldSQL} {
			for w, lockFn := range []string{try, wait} {
				if lockFn != "" {
					s[p][w] = fmt.Sprintf(lockSQL, lockFn, "$"+strconv.Itoa(bound), "$"+strconv.Itoa(bound+1), "$"+strconv.Itoa(bound+2), held)
				}
			}
		}
		return s
	}
	return map[lock.Mode][2][2]string{
		lock.Exclusive: build("case when pg_try_advisory_lock($1::int4, $2::int4) then 0 else -1 end",
			"(select 0 from pg_advisory_lock($1::int4, $2::int4))", 6),
		lock.Shared: build("case when pg_try_advisory_lock_shared($1::int4, $2::int4) then 0 else -1 end",
			"(select 0 from pg_advisory_lock_shared($1::int4, $2::int4))", 6),
		lock.Semaphore: build(semTrySQL, "", 11), // after semTrySQL's five
	}
})

// boundSQL is the server-side bound (docs/postgres.md), set on the session
// once it holds the lock: the server ends the session, and with it the
// lock, once withlock has been silent for the ttl, so that a holder that
// is frozen or partitioned away does not keep the lock for the others
// until the server notices a dead client (hours, with default
// keepalives). Every timer below starts at or after the last statement
// withlock sent, and withlock has stopped its command by ttl after the last
// check that succeeded (lock.Held), so the session ends after the command,
// never before:
//
//   - idle_session_timeout (PostgreSQL 14 and later): the session ends after
//     ttl without a statement. A holder's checks (Keep, as often as lock.Held
//     says) run in no transaction, to which the timeout would not apply. It
//     alone ends the session of a frozen holder, whose kernel still
//     answers TCP;
//   - tcp_user_timeout (PostgreSQL 12 and later): the connection ends when
//     what the server sent stays unacknowledged for ttl;
//   - TCP keepalives: probes from ttl/2 of silence on, every ttl/6, three
//     unanswered end the connection (at least 1s each, rounded up): the
//     bound of a partition on servers before 14.
//
// A setting the server does not have is skipped (current_setting(..., true)
// is null), not an error, so that older servers still grant the lock. Its
// value: idle_session_timeout as set, or null when the server has none.
//
// Its values are boundArgs, worked out here rather than by the server: in
// the first statement of a new server process every function, operator and
// cast costs a catalog lookup (which is also why lockSQL reads
// pg_lock_status() rather than the pg_locks view).
const boundSQL = `(select case when pg_catalog.current_setting('idle_session_timeout', true) is not null
			then pg_catalog.set_config('idle_session_timeout', %[2]s, false) end
		from (select case when pg_catalog.current_setting('tcp_user_timeout', true) is not null
				then pg_catalog.set_config('tcp_user_timeout', %[2]s, false) end,
			pg_catalog.set_config('tcp_keepalives_idle', %[3]s, false),
			pg_catalog.set_config('tcp_keepalives_interval', %[4]s, false),
			pg_catalog.set_config('tcp_keepalives_count', '3', false)
			offset 0) k)`

// boundArgs are boundSQL's values for a ttl, as text: the ttl in
// milliseconds, then the keepalives' idle time (ttl/2) and interval (ttl/6)
// in whole seconds, rounded up, at least 1.
func boundArgs(ttl time.Duration) []any {
	ms := ttl.Milliseconds()
	ceilDiv := func(n, d int64) int64 { return max(1, (n+d-1)/d) }
	return []any{strconv.FormatInt(ms, 10), strconv.FormatInt(ceilDiv(ms, 2000), 10), strconv.FormatInt(ceilDiv(ms, 6000), 10)}
}

// maxProbes bounds the connections of one attempt behind a pooler.
const maxProbes = 4

// take makes one attempt to take name; with wait, it waits for it.
//
// Behind a pooler, one connection cannot tell its modes apart: a lone
// client sees the same in both. So take marks the server session and
// connects again, until a statement lands in a server process it has
// marked before: still marked, that process serves several clients in
// turn (transaction mode), and take refuses; unmarked, the pooler reset it
// between two clients (session mode), and take locks there. Then it checks
// once more, in a statement of its own, that the session stayed the same,
// so that a pooler that moves statements or resets sessions after every
// transaction is refused before the command runs.
//
// The statement goes by the simple protocol, so that its values are
// written into its text (quoted by pgx) and pg_stat_activity shows the
// record; it is still one round trip.
func (b *backend) take(ctx context.Context, name string, wait bool) (lock.Lease, error) {
	k1, k2 := Keys(name)
	mode := b.opts.Mode
	var sem *semaphore
	if mode == lock.Semaphore {
		sem = newSemaphore(name, b.opts.MaxHolders)
	}
	rec := b.record(name, nil)
	for probes := 1; ; probes++ {
		conn, err := b.connect(ctx, name)
		if err != nil {
			return nil, err
		}
		sql := lockStatement(mode, wait, b.pooled)
		accept := []int64{int64(conn.PgConn().PID())}
		if b.pooled {
			accept = b.seen
		}
		args := []any{pgx.QueryExecModeSimpleProtocol, k1, k2, b.token, accept, rec}
		if sem != nil {
			args = append(args, sem.n, sem.mark(), sem.markHi, sem.markMid, sem.slotBase)
		}
		args = append(args, boundArgs(b.opts.TTL)...)
		var (
			pid     int64
			standby bool
			shared  *string
			v       *int64
			at      time.Time
			idle    *string // idle_session_timeout as set; see boundSQL
		)
		b.cancelOnServer.Store(wait)
		err = conn.QueryRow(ctx, sql, args...).Scan(nil, &pid, &standby, &shared, &v, &at, nil, nil, &idle)
		b.cancelOnServer.Store(false)
		switch {
		case err != nil && wait && ctx.Err() != nil:
			// The lock may have been granted just as we gave up; ending the
			// session is the one sure way to leave nothing behind.
			b.drop()
			return nil, fmt.Errorf("postgres: wait for %q: %w", name, context.Cause(ctx))
		case err != nil && wait && waitCut(err):
			b.drop()
			return nil, b.cutWait(err)
		case err != nil && isCancel(err):
			_, why := sortError(err)
			b.drop()
			return nil, b.errorAt(b.addr, errCancelled, why)
		case err != nil:
			return nil, b.failed(err)
		case standby:
			b.drop()
			return nil, b.standby()
		case shared != nil:
			b.drop() // a session pool must not keep a server session for a refused client
			return nil, b.pooler(*shared)
		case v == nil:
			if !b.pooled {
				b.opts.Log.Debug("a pooler answered: connecting again to see whether it shares server sessions", "backend", "postgres", "addr", b.addr)
			}
			b.pooled = true
			b.seen = append(b.seen, pid)
			b.drop()
			if probes == maxProbes {
				return nil, lock.Errorf(lock.ErrUnavailable, "cannot tell whether the pooler at %s shares server sessions between clients: "+
					"each of %d connections landed in another server process", b.addr, probes)
			}
			continue
		case *v <= -4:
			return nil, lock.Errorf(lock.ErrUsage, "%q is a semaphore of %d (--max-holders %d); this holder asked for %d", name, -4-*v, -4-*v, sem.n)
		case *v == -1 && sem != nil:
			return nil, blocked{waitName}
		case *v == -2:
			return nil, blocked{waitSlot}
		case *v == -3:
			return nil, blocked{waitMark}
		case *v < 0:
			return nil, lock.ErrHeld
		}
		if idle == nil {
			b.opts.Log.Debug("the server has no idle_session_timeout (PostgreSQL before 14): only TCP keepalives end the session of a holder that stops answering",
				"backend", "postgres", "addr", b.addr)
		}
		l := &lease{b: b, conn: conn, k1: k1, k2: k2, mode: mode, sem: sem, slot: int(*v), pid: pid, token: b.token, record: b.record(name, &at)}
		if b.pooled {
			if why, err := l.check(ctx); err != nil {
				return nil, b.failed(err)
			} else if why != "" {
				l.Release(ctx) // lands on the locking session only if the pid still matches
				b.drop()
				return nil, b.pooler(why)
			}
		}
		return l, nil
	}
}
