package testenv

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
)

// The account of every MariaDB server: all privileges, with a password, so
// that tests can check wrong-password errors and that the password never
// appears in output. MariaDBUnprivileged is an account that may connect and
// take locks but not end other accounts' sessions (KILL).
const (
	MariaDBUser         = "withlock"
	MariaDBPassword     = "secret"
	MariaDBUnprivileged = "nobody"
)

// ErrNoMariaDB is returned by [StartMariaDB] when the MariaDB server is not
// installed. Its message says how to install it.
var ErrNoMariaDB = errors.New("testenv: mariadbd and mariadb-install-db not found in PATH or /usr/sbin; install them with: apt-get install mariadb-server mariadb-client (or run scripts/test-deps as root)")

// MariaDB is a running throwaway mariadbd on 127.0.0.1 whose data directory
// is Dir (also my.cnf, the socket and the server's output).
type MariaDB struct {
	*proc
	Port   int    // TCP port on 127.0.0.1, the same across Stop and Start
	Socket string // the Unix socket, for the mariadb client
	// URL connects as MariaDBUser with its password:
	// mysql://withlock:secret@127.0.0.1:PORT/withlock
	URL string
	// CertFile, with TLS, is the CA that signed the server's certificate.
	CertFile string
}

// MariaDBOptions say how [StartMariaDBWith] starts a server. The zero value
// is [StartMariaDB]'s: performance_schema on, with the metadata-lock
// instrument that MySQL 8 has on by default.
type MariaDBOptions struct {
	// NoPerformanceSchema starts the server as MariaDB ships it:
	// performance_schema off, so that no session's attributes, user
	// variables or metadata locks can be seen by others.
	NoPerformanceSchema bool
	// TLS gives the server a certificate for 127.0.0.1 signed by a test CA
	// (CertFile), so that clients may use TLS; they need not.
	TLS bool
}

// StartMariaDB starts a new server on a free port and returns it running.
// The caller must Close it. Servers are copies of a data directory that
// mariadb-install-db makes once per test process (a few seconds), so a start
// costs a copy of about 20 MB and the server's start-up, about a second. As
// root the server runs as the OS user mysql, as Debian's does, since
// mariadbd refuses to run as root.
func StartMariaDB() (*MariaDB, error) { return StartMariaDBWith(MariaDBOptions{}) }

// StartMariaDBWith is [StartMariaDB] with the options o.
func StartMariaDBWith(o MariaDBOptions) (*MariaDB, error) {
	inst, err := mariaInstall()
	if err != nil {
		return nil, err
	}
	proc, err := newProc(inst.base, "mariadb", inst.asUser)
	if err != nil {
		return nil, err
	}
	m := &MariaDB{proc: proc, Socket: filepath.Join(proc.Dir, "mysqld.sock")}
	// cp -a keeps the owner (the server's user) and modes.
	if out, err := exec.Command("cp", "-a", filepath.Join(inst.template, "data"), m.Dir).CombinedOutput(); err != nil {
		m.Close()
		return nil, fmt.Errorf("testenv: copy the MariaDB template: %v: %s", err, out)
	}
	if o.TLS {
		if m.CertFile, err = writeCerts(m.Dir, inst.asUser, "127.0.0.1"); err != nil {
			m.Close()
			return nil, err
		}
	}
	proc.command = func() *exec.Cmd {
		conf := fmt.Sprintf(mariaConf, m.Dir, m.Port)
		if o.TLS {
			conf += fmt.Sprintf("ssl-cert = %[1]s/server.crt\nssl-key = %[1]s/server.key\n", m.Dir)
		}
		if o.NoPerformanceSchema {
			conf += "performance-schema = OFF\n"
		} else {
			conf += "performance-schema = ON\nperformance-schema-instrument = 'wait/lock/metadata/sql/mdl=ON'\n"
		}
		name := filepath.Join(m.Dir, "my.cnf")
		os.WriteFile(name, []byte(conf), 0o644)
		m.URL = m.urlFor(MariaDBUser, MariaDBPassword)
		// --defaults-file must come first; it is the only file read.
		return exec.Command(inst.mariadbd, "--defaults-file="+name)
	}
	proc.ready = func() error {
		if !pingMySQL(m.Port) {
			return errors.New("no greeting")
		}
		return nil
	}
	if err := proc.startOnFreePort(func(port int) { m.Port = port }); err != nil {
		m.Close()
		return nil, err
	}
	return m, nil
}

