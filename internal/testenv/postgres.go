// Package testenv starts the real servers withlock's tests run against: throwaway
// PostgreSQL clusters on loopback in temporary directories, and the npm package
// advisory-lock for compatibility tests. No mocks.
//
// Tests normally use [RequirePostgres] and [RequireNPM], which decide in one place
// whether a missing dependency skips the test (developer machine) or fails it
// (CI=true). scripts/test-deps installs everything on a Debian machine.
package testenv

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
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
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// The superuser of every cluster. Host connections need the password
// (scram-sha-256), so tests can check wrong-password errors and that the password
// never appears in output.
const (
	PostgresUser     = "withlock"
	PostgresPassword = "secret"
)

// ErrNoPostgres is returned by [StartPostgres] when no PostgreSQL server binaries
// are installed. Its message says how to install them.
var ErrNoPostgres = errors.New("testenv: PostgreSQL server binaries (initdb, pg_ctl, postgres) not found in PATH or /usr/lib/postgresql/*/bin; install them with: apt-get install postgresql (or run scripts/test-deps as root)")

// Postgres is a running throwaway cluster on 127.0.0.1 in a temporary directory.
//
// Every cluster has a watchdog process (sh, in its own session) that holds the read
// end of a pipe whose write end only the test process holds. When the test process
// exits, however it dies (even SIGKILL), the pipe closes and the watchdog stops the
// server with "pg_ctl stop -m immediate" and removes Dir. So a test binary that
// dies leaves no server behind; Close does the same at once. Dir/data/postmaster.pid
// names the postmaster's pid while it runs.
type Postgres struct {
	Dir  string // data dir parent: data/ is the cluster, postgres.log its server log, also the unix socket directory
	Port int    // TCP port on 127.0.0.1, the same across Stop and Start
	// URL connects as the superuser with a password, e.g.
	// postgres://withlock:secret@127.0.0.1:PORT/postgres?sslmode=disable
	URL string

	inst     *pgInstall
	mu       sync.Mutex
	closed   bool
	conf     string // settings added by Configure
	watchdog *exec.Cmd
	wdPipe   *os.File // write end of the watchdog's stdin
	wdDone   chan error
}

// StartPostgres starts a new cluster on a free port and returns it running. The
// caller must Close it. The cluster lives in /dev/shm when that is a tmpfs with at
// least 1 GiB free, else in os.TempDir.
//
// Clusters are copies of a template made by initdb once: the first call in a
// process looks for it in os.TempDir (withlock-pgtemplate-KEY, keyed by the server
// binaries, their version, the settings and the OS user; built under a flock, so
// concurrent test binaries share one initdb) and builds it if missing. A start
// therefore costs a copy and a pg_ctl start, not an initdb.
//
// The binaries are initdb and pg_ctl from PATH (with postgres next to pg_ctl), else
// the newest /usr/lib/postgresql/*/bin. If none is found, the error is
// [ErrNoPostgres]. As root the server runs as the OS user postgres, since initdb
// refuses to run as root.
func StartPostgres() (*Postgres, error) {
	inst, err := findInstall()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp(inst.clusterBase(), "withlock-pg-")
	if err != nil {
		if dir, err = os.MkdirTemp(inst.tempBase(), "withlock-pg-"); err != nil {
			return nil, fmt.Errorf("testenv: %w", err)
		}
	}
	p := &Postgres{Dir: dir, inst: inst}
	if err := p.create(); err != nil {
		p.Close()
		return nil, err
	}
	return p, nil
}

func (p *Postgres) dataDir() string { return filepath.Join(p.Dir, "data") }
func (p *Postgres) logFile() string { return filepath.Join(p.Dir, "postgres.log") }

func (p *Postgres) create() error {
	if err := p.inst.chown(p.Dir); err != nil {
		return err
	}
	// A template someone (or a tmp cleaner) damaged shows up as a count mismatch
	// while copying; rebuild it once.
	var tpl *template
	var err error
	for attempt := 0; ; attempt++ {
		tpl, err = p.inst.template()
		if err != nil {
			return err
		}
		os.RemoveAll(p.dataDir())
		err = tpl.copyTo(p.dataDir(), p.inst)
		if err == nil {
			break
		}
		if attempt > 0 || !errors.Is(err, errTemplateDamaged) {
			return err
		}
		p.inst.discardTemplate(tpl)
	}
	if err := p.startWatchdog(); err != nil {
		return err
	}
	return p.listen()
}

