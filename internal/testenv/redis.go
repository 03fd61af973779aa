package testenv

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
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
)

// ErrNoRedis is returned by [StartRedis] when redis-server is not installed. Its
// message says how to install it.
var ErrNoRedis = errors.New("testenv: redis-server not found in PATH; install it with: apt-get install redis-server (or run scripts/test-deps as root)")

// Redis is a running throwaway redis-server on 127.0.0.1 in a temporary directory,
// without persistence (save "", appendonly no): its data does not survive Stop.
//
// A new server is marked as one that forgot no lock: its key [RedisFreshKey] holds
// its run_id, which lifts withlock's wait on servers younger than the lock's ttl.
// A server started again after Stop is not marked: that is the restart withlock
// must wait out.
//
// Like [Postgres], it has a watchdog that kills the server and removes Dir when the
// test process exits, however it dies.
type Redis struct {
	Dir  string // redis.conf, redis.log; the server's working directory
	Port int    // TCP port on 127.0.0.1, the same across Stop and Start
	// URL is redis://127.0.0.1:PORT/0, or redis://:PASSWORD@127.0.0.1:PORT/0 with
	// a password; rediss:// with TLS.
	URL string
	// CertFile is the server's self-signed certificate (PEM) with TLS, for
	// clients to trust or, by default, to refuse.
	CertFile string

	bin  string
	opts RedisOptions
	proc *serverProc
}

// RedisFreshKey is the key whose value, the server's run_id, tells withlock that
// this start of the server forgot no lock (internal/lock/redis.FreshKey).
const RedisFreshKey = "withlock-fresh"

// RedisOptions say how [StartRedisWith] starts a server. The zero value is
// [StartRedis]'s server.
type RedisOptions struct {
	// Password is requirepass (and, for a replica, masterauth): commands fail
	// with NOAUTH until AUTH password, and AUTH with another password fails with
	// WRONGPASS. It is in URL.
	Password string
	// TLS makes the server speak only TLS (tls-port, no plaintext port), with a
	// self-signed certificate for 127.0.0.1 in CertFile; client certificates are
	// not asked for.
	TLS bool
	// ReplicaOf makes the server a replica (replicaof) of that server.
	ReplicaOf *Redis
}

// StartRedis starts a new redis-server on a free port, without a password, and
// returns it running. The caller must Close it. If redis-server is not in PATH,
// the error is [ErrNoRedis].
func StartRedis() (*Redis, error) { return StartRedisWith(RedisOptions{}) }

// StartRedisWithPassword is [StartRedis] with requirepass set to password.
func StartRedisWithPassword(password string) (*Redis, error) {
	if password == "" {
		return nil, errors.New("testenv: StartRedisWithPassword: empty password")
	}
	return StartRedisWith(RedisOptions{Password: password})
}

// StartRedisWith is [StartRedis] with the options o.
func StartRedisWith(o RedisOptions) (*Redis, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, ErrNoRedis
	}
	proc, err := newServerProc("withlock-redis-")
	if err != nil {
		return nil, err
	}
	r := &Redis{Dir: proc.dir, bin: bin, opts: o, proc: proc}
	if o.TLS {
		r.CertFile = filepath.Join(r.Dir, "cert.pem")
		if err := writeSelfSigned(r.CertFile, filepath.Join(r.Dir, "key.pem")); err != nil {
			r.Close()
			return nil, err
		}
	}
	// Another process may take the port between our probe and the server's bind;
	// that is rare, and then we try another.
	for attempt := 0; ; attempt++ {
		if r.Port, err = freePort(); err != nil {
			break
		}
		if err = r.start(); err == nil || attempt >= 4 || !errors.Is(err, errPortInUse) {
			break
		}
	}
	if err != nil {
		r.Close()
		return nil, err
	}
	u := url.URL{Scheme: "redis", Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(r.Port)), Path: "/0"}
	if o.TLS {
		u.Scheme = "rediss"
	}
	if o.Password != "" {
		u.User = url.UserPassword("", o.Password)
	}
	r.URL = u.String()
	if o.ReplicaOf == nil {
		if err := r.markFresh(); err != nil {
			r.Close()
			return nil, err
		}
	}
	return r, nil
}

