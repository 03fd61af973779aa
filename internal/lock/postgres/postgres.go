package postgres

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/url"
	"os"
	"slices"
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
	config *pgx.ConnConfig // one host's: connect sets Host and Port
	hosts  []*host
	opts   lock.Options

	conn    *pgx.Conn
	current *host  // conn's server
	addr    string // host:port of conn's server (before connecting: the first host's), for messages
	token   string // conn's mark on its server session; see lockSQL
	// listening is the channel conn LISTENs on (a semaphore's waiter), and
	// notified gets a value when a notification arrives, whatever conn was
	// doing then; see acquireSlot.
	listening string
	notified  chan struct{}
	// pooled says that a pooler is in between: the server ran our
	// statements in another process than the one that answered the
	// connection. seen lists the server processes our earlier connections
	// marked; see take.
	pooled bool
	seen   []int64
	// cancelOnServer says how the open context-watcher of conn reacts to
	// a context ending; see ctxHandler.
	cancelOnServer atomic.Bool
	// settingsBySQL says that the server refused sessionSettings in the
	// startup message; see connectTo.
	settingsBySQL bool
	// testHooks widen a semaphore waiter's races in tests; nil otherwise.
	testHooks *semaphoreTestHooks
}

func open(u *url.URL, opts lock.Options) (lock.Backend, error) {
	if opts.Mode == lock.Semaphore && opts.MaxHolders > maxSlots {
		return nil, lock.Errorf(lock.ErrUsage, "a PostgreSQL semaphore has at most %d holders, not %d", maxSlots, opts.MaxHolders)
	}
	config, err := pgx.ParseConfig(u.String())
	if err != nil {
		return nil, lock.Errorf(lock.ErrUsage, "postgres URL: %v", err)
	}
	if config.ConnectTimeout == 0 {
		config.ConnectTimeout = min(maxDial, opts.ConnectTimeout)
	}
	if config.ValidateConnect, err = targetSessionAttrs(u); err != nil {
		return nil, err
	}
	// One round trip per statement, no prepared-statement cache: each
	// statement runs once or a few times per process.
	config.DefaultQueryExecMode = pgx.QueryExecModeExec
	// connect tries the hosts itself, one pgx attempt each, so that each
	// failure is judged (and named) on its own; the dialer negotiates TLS.
	hs := hosts(&config.Config)
	d := &dialer{dial: config.DialFunc, hosts: hs, served: map[string]*host{}}
	config.DialFunc = d.DialContext
	// The dialer gets the host name, for its TLS; net.Dialer tries each of
	// its addresses.
	config.LookupFunc = func(_ context.Context, host string) ([]string, error) { return []string{host}, nil }
	config.TLSConfig, config.Fallbacks = nil, nil
	b := &backend{config: config, hosts: hs, addr: hs[0].addr, opts: opts, notified: make(chan struct{}, 1)}
	config.BuildContextWatcherHandler = func(c *pgconn.PgConn) ctxwatch.Handler {
		return &ctxHandler{conn: c, cancelOnServer: &b.cancelOnServer}
	}
	config.OnNotification = func(*pgconn.PgConn, *pgconn.Notification) {
		select {
		case b.notified <- struct{}{}:
		default:
		}
	}
	return b, nil
}

// sibling returns a backend for a second connection to the server of b's
// connection, with b's options; it gets no notifications.
func (b *backend) sibling() *backend {
	config := b.config.Copy()
	config.OnNotification = nil
	h := b.current
	if h == nil {
		h = b.hosts[0]
	}
	s := &backend{config: config, hosts: []*host{h}, addr: h.addr, opts: b.opts, settingsBySQL: b.settingsBySQL}
	config.BuildContextWatcherHandler = func(c *pgconn.PgConn) ctxwatch.Handler {
		return &ctxHandler{conn: c, cancelOnServer: &s.cancelOnServer}
	}
	return s
}