// listen starts the server in dataDir on a free port and sets Port and URL.
func (p *Postgres) listen() error {
	// Another process may take the port between our probe and the server's bind;
	// that is rare, and then we try another.
	for attempt := 0; ; attempt++ {
		port, err := freePort()
		if err != nil {
			return err
		}
		p.Port = port
		if err := p.writeClusterConf(); err != nil {
			return err
		}
		err = p.start()
		if err == nil {
			break
		}
		if attempt >= 4 || !errors.Is(err, errPortInUse) {
			return err
		}
	}
	p.URL = p.urlFor("postgres")
	return nil
}

func (p *Postgres) urlFor(db string) string {
	u := url.URL{
		Scheme:   "postgres",
		User:     url.UserPassword(PostgresUser, PostgresPassword),
		Host:     net.JoinHostPort("127.0.0.1", strconv.Itoa(p.Port)),
		Path:     "/" + db,
		RawQuery: "sslmode=disable",
	}
	return u.String()
}

// writeClusterConf writes the settings that differ between clusters; the
// template's postgresql.conf includes the file.
func (p *Postgres) writeClusterConf() error {
	conf := fmt.Sprintf("port = %d\nunix_socket_directories = '%s'\n%s",
		p.Port, strings.ReplaceAll(p.Dir, "'", "''"), p.conf)
	name := filepath.Join(p.dataDir(), clusterConfName)
	if err := os.WriteFile(name, []byte(conf), 0o600); err != nil {
		return fmt.Errorf("testenv: %w", err)
	}
	return p.inst.chown(name)
}

var errPortInUse = errors.New("port in use")

// start runs pg_ctl start -w; on failure the error carries the server log's new
// lines.
func (p *Postgres) start() error {
	var logOffset int64
	if fi, err := os.Stat(p.logFile()); err == nil {
		logOffset = fi.Size()
	}
	out, err := p.inst.run(p.Dir, p.inst.pgCtl, "start", "-w", "-t", "60", "-D", p.dataDir(), "-l", p.logFile())
	if err == nil {
		return nil
	}
	tail := logTail(p.logFile(), logOffset, 20)
	err = fmt.Errorf("testenv: pg_ctl start (port %d): %w\n%s\nserver log %s:\n%s", p.Port, err, bytes.TrimSpace(out), p.logFile(), tail)
	if strings.Contains(tail, "could not bind") || strings.Contains(tail, "Address already in use") {
		return errors.Join(errPortInUse, err)
	}
	return err
}

// Stop shuts the server down fast (pg_ctl stop -m fast: sessions are terminated,
// a checkpoint is written) and keeps the data, so Start can bring it back on the
// same port.
func (p *Postgres) Stop() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return errors.New("testenv: Stop after Close")
	}
	out, err := p.inst.run(p.Dir, p.inst.pgCtl, "stop", "-w", "-t", "60", "-m", "fast", "-D", p.dataDir())
	if err != nil {
		return fmt.Errorf("testenv: pg_ctl stop: %w: %s", err, bytes.TrimSpace(out))
	}
	return nil
}

// Start starts the server again after Stop, on the same port with the same data.
// It fails if something else took the port meanwhile.
func (p *Postgres) Start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return errors.New("testenv: Start after Close")
	}
	return p.start()
}

// Configure adds settings (postgresql.conf lines) to the cluster's own and
// restarts the server (Stop, Start) so that every one of them applies.
func (p *Postgres) Configure(settings string) error {
	if err := p.Stop(); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.conf += strings.TrimSuffix(settings, "\n") + "\n"
	if err := p.writeClusterConf(); err != nil {
		return err
	}
	return p.start()
}

// Close stops the server at once (pg_ctl stop -m immediate; if that fails, the
// postmaster is killed) and removes Dir. It is safe to call twice and after Stop.
func (p *Postgres) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	var errs []error
	if pid := p.postmasterPID(); pid > 0 {
		out, err := p.inst.run(p.Dir, p.inst.pgCtl, "stop", "-w", "-t", "30", "-m", "immediate", "-D", p.dataDir())
		if err != nil && p.postmasterPID() == pid && syscall.Kill(pid, 0) == nil {
			syscall.Kill(pid, syscall.SIGKILL)
			errs = append(errs, fmt.Errorf("testenv: pg_ctl stop -m immediate: %w: %s (killed pid %d)", err, bytes.TrimSpace(out), pid))
		}
	}
	if p.wdPipe != nil {
		// The watchdog now runs pg_ctl stop on a stopped server and removes Dir.
		p.wdPipe.Close()
		select {
		case <-p.wdDone:
		case <-time.After(30 * time.Second):
			p.watchdog.Process.Kill()
			errs = append(errs, errors.New("testenv: watchdog did not finish"))
		}
	}
	if err := os.RemoveAll(p.Dir); err != nil {
		errs = append(errs, fmt.Errorf("testenv: %w", err))
	}
	return errors.Join(errs...)
}

