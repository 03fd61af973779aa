package testenv

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// ErrNoPgBouncer is returned by [StartPgBouncer] when pgbouncer is not installed.
// Its message says how to install it.
var ErrNoPgBouncer = errors.New("testenv: pgbouncer not found in PATH or /usr/sbin; install it with: apt-get install pgbouncer (or run scripts/test-deps as root)")

// PgBouncer is a running pgbouncer on 127.0.0.1 in front of one of testenv's
// PostgreSQL servers, in a temporary directory, with a watchdog as [Redis] has.
type PgBouncer struct {
	Dir  string // pgbouncer.ini, userlist.txt; pgbouncer's log is server.out
	Port int
	// URL is the server URL given to StartPgBouncer with pgbouncer's address in
	// place of the server's, and without sslmode (libpq's default, prefer; this
	// pgbouncer has no TLS).
	URL string

	proc *serverProc
}

// StartPgBouncer starts pgbouncer with pool_mode mode (session, transaction or
// statement) and default_pool_size pool, in front of the server of serverURL, a
// URL of one of testenv's clusters (user PostgresUser). Any database name
// reaches the server's database of that name. The caller must Close it. If
// pgbouncer is not installed, the error is [ErrNoPgBouncer].
func StartPgBouncer(serverURL, mode string, pool int) (*PgBouncer, error) {
	bin, err := exec.LookPath("pgbouncer")
	if err != nil {
		if bin, err = exec.LookPath("/usr/sbin/pgbouncer"); err != nil {
			return nil, ErrNoPgBouncer
		}
	}
	server, err := url.Parse(serverURL)
	if err != nil {
		return nil, fmt.Errorf("testenv: %w", err)
	}
	inst, err := findInstall() // pgbouncer refuses to run as root: it runs as the servers do
	if err != nil {
		return nil, err
	}
	proc, err := newServerProc("withlock-pgbouncer-")
	if err != nil {
		return nil, err
	}
	b := &PgBouncer{Dir: proc.dir, proc: proc}
	if err := inst.chown(b.Dir); err != nil {
		b.Close()
		return nil, err
	}
	for attempt := 0; ; attempt++ {
		if b.Port, err = freePort(); err != nil {
			break
		}
		if err = b.start(inst, bin, server, mode, pool); err == nil || attempt >= 4 || !errors.Is(err, errPortInUse) {
			break
		}
	}
	if err != nil {
		b.Close()
		return nil, err
	}
	u := *server
	u.Host = net.JoinHostPort("127.0.0.1", strconv.Itoa(b.Port))
	q := u.Query()
	q.Del("sslmode")
	u.RawQuery = q.Encode()
	b.URL = u.String()
	return b, nil
}

func (b *PgBouncer) start(inst *pgInstall, bin string, server *url.URL, mode string, pool int) error {
	password, _ := server.User.Password()
	files := map[string]string{
		"userlist.txt": fmt.Sprintf("%q %q\n", server.User.Username(), password),
		"pgbouncer.ini": fmt.Sprintf(`[databases]
* = host=%s port=%s

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = scram-sha-256
auth_file = %s
pool_mode = %s
default_pool_size = %d
max_client_conn = 500
logfile =
pidfile =
server_login_retry = 1
`, server.Hostname(), server.Port(), b.Port, filepath.Join(b.Dir, "userlist.txt"), mode, pool),
	}
	for name, data := range files {
		file := filepath.Join(b.Dir, name)
		if err := os.WriteFile(file, []byte(data), 0o600); err != nil {
			return fmt.Errorf("testenv: %w", err)
		}
		if err := inst.chown(file); err != nil {
			return err
		}
	}
	out := filepath.Join(b.Dir, "server.out")
	var offset int64
	if fi, err := os.Stat(out); err == nil {
		offset = fi.Size()
	}
	cmd := exec.Command(bin, filepath.Join(b.Dir, "pgbouncer.ini"))
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: inst.credential()}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(b.Port))
	err := b.proc.start(cmd, nil, func() bool {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	if err != nil {
		tail := logTail(out, offset, 20)
		err = fmt.Errorf("testenv: pgbouncer (port %d): %w\nlog %s:\n%s", b.Port, err, out, tail)
		if strings.Contains(tail, "Address already in use") {
			return errors.Join(errPortInUse, err)
		}
		return err
	}
	return nil
}

// Close stops pgbouncer and removes Dir. It is safe to call twice.
func (b *PgBouncer) Close() error { return b.proc.close() }

// RequirePgBouncer starts pgbouncer with [StartPgBouncer] and closes it when t's
// test ends. If pgbouncer is not installed, t fails under CI (CI=true) and is
// skipped elsewhere, with the install hint either way; any other error fails t.
func RequirePgBouncer(t testing.TB, serverURL, mode string, pool int) *PgBouncer {
	t.Helper()
	b, err := StartPgBouncer(serverURL, mode, pool)
	if err != nil {
		missing(t, err, ErrNoPgBouncer)
	}
	t.Cleanup(func() {
		if err := b.Close(); err != nil {
			t.Errorf("testenv: close pgbouncer: %v", err)
		}
	})
	return b
}

// SetPoolMode changes pool_mode and makes pgbouncer reload its configuration
// (SIGHUP), as an administrator would, and waits until it has. Clients already
// connected keep their connection; pgbouncer applies the new mode at the end of
// their next transaction.
func (b *PgBouncer) SetPoolMode(mode string) error {
	ini := filepath.Join(b.Dir, "pgbouncer.ini")
	data, err := os.ReadFile(ini)
	if err != nil {
		return fmt.Errorf("testenv: %w", err)
	}
	var lines []string
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(line, "pool_mode = ") {
			line = "pool_mode = " + mode
		}
		lines = append(lines, line)
	}
	if err := os.WriteFile(ini, []byte(strings.Join(lines, "\n")), 0o600); err != nil {
		return fmt.Errorf("testenv: %w", err)
	}
	out := filepath.Join(b.Dir, "server.out")
	count := func() int {
		data, _ := os.ReadFile(out)
		return strings.Count(string(data), "got SIGHUP")
	}
	before := count()
	if err := b.proc.signal(syscall.SIGHUP); err != nil {
		return err
	}
	for deadline := time.Now().Add(30 * time.Second); count() == before; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			return fmt.Errorf("testenv: pgbouncer did not log a reload within 30s of SIGHUP")
		}
	}
	return nil
}
