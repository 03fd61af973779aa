package testenv

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
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
// is a temporary directory (Dir). Like [Redis], it has a watchdog that kills
// the server and removes Dir when the test process exits, however it dies.
type MariaDB struct {
	Dir    string // the data directory; also my.cnf, error.log and the socket
	Port   int    // TCP port on 127.0.0.1, the same across Stop and Start
	Socket string // the Unix socket, for the mariadb client
	// URL connects as MariaDBUser with its password:
	// mysql://withlock:secret@127.0.0.1:PORT/withlock
	URL string
	// CertFile is the server's self-signed certificate (PEM) with TLS.
	CertFile string

	inst *mariaInstall
	opts MariaDBOptions
	proc *serverProc
}

// MariaDBOptions say how [StartMariaDBWith] starts a server. The zero value
// is [StartMariaDB]'s: performance_schema on, with the metadata-lock
// instrument that MySQL 8 has on by default.
type MariaDBOptions struct {
	// NoPerformanceSchema starts the server as MariaDB ships it:
	// performance_schema off, so that no session's attributes, user
	// variables or metadata locks can be seen by others.
	NoPerformanceSchema bool
	// TLS gives the server a self-signed certificate for 127.0.0.1
	// (CertFile), so that clients may use TLS; they need not.
	TLS bool
}

// StartMariaDB starts a new server on a free port and returns it running. The
// caller must Close it. Servers are copies of a data directory made by
// mariadb-install-db once (a few seconds; see template), so a start costs a
// copy of about 20 MB and the server's start-up, about a second. As root the server runs as the OS
// user mysql, as Debian's does, since mariadbd refuses to run as root.
func StartMariaDB() (*MariaDB, error) { return StartMariaDBWith(MariaDBOptions{}) }