// postmasterPID reads the first line of postmaster.pid; 0 if there is none.
func (p *Postgres) postmasterPID() int {
	b, err := os.ReadFile(filepath.Join(p.dataDir(), "postmaster.pid"))
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	pid, _ := strconv.Atoi(strings.TrimSpace(line))
	return pid
}

// watchdogScript waits for EOF on stdin (the test process closed the pipe or
// died), then stops the server and removes the cluster's directory.
// $0 is pg_ctl, $1 the data directory, $2 the cluster's directory.
const watchdogScript = `cat >/dev/null 2>&1
"$0" stop -D "$1" -m immediate -s >/dev/null 2>&1
rm -rf "$2"`

func (p *Postgres) startWatchdog() error {
	r, w, err := os.Pipe() // close-on-exec: no other child inherits w
	if err != nil {
		return fmt.Errorf("testenv: %w", err)
	}
	defer r.Close()
	cmd := exec.Command("/bin/sh", "-c", watchdogScript, p.inst.pgCtl, p.dataDir(), p.Dir)
	cmd.Stdin = r
	cmd.Dir = "/"
	cmd.Env = pgEnv()
	// Its own session: Ctrl-C on go test must not kill the watchdog before the
	// test process it watches.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Credential: p.inst.credential()}
	if err := cmd.Start(); err != nil {
		w.Close()
		return fmt.Errorf("testenv: start watchdog: %w", err)
	}
	p.watchdog, p.wdPipe = cmd, w
	p.wdDone = make(chan error, 1)
	go func() { p.wdDone <- cmd.Wait() }()
	return nil
}

// CreateDatabase creates a fresh database and returns a URL for it with the same
// credentials as p.URL.
func (p *Postgres) CreateDatabase(name string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := Exec(ctx, p.URL, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return "", fmt.Errorf("testenv: create database %q: %w", name, err)
	}
	return p.urlFor(name), nil
}

// Exec runs sql (one or more statements, simple protocol) against url's database
// on one short-lived connection and returns the rows of every statement as lines,
// columns in PostgreSQL's text format separated by a single space, NULL as "NULL"
// (so booleans are "t" and "f", as psql prints them). Errors wrap pgx's, so
// errors.As finds a *pgconn.PgError with the SQLSTATE.
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
			cols := make([]string, len(row))
			for i, v := range row {
				if v == nil {
					cols[i] = "NULL"
				} else {
					cols[i] = string(v)
				}
			}
			lines = append(lines, strings.Join(cols, " "))
		}
		if r.Err != nil && err == nil {
			err = r.Err
		}
	}
	return lines, err
}

// pgInstall is one PostgreSQL installation and the OS user its servers run as.
type pgInstall struct {
	initdb, pgCtl string
	version       string // initdb --version
	runAs         *user.User
	uid, gid      uint32 // of the user the server runs as

	mu     sync.Mutex
	tpl    *template
	tplErr error
}

var findInstall = sync.OnceValues(func() (*pgInstall, error) {
	initdb, pgCtl := findBinaries()
	if initdb == "" {
		return nil, ErrNoPostgres
	}
	inst := &pgInstall{initdb: initdb, pgCtl: pgCtl}
	inst.uid, inst.gid = uint32(os.Geteuid()), uint32(os.Getegid())
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return nil, fmt.Errorf("testenv: running as root, the server must run as the OS user postgres (initdb refuses root): %w; create it with: useradd --system postgres", err)
		}
		uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
		gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
		if err1 != nil || err2 != nil {
			return nil, fmt.Errorf("testenv: bad uid/gid for user postgres: %q/%q", u.Uid, u.Gid)
		}
		inst.runAs, inst.uid, inst.gid = u, uint32(uid), uint32(gid)
	}
	out, err := inst.run("/", inst.initdb, "--version")
	if err != nil {
		return nil, fmt.Errorf("testenv: %s --version: %w: %s", inst.initdb, err, out)
	}
	inst.version = strings.TrimSpace(string(out))
	return inst, nil
})

