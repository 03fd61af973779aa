// Package testenv starts the real servers withlock's tests run against, on
// loopback, each in a temporary directory of its own: PostgreSQL (with
// PgBouncer and hot standbys), redis-server, a MongoDB-wire server (FerretDB,
// built from internal/testenv/ferretdb), MariaDB and etcd (Debian's, and later
// releases built from internal/testenv/etcd35 and its siblings). No mocks.
//
// Every server is a child of the test process, started with a parent-death
// signal (SIGKILL): a test binary that crashes, or is killed, leaves no server
// running. Its directory is removed by Close, or, after a crash, by the next
// test process that starts a server.
//
// Each StartX takes at most one options value (none: the defaults), and the
// caller must Close what it returns. RequireX is StartX for a test, closed
// when it ends; a missing program skips the test on a developer's machine and
// fails it under CI=true, with the apt-get command that installs it
// (scripts/test-deps installs them all).
package testenv

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// require returns s, closed when t ends, or ends t: skipped if err is
// missing (a program not installed) outside CI, failed otherwise.
func require[S interface{ Close() error }](t testing.TB, s S, err, missing error) S {
	t.Helper()
	if ci, perr := strconv.ParseBool(os.Getenv("CI")); errors.Is(err, missing) && (os.Getenv("CI") == "" || perr == nil && !ci) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("%v", err)
		}
	})
	return s
}

// proc is one server process in a directory of its own, Dir, which Close
// removes. Stop and Start restart it in place; Pause and Resume freeze it.
type proc struct {
	Dir      string
	Port     int    // on 127.0.0.1, the same across Stop and Start
	URL      string // how withlock reaches the server (each server's type says its form)
	CertFile string // with TLS, the CA (Dir/ca.crt) that signed the server's certificate

	mu      sync.Mutex
	command func() *exec.Cmd // the server's command line, made anew at each start
	ready   func() error     // nil once the server answers
	stopSig syscall.Signal   // asks the server to shut down, keeping its data
	quitSig syscall.Signal   // asks it to quit at once, before Close kills it; 0: none
	cmd     *exec.Cmd        // nil when stopped
	exited  chan struct{}
	closed  bool
	asUser  *syscall.Credential // the OS user the server runs as; nil: ours
}

// newProc makes the directory of a server of the given kind, with
// certificates (writeCerts) if tls. Directories are named after the test
// process's pid, so that the first server a test process starts can remove
// those of test processes that died without their Close.
func newProc(base, kind string, asUser *syscall.Credential, tls bool) (*proc, error) {
	stale, _ := filepath.Glob(filepath.Join(base, "withlock-srv-*"))
	for _, dir := range stale {
		pid, err := strconv.Atoi(strings.Split(filepath.Base(dir), "-")[2])
		if err == nil && syscall.Kill(pid, 0) == syscall.ESRCH {
			os.RemoveAll(dir)
		}
	}
	dir, err := os.MkdirTemp(base, fmt.Sprintf("withlock-srv-%d-%s-", os.Getpid(), kind))
	if err != nil {
		return nil, fmt.Errorf("testenv: %w", err)
	}
	if asUser != nil {
		os.Chown(dir, int(asUser.Uid), int(asUser.Gid))
	}
	p := &proc{Dir: dir, stopSig: syscall.SIGTERM, asUser: asUser}
	if tls {
		if p.CertFile, err = writeCerts(dir, asUser); err != nil {
			p.Close()
			return nil, err
		}
	}
	return p, nil
}

// spawner starts every server from one OS thread that lives as long as the
// test process: a parent-death signal fires when the thread that forked the
// child ends, not the process.
var spawner = sync.OnceValue(func() chan func() {
	c := make(chan func())
	go func() {
		runtime.LockOSThread() // never unlocked: the thread never ends
		for f := range c {
			f()
		}
	}()
	return c
})