// targetSessionAttrs returns the check of the URL's target_session_attrs
// (or $PGTARGETSESSIONATTRS), as libpq does it, answered from what the
// server reports at start-up where it can (PostgreSQL 14 and later), so
// that it costs no round trip. The values that pick a standby are refused:
// a lock on a standby excludes nobody.
func targetSessionAttrs(u *url.URL) (pgconn.ValidateConnectFunc, error) {
	attrs := u.Query().Get("target_session_attrs")
	if attrs == "" {
		attrs = os.Getenv("PGTARGETSESSIONATTRS")
	}
	switch attrs {
	case "", "any":
		return nil, nil
	case "read-write":
		return func(ctx context.Context, c *pgconn.PgConn) error {
			standby, readOnly := c.ParameterStatus("in_hot_standby"), c.ParameterStatus("default_transaction_read_only")
			if standby == "" || readOnly == "" {
				return pgconn.ValidateConnectTargetSessionAttrsReadWrite(ctx, c)
			}
			if standby == "on" || readOnly == "on" {
				return pgconn.ErrReadOnlyConnection
			}
			return nil
		}, nil
	case "primary":
		return func(ctx context.Context, c *pgconn.PgConn) error {
			switch c.ParameterStatus("in_hot_standby") {
			case "":
				return pgconn.ValidateConnectTargetSessionAttrsPrimary(ctx, c)
			case "on":
				return pgconn.ErrStandbyConnection
			}
			return nil
		}, nil
	default: // read-only, standby, prefer-standby
		return nil, lock.Errorf(lock.ErrUsage, "target_session_attrs=%s picks a standby, where a lock excludes nobody on the primary; use read-write or primary", attrs)
	}
}

// cancelWait bounds how long a statement whose context ended waits for
// the server to act on the cancel request before its read is cut.
const cancelWait = time.Second

// ctxHandler decides what happens when the context of a running statement
// ends. While we wait in pg_advisory_lock it sends the server a cancel
// request, so that the waiter leaves PostgreSQL's lock queue at once instead
// of taking the lock for a dead client later. While we only listen for the
// server closing the session (Watch) it just ends the read: a cancel request
// would be pointless then, and could land on our next statement.
//
// Unlike pgx's own handler, it lets the server close the cancel request's
// connection, as libpq does, instead of closing it as soon as the
// statement returns: PgBouncer 1.18 crashes when a client closes that
// connection before PgBouncer has passed the request on. Nor does it wait
// 100ms more, as pgx's does, lest the cancel hit the next statement: a
// cancelled wait drops its connection, and in the race where the lock was
// granted anyway, a late cancel can only fail one later statement, which
// is retried or warned of.
type ctxHandler struct {
	conn           *pgconn.PgConn
	cancelOnServer *atomic.Bool
	cancelled      chan struct{} // closed when the cancel request is done; nil when none was sent
}

func (h *ctxHandler) HandleCancel(context.Context) {
	deadline := time.Now()
	h.cancelled = nil
	if h.cancelOnServer.Load() {
		deadline = deadline.Add(cancelWait)
		done := make(chan struct{})
		h.cancelled = done
		go func() {
			defer close(done)
			ctx, cancel := context.WithDeadline(context.Background(), deadline)
			defer cancel()
			h.conn.CancelRequest(ctx) // returns when the server closes its connection
		}()
	}
	h.conn.Conn().SetDeadline(deadline)
}

func (h *ctxHandler) HandleUnwatchAfterCancel() {
	if h.cancelled != nil {
		<-h.cancelled
	}
	h.conn.Conn().SetDeadline(time.Time{})
}

// connect opens the dedicated connection if there is none, to the first
// host of the URL that answers (and suits target_session_attrs), as libpq
// does. A refusal ends the search: it is the answer. application_name
// names the holder, so that pg_stat_activity shows who holds what.
func (b *backend) connect(ctx context.Context, name string) (*pgx.Conn, error) {
	if b.conn != nil && !b.conn.IsClosed() {
		return b.conn, nil
	}
	b.conn = nil
	config := b.config.Copy()
	if _, set := config.RuntimeParams["application_name"]; !set {
		h := b.opts.Holder
		// pid and host first: the server cuts the name at 63 bytes.
		config.RuntimeParams["application_name"] = printable(fmt.Sprintf("withlock %d@%s %s", h.PID, h.Host, name))
	}
	var addrs, whys []string
	for _, h := range b.hosts {
		config.Host, config.Port = h.host, h.port
		start := time.Now()
		conn, err := b.connectTo(ctx, config)
		if err == nil {
			b.opts.Log.Debug("connected", "backend", "postgres", "addr", h.addr, "took", time.Since(start).Round(10*time.Microsecond))
			b.conn, b.current, b.addr, b.token, b.listening = conn, h, h.addr, lock.NewToken(), ""
			return conn, nil
		}
		kind, why := sortError(err)
		if kind == lock.ErrRefused || len(b.hosts) == 1 {
			return nil, b.errorAt(h.addr, kind, why)
		}
		addrs, whys = append(addrs, h.addr), append(whys, why)
		if ctx.Err() != nil {
			break
		}
	}
	if len(slices.Compact(slices.Clone(whys))) == 1 { // one reason for all
		return nil, lock.Unreachable("postgres at "+strings.Join(addrs, ", "), whys[0])
	}
	for i := range addrs {
		addrs[i] += " (" + whys[i] + ")"
	}
	return nil, lock.Errorf(lock.ErrUnavailable, "cannot reach postgres at %s", strings.Join(addrs, ", "))
}