// StartMariaDBWith is [StartMariaDB] with the options o.
func StartMariaDBWith(o MariaDBOptions) (*MariaDB, error) {
	inst, err := findMariaDB()
	if err != nil {
		return nil, err
	}
	tpl, err := inst.template()
	if err != nil {
		return nil, err
	}
	proc, err := newServerProcIn(mariaBase(), "withlock-mariadb-")
	if err != nil {
		return nil, err
	}
	m := &MariaDB{Dir: proc.dir, Socket: filepath.Join(proc.dir, "mysqld.sock"), inst: inst, opts: o, proc: proc}
	if err := copyTree(tpl, m.Dir, inst); err != nil {
		m.Close()
		return nil, err
	}
	if o.TLS {
		m.CertFile = filepath.Join(m.Dir, "cert.pem")
		key := filepath.Join(m.Dir, "key.pem")
		err := writeSelfSigned(m.CertFile, key)
		if err == nil {
			err = errors.Join(inst.chown(m.CertFile), inst.chown(key))
		}
		if err != nil {
			m.Close()
			return nil, err
		}
	}
	for attempt := 0; ; attempt++ {
		if m.Port, err = freePort(); err != nil {
			break
		}
		if err = m.start(); err == nil || attempt >= 4 || !errors.Is(err, errPortInUse) {
			break
		}
	}
	if err != nil {
		m.Close()
		return nil, err
	}
	m.URL = m.urlFor(MariaDBUser, MariaDBPassword)
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
const mariaConf = `[mariadbd]
datadir = %[1]s
socket = %[1]s/mysqld.sock
pid-file = %[1]s/mariadbd.pid
log-error = %[1]s/error.log
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

func (m *MariaDB) start() error {
	conf := fmt.Sprintf(mariaConf, m.Dir, m.Port)
	if m.opts.TLS {
		conf += fmt.Sprintf("ssl-cert = %s\nssl-key = %s\n", m.CertFile, filepath.Join(m.Dir, "key.pem"))
	}
	if m.opts.NoPerformanceSchema {
		conf += "performance-schema = OFF\n"
	} else {
		conf += "performance-schema = ON\nperformance-schema-instrument = 'wait/lock/metadata/sql/mdl=ON'\n"
	}
	name := filepath.Join(m.Dir, "my.cnf")
	if err := os.WriteFile(name, []byte(conf), 0o644); err != nil {
		return fmt.Errorf("testenv: %w", err)
	}
	logName := filepath.Join(m.Dir, "error.log")
	var logOffset int64
	if fi, err := os.Stat(logName); err == nil {
		logOffset = fi.Size()
	}
	// --defaults-file must come first; it is the only file read.
	cmd := exec.Command(m.inst.mariadbd, "--defaults-file="+name)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: m.inst.credential()}
	err := m.proc.start(cmd, nil, func() bool { return pingMySQL(m.Port) })
	if err != nil {
		tail := logTail(logName, logOffset, 20)
		err = fmt.Errorf("testenv: mariadbd (port %d): %w\nserver log %s:\n%s", m.Port, err, logName, tail)
		if strings.Contains(tail, "Address already in use") {
			return errors.Join(errPortInUse, err)
		}
		return err
	}
	return nil
}

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

// Stop shuts the server down (SIGTERM: a clean shutdown that ends every
// session; SIGKILL after 10s) and keeps Dir and Port, so Start can bring it
// back with the same data.
func (m *MariaDB) Stop() error { return m.proc.stop() }

// Start starts the server again after Stop, on the same port. It fails if
// something else took the port meanwhile.
func (m *MariaDB) Start() error {
	return m.proc.locked(func() error { return m.start() })
}

// Pause stops the server with SIGSTOP: connections stay open and requests go
// unanswered, as with a hung server or a network partition, until Resume.
func (m *MariaDB) Pause() error { return m.proc.signal(syscall.SIGSTOP) }

// Resume continues a server stopped by Pause.
func (m *MariaDB) Resume() error { return m.proc.signal(syscall.SIGCONT) }

// Close kills the server and removes Dir. It is safe to call twice, after
// Stop and while paused.
func (m *MariaDB) Close() error { return m.proc.close() }

// RequireMariaDB starts a server with [StartMariaDB] and closes it when t's
// test ends. If MariaDB is not installed, t fails under CI (CI=true) and is
// skipped elsewhere, with the install hint either way; any other error fails t.
func RequireMariaDB(t testing.TB) *MariaDB {
	t.Helper()
	return RequireMariaDBWith(t, MariaDBOptions{})
}

// RequireMariaDBWith is [RequireMariaDB] with [StartMariaDBWith].
func RequireMariaDBWith(t testing.TB, o MariaDBOptions) *MariaDB {
	t.Helper()
	m, err := StartMariaDBWith(o)
	if err != nil {
		missing(t, err, ErrNoMariaDB)
	}
	t.Cleanup(func() {
		if err := m.Close(); err != nil {
			t.Errorf("testenv: close mariadb: %v", err)
		}
	})
	return m
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

// mariaInstall is the MariaDB installation and the OS user its servers run as.
type mariaInstall struct {
	installDB, mariadbd string
	uid, gid            uint32 // of the user the server runs as
	runAs               bool   // we are root: the server runs as uid, gid

	once   sync.Once
	tpl    string
	tplErr error
}

// mariaSbin is where Debian installs mariadbd, outside most users' PATH; a
// variable for the test of the missing-server policy.
var mariaSbin = "/usr/sbin"

var findMariaDB = sync.OnceValues(func() (*mariaInstall, error) {
	look := func(name string) string {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
		if p := filepath.Join(mariaSbin, name); isExecutable(p) {
			return p
		}
		return ""
	}
	inst := &mariaInstall{installDB: look("mariadb-install-db"), mariadbd: look("mariadbd")}
	if inst.installDB == "" || inst.mariadbd == "" {
		return nil, ErrNoMariaDB
	}
	inst.uid, inst.gid = uint32(os.Geteuid()), uint32(os.Getegid())
	if os.Geteuid() == 0 {
		u, err := user.Lookup("mysql")
		if err != nil {
			return nil, fmt.Errorf("testenv: running as root, the server must run as the OS user mysql (mariadbd refuses root): %w; create it with: useradd --system mysql", err)
		}
		uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
		gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
		if err1 != nil || err2 != nil {
			return nil, fmt.Errorf("testenv: bad uid/gid for user mysql: %q/%q", u.Uid, u.Gid)
		}
		inst.uid, inst.gid, inst.runAs = uint32(uid), uint32(gid), true
	}
	return inst, nil
})

func (inst *mariaInstall) credential() *syscall.Credential {
	if !inst.runAs {
		return nil
	}
	return &syscall.Credential{Uid: inst.uid, Gid: inst.gid}
}

func (inst *mariaInstall) chown(path string) error {
	if !inst.runAs {
		return nil
	}
	if err := os.Lchown(path, int(inst.uid), int(inst.gid)); err != nil {
		return fmt.Errorf("testenv: %w", err)
	}
	return nil
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

// template returns the data directory that mariadb-install-db made, shared by
// every test process of this installation and OS user: the first to need it
// builds it under a flock (a few seconds); it is never removed, like the
// PostgreSQL template, and rebuilt when the server or these settings change.
func (inst *mariaInstall) template() (string, error) {
	inst.once.Do(func() { inst.tpl, inst.tplErr = inst.sharedTemplate() })
	return inst.tpl, inst.tplErr
}

// mariaInstallArgs are mariadb-install-db's, after --datadir and --extra-file.
// The InnoDB sizes must be mariaConf's, so that the servers can open the files.
var mariaInstallArgs = []string{
	"--no-defaults", "--auth-root-authentication-method=normal", "--skip-test-db", "--skip-name-resolve",
	"--innodb-log-file-size=4M", "--innodb-data-file-path=ibdata1:4M:autoextend",
	"--innodb-autoextend-increment=1", "--innodb-buffer-pool-size=8M",
}

func (inst *mariaInstall) sharedTemplate() (string, error) {
	version, err := exec.Command(inst.mariadbd, "--version").Output()
	if err != nil {
		return "", fmt.Errorf("testenv: %s --version: %w", inst.mariadbd, err)
	}
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00%s\x00%s\x00%d\x00%s\x00%s", inst.installDB, inst.mariadbd, version, inst.uid, strings.Join(mariaInstallArgs, " "), mariaUsers)
	dir := filepath.Join(mariaBase(), "withlock-mariadb-template-"+hex.EncodeToString(h.Sum(nil))[:16])
	unlock, err := lockFile(dir + ".lock")
	if err != nil {
		return "", err
	}
	defer unlock()
	data := filepath.Join(dir, "data")
	if fi, err := os.Lstat(dir); err == nil {
		if !fi.IsDir() || !ownedBy(fi, uint32(os.Geteuid())) || fi.Mode().Perm()&0o022 != 0 {
			return "", fmt.Errorf("testenv: %s is not a directory owned by uid %d and writable only by it", dir, os.Geteuid())
		}
		if _, err := os.Stat(filepath.Join(dir, markerName)); err == nil {
			return data, nil
		}
		if err := os.RemoveAll(dir); err != nil { // ours, but incomplete
			return "", fmt.Errorf("testenv: %w", err)
		}
	}
	tmp, err := os.MkdirTemp(filepath.Dir(dir), filepath.Base(dir)+".tmp-")
	if err != nil {
		return "", fmt.Errorf("testenv: %w", err)
	}
	defer os.RemoveAll(tmp)
	// The server's user must reach the data directory inside.
	if err := os.Chmod(tmp, 0o755); err != nil {
		return "", fmt.Errorf("testenv: %w", err)
	}
	extra := filepath.Join(tmp, "users.sql")
	if err := os.WriteFile(extra, []byte(mariaUsers), 0o644); err != nil {
		return "", fmt.Errorf("testenv: %w", err)
	}
	args := append([]string{"--datadir=" + filepath.Join(tmp, "data"), "--extra-file=" + extra}, mariaInstallArgs...)
	if inst.runAs {
		args = append(args, "--user=mysql")
	}
	cmd := exec.Command(inst.installDB, args...)
	cmd.Dir = tmp
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("testenv: mariadb-install-db: %w\n%s", err, out)
	}
	if err := os.WriteFile(filepath.Join(tmp, markerName), []byte("complete\n"), 0o644); err != nil {
		return "", fmt.Errorf("testenv: %w", err)
	}
	if err := os.Rename(tmp, dir); err != nil {
		return "", fmt.Errorf("testenv: %w", err)
	}
	return data, nil
}

// mariaBase is where data directories go: /dev/shm when it is a roomy tmpfs
// (InnoDB writes its files at start-up; on a slow disk that costs seconds),
// else os.TempDir.
func mariaBase() string {
	const tmpfsMagic = 0x01021994
	var st syscall.Statfs_t
	if syscall.Statfs("/dev/shm", &st) == nil && st.Type == tmpfsMagic && st.Bavail*uint64(st.Bsize) >= 1<<30 {
		return "/dev/shm"
	}
	return os.TempDir()
}

// copyTree copies the files of src into dst (which exists), owned by the
// server's user.
func copyTree(src, dst string, inst *mariaInstall) error {
	if err := inst.chown(dst); err != nil {
		return err
	}
	err := filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil || rel == "." {
			return err
		}
		target := filepath.Join(dst, rel)
		switch {
		case d.IsDir():
			if err := os.Mkdir(target, 0o700); err != nil {
				return err
			}
		case d.Type().IsRegular():
			if _, err := copyFile(target, path); err != nil {
				return err
			}
		default:
			return fmt.Errorf("%s: unexpected file type %v", path, d.Type())
		}
		return inst.chown(target)
	})
	if err != nil {
		return fmt.Errorf("testenv: copy the MariaDB template: %w", err)
	}
	return nil
}