// markFresh sets RedisFreshKey to the server's run_id.
func (r *Redis) markFresh() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	info, err := RedisDo(ctx, r.URL, "INFO", "server")
	if err != nil {
		return fmt.Errorf("testenv: INFO server: %w", err)
	}
	_, after, ok := strings.Cut(info, "run_id:")
	if !ok {
		return fmt.Errorf("testenv: no run_id in INFO server:\n%s", info)
	}
	runID, _, _ := strings.Cut(after, "\r\n")
	if _, err := RedisDo(ctx, r.URL, "SET", RedisFreshKey, runID); err != nil {
		return fmt.Errorf("testenv: SET %s: %w", RedisFreshKey, err)
	}
	return nil
}

func (r *Redis) addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(r.Port)) }

// start writes redis.conf for r.Port and starts the server, waiting until it
// answers PING (with NOAUTH when it has a password: it is up either way).
func (r *Redis) start() error {
	// repl-diskless-sync-delay 0: a replica's first sync starts at once, not
	// after the default 5s.
	conf := fmt.Sprintf(`bind 127.0.0.1
daemonize no
supervised no
dir %s
logfile %s
save ""
appendonly no
repl-diskless-sync-delay 0
`, redisQuote(r.Dir), redisQuote(filepath.Join(r.Dir, "redis.log")))
	if r.opts.TLS {
		conf += fmt.Sprintf("port 0\ntls-port %d\ntls-cert-file %s\ntls-key-file %s\ntls-auth-clients no\n",
			r.Port, redisQuote(r.CertFile), redisQuote(filepath.Join(r.Dir, "key.pem")))
	} else {
		conf += fmt.Sprintf("port %d\n", r.Port)
	}
	if r.opts.Password != "" {
		conf += "requirepass " + redisQuote(r.opts.Password) + "\n"
	}
	if p := r.opts.ReplicaOf; p != nil {
		conf += fmt.Sprintf("replicaof 127.0.0.1 %d\n", p.Port)
		if p.opts.Password != "" {
			conf += "masterauth " + redisQuote(p.opts.Password) + "\n"
		}
		if p.opts.TLS {
			conf += "tls-replication yes\n"
		}
	}
	name := filepath.Join(r.Dir, "redis.conf")
	if err := os.WriteFile(name, []byte(conf), 0o600); err != nil {
		return fmt.Errorf("testenv: %w", err)
	}
	logName := filepath.Join(r.Dir, "redis.log")
	var logOffset int64
	if fi, err := os.Stat(logName); err == nil {
		logOffset = fi.Size()
	}
	err := r.proc.start(exec.Command(r.bin, name), nil, func() bool {
		reply, err := redisPing(r.addr(), r.opts.TLS)
		return err == nil && reply != ""
	})
	if err != nil {
		tail := logTail(logName, logOffset, 20)
		err = fmt.Errorf("testenv: redis-server (port %d): %w\nserver log %s:\n%s", r.Port, err, logName, tail)
		if strings.Contains(tail, "Address already in use") {
			return errors.Join(errPortInUse, err)
		}
		return err
	}
	return nil
}

// Stop shuts the server down (SIGTERM; SIGKILL after 10s) and keeps Dir and Port,
// so Start can bring it back. Its data is gone: there is no persistence.
func (r *Redis) Stop() error { return r.proc.stop() }

// Start starts the server again after Stop, on the same port, empty. It fails if
// something else took the port meanwhile.
func (r *Redis) Start() error {
	return r.proc.locked(func() error { return r.start() })
}

// Pause stops the server with SIGSTOP: connections stay open and requests go
// unanswered, as with a hung server or a network partition, until Resume.
func (r *Redis) Pause() error { return r.proc.signal(syscall.SIGSTOP) }

// Resume continues a server stopped by Pause.
func (r *Redis) Resume() error { return r.proc.signal(syscall.SIGCONT) }

// Close kills the server and removes Dir. It is safe to call twice, after Stop
// and while paused.
func (r *Redis) Close() error { return r.proc.close() }

// RequireRedis starts a server with [StartRedis] and closes it when t's test
// ends. If redis-server is not installed, t fails under CI (CI=true) and is
// skipped elsewhere, with the install hint either way; any other error fails t.
func RequireRedis(t testing.TB) *Redis {
	t.Helper()
	return RequireRedisWith(t, RedisOptions{})
}

