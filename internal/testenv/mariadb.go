package testenv

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
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
// is Dir/data. Its URL connects as MariaDBUser with its password:
// mysql://withlock:secret@127.0.0.1:PORT/withlock
type MariaDB struct {
	*proc
	galeraPort int // a Galera node's group port; 0 for a plain server
}

// MariaDBOptions say how [StartMariaDB] starts a server. The zero value
// turns performance_schema on, with the metadata-lock instrument that MySQL 8
// has on by default.
type MariaDBOptions struct {
	// NoPerformanceSchema starts the server as MariaDB ships it:
	// performance_schema off, so that no session's attributes, user
	// variables or metadata locks can be seen by others.
	NoPerformanceSchema bool
	// TLS gives the server a certificate for 127.0.0.1 signed by a test CA
	// (CertFile), so that clients may use TLS; they need not.
	TLS bool
	// Conf is added to the server's my.cnf, in its [mariadbd] section: one
	// option a line (a replica's server-id, Galera's wsrep options).
	Conf string
	// Args are added to the server's command line (--wsrep-new-cluster).
	Args []string
}

// StartMariaDB starts a new server on a free port. Servers are copies of a
// data directory that mariadb-install-db makes once per test process (a few
// seconds), so a start costs a copy of about 20 MB and the server's
// start-up, about a second.
func StartMariaDB(opts ...MariaDBOptions) (*MariaDB, error) {
	o := append(opts, MariaDBOptions{})[0]
	inst, err := mariaInstall()
	if err != nil {
		return nil, err
	}
	proc, err := inst.newProc("mariadb", o.TLS)
	if err != nil {
		return nil, err
	}
	m := &MariaDB{proc: proc}
	proc.command = func() *exec.Cmd {
		// tmpdir of its own: a starting server deletes every #sql file in
		// its tmpdir, the temporary tables of any other server there too.
		conf := fmt.Sprintf("[mariadbd]\ndatadir = %[1]s/data\ntmpdir = %[1]s\nsocket = %[1]s/mysqld.sock\npid-file = %[1]s/mariadbd.pid\n"+
			"port = %[2]d\nbind-address = 127.0.0.1\nskip-name-resolve\nmax-connections = 500\ninnodb-flush-log-at-trx-commit = 0\n"+
			"skip-log-bin\nlc-messages = en_US\n", m.Dir, m.Port)
		for _, arg := range mariaInnoDB { // the template's sizes, so that the server can open its files
			conf += strings.TrimPrefix(arg, "--") + "\n"
		}
		if o.TLS {
			conf += fmt.Sprintf("ssl-cert = %[1]s/server.crt\nssl-key = %[1]s/server.key\n", m.Dir)
		}
		if o.NoPerformanceSchema {
			conf += "performance-schema = OFF\n"
		} else {
			conf += "performance-schema = ON\nperformance-schema-instrument = 'wait/lock/metadata/sql/mdl=ON'\n"
		}
		conf += o.Conf
		if o.Conf != "" && !strings.HasSuffix(o.Conf, "\n") {
			conf += "\n"
		}
		name := filepath.Join(m.Dir, "my.cnf")
		os.WriteFile(name, []byte(conf), 0o644)
		m.URL = m.urlFor(MariaDBUser)
		// --defaults-file must come first; it is the only file read. Its
		// messages go to stderr, where start looks for "already in use".
		return exec.Command(inst.mariadbd, append([]string{"--defaults-file=" + name}, o.Args...)...)
	}
	proc.ready = func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := MySQLExec(ctx, m.URL, "select 1")
		return err
	}
	if err := proc.launch(); err != nil {
		return nil, err
	}
	return m, nil
}

// RequireMariaDB is [StartMariaDB] for t.
func RequireMariaDB(t testing.TB, opts ...MariaDBOptions) *MariaDB {
	m, err := StartMariaDB(opts...)
	return require(t, m, err, ErrNoMariaDB)
}

// UnprivilegedURL is the URL of the MariaDBUnprivileged account, with the
// same password and database as URL.
func (m *MariaDB) UnprivilegedURL() string { return m.urlFor(MariaDBUnprivileged) }

func (m *MariaDB) urlFor(name string) string {
	return (&url.URL{Scheme: "mysql", User: url.UserPassword(name, MariaDBPassword), Host: m.addr(), Path: "/withlock"}).String()
}

