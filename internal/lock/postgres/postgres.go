// Package postgres is the postgres:// backend: a session advisory lock,
// pg_advisory_lock(k1, k2), on one dedicated connection. The lock lives
// exactly as long as that session, so PostgreSQL frees it whenever withlock
// or its connection dies; there is no lease to renew.
package postgres

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"sync/atomic"
	"time"
	"unicode"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"

	"github.com/withlock/withlock/internal/lock"
)

func init() {
	lock.Register("postgres", open)
	lock.Register("postgresql", open)
}

// Keys derives the two int4 keys of pg_advisory_lock(k1, k2) from a lock
// name: bytes 0-3 and 4-7 of SHA-256(name), each read as a little-endian
// signed int32. The npm package advisory-lock derives its keys the same way,
// so the two tools exclude each other on the same name.
func Keys(name string) (k1, k2 int32) {
	sum := sha256.Sum256([]byte(name))
	return int32(binary.LittleEndian.Uint32(sum[0:4])), int32(binary.LittleEndian.Uint32(sum[4:8]))
}

// maxDial bounds one connection attempt when the URL sets no
// connect_timeout, so that a host that drops packets is retried (and
// reported) instead of hanging the whole wait.
const maxDial = 5 * time.Second

type backend struct {
	config *pgx.ConnConfig
	addr   string // host:port, for messages
	opts   lock.Options
	conn   *pgx.Conn
	// cancelOnServer says how the open context-watcher of conn reacts to
	// a context ending; see ctxHandler.
	cancelOnServer atomic.Bool
}

func open(u *url.URL, opts lock.Options) (lock.Backend, error) {
	if opts.Mode != lock.Exclusive {
		return nil, lock.Errorf(lock.ErrUsage, "%s locks are not supported by the postgres backend yet", opts.Mode)
	}
	config, err := pgx.ParseConfig(u.String())
	if err != nil {
		return nil, lock.Errorf(lock.ErrUsage, "postgres URL: %v", err)
	}
	if config.ConnectTimeout == 0 {
		config.ConnectTimeout = min(maxDial, opts.ConnectTimeout)
	}
	// One round trip per statement, no prepared-statement cache: each
	// statement runs once or a few times per process.
	config.DefaultQueryExecMode = pgx.QueryExecModeExec
	b := &backend{config: config, addr: net.JoinHostPort(config.Host, fmt.Sprint(config.Port)), opts: opts}
	config.BuildContextWatcherHandler = func(c *pgconn.PgConn) ctxwatch.Handler {
		return &ctxHandler{
			cancelOnServer: &b.cancelOnServer,
			cancel:         &pgconn.CancelRequestContextWatcherHandler{Conn: c, DeadlineDelay: time.Second},
			deadline:       &pgconn.DeadlineContextWatcherHandler{Conn: c.Conn()},
		}
	}
	return b, nil
}

// ctxHandler decides what happens when the context of a running statement
// ends. While we wait in pg_advisory_lock it sends the server a cancel
// request, so that the waiter leaves PostgreSQL's lock queue at once instead
// of taking the lock for a dead client later. While we only listen for the
// server closing the session (Watch) it just ends the read: a cancel request
// would be pointless then, and could land on our next statement.
type ctxHandler struct {
	cancelOnServer *atomic.Bool
	cancel         ctxwatch.Handler
	deadline       ctxwatch.Handler
	active         ctxwatch.Handler
}

func (h *ctxHandler) HandleCancel(ctx context.Context) {
	h.active = h.deadline
	if h.cancelOnServer.Load() {
		h.active = h.cancel
	}
	h.active.HandleCancel(ctx)
}

func (h *ctxHandler) HandleUnwatchAfterCancel() { h.active.HandleUnwatchAfterCancel() }

// connect opens the dedicated connection if there is none. application_name
// names the holder, so that pg_stat_activity shows who holds what.
func (b *backend) connect(ctx context.Context, name string) (*pgx.Conn, error) {
	if b.conn != nil && !b.conn.IsClosed() {
		return b.conn, nil
	}
	config := b.config.Copy()
	if _, set := config.RuntimeParams["application_name"]; !set {
		h := b.opts.Holder
		// pid and host first: the server cuts the name at 63 bytes.
		config.RuntimeParams["application_name"] = printable(fmt.Sprintf("withlock %d@%s %s", h.PID, h.Host, name))
	}
	start := time.Now()
	conn, err := pgx.ConnectConfig(ctx, config)
	if err != nil {
		return nil, b.classify(err)
	}
	b.opts.Log.Debug("connected", "backend", "postgres", "addr", b.addr, "took", time.Since(start).Round(10*time.Microsecond))
	b.conn = conn
	return conn, nil
}

