// Package mysql is the mysql:// backend, for MySQL 5.7 and later and
// MariaDB 10: a user-level lock, GET_LOCK(Key(NAME), timeout), on one
// dedicated connection. The lock lives exactly as long as that session, so
// the server frees it whenever withlock or its connection dies; there is no
// lease to renew. The `mysql` client's GET_LOCK on the same key excludes
// withlock and the other way round.
//
// A semaphore of N holders (--max-holders N) is N such locks, its slots;
// slot 0 is NAME's own key, so that an exclusive holder and a semaphore's
// first holder exclude each other. GET_LOCK has no shared mode: --shared
// is refused.
//
// Waiters wait in the server, in GET_LOCK: an exclusive lock's for
// waitSeconds at a time; a semaphore's tries every slot and then waits in
// one of them, chosen at random, for slotWaitSeconds, since no server can
// wait for any one of several locks.
//
// The session also carries what status shows: the connection attribute
// program_name=withlock, and user variables, set by the statement that
// locks, holding the holder's record (@withlock) and the server's time
// of the attempt (@withlock_at). Other sessions can read them only
// through performance_schema.
package mysql

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"database/sql"
	"database/sql/driver"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/withlock/withlock/internal/lock"
)

func init() {
	lock.Register("mysql", open)
	// The driver logs some failures on stderr by itself; withlock's stderr
	// is its own, and those errors reach us as return values anyway.
	gomysql.SetLogger(&gomysql.NopLogger{})
}

var (
	_ lock.Backend = (*backend)(nil)
	_ lock.Waiter  = (*backend)(nil)
	_ lock.Watcher = (*lease)(nil)
)

// keyPrefix starts every key. MySQL caps lock names at 64 characters:
// the prefix and 55 hex digits fill them.
const keyPrefix = "withlock:"

// Key is NAME's lock name on the server: "withlock:" and the first 55 hex
// digits of SHA-256(NAME as UTF-8), 64 characters. It is also slot 0 of a
// semaphore.
func Key(name string) string { return keyPrefix + digest(name)[:55] }

// SlotKey is the lock name of slot i of NAME's semaphore: Key(NAME) for
// slot 0, else "withlock:", the first 48 hex digits of SHA-256(NAME), ":"
// and i in decimal (at most 64 characters for any i below MaxHolders).
// Slot keys cannot be another NAME's Key, which has no ':' after the prefix.
func SlotKey(name string, i int) string {
	if i == 0 {
		return Key(name)
	}
	return slotPrefix(name) + strconv.Itoa(i)
}

func slotPrefix(name string) string { return keyPrefix + digest(name)[:48] + ":" }

func digest(name string) string {
	sum := sha256.Sum256([]byte(name))
	return hex.EncodeToString(sum[:])
}

// MaxHolders is the largest semaphore this backend takes. Each holder is a
// connection, and status looks for holders in every slot below it.
const MaxHolders = 1000

// maxDial bounds one connection attempt, so that a host that drops packets
// is retried (and reported) instead of hanging the whole wait.
const maxDial = 5 * time.Second

// waitSeconds is how long one server-side wait (Waiter.Acquire) for an
// exclusive lock lasts; a wait that runs out is said to be ErrHeld, and
// Client.Acquire issues another. The socket gives up waitSlack later: by
// then the server or the network is gone.
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

type backend struct {
	addr string
	opts lock.Options
	n    int // slots: 1 for an exclusive lock

	// db makes the lock's connections, one at a time (dialled records the
	// socket of the last); aux makes the short ones of KILL QUERY, status
	// and release.
	db      *sql.DB
	aux     *sql.DB
	dialMu  sync.Mutex
	dialled *socket
	conn    *sql.Conn    // the lock's connection; nil when there is none
	sock    *socket      // conn's socket
	id      int64        // conn's CONNECTION_ID(), once known
	holder  holderRecord // @withlock, but for the name
	warned  bool         // Server.Warning was logged
	server  *Server      // what conn's first packet detected; nil before
}