// UnprivilegedURL is the URL of the MariaDBUnprivileged account, with the
// same password and database as URL.
func (m *MariaDB) UnprivilegedURL() string { return m.urlFor(MariaDBUnprivileged, MariaDBPassword) }

func (m *MariaDB) urlFor(name, password string) string {
	u := url.URL{
		Scheme: "mysql",
		User:   url.UserPassword(name, password),
		Host:   net.JoinHostPort("127.0.0.1", strconv.Itoa(m.Port)),
		Path:   "/withlock",
	}
	return u.String()
}

// mariaConf is the server's configuration: small and fast to start,
// durability off. The InnoDB sizes must be those the template was made with.
// Its messages go to stderr (the proc's server.out), where start looks for
// "already in use".
const mariaConf = `[mariadbd]
datadir = %[1]s/data
socket = %[1]s/mysqld.sock
pid-file = %[1]s/mariadbd.pid
port = %[2]d
bind-address = 127.0.0.1
skip-name-resolve
max-connections = 500
innodb-log-file-size = 4M
innodb-data-file-path = ibdata1:4M:autoextend
innodb-autoextend-increment = 1
innodb-buffer-pool-size = 8M
innodb-flush-log-at-trx-commit = 0
skip-log-bin
lc-messages = en_US
`

// pingMySQL reports whether a MySQL server answers on port: it sends its
// greeting once it accepts connections.
func pingMySQL(port int) bool {
	c, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), time.Second)
	if err != nil {
		return false
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(time.Second))
	var head [5]byte // a packet header, then the protocol version (10)
	_, err = io.ReadFull(c, head[:])
	return err == nil && head[4] == 10
}

// RequireMariaDB is [StartMariaDB] for t, closed when t ends; without
// MariaDB, t fails under CI and is skipped elsewhere, with the install hint.
func RequireMariaDB(t testing.TB) *MariaDB { return RequireMariaDBWith(t, MariaDBOptions{}) }

// RequireMariaDBWith is [StartMariaDBWith] for t.
func RequireMariaDBWith(t testing.TB, o MariaDBOptions) *MariaDB {
	m, err := StartMariaDBWith(o)
	return require(t, m, err, ErrNoMariaDB)
}

// MySQLConfig is the go-sql-driver configuration of a
// mysql://user:password@host:port/db URL, with multiple statements allowed.
func MySQLConfig(rawURL string) (*mysql.Config, error) {
	u, err := url.Parse(rawURL)
	if err != nil || u.Scheme != "mysql" {
		return nil, fmt.Errorf("testenv: not a mysql:// URL: %q", rawURL)
	}
	c := mysql.NewConfig()
	c.Net, c.Addr = "tcp", u.Host
	c.User = u.User.Username()
	c.Passwd, _ = u.User.Password()
	c.DBName = strings.TrimPrefix(u.Path, "/")
	c.MultiStatements = true
	c.Logger = &mysql.NopLogger{}
	return c, nil
}

