package postgres

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/withlock/withlock/internal/lock"
)

var _ lock.Watcher = (*lease)(nil)

type lease struct {
	b      *backend
	conn   *pgx.Conn
	k1, k2 int32
	mode   lock.Mode
	sem    *semaphore // a semaphore's keys; nil in the other modes
	slot   int        // a semaphore's slot
	pid    int64      // the server process that holds the lock
	token  string     // its mark on that session
	record string     // the holder's record, with the time of the grant
}

// keepSQL reads, in one round trip, everything Keep checks: the server
// process, whether it is a standby now, the session's mark, and whether
// the session still holds the lock. Its first value is the holder's record
// again ($3), so that pg_stat_activity keeps showing it. %s is more for a
// semaphore: keepSlotSQL.
const keepSQL = `select $3::pg_catalog.text as withlock, pg_catalog.pg_backend_pid(), pg_catalog.pg_is_in_recovery(),
	coalesce(pg_catalog.current_setting('withlock.session', true), ''),
	exists(select 1 from pg_catalog.pg_locks
		where locktype = 'advisory' and pid = pg_catalog.pg_backend_pid() and granted
		and classid::pg_catalog.int8 = $1 and objid::pg_catalog.int8 = $2 and objsubid = 2)%s`

// keepSlotSQL checks that a semaphore's holder still holds its slot ($4,
// $5: its pg_locks classid and objid), and wakes the semaphore's waiters
// ($8 is the channel) when a slot is free while someone waits in the
// server's queue for one (a detector, see acquireSlot): a holder whose
// session ended without a release frees its slot without a NOTIFY. $6 is
// the upper objid of the slots, $7 N.
const keepSlotSQL = `
	and exists(select 1 from pg_catalog.pg_locks
		where locktype = 'advisory' and pid = pg_catalog.pg_backend_pid() and granted
		and classid::pg_catalog.int8 = $4 and objid::pg_catalog.int8 = $5 and objsubid = 1),
	case when (select pg_catalog.count(*) from pg_catalog.pg_locks
			where locktype = 'advisory' and objsubid = 1 and granted and ` + thisDB + `
			and classid::pg_catalog.int8 = $4 and objid::pg_catalog.int8 >> 16 = $6) < $7
		and exists(select 1 from pg_catalog.pg_locks
			where locktype = 'advisory' and objsubid = 1 and not granted and ` + thisDB + `
			and classid::pg_catalog.int8 = $4 and objid::pg_catalog.int8 >> 16 = $6)
		then pg_catalog.pg_notify($8, '') end`

var (
	keepOneSQL = sync.OnceValue(func() string { return fmt.Sprintf(keepSQL, "") })
	keepSemSQL = sync.OnceValue(func() string { return fmt.Sprintf(keepSQL, keepSlotSQL) })
)

// check says what is wrong with the session, "" if nothing: err is set
// only when the statement failed.
func (l *lease) check(ctx context.Context) (why string, err error) {
	var (
		pid     int64
		standby bool
		mark    string
		held    bool
	)
	args := []any{pgx.QueryExecModeSimpleProtocol, int64(uint32(l.k1)), int64(uint32(l.k2)), l.record}
	dest := []any{nil, &pid, &standby, &mark, &held}
	sql := keepOneSQL()
	if l.sem != nil {
		sql = keepSemSQL()
		args = append(args, l.sem.slotHi, int64(uint32(l.sem.slot(l.slot))), l.sem.slotMid, l.sem.n, l.sem.channel)
		dest = append(dest, nil)
	}
	err = l.conn.QueryRow(ctx, sql, args...).Scan(dest...)
	switch {
	case err != nil:
		return "", err
	case pid != l.pid:
		return fmt.Sprintf("our statements moved from server process %d to %d", l.pid, pid), nil
	case standby:
		return "the server is a hot standby now", nil
	case mark != l.token:
		return "another client ran statements in our session", nil
	case !held:
		return "the session no longer holds the advisory lock", nil
	}
	return "", nil
}