func open(u *url.URL, opts lock.Options) (lock.Backend, error) {
	switch {
	case opts.Mode == lock.Shared:
		return nil, lock.Errorf(lock.ErrUsage, "the mysql backend has no shared locks: GET_LOCK is exclusive only; use an exclusive lock or --max-holders N")
	case opts.Mode == lock.Semaphore && opts.MaxHolders > MaxHolders:
		return nil, lock.Errorf(lock.ErrUsage, "the mysql backend takes semaphores of at most %d holders, not %d", MaxHolders, opts.MaxHolders)
	}
	config, err := parseURL(u)
	if err != nil {
		return nil, err
	}
	config.Timeout = min(maxDial, opts.ConnectTimeout)
	b := &backend{addr: config.Addr, opts: opts, n: 1}
	if opts.Mode == lock.Semaphore {
		b.n = opts.MaxHolders
	}
	b.holder = record(opts.Holder, opts.Mode, opts.MaxHolders)

	lockConfig := config.Clone()
	lockConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		s, err := dial(ctx, network, addr)
		if err == nil {
			b.dialMu.Lock()
			b.dialled = s.(*socket)
			b.dialMu.Unlock()
		}
		return s, err
	}
	b.db, err = openDB(lockConfig)
	if err != nil {
		return nil, err
	}
	auxConfig := config.Clone()
	auxConfig.DialFunc = dial
	if b.aux, err = openDB(auxConfig); err != nil {
		return nil, err
	}
	return b, nil
}

// parseURL turns mysql://user:password@host[:port]/[database][?tls=...]
// into the driver's configuration. tls takes the driver's values: true
// (verified), skip-verify, preferred (TLS if the server offers it,
// unverified) or false (the default, as the driver's). cacert (the CA to
// verify the server with, instead of the system's), cert and key (a client
// certificate) are withlock's, as for Redis and etcd; they imply tls=true.
func parseURL(u *url.URL) (*gomysql.Config, error) {
	c := gomysql.NewConfig()
	c.Net = "tcp"
	host := u.Host
	if host == "" {
		return nil, lock.Errorf(lock.ErrUsage, "mysql URL: no host; write mysql://user:password@host:3306/database")
	}
	if u.Port() == "" {
		host = net.JoinHostPort(u.Hostname(), "3306")
	}
	c.Addr = host
	if u.User != nil {
		c.User = u.User.Username()
		c.Passwd, _ = u.User.Password()
	}
	db := strings.TrimPrefix(u.Path, "/")
	if strings.Contains(db, "/") {
		return nil, lock.Errorf(lock.ErrUsage, "mysql URL: %q is not a database name", db)
	}
	c.DBName = db
	for k, vs := range u.Query() {
		v := vs[len(vs)-1]
		switch k {
		case "tls":
			switch v {
			case "true", "skip-verify", "preferred", "false":
				c.TLSConfig = v
			default:
				return nil, lock.Errorf(lock.ErrUsage, "mysql URL: tls must be true, skip-verify, preferred or false, not %q", v)
			}
		case "cacert", "cert", "key":
		default:
			return nil, lock.Errorf(lock.ErrUsage, "mysql URL: unknown parameter %q; there are tls, cacert, cert and key", k)
		}
	}
	files, err := lock.TLSFiles("mysql URL", u.Query())
	if err != nil {
		return nil, err
	}
	if files != nil {
		switch {
		case c.TLSConfig == "":
			c.TLSConfig = "true" // a CA or a client certificate asks for TLS
		case c.TLSConfig == "false":
			return nil, lock.Errorf(lock.ErrUsage, "mysql URL: cacert, cert and key are TLS options, and tls is false")
		case c.TLSConfig != "true" && files.RootCAs != nil:
			return nil, lock.Errorf(lock.ErrUsage, "mysql URL: cacert is for verifying the server, and tls=%s verifies nothing; use tls=true", c.TLSConfig)
		}
	} else {
		files = &tls.Config{}
	}
	// The driver resolves TLSConfig names when a DSN is parsed; the same,
	// for a Config made by hand.
	switch c.TLSConfig {
	case "true":
		c.TLS = &tls.Config{ServerName: u.Hostname(), RootCAs: files.RootCAs, Certificates: files.Certificates}
	case "skip-verify", "preferred":
		c.TLS = &tls.Config{InsecureSkipVerify: true, Certificates: files.Certificates}
		c.AllowFallbackToPlaintext = c.TLSConfig == "preferred"
	}
	c.TLSConfig = ""
	// Every statement is one round trip: parameters are quoted by the
	// driver into the text (never pasted by us), and a lock statement can
	// set session variables in the same packet.
	c.InterpolateParams = true
	c.MultiStatements = true
	c.CheckConnLiveness = false
	c.ConnectionAttributes = "program_name:withlock"
	c.Logger = &gomysql.NopLogger{}
	return c, nil
}