// pgLibGlob is where Debian and Ubuntu install the server binaries; a variable for
// the tests of the missing-PostgreSQL policy.
var pgLibGlob = "/usr/lib/postgresql/*/bin"

// findBinaries returns initdb and pg_ctl (the postgres binary must sit next to
// pg_ctl, which starts it from its own directory), or "" if there are none.
func findBinaries() (initdb, pgCtl string) {
	complete := func(dir string) bool {
		for _, name := range []string{"initdb", "pg_ctl", "postgres"} {
			if fi, err := os.Stat(filepath.Join(dir, name)); err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
				return false
			}
		}
		return true
	}
	if path, err := exec.LookPath("initdb"); err == nil {
		if real, err := filepath.EvalSymlinks(path); err == nil && complete(filepath.Dir(real)) {
			dir := filepath.Dir(real)
			return filepath.Join(dir, "initdb"), filepath.Join(dir, "pg_ctl")
		}
		if ctl, err := exec.LookPath("pg_ctl"); err == nil {
			if real, err := filepath.EvalSymlinks(ctl); err == nil && complete(filepath.Dir(real)) {
				return path, real
			}
		}
	}
	dirs, _ := filepath.Glob(pgLibGlob)
	version := func(dir string) float64 {
		v, _ := strconv.ParseFloat(filepath.Base(filepath.Dir(dir)), 64)
		return v
	}
	slices.SortFunc(dirs, func(a, b string) int { return -cmpFloat(version(a), version(b)) })
	for _, dir := range dirs {
		if complete(dir) {
			return filepath.Join(dir, "initdb"), filepath.Join(dir, "pg_ctl")
		}
	}
	return "", ""
}

func cmpFloat(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func (inst *pgInstall) credential() *syscall.Credential {
	if inst.runAs == nil {
		return nil
	}
	return &syscall.Credential{Uid: inst.uid, Gid: inst.gid} // and no supplementary groups
}

// run runs a PostgreSQL program as the server's OS user and returns its combined
// output.
func (inst *pgInstall) run(dir, name string, args ...string) ([]byte, error) {
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Env = pgEnv()
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: inst.credential()}
	return cmd.CombinedOutput()
}

// chown gives path to the server's OS user when we run as root.
func (inst *pgInstall) chown(path string) error {
	if inst.runAs == nil {
		return nil
	}
	if err := os.Lchown(path, int(inst.uid), int(inst.gid)); err != nil {
		return fmt.Errorf("testenv: %w", err)
	}
	return nil
}

// tempBase is os.TempDir, or /tmp if the server's OS user could not reach it.
func (inst *pgInstall) tempBase() string {
	base := os.TempDir()
	if inst.runAs == nil {
		return base
	}
	for d := base; ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil || fi.Mode().Perm()&0o001 == 0 {
			return "/tmp"
		}
		if d == filepath.Dir(d) {
			return base
		}
	}
}

// clusterBase is where clusters live: /dev/shm if it is a roomy tmpfs, since a
// cluster is about a thousand small files and creating them on a disk file system
// can cost a second on slow virtual disks; else tempBase.
func (inst *pgInstall) clusterBase() string {
	const tmpfsMagic = 0x01021994
	var st syscall.Statfs_t
	if syscall.Statfs("/dev/shm", &st) == nil && st.Type == tmpfsMagic && st.Bavail*uint64(st.Bsize) >= 1<<30 {
		return "/dev/shm"
	}
	return inst.tempBase()
}

// pgEnv is the environment for PostgreSQL programs: ours without PG* variables,
// which would redirect them, and with messages in English.
func pgEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "PG") || strings.HasPrefix(kv, "LC_") || strings.HasPrefix(kv, "LANG=") {
			continue
		}
		env = append(env, kv)
	}
	return append(env, "LC_ALL=C")
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("testenv: find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// logTail returns at most n lines of file written after offset.
func logTail(file string, offset int64, n int) string {
	f, err := os.Open(file)
	if err != nil {
		return "(" + err.Error() + ")"
	}
	defer f.Close()
	f.Seek(offset, io.SeekStart)
	var lines []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > n {
			lines = lines[1:]
		}
	}
	return strings.Join(lines, "\n")
}

// The template.

const (
	clusterConfName = "withlock-cluster.conf"
	markerName      = "withlock-template"
)

// templateConf is appended to the template's postgresql.conf: settings for fast,
// disposable clusters. Durability does not matter; start-up time does.
const templateConf = `
# withlock testenv
listen_addresses = '127.0.0.1'
max_connections = 200
shared_buffers = 16MB
fsync = off
synchronous_commit = off
full_page_writes = off
wal_level = minimal
max_wal_senders = 0
autovacuum = off
huge_pages = off
lc_messages = 'C'
include_if_exists = '` + clusterConfName + `'
`