// start starts the server and waits until it is ready, for at most a
// minute; its output goes to Dir/server.out. It fails with errPortInUse
// when the server could not bind its port.
func (p *proc) start() error {
	if p.closed || p.cmd != nil {
		return errors.New("testenv: start: server closed or running")
	}
	out, err := os.OpenFile(filepath.Join(p.Dir, "server.out"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("testenv: %w", err)
	}
	defer out.Close()
	offset, _ := out.Seek(0, 2)
	cmd := p.command()
	cmd.Dir, cmd.Stdout, cmd.Stderr = p.Dir, out, out
	// Its own process group, so that Ctrl-C reaches only the test process.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL, Credential: p.asUser}
	done := make(chan error)
	spawner() <- func() { done <- cmd.Start() }
	if err := <-done; err != nil {
		return fmt.Errorf("testenv: %w", err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	p.cmd, p.exited = cmd, exited
	for deadline := time.Now().Add(time.Minute); ; {
		err := p.ready()
		if err == nil {
			return nil
		}
		select {
		case <-exited:
			err = fmt.Errorf("exited (%v)", cmd.ProcessState)
		case <-time.After(5 * time.Millisecond):
			if time.Now().Before(deadline) {
				continue
			}
		}
		p.halt(0, 0)
		log, _ := os.ReadFile(out.Name())
		tail := string(log[min(offset, int64(len(log))):])
		err = fmt.Errorf("testenv: %s not ready: %v; its output:\n%s", filepath.Base(cmd.Path), err, tail)
		if strings.Contains(tail, "already in use") {
			err = errors.Join(errPortInUse, err)
		}
		return err
	}
}

var errPortInUse = errors.New("port in use")

// launch starts the server for the first time, on a free port (FreePort),
// trying another if something outside the tests took it between our probe
// and the server's bind. If it fails, it closes p.
func (p *proc) launch() (err error) {
	for attempt := 0; err == nil || attempt < 5 && errors.Is(err, errPortInUse); attempt++ {
		if p.Port, err = FreePort(); err != nil {
			p.Close()
			return err
		}
		if err = p.start(); err == nil {
			return nil
		}
	}
	p.Close()
	return err
}

// Servers' ports come from [portsFrom, portsTo): below the kernel's
// ephemeral range (32768 and up unless configured otherwise), where the
// local ports of outgoing connections and of listeners on port 0 (fault
// proxies, tests' own listeners) come from. So none of those can take a
// stopped server's port before it starts again, on the same port, as its
// data and the tests' URLs expect. A Redis Cluster node's bus port, its
// port + 10000, stays below that range too.
const portsFrom, portsTo = 10000, 20000

// FreePort returns a port of 127.0.0.1 that was free a moment ago and is
// no other server's: a test process reserves each port it hands out, for as
// long as it lives, with a lock on byte PORT of one file that every test
// process shares (os.TempDir()/withlock-testenv-ports), so that two test
// binaries running at once never pick the same one.
func FreePort() (int, error) {
	ports.Lock()
	defer ports.Unlock()
	if ports.file == nil {
		// Opened once and never closed: closing any descriptor of the
		// file would drop every lock this process holds on it.
		f, err := os.OpenFile(filepath.Join(os.TempDir(), "withlock-testenv-ports"), os.O_RDWR|os.O_CREATE, 0o666)
		if err != nil {
			return 0, fmt.Errorf("testenv: %w", err)
		}
		ports.file, ports.mine = f, map[int]bool{}
	}
	first := rand.IntN(portsTo - portsFrom)
	for i := range portsTo - portsFrom {
		port := portsFrom + (first+i)%(portsTo-portsFrom)
		if ports.mine[port] { // fcntl locks never conflict within a process
			continue
		}
		lk := syscall.Flock_t{Type: syscall.F_WRLCK, Whence: io.SeekStart, Start: int64(port), Len: 1}
		if syscall.FcntlFlock(ports.file.Fd(), syscall.F_SETLK, &lk) != nil {
			continue // another test process's
		}
		ports.mine[port] = true
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			continue // in use by something else: stays reserved, unused
		}
		l.Close()
		return port, nil
	}
	return 0, fmt.Errorf("testenv: no free port of 127.0.0.1 between %d and %d", portsFrom, portsTo)
}

var ports struct {
	sync.Mutex
	file *os.File
	mine map[int]bool // reserved by this process
}

func (p *proc) addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(p.Port)) }

