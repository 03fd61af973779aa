// Package postgres is the postgres:// backend: a session advisory lock,
// pg_advisory_lock(k1, k2), on one dedicated connection. The lock lives
// exactly as long as that session, so PostgreSQL frees it whenever withlock
// or its connection dies; there is no lease to renew. Shared locks are
// pg_advisory_lock_shared on the same keys; a semaphore adds a slot lock
// (semaphore.go). What the session shows of its holder is in record.go;
// status and release --force in status.go.
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
	"strconv"
	"strings"
	"sync"
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

var (
	_ lock.Backend = (*backend)(nil)
	_ lock.Waiter  = (*backend)(nil)
	_ lock.Watcher = (*lease)(nil)
)

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
// statement returns: PgBouncer 1.18 (Debian 12's) crashes when a client
// closes that connection before PgBouncer has passed the request on
// (pgbouncer/pgbouncer#801). Nor does it wait 100ms more, as pgx's does, lest
// the cancel hit the next statement: a cancelled wait drops its
// connection, and in the race where the lock was granted anyway, a late
// cancel can only fail one later statement, which is retried or warned of.
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
//     waits (--timeout) and checks (the keep loop's deadlines), and sets
//     idle_session_timeout itself once it holds the lock (boundSQL).
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
//     client, which clears both;
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
			when exists(select 1 from pg_catalog.pg_lock_status() l where l.locktype = 'advisory' and l.pid = pg_catalog.pg_backend_pid())
				then 'this server session already held advisory locks'
			end as shared,
			case when pg_catalog.current_setting('transaction_timeout', true) is not null
				then pg_catalog.set_config('transaction_timeout', '0', false) end
		offset 0) s
	offset 0) x`

// lockSQLs are the lock statements of each mode: a single attempt, and a
// wait in the server's queue. A semaphore has no wait statement; see
// acquireSlot. They are built at first use, as every statement put
// together with Sprintf here: package init runs in every withlock start,
// whatever the backend (docs/design.md, A small binary, started often).
var lockSQLs = sync.OnceValue(func() map[lock.Mode][2]string {
	return map[lock.Mode][2]string{
		lock.Exclusive: {
			fmt.Sprintf(lockSQL, "case when pg_try_advisory_lock($1::int4, $2::int4) then 0 else -1 end", "$6", "$7", "$8"),
			fmt.Sprintf(lockSQL, "(select 0 from pg_advisory_lock($1::int4, $2::int4))", "$6", "$7", "$8"),
		},
		lock.Shared: {
			fmt.Sprintf(lockSQL, "case when pg_try_advisory_lock_shared($1::int4, $2::int4) then 0 else -1 end", "$6", "$7", "$8"),
			fmt.Sprintf(lockSQL, "(select 0 from pg_advisory_lock_shared($1::int4, $2::int4))", "$6", "$7", "$8"),
		},
		lock.Semaphore: {fmt.Sprintf(lockSQL, semTrySQL, "$11", "$12", "$13")}, // after semTrySQL's five
	}
})

// boundSQL is the server-side bound (docs/postgres.md), set on the session once it holds
// the lock: the server ends the session, and with it the lock, once
// withlock has been silent for the ttl, so that a
// holder that is frozen or partitioned away does not keep the lock for the
// others until the server notices a dead client (hours, with default
// keepalives). Every timer below starts at or after the last statement
// withlock sent, and withlock has stopped its command by ttl after the last
// check that succeeded (lock.Held), so the session ends after the command,
// never before:
//
//   - idle_session_timeout (PostgreSQL 14 and later): the session ends after
//     ttl without a statement. The keep loop's checks come every ttl/3, and
//     none runs in a transaction, to which the timeout would not apply. It
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
// cast costs a catalog lookup, and the arithmetic took a millisecond there
// (pg_lock_status() instead of the pg_locks view above saves another).
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
	sql := lockSQLs()[mode][0]
	if wait {
		sql = lockSQLs()[mode][1]
	}
	rec := b.record(name, nil)
	for probes := 1; ; probes++ {
		conn, err := b.connect(ctx, name)
		if err != nil {
			return nil, err
		}
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

// record is this holder's record (see record.go) for a lock on name,
// granted at at (nil while it is being taken).
func (b *backend) record(name string, at *time.Time) string {
	h := b.opts.Holder
	r := record{Withlock: 1, Host: h.Host, PID: h.PID, Name: name, Command: h.Command}
	if at != nil {
		t := at.UTC()
		r.At = &t
	}
	return r.fit()
}

// pooler is the refusal of a server session that other clients share.
func (b *backend) pooler(why string) error {
	return lock.Unsafe(fmt.Sprintf("postgres at %s shares server sessions between clients (%s), as a pooler in transaction or statement mode does, so a lock there excludes nobody", b.addr, why),
		"use a session-mode pool (PgBouncer pool_mode=session) or connect to the server directly")
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
// dropped: ErrHeld, as far as the waiter knows, so that Client.Acquire
// waits again (at once after a long wait; one that keeps being cut at once
// is paced as a poll).
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

// Release unlocks, in the server process that holds the lock only.
func (l *lease) Release(ctx context.Context) error {
	var was *bool
	var err error
	if l.sem != nil {
		err = l.conn.QueryRow(ctx, releaseSQLs[l.mode], l.sem.slot(l.slot), l.pid, l.sem.channel).Scan(&was, nil, nil)
	} else {
		err = l.conn.QueryRow(ctx, releaseSQLs[l.mode], l.k1, l.k2, l.pid).Scan(&was)
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