var initdbArgs = []string{
	"-U", PostgresUser, "--auth=scram-sha-256", "-E", "UTF8", "--locale=C",
	"--no-sync", "--wal-segsize=1",
}

// template is an initdb'd data directory in dir/data; clusters are its copies.
type template struct {
	dir   string
	files int
	bytes int64
	id    string
}

var errTemplateDamaged = errors.New("template damaged")

// template returns the process's template, finding or building the shared one on
// first use. If the shared one cannot be used safely (another user's, unreadable
// lock), a private one is built in a temporary directory.
func (inst *pgInstall) template() (*template, error) {
	inst.mu.Lock()
	defer inst.mu.Unlock()
	if inst.tpl != nil || inst.tplErr != nil {
		return inst.tpl, inst.tplErr
	}
	inst.tpl, inst.tplErr = inst.sharedTemplate()
	if inst.tplErr != nil && !errors.Is(inst.tplErr, ErrNoPostgres) {
		var err error
		if inst.tpl, err = inst.privateTemplate(); err != nil {
			inst.tplErr = errors.Join(inst.tplErr, err)
		} else {
			inst.tplErr = nil
		}
	}
	return inst.tpl, inst.tplErr
}

// discardTemplate drops a template found damaged, so that the next call rebuilds
// it (unless another process already has).
func (inst *pgInstall) discardTemplate(bad *template) {
	inst.mu.Lock()
	defer inst.mu.Unlock()
	if inst.tpl != bad {
		return
	}
	inst.tpl = nil
	unlock, err := lockFile(bad.dir + ".lock")
	if err != nil {
		return
	}
	defer unlock()
	if cur, err := inst.readTemplate(bad.dir); err == nil && cur.id == bad.id {
		junk := fmt.Sprintf("%s.damaged-%d", bad.dir, os.Getpid())
		if os.Rename(bad.dir, junk) == nil {
			os.RemoveAll(junk)
		}
	}
}

func (inst *pgInstall) key() string {
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00%s\x00%s\x00%d\x00%s\x00%s", inst.initdb, inst.pgCtl, inst.version, inst.uid, strings.Join(initdbArgs, " "), templateConf)
	return hex.EncodeToString(h.Sum(nil))[:16]
}

func (inst *pgInstall) sharedTemplate() (*template, error) {
	dir := filepath.Join(inst.tempBase(), "withlock-pgtemplate-"+inst.key())
	unlock, err := lockFile(dir + ".lock")
	if err != nil {
		return nil, err
	}
	defer unlock()
	if fi, err := os.Lstat(dir); err == nil {
		tpl, err := inst.readTemplate(dir)
		if err == nil {
			return tpl, nil
		}
		if !fi.Mode().IsDir() || !ownedBy(fi, inst.uid) {
			return nil, err // not ours to repair
		}
		if err := os.RemoveAll(dir); err != nil { // ours, but incomplete
			return nil, fmt.Errorf("testenv: %w", err)
		}
	}
	return inst.buildTemplate(dir)
}

func (inst *pgInstall) privateTemplate() (*template, error) {
	parent, err := os.MkdirTemp(inst.tempBase(), "withlock-pgtemplate-private-")
	if err != nil {
		return nil, fmt.Errorf("testenv: %w", err)
	}
	// The directory is left for the process's lifetime; it is only used when the
	// shared one cannot be.
	return inst.buildTemplate(filepath.Join(parent, "t"))
}

// readTemplate checks that dir is a complete template owned by the server's user
// and writable by nobody else.
func (inst *pgInstall) readTemplate(dir string) (*template, error) {
	fi, err := os.Lstat(dir)
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsDir() || !ownedBy(fi, inst.uid) || fi.Mode().Perm()&0o022 != 0 {
		return nil, fmt.Errorf("testenv: template %s: not a directory owned by uid %d and writable only by it", dir, inst.uid)
	}
	b, err := os.ReadFile(filepath.Join(dir, markerName))
	if err != nil {
		return nil, fmt.Errorf("testenv: template %s incomplete: %w", dir, err)
	}
	t := &template{dir: dir}
	if _, err := fmt.Sscanf(string(b), "files %d bytes %d id %s", &t.files, &t.bytes, &t.id); err != nil {
		return nil, fmt.Errorf("testenv: template %s: bad marker: %v", dir, err)
	}
	return t, nil
}