// MySQLExec runs query (one or more statements) against the server of rawURL
// (a mysql:// URL) on one short-lived connection and returns the rows of every
// statement as lines, columns separated by a single space, NULL as "NULL".
// Errors wrap the driver's, so errors.As finds a *mysql.MySQLError.
func MySQLExec(ctx context.Context, rawURL, query string) ([]string, error) {
	c, err := MySQLConfig(rawURL)
	if err != nil {
		return nil, err
	}
	conn, err := mysql.NewConnector(c)
	if err != nil {
		return nil, err
	}
	db := sql.OpenDB(conn)
	defer db.Close()
	rows, err := db.QueryContext(ctx, query)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var lines []string
	for {
		cols, _ := rows.Columns()
		for rows.Next() {
			vals := make([]sql.RawBytes, len(cols))
			ptrs := make([]any, len(cols))
			for i := range vals {
				ptrs[i] = &vals[i]
			}
			if err := rows.Scan(ptrs...); err != nil {
				return lines, err
			}
			fields := make([]string, len(vals))
			for i, v := range vals {
				if v == nil {
					fields[i] = "NULL"
				} else {
					fields[i] = string(v)
				}
			}
			lines = append(lines, strings.Join(fields, " "))
		}
		if !rows.NextResultSet() {
			break
		}
	}
	return lines, rows.Err()
}

// mariaInstallation is the server's binaries, the OS user it runs as, and
// the test process's template data directory.
type mariaInstallation struct {
	mariadbd string
	asUser   *syscall.Credential
	base     string // where data directories live
	template string // a proc directory whose data/ mariadb-install-db made
}

// mariaSbin is where Debian installs mariadbd, outside most users' PATH; a
// variable for the test of the missing-server policy.
var mariaSbin = "/usr/sbin"

// mariaUsers is run once, when the template is made. mariadb-install-db runs
// it with the grant tables off; FLUSH PRIVILEGES turns them on.
const mariaUsers = `
FLUSH PRIVILEGES;
CREATE USER '` + MariaDBUser + `'@'%' IDENTIFIED BY '` + MariaDBPassword + `';
GRANT ALL PRIVILEGES ON *.* TO '` + MariaDBUser + `'@'%' WITH GRANT OPTION;
CREATE USER '` + MariaDBUnprivileged + `'@'%' IDENTIFIED BY '` + MariaDBPassword + `';
GRANT USAGE ON *.* TO '` + MariaDBUnprivileged + `'@'%';
CREATE DATABASE withlock;
GRANT ALL PRIVILEGES ON withlock.* TO '` + MariaDBUnprivileged + `'@'%';
`

// mariaInstallArgs are mariadb-install-db's, after --datadir and
// --extra-file. The InnoDB sizes must be mariaConf's, so that the servers
// can open the files.
var mariaInstallArgs = []string{
	"--no-defaults", "--auth-root-authentication-method=normal", "--skip-test-db", "--skip-name-resolve",
	"--innodb-log-file-size=4M", "--innodb-data-file-path=ibdata1:4M:autoextend",
	"--innodb-autoextend-increment=1", "--innodb-buffer-pool-size=8M",
}

var mariaInstall = sync.OnceValues(func() (*mariaInstallation, error) {
	installDB := findProgram("mariadb-install-db", mariaSbin)
	inst := &mariaInstallation{mariadbd: findProgram("mariadbd", mariaSbin), base: dataBase()}
	if installDB == "" || inst.mariadbd == "" {
		return nil, ErrNoMariaDB
	}
	args := mariaInstallArgs
	var err error
	if inst.asUser, err = serverUser("mysql"); err != nil {
		return nil, err
	}
	if inst.asUser != nil {
		args = append(args, "--user=mysql")
	}
	tpl, err := newProc(inst.base, "mariadbtemplate", inst.asUser)
	if err != nil {
		return nil, err
	}
	inst.template = tpl.Dir
	extra := filepath.Join(tpl.Dir, "users.sql")
	if err := os.WriteFile(extra, []byte(mariaUsers), 0o644); err != nil {
		return nil, fmt.Errorf("testenv: %w", err)
	}
	cmd := exec.Command(installDB, append([]string{"--datadir=" + filepath.Join(tpl.Dir, "data"), "--extra-file=" + extra}, args...)...)
	cmd.Dir = tpl.Dir
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("testenv: mariadb-install-db: %w\n%s", err, out)
	}
	return inst, nil
})