// RequireRedisWithPassword is [RequireRedis] with [StartRedisWithPassword].
func RequireRedisWithPassword(t testing.TB, password string) *Redis {
	t.Helper()
	return RequireRedisWith(t, RedisOptions{Password: password})
}

// RequireRedisWith is [RequireRedis] with [StartRedisWith].
func RequireRedisWith(t testing.TB, o RedisOptions) *Redis {
	t.Helper()
	r, err := StartRedisWith(o)
	if err != nil {
		missing(t, err, ErrNoRedis)
	}
	t.Cleanup(func() {
		if err := r.Close(); err != nil {
			t.Errorf("testenv: close redis: %v", err)
		}
	})
	return r
}

// RedisDo runs one command on a new connection to the server of url (a
// redis://[[user]:password@]host:port[/db] URL: AUTH and SELECT first as it says;
// rediss:// for TLS, trusting any certificate: this is a test's own server)
// and returns the reply as text: a simple or bulk string as is, an integer in
// decimal, a nil reply as "(nil)", an array as its elements' texts, one a line.
// An error reply is returned as an error whose text is the reply's (for example
// "NOAUTH Authentication required." or "WRONGPASS invalid username-password pair
// or user is disabled.").
func RedisDo(ctx context.Context, url string, args ...string) (string, error) {
	addr, auth, db, useTLS, err := parseRedisURL(url)
	if err != nil {
		return "", err
	}
	var conn net.Conn
	if useTLS {
		d := tls.Dialer{Config: &tls.Config{InsecureSkipVerify: true}}
		conn, err = d.DialContext(ctx, "tcp", addr)
	} else {
		var d net.Dialer
		conn, err = d.DialContext(ctx, "tcp", addr)
	}
	if err != nil {
		return "", err
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	br := bufio.NewReader(conn)
	if auth != nil {
		if _, err := respDo(conn, br, append([]string{"AUTH"}, auth...)...); err != nil {
			return "", err
		}
	}
	if db != "" && db != "0" {
		if _, err := respDo(conn, br, "SELECT", db); err != nil {
			return "", err
		}
	}
	reply, err := respDo(conn, br, args...)
	if ctx.Err() != nil {
		return "", ctx.Err()
	}
	return reply, err
}

func parseRedisURL(s string) (addr string, auth []string, db string, useTLS bool, err error) {
	u, err := url.Parse(s)
	if err != nil {
		return "", nil, "", false, fmt.Errorf("testenv: %w", err)
	}
	if u.Scheme != "redis" && u.Scheme != "rediss" {
		return "", nil, "", false, fmt.Errorf("testenv: not a redis:// URL: %s", u.Redacted())
	}
	if u.User != nil {
		if pw, ok := u.User.Password(); ok {
			auth = []string{pw}
			if name := u.User.Username(); name != "" {
				auth = []string{name, pw}
			}
		}
	}
	return u.Host, auth, strings.TrimPrefix(u.Path, "/"), u.Scheme == "rediss", nil
}

// redisError is an error reply.
type redisError string

func (e redisError) Error() string { return string(e) }

// respDo sends a command as a RESP array of bulk strings and reads the reply.
func respDo(w io.Writer, r *bufio.Reader, args ...string) (string, error) {
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := io.WriteString(w, b.String()); err != nil {
		return "", err
	}
	lines, err := respRead(r)
	return strings.Join(lines, "\n"), err
}

// respRead reads one RESP2 reply as lines of text.
func respRead(r *bufio.Reader) ([]string, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return nil, err
	}
	line = strings.TrimSuffix(line, "\r\n")
	if line == "" {
		return nil, fmt.Errorf("testenv: bad RESP reply %q", line)
	}
	switch body := line[1:]; line[0] {
	case '+', ':':
		return []string{body}, nil
	case '-':
		return nil, redisError(body)
	case '$':
		n, err := strconv.Atoi(body)
		if err != nil {
			return nil, fmt.Errorf("testenv: bad RESP reply %q", line)
		}
		if n < 0 {
			return []string{"(nil)"}, nil
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return nil, err
		}
		return []string{string(buf[:n])}, nil
	case '*':
		n, err := strconv.Atoi(body)
		if err != nil {
			return nil, fmt.Errorf("testenv: bad RESP reply %q", line)
		}
		if n < 0 {
			return []string{"(nil)"}, nil
		}
		var lines []string
		var firstErr error
		for range n {
			l, err := respRead(r)
			var re redisError
			if errors.As(err, &re) {
				if firstErr == nil {
					firstErr = err
				}
				continue
			}
			if err != nil {
				return nil, err
			}
			lines = append(lines, l...)
		}
		return lines, firstErr
	}
	return nil, fmt.Errorf("testenv: bad RESP reply %q", line)
}