// halt sends the server sig, if not 0, and SIGCONT (in case it is frozen),
// and waits at most wait for it to exit; then it kills it (SIGKILL works on
// a frozen server too). It reports whether the server exited by itself.
func (p *proc) halt(sig syscall.Signal, wait time.Duration) (exited bool) {
	if p.cmd == nil {
		return true
	}
	if sig != 0 {
		p.cmd.Process.Signal(sig)
		p.cmd.Process.Signal(syscall.SIGCONT)
	}
	select {
	case <-p.exited:
		exited = true
	case <-time.After(wait):
		p.cmd.Process.Kill()
		<-p.exited
	}
	p.cmd = nil
	return exited
}

// Stop shuts the server down, keeping its data and port: Start brings it
// back. A server still running a minute later is killed.
func (p *proc) Stop() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return errors.New("testenv: Stop: server not running")
	}
	if !p.halt(p.stopSig, time.Minute) {
		return errors.New("testenv: server did not stop within a minute; killed")
	}
	return nil
}

// Start starts the server again after Stop, on the same port with the same
// data.
func (p *proc) Start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.start()
}

// Pause freezes the server (SIGSTOP): connections stay open and requests go
// unanswered, as with a hung server or a partition, until Resume. It
// returns once every thread has stopped: kill(2) returns before the threads
// running on another CPU stop.
func (p *proc) Pause() error {
	err := p.signal(syscall.SIGSTOP)
	for deadline := time.Now().Add(10 * time.Second); err == nil && !p.allStopped(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			return fmt.Errorf("testenv: server %d still running 10s after SIGSTOP", p.PID())
		}
	}
	return err
}

// allStopped says whether /proc shows every thread of the server stopped
// (state T).
func (p *proc) allStopped() bool {
	stats, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/stat", p.PID()))
	for _, f := range stats {
		b, _ := os.ReadFile(f)
		// "pid (comm) S ...": the state follows the last ')'.
		if i := strings.LastIndexByte(string(b), ')'); i < 0 || i+2 >= len(b) || b[i+2] != 'T' {
			return false
		}
	}
	return len(stats) > 0
}

// Resume continues a server frozen by Pause.
func (p *proc) Resume() error { return p.signal(syscall.SIGCONT) }

func (p *proc) signal(sig syscall.Signal) error {
	if pid := p.PID(); pid != 0 {
		return syscall.Kill(pid, sig)
	}
	return errors.New("testenv: server not running")
}

// PID is the server's process id, 0 while it is stopped (for benchmarks
// that read what it spends in /proc/PID/stat).
func (p *proc) PID() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// Close kills the server and removes its directory. It is safe to call
// twice, and after Stop or Pause.
func (p *proc) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.quitSig != 0 {
		p.halt(p.quitSig, 10*time.Second)
	}
	p.halt(0, 0)
	p.closed = true
	if err := os.RemoveAll(p.Dir); err != nil {
		return fmt.Errorf("testenv: %w", err)
	}
	return nil
}

// install is where a server that runs from copies of one data directory
// (PostgreSQL, MariaDB) finds its template, made once per test process, and
// the OS user it runs as: ours or, as root, the OS user name (newInstall),
// since those servers refuse root, as their packages do. Data directories live on /dev/shm when it is a roomy
// tmpfs, where making one takes milliseconds, not a slow disk's seconds.
type install struct {
	asUser   *syscall.Credential
	base     string // where data directories live
	template string // the data directory to copy, for init to make
}

func newInstall(name, kind string) (*install, error) {
	inst := &install{base: os.TempDir()}
	var st syscall.Statfs_t
	if syscall.Statfs("/dev/shm", &st) == nil && st.Type == 0x01021994 && st.Bavail*uint64(st.Bsize) >= 1<<30 {
		inst.base = "/dev/shm"
	}
	if os.Geteuid() == 0 {
		u, err := user.Lookup(name)
		if err != nil {
			return nil, fmt.Errorf("testenv: as root, the server runs as the OS user %s: %w; create it with: useradd --system %s", name, err, name)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		inst.asUser = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}
	tpl, err := newProc(inst.base, kind+"template", inst.asUser, false)
	if err != nil {
		return nil, err
	}
	inst.template = filepath.Join(tpl.Dir, "data")
	return inst, nil
}

// newProc makes a server's directory holding a copy of the template in data/.
func (inst *install) newProc(kind string, tls bool) (*proc, error) {
	p, err := newProc(inst.base, kind, inst.asUser, tls)
	if err != nil {
		return nil, err
	}
	// cp -a keeps the owner (the server's user) and modes.
	if out, err := exec.Command("cp", "-a", inst.template, p.Dir).CombinedOutput(); err != nil {
		p.Close()
		return nil, fmt.Errorf("testenv: copy the %s template: %v: %s", kind, err, out)
	}
	return p, nil
}

// run runs a command of the installation as the server's user.
func (inst *install) run(name string, args ...string) error {
	cmd := exec.Command(name, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: inst.asUser}
	cmd.Dir, cmd.Env = filepath.Dir(inst.template), append(os.Environ(), "LC_ALL=C")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("testenv: %s: %w\n%s", filepath.Base(name), err, out)
	}
	return nil
}