// buildTemplate runs initdb into a temporary sibling of dir and renames it into
// place once complete.
func (inst *pgInstall) buildTemplate(dir string) (*template, error) {
	tmp, err := os.MkdirTemp(filepath.Dir(dir), filepath.Base(dir)+".tmp-")
	if err != nil {
		return nil, fmt.Errorf("testenv: %w", err)
	}
	defer os.RemoveAll(tmp)
	if err := inst.chown(tmp); err != nil {
		return nil, err
	}
	pwfile := filepath.Join(tmp, "pwfile")
	if err := os.WriteFile(pwfile, []byte(PostgresPassword+"\n"), 0o600); err != nil {
		return nil, fmt.Errorf("testenv: %w", err)
	}
	if err := inst.chown(pwfile); err != nil {
		return nil, err
	}
	data := filepath.Join(tmp, "data")
	args := append([]string{"-D", data, "--pwfile", pwfile}, initdbArgs...)
	if out, err := inst.run(tmp, inst.initdb, args...); err != nil {
		return nil, fmt.Errorf("testenv: initdb: %w\n%s", err, out)
	}
	os.Remove(pwfile)
	conf, err := os.OpenFile(filepath.Join(data, "postgresql.conf"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return nil, fmt.Errorf("testenv: %w", err)
	}
	_, err = conf.WriteString(templateConf)
	if cerr := conf.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, fmt.Errorf("testenv: %w", err)
	}
	t := &template{dir: dir, id: rand.Text()}
	err = filepath.WalkDir(data, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		t.files++
		t.bytes += fi.Size()
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("testenv: %w", err)
	}
	marker := filepath.Join(tmp, markerName)
	if err := os.WriteFile(marker, fmt.Appendf(nil, "files %d bytes %d id %s\n", t.files, t.bytes, t.id), 0o644); err != nil {
		return nil, fmt.Errorf("testenv: %w", err)
	}
	if err := inst.chown(marker); err != nil {
		return nil, err
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		return nil, fmt.Errorf("testenv: %w", err)
	}
	if err := os.Rename(tmp, dir); err != nil {
		return nil, fmt.Errorf("testenv: %w", err)
	}
	return t, nil
}

// copyTo copies the template's data directory to dst, owned by the server's user,
// and checks that it copied what initdb made.
func (t *template) copyTo(dst string, inst *pgInstall) error {
	src := filepath.Join(t.dir, "data")
	files, n := 0, int64(0)
	err := filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		switch {
		case d.IsDir():
			if err := os.Mkdir(target, 0o700); err != nil {
				return err
			}
			if err := os.Chmod(target, 0o700); err != nil { // whatever the umask
				return err
			}
		case d.Type().IsRegular():
			size, err := copyFile(target, path)
			if err != nil {
				return err
			}
			files++
			n += size
		case d.Type()&fs.ModeSymlink != 0:
			link, err := os.Readlink(path)
			if err != nil {
				return err
			}
			if err := os.Symlink(link, target); err != nil {
				return err
			}
		default:
			return fmt.Errorf("%s: unexpected file type %v", path, d.Type())
		}
		return inst.chown(target)
	})
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("testenv: copy template: %w: %w", errTemplateDamaged, err)
		}
		return fmt.Errorf("testenv: copy template: %w", err)
	}
	if files != t.files || n != t.bytes {
		return fmt.Errorf("testenv: copy template %s: %w: %d files, %d bytes; want %d, %d", t.dir, errTemplateDamaged, files, n, t.files, t.bytes)
	}
	return nil
}

func copyFile(dst, src string) (int64, error) {
	in, err := os.Open(src)
	if err != nil {
		return 0, err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return 0, err
	}
	n, err := io.Copy(out, in) // copy_file_range where the file system has it
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	return n, err
}

func ownedBy(fi fs.FileInfo, uid uint32) bool {
	st, ok := fi.Sys().(*syscall.Stat_t)
	return ok && st.Uid == uid
}

// lockFile takes an exclusive flock on name (created if missing, readable by all
// so that other users' test binaries can take it too) and returns its release.
func lockFile(name string) (unlock func(), err error) {
	f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		if f, err = os.Open(name); err != nil {
			return nil, fmt.Errorf("testenv: lock: %w", err)
		}
	}
	for {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX)
		if err != syscall.EINTR {
			break
		}
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("testenv: lock %s: %w", name, err)
	}
	return func() { f.Close() }, nil
}
