package testenv

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// ErrNoEtcd is returned by [StartEtcd] when etcd is not installed. Its message
// says how to install it.
var ErrNoEtcd = errors.New("testenv: etcd not found in PATH; install it with: apt-get install etcd-server etcd-client (or run scripts/test-deps as root)")

// Etcd is a running throwaway single-member etcd on 127.0.0.1 in a temporary
// directory, with its data in Dir/data: unlike [Redis], its data (keys and
// leases) survives Stop and Start, as a real etcd's does.
//
// It runs with a heartbeat of 10ms and an election timeout of 100ms, so that it
// elects itself within a fraction of a second; the server's smallest lease is
// then 1s (1.5 election timeouts, rounded up to the second) instead of the 2s
// of the default settings.
//
// Like [Postgres], it has a watchdog that kills the server and removes Dir when the
// test process exits, however it dies.
type Etcd struct {
	Dir      string // data/ holds the member's data, server.out its log
	Port     int    // client port on 127.0.0.1, the same across Stop and Start
	PeerPort int    // peer port on 127.0.0.1
	// Endpoint is 127.0.0.1:PORT, as etcdctl --endpoints takes it.
	Endpoint string
	// URL is etcd://127.0.0.1:PORT, or etcds://127.0.0.1:PORT?cacert=CertFile
	// with TLS.
	URL string
	// CertFile is the server's self-signed certificate (PEM) with TLS, which
	// is also the CA that signed it, for clients to trust or, by default, to
	// refuse.
	CertFile string

	bin  string
	opts EtcdOptions
	proc *serverProc
	// root is the root user's password once auth is enabled ([Etcd.EnableAuth]).
	root string
}

// EtcdOptions say how [StartEtcdWith] starts a server. The zero value is
// [StartEtcd]'s server.
type EtcdOptions struct {
	// TLS makes the client port speak only TLS, with a self-signed certificate
	// for 127.0.0.1 in CertFile; client certificates are not asked for.
	TLS bool
}

// StartEtcd starts a new etcd on free ports and returns it running, ready
// (it has elected itself leader). The caller must Close it. If etcd is not in
// PATH, the error is [ErrNoEtcd].
func StartEtcd() (*Etcd, error) { return StartEtcdWith(EtcdOptions{}) }

// StartEtcdWith is [StartEtcd] with the options o.
func StartEtcdWith(o EtcdOptions) (*Etcd, error) {
	bin, err := exec.LookPath("etcd")
	if err != nil {
		return nil, ErrNoEtcd
	}
	proc, err := newServerProc("withlock-etcd-")
	if err != nil {
		return nil, err
	}
	e := &Etcd{Dir: proc.dir, bin: bin, opts: o, proc: proc}
	if o.TLS {
		e.CertFile = filepath.Join(e.Dir, "cert.pem")
		if err := writeSelfSigned(e.CertFile, filepath.Join(e.Dir, "key.pem")); err != nil {
			e.Close()
			return nil, err
		}
	}
	// Another process may take a port between our probe and the server's
	// bind; that is rare, and then we try others.
	for attempt := 0; ; attempt++ {
		if e.Port, err = freePort(); err == nil {
			e.PeerPort, err = freePort()
		}
		if err != nil {
			break
		}
		if err = e.start(); err == nil || attempt >= 4 || !errors.Is(err, errPortInUse) {
			break
		}
		// The member's data names the peer URL it was made with: begin anew.
		os.RemoveAll(filepath.Join(e.Dir, "data"))
	}
	if err != nil {
		e.Close()
		return nil, err
	}
	e.Endpoint = net.JoinHostPort("127.0.0.1", strconv.Itoa(e.Port))
	e.URL = "etcd://" + e.Endpoint
	if o.TLS {
		e.URL = "etcds://" + e.Endpoint + "?cacert=" + e.CertFile
	}
	return e, nil
}

func (e *Etcd) clientScheme() string {
	if e.opts.TLS {
		return "https"
	}
	return "http"
}