// findProgram looks name up in PATH, then in dirs (globs, the newest
// version first when they sort by version); "" if it is nowhere.
func findProgram(name string, dirs ...string) string {
	if path, err := exec.LookPath(name); err == nil {
		return path
	}
	for _, pattern := range dirs {
		matches, _ := filepath.Glob(filepath.Join(pattern, name))
		for i := len(matches) - 1; i >= 0; i-- {
			if fi, err := os.Stat(matches[i]); err == nil && fi.Mode()&0o111 != 0 {
				return matches[i]
			}
		}
	}
	return ""
}

// moduleDir finds a directory of this package's source tree (ferretdb, npm),
// next to this file or, in binaries built with -trimpath, below the module
// root above the working directory.
func moduleDir(name string) (string, error) {
	if _, file, _, ok := runtime.Caller(0); ok && filepath.IsAbs(file) {
		return filepath.Join(filepath.Dir(file), name), nil
	}
	wd, _ := os.Getwd()
	for d := wd; d != filepath.Dir(d); d = filepath.Dir(d) {
		if b, err := os.ReadFile(filepath.Join(d, "go.mod")); err == nil && strings.Contains(string(b), "module github.com/withlock/withlock\n") {
			return filepath.Join(d, "internal", "testenv", name), nil
		}
	}
	return "", fmt.Errorf("testenv: internal/testenv/%s not found above %s", name, wd)
}

// cachedBuild finds the program pkg of the module internal/testenv/module in
// the user's cache, or builds it there (statically, with the module's go.mod
// and go.sum alone) under a lock, so that test processes that run at once
// build it once; flags go to go build. Its name has a hash of the module's
// files: a change builds anew. Errors wrap errNo, which says what to do.
func cachedBuild(module, pkg string, errNo error, flags ...string) (string, error) {
	src, err := moduleDir(module)
	if err != nil {
		return "", err
	}
	files, _ := filepath.Glob(filepath.Join(src, "*.go"))
	h := sha256.New()
	fmt.Fprintln(h, runtime.GOOS, runtime.GOARCH)
	for _, f := range append([]string{filepath.Join(src, "go.mod"), filepath.Join(src, "go.sum")}, files...) {
		b, err := os.ReadFile(f)
		if err != nil {
			return "", fmt.Errorf("testenv: %w", err)
		}
		h.Write(b)
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	bin := filepath.Join(cache, "withlock-testenv", path.Base(pkg)+"-"+hex.EncodeToString(h.Sum(nil))[:16])
	if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
		return "", fmt.Errorf("testenv: %w", err)
	}
	unlock, err := lockFile(bin + ".lock")
	if err != nil {
		return "", err
	}
	defer unlock()
	if _, err := os.Stat(bin); err == nil {
		return bin, nil
	}
	if _, err := exec.LookPath("go"); err != nil {
		return "", errNo
	}
	build := exec.Command("go", append(append([]string{"build", "-trimpath", "-ldflags=-s -w", "-o", bin + ".tmp"}, flags...), pkg)...)
	build.Dir = src
	build.Env = append(os.Environ(), "GOFLAGS=-mod=readonly -buildvcs=false", "GOWORK=off", "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		return "", fmt.Errorf("%w\ngo build in %s: %v\n%s", errNo, src, err, out)
	}
	return bin, os.Rename(bin+".tmp", bin)
}

// lockFile takes an exclusive flock on name (created if missing), so that
// test processes that run at once build or install a thing once.
func lockFile(name string) (unlock func(), err error) {
	f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("testenv: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("testenv: flock %s: %w", name, err)
	}
	return func() { f.Close() }, nil
}
