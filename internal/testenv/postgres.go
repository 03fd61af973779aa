package testenv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// The superuser of every cluster. Connections need the password
// (scram-sha-256), so that tests can check wrong-password errors and that the
// password never shows.
const (
	PostgresUser     = "withlock"
	PostgresPassword = "secret"
)

// ErrNoPostgres is returned by [StartPostgres] when no PostgreSQL server
// binaries are installed. Its message says how to install them.
var ErrNoPostgres = errors.New("testenv: PostgreSQL server binaries (initdb, postgres, pg_basebackup) not found in PATH or /usr/lib/postgresql/*/bin; install them with: apt-get install postgresql (or run scripts/test-deps as root)")

// Postgres is a running throwaway cluster on 127.0.0.1 (in Dir/data; Dir is
// also its unix socket directory). Stop, Start, Pause, Resume and Close act
// on its postmaster. URL connects as the superuser with a password, without
// TLS: postgres://withlock:secret@127.0.0.1:PORT/postgres?sslmode=disable
type Postgres struct {
	*proc
	conf string // settings added by Configure
}

// StartPostgres starts a new cluster on a free port. Clusters are copies of
// one made by initdb once per test process.
func StartPostgres() (*Postgres, error) {
	p, err := newPostgres(true)
	if err != nil {
		return nil, err
	}
	if err := p.launch(); err != nil {
		return nil, err
	}
	return p, nil
}

// RequirePostgres is [StartPostgres] for t.
func RequirePostgres(t testing.TB) *Postgres {
	p, err := StartPostgres()
	return require(t, p, err, ErrNoPostgres)
}

// newPostgres makes a cluster's directory, with a copy of the template if
// fromTemplate (not for a standby).
func newPostgres(fromTemplate bool) (*Postgres, error) {
	inst, err := pgInstall()
	if err != nil {
		return nil, err
	}
	var proc *proc
	if fromTemplate {
		proc, err = inst.newProc("pg", false)
	} else {
		proc, err = newProc(inst.base, "pg", inst.asUser, false)
	}
	if err != nil {
		return nil, err
	}
	p := &Postgres{proc: proc}
	proc.stopSig, proc.quitSig = syscall.SIGINT, syscall.SIGQUIT // fast and immediate shutdown
	proc.command = func() *exec.Cmd {
		p.URL = p.urlFor("postgres")
		conf := fmt.Sprintf("port = %d\nunix_socket_directories = '%s'\n%s", p.Port, p.Dir, p.conf)
		os.WriteFile(filepath.Join(p.Dir, "data", "withlock.conf"), []byte(conf), 0o644)
		return exec.Command(inst.postgres, "-D", filepath.Join(p.Dir, "data"))
	}
	// Ready as pg_ctl -w sees it: the postmaster's status line in its pid
	// file says "ready" (or "standby", for one that takes no connections).
	proc.ready = func() error {
		b, _ := os.ReadFile(filepath.Join(p.Dir, "data", "postmaster.pid"))
		if lines := strings.Split(string(b), "\n"); len(lines) > 7 && strings.Contains(" ready standby ", " "+strings.TrimSpace(lines[7])+" ") {
			return nil
		}
		return errors.New("not ready")
	}
	return p, nil
}

func (p *Postgres) urlFor(db string) string {
	u := url.URL{Scheme: "postgres", User: url.UserPassword(PostgresUser, PostgresPassword), Host: p.addr(), Path: "/" + db, RawQuery: "sslmode=disable"}
	return u.String()
}

// Configure adds settings (postgresql.conf lines) and restarts the server, so
// that every one of them applies.
func (p *Postgres) Configure(settings string) error {
	if err := p.Stop(); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.conf += settings + "\n"
	return p.start()
}

// CreateDatabase creates a database and returns a URL for it with p.URL's
// credentials.
func (p *Postgres) CreateDatabase(name string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := Exec(ctx, p.URL, "create database "+pgx.Identifier{name}.Sanitize()); err != nil {
		return "", fmt.Errorf("testenv: create database %q: %w", name, err)
	}
	return p.urlFor(name), nil
}