// start starts the server on e.Port and e.PeerPort and waits until it answers
// /health with a leader.
func (e *Etcd) start() error {
	client := fmt.Sprintf("%s://127.0.0.1:%d", e.clientScheme(), e.Port)
	peer := fmt.Sprintf("http://127.0.0.1:%d", e.PeerPort)
	args := []string{
		"--name", "withlock",
		"--data-dir", filepath.Join(e.Dir, "data"),
		"--listen-client-urls", client,
		"--advertise-client-urls", client,
		"--listen-peer-urls", peer,
		"--initial-advertise-peer-urls", peer,
		"--initial-cluster", "withlock=" + peer,
		"--initial-cluster-state", "new",
		"--heartbeat-interval", "10",
		"--election-timeout", "100",
		"--logger", "zap",
		"--log-outputs", "stderr",
	}
	if e.opts.TLS {
		args = append(args, "--cert-file", e.CertFile, "--key-file", filepath.Join(e.Dir, "key.pem"))
	}
	logName := filepath.Join(e.Dir, "server.out")
	var logOffset int64
	if fi, err := os.Stat(logName); err == nil {
		logOffset = fi.Size()
	}
	cmd := exec.Command(e.bin, args...)
	// etcd reads ETCD_* variables as flags; none of the test process's may
	// leak in.
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "ETCD") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	err := e.proc.start(cmd, nil, func() bool { return e.healthy(client) })
	if err != nil {
		tail := logTail(logName, logOffset, 20)
		err = fmt.Errorf("testenv: etcd (ports %d, %d): %w\nserver log %s:\n%s", e.Port, e.PeerPort, err, logName, tail)
		if strings.Contains(tail, "address already in use") {
			return errors.Join(errPortInUse, err)
		}
		return err
	}
	return nil
}

// healthy reports whether the server answers /health with a leader.
func (e *Etcd) healthy(clientURL string) bool {
	c := &http.Client{
		Timeout:   250 * time.Millisecond,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}},
	}
	defer c.CloseIdleConnections()
	resp, err := c.Get(clientURL + "/health")
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	// With auth enabled, 3.4 answers {"health":"false"} to /health without a
	// user, but only once it runs: any answer with a leader will do.
	return resp.StatusCode == http.StatusOK && strings.Contains(string(body), `"health":"true"`) ||
		e.root != "" && strings.Contains(string(body), `"health"`)
}

// Stop shuts the server down (SIGTERM; SIGKILL after 10s) and keeps Dir, its data
// and Port, so Start can bring it back.
func (e *Etcd) Stop() error { return e.proc.stop() }

// Start starts the server again after Stop, on the same ports with the same
// data. It fails if something else took a port meanwhile.
func (e *Etcd) Start() error {
	return e.proc.locked(func() error { return e.start() })
}

// Pause stops the server with SIGSTOP: connections stay open and requests go
// unanswered, as with a hung server or a network partition, until Resume.
func (e *Etcd) Pause() error { return e.proc.signal(syscall.SIGSTOP) }

// Resume continues a server stopped by Pause.
func (e *Etcd) Resume() error { return e.proc.signal(syscall.SIGCONT) }

// Close kills the server and removes Dir. It is safe to call twice, after Stop
// and while paused.
func (e *Etcd) Close() error { return e.proc.close() }

// Client returns a client of the server for a test's own checks, as root once
// auth is enabled. The caller must Close it.
func (e *Etcd) Client() (*clientv3.Client, error) {
	cfg := clientv3.Config{
		Endpoints:   []string{e.Endpoint},
		DialTimeout: 10 * time.Second,
		Logger:      zap.NewNop(),
	}
	if e.opts.TLS {
		pem, err := os.ReadFile(e.CertFile)
		if err != nil {
			return nil, fmt.Errorf("testenv: %w", err)
		}
		roots := x509.NewCertPool()
		roots.AppendCertsFromPEM(pem)
		cfg.TLS = &tls.Config{RootCAs: roots}
	}
	if e.root != "" {
		cfg.Username, cfg.Password = "root", e.root
	}
	c, err := clientv3.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("testenv: etcd client: %w", err)
	}
	return c, nil
}