// redisPing sends PING and returns the reply's first line, error replies
// included ("NOAUTH ..."): any reply means the server is up.
func redisPing(addr string, useTLS bool) (string, error) {
	// Short timeouts: whatever listens on the port may not be our server (then it
	// exits, which the caller notices between attempts).
	d := &net.Dialer{Timeout: 250 * time.Millisecond}
	var conn net.Conn
	var err error
	if useTLS {
		conn, err = tls.DialWithDialer(d, "tcp", addr, &tls.Config{InsecureSkipVerify: true})
	} else {
		conn, err = d.Dial("tcp", addr)
	}
	if err != nil {
		return "", err
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(250 * time.Millisecond))
	reply, err := respDo(conn, bufio.NewReader(conn), "PING")
	var re redisError
	if errors.As(err, &re) {
		return string(re), nil
	}
	return reply, err
}

// writeSelfSigned writes a new self-signed certificate for 127.0.0.1 and its
// key, in PEM, valid for a day.
func writeSelfSigned(certFile, keyFile string) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("testenv: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: "withlock test server"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IsCA:         true,
		// A CA as well, so that a client can trust it as its own root.
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return fmt.Errorf("testenv: %w", err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return fmt.Errorf("testenv: %w", err)
	}
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		return fmt.Errorf("testenv: %w", err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		return fmt.Errorf("testenv: %w", err)
	}
	return nil
}

// redisQuote quotes s for redis.conf.
func redisQuote(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"' || c == '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		case c < 0x20 || c >= 0x7f:
			fmt.Fprintf(&b, "\\x%02x", c)
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('"')
	return b.String()
}

// serverProc is a server program run by the test process as a child, in its own
// temporary directory dir, which is also the child's working directory.
//
// Its watchdog (sh, in its own session) holds the read end of a pipe whose write
// end only the test process holds. When the test process exits, however it dies,
// the pipe closes and the watchdog kills the server (the pid in dir/server.pid, if
// that process still has dir as its working directory, so a reused pid is spared)
// and removes dir. Servers that watch their stdin (FerretDB) also get the pipe's
// read end as stdin and exit by themselves.
type serverProc struct {
	dir string // absolute, without symlinks, as /proc/PID/cwd shows it

	mu      sync.Mutex
	closed  bool
	cmd     *exec.Cmd     // the current server, nil when stopped
	exited  chan struct{} // closed when cmd has exited
	wd      *exec.Cmd
	wdRead  *os.File // read end of the watchdog's pipe
	wdWrite *os.File
	wdDone  chan error
}

// newServerProc makes a temporary directory named prefix* and starts its
// watchdog.
func newServerProc(prefix string) (*serverProc, error) {
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		return nil, fmt.Errorf("testenv: %w", err)
	}
	p := &serverProc{dir: dir}
	if real, err := filepath.EvalSymlinks(dir); err == nil {
		p.dir = real
	}
	if err := p.startWatchdog(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return p, nil
}

// serverWatchdogScript waits for EOF on stdin, then kills the server and removes
// its directory. $0 is the directory.
const serverWatchdogScript = `cat >/dev/null 2>&1
pid=$(cat "$0/server.pid" 2>/dev/null)
if [ -n "$pid" ] && [ "$(readlink "/proc/$pid/cwd" 2>/dev/null)" = "$0" ]; then
	kill -KILL "$pid" 2>/dev/null
fi
rm -rf "$0"`