// Exec runs sql (statements, simple protocol) on a connection of its own to
// url and returns the rows of every statement as lines, columns in
// PostgreSQL's text format separated by a space, NULL as "NULL" (booleans are
// "t" and "f", as psql prints them). Errors wrap pgx's, so errors.As finds a
// *pgconn.PgError.
func Exec(ctx context.Context, url, sql string) ([]string, error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	results, err := conn.PgConn().Exec(ctx, sql).ReadAll()
	var lines []string
	for _, r := range results {
		for _, row := range r.Rows {
			lines = append(lines, textRow(row))
		}
		err = errors.Join(err, r.Err)
	}
	return lines, err
}

// textRow is a row's columns separated by a space, NULL as "NULL".
func textRow[B ~[]byte](row []B) string {
	cols := make([]string, len(row))
	for i, v := range row {
		cols[i] = string(v)
		if v == nil {
			cols[i] = "NULL"
		}
	}
	return strings.Join(cols, " ")
}

// EnableTLS gives the server a certificate for 127.0.0.1 (not localhost),
// signed by a new CA, turns ssl on and restarts it (with settings too, if
// any). Clients may still connect without TLS. It returns the CA's file,
// for clients' sslrootcert.
func (p *Postgres) EnableTLS(settings ...string) (caFile string, err error) {
	if p.CertFile, err = writeCerts(p.Dir, p.asUser); err != nil {
		return "", err
	}
	// Absolute paths, so that a standby made later serves the same ones.
	settings = append([]string{"ssl = on", fmt.Sprintf("ssl_cert_file = '%s/server.crt'\nssl_key_file = '%s/server.key'", p.Dir, p.Dir)}, settings...)
	return p.CertFile, p.Configure(strings.Join(settings, "\n"))
}

// StartStandby makes a hot standby of p as a user would, with pg_basebackup
// -R, started on a port of its own; the first call restarts p so that it
// can send WAL. The caller must Close the standby. Its URL connects as p's
// does; there pg_is_in_recovery() is true and writes fail.
func (p *Postgres) StartStandby() (*Postgres, error) {
	const replication = "wal_level = replica\nmax_wal_senders = 4"
	if !strings.Contains(p.conf, replication) {
		if err := p.Configure(replication); err != nil {
			return nil, err
		}
	}
	s, err := newPostgres(false)
	if err != nil {
		return nil, err
	}
	s.conf = p.conf // a standby's settings must match its primary's
	inst, _ := pgInstall()
	if err := inst.run(inst.basebackup, "-D", filepath.Join(s.Dir, "data"), "-R", "-X", "stream", "-c", "fast",
		"-d", fmt.Sprintf("host=127.0.0.1 port=%d user=%s password=%s", p.Port, PostgresUser, PostgresPassword)); err != nil {
		s.Close()
		return nil, err
	}
	if err := s.launch(); err != nil {
		return nil, err
	}
	return s, nil
}

// pgInstall finds the server's binaries and makes the template cluster.
var pgInstall = sync.OnceValues(func() (*pgInstallation, error) {
	initdb, _ := filepath.EvalSymlinks(findProgram("initdb", "/usr/lib/postgresql/*/bin"))
	bin := filepath.Dir(initdb) // postgres and pg_basebackup are next to the real initdb
	postgres := filepath.Join(bin, "postgres")
	if initdb == "" || findProgram(postgres) == "" {
		return nil, ErrNoPostgres
	}
	inst, err := newInstall("postgres", "pg")
	if err != nil {
		return nil, err
	}
	pwfile := filepath.Join(filepath.Dir(inst.template), "pwfile")
	os.WriteFile(pwfile, []byte(PostgresPassword), 0o644)
	if err := inst.run(initdb, "-D", inst.template, "--pwfile", pwfile, "-U", PostgresUser,
		"--auth=scram-sha-256", "-E", "UTF8", "--locale=C", "--no-sync"); err != nil {
		return nil, err
	}
	// Settings for fast, disposable clusters: durability does not matter.
	conf, err := os.OpenFile(filepath.Join(inst.template, "postgresql.conf"), os.O_WRONLY|os.O_APPEND, 0)
	if err == nil {
		_, err = conf.WriteString("listen_addresses = '127.0.0.1'\nmax_connections = 200\nshared_buffers = 16MB\n" +
			"fsync = off\nsynchronous_commit = off\nfull_page_writes = off\nwal_level = minimal\nmax_wal_senders = 0\n" +
			"autovacuum = off\nlc_messages = 'C'\ninclude_if_exists = 'withlock.conf'\n")
		conf.Close()
	}
	return &pgInstallation{inst, postgres, filepath.Join(bin, "pg_basebackup")}, err
})