// EnableAuth creates the root user with password rootPassword and turns
// authentication on, as `etcdctl user add root` and `etcdctl auth enable` do.
// Afterwards every request needs a user; [Etcd.Client] logs in as root.
func (e *Etcd) EnableAuth(rootPassword string) error {
	c, err := e.Client()
	if err != nil {
		return err
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := c.UserAdd(ctx, "root", rootPassword); err != nil {
		return fmt.Errorf("testenv: add user root: %w", err)
	}
	if _, err := c.UserGrantRole(ctx, "root", "root"); err != nil {
		return fmt.Errorf("testenv: grant root: %w", err)
	}
	if _, err := c.AuthEnable(ctx); err != nil {
		return fmt.Errorf("testenv: auth enable: %w", err)
	}
	e.root = rootPassword
	return nil
}

// AddUser creates user name with password, allowed to read and write the keys
// under prefix and nothing else (an empty prefix: no key at all). Auth must be
// enabled.
func (e *Etcd) AddUser(name, password, prefix string) error {
	c, err := e.Client()
	if err != nil {
		return err
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := c.UserAdd(ctx, name, password); err != nil {
		return fmt.Errorf("testenv: add user %s: %w", name, err)
	}
	if prefix == "" {
		return nil
	}
	role := name + "-role"
	if _, err := c.RoleAdd(ctx, role); err != nil {
		return fmt.Errorf("testenv: add role %s: %w", role, err)
	}
	if _, err := c.RoleGrantPermission(ctx, role, prefix, clientv3.GetPrefixRangeEnd(prefix), clientv3.PermissionType(clientv3.PermReadWrite)); err != nil {
		return fmt.Errorf("testenv: grant %s: %w", role, err)
	}
	if _, err := c.UserGrantRole(ctx, name, role); err != nil {
		return fmt.Errorf("testenv: grant %s to %s: %w", role, name, err)
	}
	return nil
}

// Watchers is how many watches the server has open right now (its metric
// etcd_debugging_mvcc_watcher_total): a waiter of withlock, etcdctl lock or
// concurrency.Mutex watches the key it waits for, so tests wait for a waiter
// to be queued by waiting for its watch.
func (e *Etcd) Watchers() (int, error) {
	c := &http.Client{
		Timeout:   10 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}},
	}
	defer c.CloseIdleConnections()
	resp, err := c.Get(fmt.Sprintf("%s://127.0.0.1:%d/metrics", e.clientScheme(), e.Port))
	if err != nil {
		return 0, fmt.Errorf("testenv: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, fmt.Errorf("testenv: %w", err)
	}
	const metric = "etcd_debugging_mvcc_watcher_total "
	for _, line := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, metric); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				return 0, fmt.Errorf("testenv: %s: %w", line, err)
			}
			return int(f), nil
		}
	}
	return 0, fmt.Errorf("testenv: no %s in the server's /metrics", strings.TrimSpace(metric))
}

// ErrNoEtcdctl is returned by [RequireEtcdctl] when etcdctl is not installed.
// Its message says how to install it.
var ErrNoEtcdctl = errors.New("testenv: etcdctl not found in PATH; install it with: apt-get install etcd-client (or run scripts/test-deps as root)")

// RequireEtcdctl checks that etcdctl, which the interop scripts run, is in
// PATH. If it is not, t fails under CI (CI=true) and is skipped elsewhere,
// with the install hint either way.
func RequireEtcdctl(t testing.TB) {
	t.Helper()
	if _, err := exec.LookPath("etcdctl"); err != nil {
		missing(t, ErrNoEtcdctl, ErrNoEtcdctl)
	}
}

// RequireEtcd starts a server with [StartEtcd] and closes it when t's test ends.
// If etcd is not installed, t fails under CI (CI=true) and is skipped elsewhere,
// with the install hint either way; any other error fails t.
func RequireEtcd(t testing.TB) *Etcd {
	t.Helper()
	return RequireEtcdWith(t, EtcdOptions{})
}

// RequireEtcdWith is [RequireEtcd] with [StartEtcdWith].
func RequireEtcdWith(t testing.TB, o EtcdOptions) *Etcd {
	t.Helper()
	e, err := StartEtcdWith(o)
	if err != nil {
		missing(t, err, ErrNoEtcd)
	}
	t.Cleanup(func() {
		if err := e.Close(); err != nil {
			t.Errorf("testenv: close etcd: %v", err)
		}
	})
	return e
}