// printable replaces control characters, which the startup message cannot
// carry (NUL) or which would garble pg_stat_activity, with '?'.
func printable(s string) string {
	return strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return '?'
		}
		return r
	}, s)
}

func (b *backend) Close() error {
	if b.conn == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	return b.conn.Close(ctx)
}

func (b *backend) TryAcquire(ctx context.Context, name string) (lock.Lease, error) {
	conn, err := b.connect(ctx, name)
	if err != nil {
		return nil, err
	}
	k1, k2 := Keys(name)
	var got bool
	if err := conn.QueryRow(ctx, "select pg_try_advisory_lock($1, $2)", k1, k2).Scan(&got); err != nil {
		return nil, b.failed(err)
	}
	if !got {
		return nil, lock.ErrHeld
	}
	return &lease{b: b, conn: conn, k1: k1, k2: k2}, nil
}

// Acquire waits in pg_advisory_lock, so that PostgreSQL hands the lock over
// the moment its holder lets go.
func (b *backend) Acquire(ctx context.Context, name string) (lock.Lease, error) {
	conn, err := b.connect(ctx, name)
	if err != nil {
		return nil, err
	}
	k1, k2 := Keys(name)
	b.cancelOnServer.Store(true)
	_, err = conn.Exec(ctx, "select pg_advisory_lock($1, $2)", k1, k2)
	b.cancelOnServer.Store(false)
	if err != nil {
		if ctx.Err() != nil {
			// The lock may have been granted just as we gave up; ending the
			// session is the one sure way to leave nothing behind.
			b.Close()
			b.conn = nil
			return nil, fmt.Errorf("postgres: wait for %q: %w", name, context.Cause(ctx))
		}
		return nil, b.failed(err)
	}
	return &lease{b: b, conn: conn, k1: k1, k2: k2}, nil
}

// failed sorts an error from a statement; a connection that broke is
// dropped so that the next attempt reconnects.
func (b *backend) failed(err error) error {
	if b.conn != nil && b.conn.IsClosed() {
		b.conn = nil
	}
	return b.classify(err)
}

// classify sorts a driver error into lock's sentinels, with a message that
// says what to do next.
func (b *backend) classify(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch {
		case strings.HasPrefix(pgErr.Code, "08"), // connection exception
			strings.HasPrefix(pgErr.Code, "57P"), // shutting down, starting up
			pgErr.Code == "53300":                // too many connections
			return lock.Unreachable("postgres at "+b.addr, pgErr.Message)
		default: // authentication, permission, missing database, ...
			return lock.Errorf(lock.ErrRefused, "postgres at %s refused: %s (SQLSTATE %s)", b.addr, pgErr.Message, pgErr.Code)
		}
	}
	msg := err.Error()
	if strings.Contains(msg, "tls") || strings.Contains(msg, "x509") || strings.Contains(msg, "SSL") {
		return lock.Errorf(lock.ErrRefused, "postgres at %s: %v", b.addr, err)
	}
	return lock.Unreachable("postgres at "+b.addr, lock.Reason(err))
}

type lease struct {
	b      *backend
	conn   *pgx.Conn
	k1, k2 int32
}

// Keep checks that our session is alive and still holds the lock.
func (l *lease) Keep(ctx context.Context) error {
	var held bool
	err := l.conn.QueryRow(ctx, `select exists(select 1 from pg_locks
		where locktype = 'advisory' and pid = pg_backend_pid() and granted
		and classid::int8 = $1 and objid::int8 = $2 and objsubid = 2)`,
		int64(uint32(l.k1)), int64(uint32(l.k2))).Scan(&held)
	switch {
	case err != nil && ctx.Err() != nil:
		// Out of time: the caller decides what an unanswered check means.
		return l.b.classify(err)
	case err != nil && l.conn.IsClosed():
		return l.sessionEnded(err)
	case err != nil:
		return l.b.classify(err)
	case !held:
		return lock.Errorf(lock.ErrLost, "the session no longer holds the advisory lock")
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
			return l.b.classify(err)
		}
	}
}

func (l *lease) sessionEnded(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return lock.Errorf(lock.ErrLost, "postgres ended the session: %s", pgErr.Message)
	}
	return lock.Errorf(lock.ErrLost, "the connection to postgres at %s broke (%s)", l.b.addr, lock.Reason(err))
}

func (l *lease) Release(ctx context.Context) error {
	var was bool
	if err := l.conn.QueryRow(ctx, "select pg_advisory_unlock($1, $2)", l.k1, l.k2).Scan(&was); err != nil {
		return l.b.classify(err)
	}
	if !was {
		return errors.New("postgres: the lock was no longer held at release")
	}
	return nil
}