// sessionSettings make the session withlock's own: the server's and the
// role's settings must not end what withlock does there, nor change what
// its statements mean. They go in the startup message, where they override
// the role's and the database's settings and cost no round trip.
//
//   - statement_timeout, lock_timeout and idle_in_transaction_session_timeout
//     off: a role or database that carries them (ALTER ROLE app SET
//     statement_timeout = '30s') would otherwise end a wait for the lock
//     after that long, and cancel a holder's checks. withlock bounds its own
//     waits (--timeout) and checks (each Keep runs within its ctx's
//     deadline), and sets idle_session_timeout itself once it holds the
//     lock (boundSQL).
//     transaction_timeout (PostgreSQL 17) cannot go here, since an older
//     server refuses a setting it does not know: lockSQL turns it off.
//   - search_path pinned to pg_catalog: with a path that names a schema
//     before pg_catalog, a function of the same name there (a look-alike
//     pg_advisory_lock that locks nothing) would replace the real one.
//     Every statement also names pg_catalog itself; the pinned path covers
//     the operators.
var sessionSettings = map[string]string{
	"statement_timeout":                   "0",
	"lock_timeout":                        "0",
	"idle_in_transaction_session_timeout": "0",
	"search_path":                         "pg_catalog, pg_temp",
}

// connectTo opens a connection with config and sessionSettings. PgBouncer
// refuses settings in the startup message that it does not track
// ("unsupported startup parameter"); from then on this backend connects
// without them and sets them in a first statement of their own, one round
// trip more (a pooler costs a connection or more anyway; see take).
func (b *backend) connectTo(ctx context.Context, config *pgx.ConnConfig) (*pgx.Conn, error) {
	if !b.settingsBySQL {
		withSettings := config.Copy()
		maps.Copy(withSettings.RuntimeParams, sessionSettings)
		conn, err := pgx.ConnectConfig(ctx, withSettings)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || !strings.HasPrefix(pgErr.Message, "unsupported startup parameter") {
			return conn, err
		}
		b.opts.Log.Debug("the server takes no settings at start-up (a pooler?); setting them in a statement", "backend", "postgres", "why", pgErr.Message)
		b.settingsBySQL = true
	}
	conn, err := pgx.ConnectConfig(ctx, config)
	if err != nil {
		return nil, err
	}
	sql := "set statement_timeout = 0; set lock_timeout = 0; set idle_in_transaction_session_timeout = 0; set search_path = pg_catalog, pg_temp"
	if _, err := conn.PgConn().Exec(ctx, sql).ReadAll(); err != nil {
		conn.Close(context.WithoutCancel(ctx))
		return nil, err
	}
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

// pooler is the refusal of a server session that other clients share.
func (b *backend) pooler(why string) error {
	return lock.Unsafe(fmt.Sprintf("postgres at %s shares server sessions between clients (%s), as a pooler in transaction or statement mode does, so a lock there excludes nobody", b.addr, why),
		"use a session-mode pool (PgBouncer pool_mode=session) or connect to the server directly")
}

// standby is the refusal of a hot standby, by acquisition, status, release
// --force and withlock check alike.
func (b *backend) standby() error {
	return lock.Unsafe(fmt.Sprintf("postgres at %s is a hot standby, where a lock excludes nobody on the primary", b.addr),
		"point withlock at the primary, or add target_session_attrs=read-write to a URL that lists every host")
}

// drop ends the connection, and with it any lock it holds.
func (b *backend) drop() {
	b.Close()
	b.conn, b.listening = nil, ""
}

// failed sorts an error from a statement; a connection that broke is
// dropped so that the next attempt reconnects.
func (b *backend) failed(err error) error {
	if b.conn != nil && b.conn.IsClosed() {
		b.conn = nil
	}
	kind, why := sortError(err)
	return b.errorAt(b.addr, kind, why)
}

// sortError sorts a driver error into ErrRefused, ErrUnavailable or
// errFull, and says why in a few words. A network that fails (closed, reset, timed out)
// is never a refusal, whatever step of the start-up it cut.
func sortError(err error) (kind error, why string) {
	var pgErr *pgconn.PgError
	var tlsErr *tlsError
	switch {
	case errors.As(err, &pgErr):
		switch pgErr.Code {
		case "53300":
			return errFull, fmt.Sprintf("%s, SQLSTATE 53300", pgErr.Message)
		case "57014", "55P03": // query_canceled, lock_not_available
			return errCancelled, fmt.Sprintf("%s, SQLSTATE %s", pgErr.Message, pgErr.Code)
		}
		if strings.HasPrefix(pgErr.Code, "08") || // connection exception
			strings.HasPrefix(pgErr.Code, "57P") || // shutting down, starting up, terminated
			strings.HasPrefix(pgErr.Code, "53") { // too many connections, out of memory
			return lock.ErrUnavailable, pgErr.Message
		}
		// authentication, permission, missing database, ...
		return lock.ErrRefused, fmt.Sprintf("%s (SQLSTATE %s)", pgErr.Message, pgErr.Code)
	case errors.Is(err, errNoTLS):
		return lock.ErrRefused, errNoTLS.Error()
	case errors.As(err, &tlsErr):
		return lock.ErrRefused, tlsErr.Error()
	case errors.Is(err, pgconn.ErrReadOnlyConnection), errors.Is(err, pgconn.ErrStandbyConnection):
		return lock.ErrUnavailable, "not the primary that target_session_attrs asks for"
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		// What pgx says of a connection that closed under a statement sent by
		// the simple protocol: its reader drops the EOF (pgx 5.12).
		errors.Is(err, pgconn.ErrConnClosed):
		return lock.ErrUnavailable, "connection closed"
	}
	return lock.ErrUnavailable, lock.Reason(err)
}

// waitCut says whether err ended a wait in the server's queue without a
// refusal: the server or a pooler cancelled the statement (errCancelled),
// or ended the session (a pooler's query_timeout, pg_terminate_backend, a
// restart). The server was reached for that wait, so the wait is not an
// outage: the waiter waits again, and only if it cannot reconnect is it one
// (an outage, bounded by --connect-timeout).
func waitCut(err error) bool {
	kind, _ := sortError(err)
	return kind == errCancelled || kind == lock.ErrUnavailable
}

// cutWait is the error of a wait that waitCut says was cut, its connection
// dropped: ErrHeld, as far as the waiter knows, so that the lock is waited
// for again, like any lock found held, rather than counted as an outage.
func (b *backend) cutWait(err error) error {
	_, why := sortError(err)
	b.opts.Log.Debug("the server cut the wait; waiting again", "backend", "postgres", "addr", b.addr, "why", why)
	return lock.ErrHeld
}

// isCancel says whether err is a statement the server cancelled; see
// errCancelled.
func isCancel(err error) bool {
	kind, _ := sortError(err)
	return kind == errCancelled
}

// errFull is sortError's kind for a server that answered but has no
// connection to spare (SQLSTATE 53300: max_connections, or a role's or
// database's connection limit, reached). It is an outage, retried like one
// (errorAt makes it ErrUnavailable), but "cannot reach" would send the
// user to look at the network.
var errFull = errors.New("no connection to spare")

// errCancelled is sortError's kind for a statement that the server
// cancelled while the session lives on: an administrator's
// pg_cancel_backend, a tool that cancels long statements, a timeout that
// setUp could not turn off. It is no refusal: nothing was refused, the
// statement was only cut. A wait for the lock that was cut waits again
// (waitCut); any other statement is an outage, retried like one. The
// session may hold a lock that the statement took before the cut (a
// session lock outlives its statement), so the connection is dropped,
// except under a check, which takes nothing.
var errCancelled = errors.New("statement cancelled")

// errorAt is the message of an error sorted by sortError, for the server
// at addr.
func (b *backend) errorAt(addr string, kind error, why string) error {
	switch kind {
	case lock.ErrRefused:
		return lock.Errorf(kind, "postgres at %s refused: %s", addr, why)
	case errFull:
		return lock.Errorf(lock.ErrUnavailable, "postgres at %s has no connection to spare (%s: max_connections or a connection limit reached)", addr, why)
	case errCancelled:
		return lock.Errorf(lock.ErrUnavailable, "postgres at %s cancelled our statement (%s)", addr, why)
	}
	return lock.Unreachable("postgres at "+addr, why)
}