// MySQLDB opens a handle on the server of a mysql://user:password@host:port/db
// URL, with multiple statements allowed. The caller must Close it.
func MySQLDB(rawURL string) (*sql.DB, error) {
	u, err := url.Parse(rawURL)
	if err != nil || u.Scheme != "mysql" {
		return nil, fmt.Errorf("testenv: not a mysql:// URL: %q", rawURL)
	}
	c := mysql.NewConfig()
	c.Net, c.Addr, c.User, c.DBName = "tcp", u.Host, u.User.Username(), strings.TrimPrefix(u.Path, "/")
	c.Passwd, _ = u.User.Password()
	c.MultiStatements, c.Logger = true, &mysql.NopLogger{}
	conn, err := mysql.NewConnector(c)
	if err != nil {
		return nil, err
	}
	return sql.OpenDB(conn), nil
}

// MySQLExec runs query (one or more statements) against the server of rawURL
// (a mysql:// URL) on one short-lived connection and returns the rows of every
// statement as lines, columns separated by a single space, NULL as "NULL".
// Errors wrap the driver's, so errors.As finds a *mysql.MySQLError.
func MySQLExec(ctx context.Context, rawURL, query string) ([]string, error) {
	db, err := MySQLDB(rawURL)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	rows, err := db.QueryContext(ctx, query)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var lines []string
	for more := true; more; more = rows.NextResultSet() {
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
			lines = append(lines, textRow(vals))
		}
	}
	return lines, rows.Err()
}

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

// mariaInnoDB are the InnoDB sizes of the template and of every server:
// small, for a fast start.
var mariaInnoDB = []string{"--innodb-log-file-size=4M", "--innodb-data-file-path=ibdata1:4M:autoextend",
	"--innodb-autoextend-increment=1", "--innodb-buffer-pool-size=8M"}

var mariaInstall = sync.OnceValues(func() (*mariaInstallation, error) {
	installDB, mariadbd := findProgram("mariadb-install-db", "/usr/sbin"), findProgram("mariadbd", "/usr/sbin")
	if installDB == "" || mariadbd == "" {
		return nil, ErrNoMariaDB
	}
	inst, err := newInstall("mysql", "mariadb")
	if err != nil {
		return nil, err
	}
	extra := filepath.Join(filepath.Dir(inst.template), "users.sql")
	if err := os.WriteFile(extra, []byte(mariaUsers), 0o644); err != nil {
		return nil, fmt.Errorf("testenv: %w", err)
	}
	return &mariaInstallation{inst, mariadbd}, inst.run(installDB, append([]string{"--datadir=" + inst.template, "--tmpdir=" + filepath.Dir(inst.template), "--extra-file=" + extra,
		"--no-defaults", "--auth-root-authentication-method=normal", "--skip-test-db", "--skip-name-resolve"}, mariaInnoDB...)...)
})

type mariaInstallation struct {
	*install
	mariadbd string
}

// StartMariaDBReplica starts two servers: a primary that writes a binary
// log, and a replica of it (CHANGE MASTER TO, START SLAVE), returned once
// the replica's Slave_running is ON. Neither is read-only: that is the
// caller's to set.
func StartMariaDBReplica() (primary, replica *MariaDB, err error) {
	if primary, err = StartMariaDB(MariaDBOptions{Conf: "log-bin = primary-bin\nserver-id = 1"}); err != nil {
		return nil, nil, err
	}
	if replica, err = StartMariaDB(MariaDBOptions{Conf: "server-id = 2"}); err != nil {
		primary.Close()
		return nil, nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err = MySQLExec(ctx, replica.URL, fmt.Sprintf("CHANGE MASTER TO MASTER_HOST = '127.0.0.1', MASTER_PORT = %d, MASTER_USER = '%s', MASTER_PASSWORD = '%s'; START SLAVE",
		primary.Port, MariaDBUser, MariaDBPassword))
	if err == nil {
		err = replica.WaitStatus("Slave_running", "ON")
	}
	if err != nil {
		replica.Close()
		primary.Close()
		return nil, nil, fmt.Errorf("testenv: replication: %w", err)
	}
	return primary, replica, nil
}

// RequireMariaDBReplica is [StartMariaDBReplica] for t.
func RequireMariaDBReplica(t testing.TB) (primary, replica *MariaDB) {
	p, r, err := StartMariaDBReplica()
	if err == nil {
		t.Cleanup(func() { p.Close() })
	}
	return p, require(t, r, err, ErrNoMariaDB)
}
