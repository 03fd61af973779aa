package postgres

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/withlock/withlock/internal/lock"
)

// breakSQL ends the session of every holder of NAME (found in pg_locks as
// in statusSQL), and says of each whether it is gone: %s is
// pg_terminate_backend with its wait ($1 milliseconds, PostgreSQL 14 and
// later), or without (it then only sends the signal). A session that is no
// longer a server process, or no longer holds NAME, is gone too. Its first
// column says whether the server is a standby, where it ends nothing.
const breakSQL = `select r.standby, x.* from (select pg_catalog.pg_is_in_recovery() as standby) r
left join lateral (select h.pid, ` + sessionColumns + `,
		case when %s then true
		else not exists(select 1 from pg_catalog.pg_locks l where l.pid = h.pid and l.locktype = 'advisory' and l.granted and ` + nameLocks + `)
		end
	from (select distinct l.pid from pg_catalog.pg_locks l
		where l.locktype = 'advisory' and l.granted and l.` + thisDB + ` and l.pid <> pg_catalog.pg_backend_pid() and ` + nameLocks + `) h
	left join pg_catalog.pg_stat_activity a on a.pid = h.pid
	where not r.standby) x on true`

var (
	breakWaitSQL = sync.OnceValue(func() string { return fmt.Sprintf(breakSQL, "pg_terminate_backend(h.pid, $1::int8)") })
	breakSendSQL = sync.OnceValue(func() string {
		return fmt.Sprintf(breakSQL, "pg_terminate_backend(h.pid) and $1::int8 is not null")
	})
)

// breakTimeout is how long Break waits for the sessions it ends when ctx
// has no deadline.
const breakTimeout = 10 * time.Second

// Break ends the session of every holder of name, found in pg_locks on
// name's keys and slots (so it breaks a lock that any tool holds, and
// everything else those sessions hold), and waits until the server
// processes are gone, within ctx (PostgreSQL 14 and later; older servers
// are only sent the signal). It needs the privilege to signal them: a
// superuser, the holders' own role, or a member of pg_signal_backend;
// without it the server's refusal is an ErrRefused. The semaphore's
// waiters are then told that slots are free.
func (b *backend) Break(ctx context.Context, name string) ([]lock.Holder, error) {
	sem := newSemaphore(name, 1)
	conn, err := b.connect(ctx, name)
	if err != nil {
		return nil, err
	}
	wait := breakTimeout
	if deadline, ok := ctx.Deadline(); ok {
		// Leave time for the answer: the server says what it did.
		wait = time.Until(deadline) * 9 / 10
	}
	sql := breakWaitSQL()
	if v := majorVersion(conn.PgConn().ParameterStatus("server_version")); v > 0 && v < 14 {
		sql = breakSendSQL()
	}
	rows, _ := conn.Query(ctx, sql, append([]any{max(wait.Milliseconds(), 1)}, sem.nameArgs()...)...)
	var (
		broken  []lock.Holder
		left    []string
		standby bool
	)
	for rows.Next() {
		var (
			pid  *int64
			s    session
			gone *bool
		)
		if err := rows.Scan(append(append([]any{&standby, &pid}, s.columns()...), &gone)...); err != nil {
			rows.Close()
			return nil, b.refusedBreak(err)
		}
		if pid == nil {
			continue
		}
		s.pid = *pid
		h, _ := s.holder()
		broken = append(broken, h)
		if !deref(gone) {
			left = append(left, strconv.FormatInt(s.pid, 10))
		}
	}
	if err := rows.Err(); err != nil {
		return nil, b.refusedBreak(err)
	}
	switch {
	case standby:
		return nil, b.standby()
	case len(left) > 0:
		return broken, lock.Errorf(lock.ErrHeld, "postgres at %s: the sessions of server processes %s still hold %q %s after pg_terminate_backend",
			b.addr, strings.Join(left, ", "), name, wait.Round(time.Millisecond))
	case len(broken) > 0:
		// Wake a semaphore's waiters: the slots are free.
		if _, err := conn.Exec(ctx, "select pg_catalog.pg_notify($1, '')", sem.channel); err != nil {
			b.opts.Log.Warn("could not tell the waiters of "+strconv.Quote(name)+" that it is free", "err", err)
		}
	}
	return broken, nil
}

// refusedBreak is the error of a failed breakSQL: the server's refusal
// (no privilege to end a session) says why, and what would do.
func (b *backend) refusedBreak(err error) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "42501" {
		return b.failed(err)
	}
	why := pgErr.Message
	if pgErr.Detail != "" {
		why += ": " + strings.TrimSuffix(pgErr.Detail, ".")
	}
	return lock.Errorf(lock.ErrRefused, "postgres at %s refused to end the holders' sessions: %s (SQLSTATE %s); "+
		"connect as a superuser, as the holders' role, or as a member of pg_signal_backend", b.addr, why, pgErr.Code)
}

// majorVersion reads the major version from a server_version such as
// "15.4 (Debian 15.4-1)"; 0 if it cannot.
func majorVersion(v string) int {
	if i := strings.IndexFunc(v, func(r rune) bool { return r < '0' || r > '9' }); i >= 0 {
		v = v[:i]
	}
	n, _ := strconv.Atoi(v)
	return n
}