type pgInstallation struct {
	*install
	postgres, basebackup string
}

// ErrNoPgBouncer is returned by [StartPgBouncer] when pgbouncer is not
// installed. Its message says how to install it.
var ErrNoPgBouncer = errors.New("testenv: pgbouncer not found in PATH or /usr/sbin; install it with: apt-get install pgbouncer (or run scripts/test-deps as root)")

// PgBouncer is a running pgbouncer on 127.0.0.1 in front of a [Postgres]
// (Dir holds pgbouncer.ini and userlist.txt). Its URL is the server URL
// given to StartPgBouncer with pgbouncer's address in place of the server's,
// and without sslmode (libpq's default, prefer; this pgbouncer has no TLS).
type PgBouncer struct {
	*proc
	mode string
}

// StartPgBouncer starts pgbouncer with pool_mode mode (session, transaction
// or statement) and default_pool_size pool in front of the server of
// serverURL, a URL of a [Postgres] (user PostgresUser), and settings, more
// lines of its [pgbouncer] section (query_timeout=1, say). Any database name
// reaches the server's database of that name.
func StartPgBouncer(serverURL, mode string, pool int, settings ...string) (*PgBouncer, error) {
	bin := findProgram("pgbouncer", "/usr/sbin")
	inst, err := pgInstall() // pgbouncer refuses root too: it runs as the servers do
	if bin == "" || err != nil {
		return nil, errors.Join(ErrNoPgBouncer, err)
	}
	server, err := url.Parse(serverURL)
	if err != nil {
		return nil, fmt.Errorf("testenv: %w", err)
	}
	proc, err := newProc(os.TempDir(), "pgbouncer", inst.asUser, false)
	if err != nil {
		return nil, err
	}
	b := &PgBouncer{proc: proc, mode: mode}
	password, _ := server.User.Password()
	users := filepath.Join(b.Dir, "userlist.txt")
	os.WriteFile(users, fmt.Appendf(nil, "%q %q\n", server.User.Username(), password), 0o644)
	proc.command = func() *exec.Cmd {
		ini := filepath.Join(b.Dir, "pgbouncer.ini")
		os.WriteFile(ini, fmt.Appendf(nil, "[databases]\n* = host=%s port=%s\n[pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = %d\n"+
			"unix_socket_dir =\nauth_type = scram-sha-256\nauth_file = %s\npool_mode = %s\ndefault_pool_size = %d\nmax_client_conn = 500\n%s",
			server.Hostname(), server.Port(), b.Port, users, b.mode, pool, strings.Join(append(settings, ""), "\n")), 0o644)
		return exec.Command(bin, ini)
	}
	proc.ready = func() error {
		c, err := net.Dial("tcp", b.addr())
		if err == nil {
			c.Close()
		}
		return err
	}
	if err := proc.launch(); err != nil {
		return nil, err
	}
	u, q := *server, server.Query()
	q.Del("sslmode")
	u.Host, u.RawQuery = b.addr(), q.Encode()
	b.URL = u.String()
	return b, nil
}

// RequirePgBouncer is [StartPgBouncer] for t.
func RequirePgBouncer(t testing.TB, serverURL, mode string, pool int) *PgBouncer {
	b, err := StartPgBouncer(serverURL, mode, pool)
	return require(t, b, err, ErrNoPgBouncer)
}

// SetPoolMode changes pool_mode as an administrator would: it rewrites the
// configuration and reloads it (SIGHUP), and returns once pgbouncer says it
// has. Clients keep their connections; the mode applies at the end of their
// next transaction.
func (b *PgBouncer) SetPoolMode(mode string) error {
	reloads := func() int {
		log, _ := os.ReadFile(filepath.Join(b.Dir, "server.out"))
		return strings.Count(string(log), "got SIGHUP")
	}
	b.mu.Lock()
	b.mode = mode
	b.command() // writes the configuration
	b.mu.Unlock()
	before := reloads()
	if err := b.signal(syscall.SIGHUP); err != nil {
		return err
	}
	for deadline := time.Now().Add(time.Minute); reloads() == before; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			return errors.New("testenv: pgbouncer did not reload within a minute of SIGHUP")
		}
	}
	return nil
}
