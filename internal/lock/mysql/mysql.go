package mysql

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"database/sql"
	"database/sql/driver"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
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
// again by itself after driver.ErrBadConn, and a backend makes single
// attempts (lock.Backend's TryAcquire): it never retries.
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

// withAux runs f on a short-lived connection of its own.
func (b *backend) withAux(ctx context.Context, f func(c *sql.Conn) error) error {
	c, err := b.aux.Conn(ctx)
	if err != nil {
		return b.auxFailed(ctx, err)
	}
	defer c.Close()
	if err := f(c); err != nil {
		return b.auxFailed(ctx, err)
	}
	return nil
}

func (b *backend) auxFailed(ctx context.Context, err error) error {
	for _, kind := range []error{lock.ErrRefused, lock.ErrUnavailable, lock.ErrHeld, lock.ErrNotSupported} {
		if errors.Is(err, kind) {
			return err // already sorted
		}
	}
	kind, why := sortError(err)
	if kind == lock.ErrUnavailable && expired(ctx) {
		why = "timed out"
	}
	return b.errorAt(kind, why, err)
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