func openDB(c *gomysql.Config) (*sql.DB, error) {
	conn, err := gomysql.NewConnector(c)
	if err != nil {
		return nil, lock.Errorf(lock.ErrUsage, "mysql URL: %v", err)
	}
	db := sql.OpenDB(oneAttempt{conn})
	// A connection given back is closed: each is one session, and the
	// lock's session ends with it.
	db.SetMaxIdleConns(0)
	return db, nil
}

// oneAttempt makes one connection attempt per call: database/sql tries
// again by itself after driver.ErrBadConn, and retrying is Client.Acquire's
// business.
type oneAttempt struct{ driver.Connector }

func (c oneAttempt) Connect(ctx context.Context) (driver.Conn, error) {
	conn, err := c.Connector.Connect(ctx)
	if errors.Is(err, driver.ErrBadConn) {
		err = errBroken
	}
	return conn, err
}

var errBroken = errors.New("connection broken")

// dial connects with TCP keepalives, as the driver does, and returns the
// socket that the backend can bound and watch.
func dial(ctx context.Context, network, addr string) (net.Conn, error) {
	d := net.Dialer{KeepAlive: 15 * time.Second}
	c, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &socket{Conn: c}, nil
}

// record is the holder's record, as @withlock holds it. A command too long
// for a statement is cut short.
func record(h lock.Holder, mode lock.Mode, n int) holderRecord {
	const maxCommand = 16 << 10
	cmd, size := h.Command, 0
	for i, a := range cmd {
		if size += len(a); size > maxCommand {
			cmd = append(cmd[:i:i], "...")
			break
		}
	}
	return holderRecord{Host: h.Host, PID: h.PID, Command: cmd, Mode: mode, MaxHolders: n}
}

// holderRecord is @withlock's JSON.
type holderRecord struct {
	Name       string    `json:"name,omitempty"`
	Host       string    `json:"host"`
	PID        int       `json:"pid"`
	Command    []string  `json:"command"`
	Mode       lock.Mode `json:"mode"`
	MaxHolders int       `json:"max_holders,omitempty"`
}

// connect opens the lock's connection if there is none.
func (b *backend) connect(ctx context.Context) error {
	if b.conn != nil {
		return nil
	}
	start := time.Now()
	conn, err := b.db.Conn(ctx)
	if err != nil {
		return b.failed(ctx, err)
	}
	b.dialMu.Lock()
	b.sock, b.dialled = b.dialled, nil
	b.dialMu.Unlock()
	b.conn, b.id = conn, 0
	b.opts.Log.Debug("connected", "backend", "mysql", "addr", b.addr, "took", time.Since(start).Round(10*time.Microsecond))
	return nil
}

// drop ends the lock's connection, and with it any lock it holds.
func (b *backend) drop() {
	if b.conn == nil {
		return
	}
	b.conn.Close()
	b.conn, b.sock, b.id, b.server = nil, nil, 0, nil
}

func (b *backend) Close() error {
	b.drop()
	return errors.Join(b.db.Close(), b.aux.Close())
}

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