// Keep checks that our session is alive, still ours, on a primary, and
// still holds the lock.
func (l *lease) Keep(ctx context.Context) error {
	why, err := l.check(ctx)
	switch {
	case err != nil && ctx.Err() != nil:
		// Out of time: the caller decides what an unanswered check means.
		return l.b.failed(err)
	case err != nil && l.conn.IsClosed():
		return l.sessionEnded(err)
	case err != nil:
		return l.b.failed(err)
	case why != "":
		return lock.Errorf(lock.ErrLost, "%s", why)
	}
	return nil
}

// Watch waits on the idle connection, so that a session ended by the
// server (pg_terminate_backend, restart) is noticed at once rather than at
// the next Keep.
func (l *lease) Watch(ctx context.Context) error {
	for {
		err := l.conn.PgConn().WaitForNotification(ctx)
		switch {
		case ctx.Err() != nil:
			return nil
		case err == nil:
			continue // a NOTIFY someone sent; not ours to care about
		case l.conn.IsClosed():
			return l.sessionEnded(err)
		default:
			return l.b.failed(err)
		}
	}
}

func (l *lease) sessionEnded(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return lock.Errorf(lock.ErrLost, "postgres ended the session: %s", pgErr.Message)
	}
	_, why := sortError(err)
	return lock.Errorf(lock.ErrLost, "the connection to postgres at %s broke (%s)", l.b.addr, why)
}

// releaseSQLs unlock, in the server process that holds the lock only
// ($3 or $2): behind a pooler the statement may land in another client's
// session. A semaphore's holder lets go of its three locks and wakes the
// waiters (its channel is $3).
var releaseSQLs = map[lock.Mode]string{
	lock.Exclusive: `select case when pg_catalog.pg_backend_pid() = $3 then pg_catalog.pg_advisory_unlock($1::pg_catalog.int4, $2::pg_catalog.int4) end`,
	lock.Shared:    `select case when pg_catalog.pg_backend_pid() = $3 then pg_catalog.pg_advisory_unlock_shared($1::pg_catalog.int4, $2::pg_catalog.int4) end`,
	lock.Semaphore: `select x.was, case when x.was is not null then pg_catalog.pg_advisory_unlock_all() end, pg_catalog.pg_notify($3, '')
		from (select case when pg_catalog.pg_backend_pid() = $2 then pg_catalog.pg_advisory_unlock($1::pg_catalog.int8) end as was offset 0) x`,
}

// directReleaseSQLs are releaseSQLs on a connection that the server
// process holding the lock answered itself: every statement lands there,
// so there is no process to check.
var directReleaseSQLs = map[lock.Mode]string{
	lock.Exclusive: `select pg_catalog.pg_advisory_unlock($1::pg_catalog.int4, $2::pg_catalog.int4)`,
	lock.Shared:    `select pg_catalog.pg_advisory_unlock_shared($1::pg_catalog.int4, $2::pg_catalog.int4)`,
}

// Release unlocks, in the server process that holds the lock only. The
// statement goes by the simple protocol: one message, which costs the
// server less than the extended protocol's three.
func (l *lease) Release(ctx context.Context) error {
	var was *bool
	var err error
	simple := pgx.QueryExecModeSimpleProtocol
	switch {
	case l.sem != nil:
		err = l.conn.QueryRow(ctx, releaseSQLs[l.mode], simple, l.sem.slot(l.slot), l.pid, l.sem.channel).Scan(&was, nil, nil)
	case l.b.pooled:
		err = l.conn.QueryRow(ctx, releaseSQLs[l.mode], simple, l.k1, l.k2, l.pid).Scan(&was)
	default:
		err = l.conn.QueryRow(ctx, directReleaseSQLs[l.mode], simple, l.k1, l.k2).Scan(&was)
	}
	switch {
	case err != nil && isCancel(err):
		// Ending the session ends the lock just as surely.
		l.b.opts.Log.Debug("the server cancelled the release; ending the session instead", "backend", "postgres", "addr", l.b.addr)
		l.b.drop()
		return nil
	case err != nil:
		return l.b.failed(err)
	case was == nil:
		return errors.New("postgres: our statements moved to another server process; the lock ends with the session that holds it")
	case !*was:
		return lock.Errorf(lock.ErrNotOurs, "postgres: the lock was no longer ours at release")
	}
	return nil
}