func (p *serverProc) startWatchdog() error {
	r, w, err := os.Pipe() // close-on-exec: no other child inherits w
	if err != nil {
		return fmt.Errorf("testenv: %w", err)
	}
	cmd := exec.Command("/bin/sh", "-c", serverWatchdogScript, p.dir)
	cmd.Stdin = r
	cmd.Dir = "/"
	// Its own session: Ctrl-C on go test must not kill the watchdog before the
	// test process it watches.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		r.Close()
		w.Close()
		return fmt.Errorf("testenv: start watchdog: %w", err)
	}
	p.wd, p.wdRead, p.wdWrite = cmd, r, w
	p.wdDone = make(chan error, 1)
	go func() { p.wdDone <- cmd.Wait() }()
	return nil
}

// locked runs f with p.mu held, unless p is closed.
func (p *serverProc) locked(f func() error) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return errors.New("testenv: server already closed")
	}
	return f()
}

// start starts cmd as the server (p.mu held by the caller via locked, or p not yet
// shared) with dir as its working directory, stdout and stderr appended to
// dir/server.out, and stdin as its stdin (nil: /dev/null). It polls ready until
// it reports true; it fails if the server exits first or 60s pass.
func (p *serverProc) start(cmd *exec.Cmd, stdin *os.File, ready func() bool) error {
	if p.cmd != nil {
		return errors.New("already running")
	}
	out, err := os.OpenFile(filepath.Join(p.dir, "server.out"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer out.Close()
	cmd.Dir = p.dir
	cmd.Stdin = stdin
	cmd.Stdout, cmd.Stderr = out, out
	// Its own process group: Ctrl-C reaches the test process, whose death the
	// watchdog handles, not the server directly. (cmd may bring a Credential.)
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan struct{})
	var waitErr error
	go func() {
		waitErr = cmd.Wait()
		close(exited)
	}()
	p.cmd, p.exited = cmd, exited
	if err := os.WriteFile(filepath.Join(p.dir, "server.pid"), []byte(strconv.Itoa(cmd.Process.Pid)+"\n"), 0o644); err != nil {
		p.kill()
		return err
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		select {
		case <-exited:
			p.cmd = nil
			return fmt.Errorf("exited before it was ready: %w", waitErr)
		default:
		}
		if ready() {
			return nil
		}
		if time.Now().After(deadline) {
			p.kill()
			return errors.New("not ready after 60s")
		}
		select {
		case <-exited:
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// kill kills the server, if running, and waits for it (p.mu held).
func (p *serverProc) kill() {
	if p.cmd == nil {
		return
	}
	p.cmd.Process.Kill() // SIGKILL works on a paused process too
	<-p.exited
	p.cmd = nil
}

// stop sends SIGTERM (and SIGCONT, in case it is paused), waits up to 10s for the
// server to exit, then kills it.
func (p *serverProc) stop() error {
	return p.locked(func() error {
		if p.cmd == nil {
			return errors.New("testenv: server not running")
		}
		p.cmd.Process.Signal(syscall.SIGTERM)
		p.cmd.Process.Signal(syscall.SIGCONT)
		select {
		case <-p.exited:
			p.cmd = nil
			return nil
		case <-time.After(10 * time.Second):
			p.kill()
			return errors.New("testenv: server did not stop within 10s of SIGTERM; killed")
		}
	})
}

func (p *serverProc) signal(sig syscall.Signal) error {
	return p.locked(func() error {
		if p.cmd == nil {
			return errors.New("testenv: server not running")
		}
		if err := p.cmd.Process.Signal(sig); err != nil {
			return fmt.Errorf("testenv: %w", err)
		}
		return nil
	})
}

// pid returns the server's pid, 0 when it is not running.
func (p *serverProc) pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

func (p *serverProc) close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	p.kill()
	var errs []error
	// The watchdog now finds no server to kill and removes dir.
	p.wdWrite.Close()
	p.wdRead.Close()
	select {
	case <-p.wdDone:
	case <-time.After(30 * time.Second):
		p.wd.Process.Kill()
		errs = append(errs, errors.New("testenv: watchdog did not finish"))
	}
	if err := os.RemoveAll(p.dir); err != nil {
		errs = append(errs, fmt.Errorf("testenv: %w", err))
	}
	return errors.Join(errs...)
}