// auxExec runs one statement on a short-lived connection of its own.
func (b *backend) auxExec(ctx context.Context, query string, args ...any) error {
	c, err := b.aux.Conn(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	_, err = c.ExecContext(ctx, query, args...)
	return err
}

// queryRow runs query on the lock's connection, bounded by ctx through the
// socket (see socket.bound), scans the first row of its first result into
// dest, and reads the other results of a multi-statement query, with rest
// unless it is nil; any error is returned.
func (b *backend) queryRow(ctx context.Context, query string, args []any, rest func(*sql.Rows) error, dest ...any) error {
	if b.conn == nil {
		return errBroken
	}
	stop := b.sock.bound(ctx)
	defer stop()
	rows, err := b.conn.QueryContext(context.WithoutCancel(ctx), query, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	if !rows.Next() {
		if err := rows.Err(); err != nil {
			return err
		}
		return sql.ErrNoRows
	}
	if err := rows.Scan(dest...); err != nil {
		return err
	}
	for rows.Next() {
	}
	if rest != nil {
		if err := rest(rows); err != nil {
			return err
		}
	}
	for rows.NextResultSet() {
		for rows.Next() {
		}
	}
	return rows.Err()
}

// failed sorts an error from the lock's connection, made under ctx; a
// connection that broke is dropped so that the next attempt reconnects.
func (b *backend) failed(ctx context.Context, err error) error {
	kind, why := sortError(err)
	if kind == lock.ErrUnavailable && expired(ctx) {
		// The socket was cut at ctx's end (the driver says only that the
		// connection is invalid): time ran out, which says nothing about
		// the server.
		why = "timed out"
	}
	if kind == lock.ErrUnavailable || errors.Is(err, driver.ErrBadConn) || errors.Is(err, sql.ErrConnDone) {
		b.drop()
	}
	return b.errorAt(kind, why, err)
}

// errorAt says what went wrong with the server (kind and why from
// sortError, of err).
func (b *backend) errorAt(kind error, why string, err error) error {
	var myErr *gomysql.MySQLError
	switch {
	case kind == lock.ErrRefused:
		return lock.Errorf(kind, "mysql at %s refused: %s", b.addr, why)
	case errors.As(err, &myErr) && connectionLimit[myErr.Number]:
		// Reached, but full: retried like an outage, and said as it is.
		return lock.Errorf(kind, "mysql at %s is at its connection limit: %s", b.addr, why)
	}
	return lock.Unreachable("mysql at "+b.addr, why)
}

// connectionLimit are the server errors of a server, or an account, at
// its connection limit (max_connections, max_user_connections).
var connectionLimit = map[uint16]bool{
	1040: true, // ER_CON_COUNT_ERROR: too many connections
	1203: true, // ER_TOO_MANY_USER_CONNECTIONS
	1226: true, // ER_USER_LIMIT_REACHED
}

// Server errors that say the server cannot serve us now, not that it
// refuses us: worth retrying.
var unavailableErrors = map[uint16]bool{
	1040: true, // ER_CON_COUNT_ERROR: too many connections
	1053: true, // ER_SERVER_SHUTDOWN
	1077: true, // ER_NORMAL_SHUTDOWN
	1079: true, // ER_SHUTDOWN_COMPLETE
	1152: true, // ER_ABORTING_CONNECTION
	1158: true, // ER_NET_READ_ERROR
	1159: true, // ER_NET_READ_INTERRUPTED
	1160: true, // ER_NET_ERROR_ON_WRITE
	1161: true, // ER_NET_WRITE_INTERRUPTED
	1184: true, // ER_NEW_ABORTING_CONNECTION
	1203: true, // ER_TOO_MANY_USER_CONNECTIONS
	1205: true, // ER_LOCK_WAIT_TIMEOUT
	1226: true, // ER_USER_LIMIT_REACHED
	1317: true, // ER_QUERY_INTERRUPTED
	1927: true, // ER_CONNECTION_KILLED (MariaDB)
	3169: true, // ER_SESSION_WAS_KILLED (MySQL)
	4031: true, // ER_CLIENT_INTERACTION_TIMEOUT (MySQL 8.0.24+: wait_timeout)
}

// sortError sorts a driver error into ErrRefused or ErrUnavailable, and
// says why in a few words. Any answer of the server other than the few
// that say it is busy or going away is a refusal (access denied, no such
// database, a privilege missing); a network that fails is never one.
func sortError(err error) (kind error, why string) {
	var myErr *gomysql.MySQLError
	var certErr *tls.CertificateVerificationError
	switch {
	case errors.As(err, &myErr):
		why := fmt.Sprintf("%s (error %d)", myErr.Message, myErr.Number)
		if unavailableErrors[myErr.Number] {
			return lock.ErrUnavailable, why
		}
		return lock.ErrRefused, why
	case errors.Is(err, gomysql.ErrNoTLS), errors.Is(err, gomysql.ErrCleartextPassword),
		errors.Is(err, gomysql.ErrNativePassword), errors.Is(err, gomysql.ErrOldPassword),
		errors.Is(err, gomysql.ErrUnknownPlugin), errors.Is(err, gomysql.ErrOldProtocol):
		return lock.ErrRefused, err.Error()
	case errors.As(err, &certErr):
		return lock.ErrRefused, err.Error()
	case isEOF(err), errors.Is(err, gomysql.ErrInvalidConn), errors.Is(err, driver.ErrBadConn),
		errors.Is(err, sql.ErrConnDone), errors.Is(err, errBroken):
		if r := lock.Reason(err); r != err.Error() {
			return lock.ErrUnavailable, r // timed out, reset...
		}
		return lock.ErrUnavailable, "connection closed"
	}
	return lock.ErrUnavailable, lock.Reason(err)
}

// expired reports whether ctx is done or its deadline has passed: a
// socket's deadline can fire a moment before ctx's timer.
func expired(ctx context.Context) bool {
	d, ok := ctx.Deadline()
	return ctx.Err() != nil || ok && !time.Now().Before(d)
}

func isEOF(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET)
}
