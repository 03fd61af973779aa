package mysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/withlock/withlock/internal/lock"
)

var _ lock.Watcher = (*lease)(nil)

// lease is a lock held by the backend's connection: the slot's key.
type lease struct {
	b    *backend
	key  string
	slot int
}

// keepSQL, followed by the connection's recheckSQL, reads in one round
// trip everything Keep checks: whether the session still holds the key,
// and what the server says of itself now: read-only (a failover that
// demoted it), in a Galera cluster of more than one node (another joined),
// out of the Primary component.
const keepSQL = "SELECT IS_USED_LOCK(?) = CONNECTION_ID();\n"

// Keep checks that the session is alive, still holds the lock, and is on a
// server where the lock still excludes everyone (see Server).
func (l *lease) Keep(ctx context.Context) error {
	if l.b.conn == nil {
		return lock.Errorf(lock.ErrLost, "the connection to mysql at %s was closed", l.b.addr)
	}
	var held sql.NullBool
	var server Server
	read := func(rows *sql.Rows) (err error) {
		server, err = readServer(rows, false)
		return err
	}
	err := l.b.queryRow(ctx, keepSQL+l.b.recheckSQL(), []any{l.key}, read, &held)
	lost := server.loss(l.b.addr)
	switch {
	case err != nil && expired(ctx):
		// Out of time: the caller decides what an unanswered check means.
		return l.b.failed(ctx, err)
	case err != nil:
		return l.sessionEnded(ctx, err)
	case lost != nil:
		return lost
	case !held.Bool:
		return lock.Errorf(lock.ErrLost, "the session no longer holds the lock %s", l.key)
	}
	return nil
}

// sessionEnded sorts a failed statement: a connection that broke, or a
// server that ended the session, is a loss (the lock went with the
// session); any other failure says nothing about the lock.
func (l *lease) sessionEnded(ctx context.Context, err error) error {
	failed := l.b.failed(ctx, err)
	if !errors.Is(failed, lock.ErrUnavailable) {
		return failed
	}
	_, why := sortError(err)
	return lock.Errorf(lock.ErrLost, "the session on mysql at %s ended (%s)", l.b.addr, why)
}

// Watch waits on the idle connection, so that a session ended by the
// server (KILL, wait_timeout, a restart) is noticed at once rather than at
// the next Keep.
func (l *lease) Watch(ctx context.Context) error {
	if l.b.sock == nil {
		return lock.Errorf(lock.ErrLost, "the connection to mysql at %s was closed", l.b.addr)
	}
	err := l.b.sock.watch(ctx)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, errClosed):
		l.b.drop()
		return lock.Errorf(lock.ErrLost, "mysql at %s closed the session (ended by KILL or withlock release --force, or a server restart?)", l.b.addr)
	}
	l.b.drop()
	_, why := sortError(err)
	return lock.Errorf(lock.ErrLost, "the connection to mysql at %s broke (%s)", l.b.addr, why)
}

// Release gives the slot back; if the statement fails, the connection is
// closed, which ends the lock too.
func (l *lease) Release(ctx context.Context) error {
	var was sql.NullInt64
	err := l.b.queryRow(ctx, "SELECT RELEASE_LOCK(?)", []any{l.key}, nil, &was)
	switch {
	case err != nil:
		err = l.b.failed(ctx, err)
		l.b.drop()
		return fmt.Errorf("mysql: %w; closed the connection, which ends the lock", err)
	case was.Int64 != 1:
		return lock.Errorf(lock.ErrNotOurs, "mysql: the lock was no longer ours at release")
	}
	return nil
}
