package testenv

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/withlock/withlock/internal/stress/faultproxy"
)

// ErrNoEtcd is returned by [StartEtcd] when etcd is not installed. Its
// message says how to install it.
var ErrNoEtcd = errors.New("testenv: etcd or etcdctl not found in PATH; install them with: apt-get install etcd-server etcd-client (or run scripts/test-deps as root)")

// Etcd is a running throwaway single-member etcd on 127.0.0.1. Its keys and
// leases survive Stop and Start, as a real etcd's do. With a heartbeat of
// 10ms and an election timeout of 100ms it elects itself within a fraction
// of a second, and its smallest lease is 1s. Its URL is
// etcd://127.0.0.1:PORT, or etcds://127.0.0.1:PORT?cacert=CertFile.
type Etcd struct {
	*proc
	Endpoint string // 127.0.0.1:PORT, as etcdctl --endpoints takes it
	Root     string // root's password, once a test turned authentication on; Client uses it
	Version  string // the release it runs, as EtcdOptions.Version names it
	// PeerProxy, with EtcdOptions.PeerProxies, stands in front of the
	// member's peer port: every connection a peer makes to this member
	// goes through it (this member's own connections to its peers go
	// through theirs). Close closes it.
	PeerProxy *faultproxy.Proxy

	name, peerURL string // the member's, as its cluster knows it
	httpURL       string // where it serves /health and /metrics, if not on its client port
}

// EtcdCertCN is the Common Name of the certificate a server with TLS
// serves and, with EtcdOptions.ClientCertAuth, takes from its clients
// (Dir/server.crt and Dir/server.key).
const EtcdCertCN = certCN

// EtcdOptions say how [StartEtcd] starts a server.
type EtcdOptions struct {
	TLS bool // the client port speaks only TLS; client certificates not asked for
	// ClientCertAuth, with TLS, makes the client port ask every client
	// for a certificate the test CA signed (--client-cert-auth): the
	// server's own pair is one, whose Common Name is EtcdCertCN.
	ClientCertAuth bool
	// PeerProxies, for StartEtcdCluster, puts a fault proxy in front of
	// each member's peer port (Etcd.PeerProxy): a member's peer URL is its
	// proxy's, so that a test can cut the member off from its peers.
	PeerProxies bool
	// Version is the release to run: "" the system's etcd (Debian's 3.4),
	// or one of EtcdVersions, built from the Go module proxy
	// (internal/testenv/etcd35 and its siblings) into the user's cache.
	Version string
	// Flags are more of etcd's flags, after testenv's own
	// (--enable-grpc-gateway=false, say).
	Flags []string
	// JWTTTL, if not 0, makes the server's auth tokens JWTs (RS256, a key
	// pair of the server's own) that expire after JWTTTL; else they are
	// simple tokens, which live in the server's memory alone. Either only
	// matters once a test turned authentication on.
	JWTTTL time.Duration
}

// EtcdVersions are the releases [EtcdOptions].Version can name, oldest
// first: the newest patch release of each minor version the module proxy
// serves.
var EtcdVersions = []string{"3.5", "3.6", "3.7"}

// ErrNoEtcdVersion is returned by [StartEtcd] when it cannot build the
// etcd release a test asked for.
var ErrNoEtcdVersion = errors.New("testenv: cannot build the test etcd releases (modules internal/testenv/etcd35, etcd36, etcd37): they need the go command in PATH and, the first time, the Go module proxy; run scripts/test-deps to build them ahead")

// etcdBinary is the server of version v ("" the system's).
func etcdBinary(v string) (string, error) {
	if v == "" {
		if bin := findProgram("etcd"); bin != "" && findProgram("etcdctl") != "" {
			return bin, nil
		}
		return "", ErrNoEtcd
	}
	if !slices.Contains(EtcdVersions, v) {
		return "", fmt.Errorf("testenv: no etcd %q; the versions are %q", v, EtcdVersions)
	}
	mod := "etcd" + strings.ReplaceAll(v, ".", "")
	return cachedBuild(mod, "github.com/withlock/withlock/internal/testenv/"+mod, ErrNoEtcdVersion)
}

// StartEtcd starts a new etcd on free ports, ready (it has elected itself).
func StartEtcd(opts ...EtcdOptions) (*Etcd, error) {
	return startEtcdMember(append(opts, EtcdOptions{})[0], "withlock", 0, "", "")
}

// StartEtcdCluster starts a cluster of n new members, each on free ports
// of its own, and returns them once every one knows a leader.
func StartEtcdCluster(n int, opts ...EtcdOptions) ([]*Etcd, error) {
	o := append(opts, EtcdOptions{})[0]
	peers := make([]string, n)
	ports := make([]int, n)
	advertised := make([]string, n)
	proxies := make([]*faultproxy.Proxy, n)
	closeProxies := func() {
		for _, p := range proxies {
			if p != nil {
				p.Close()
			}
		}
	}
	for i := range n {
		var err error
		if ports[i], err = FreePort(); err != nil {
			closeProxies()
			return nil, err
		}
		advertised[i] = fmt.Sprintf("http://127.0.0.1:%d", ports[i])
		if o.PeerProxies {
			if proxies[i], err = faultproxy.Start(fmt.Sprintf("127.0.0.1:%d", ports[i])); err != nil {
				closeProxies()
				return nil, fmt.Errorf("testenv: %w", err)
			}
			advertised[i] = "http://" + proxies[i].Addr()
		}
		peers[i] = fmt.Sprintf("m%d=%s", i, advertised[i])
	}
	members := make([]*Etcd, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n { // at once: a member is ready only once a majority runs
		wg.Add(1)
		go func() {
			defer wg.Done()
			members[i], errs[i] = startEtcdMember(o, fmt.Sprintf("m%d", i), ports[i], advertised[i], strings.Join(peers, ","))
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		for _, m := range members {
			if m != nil {
				m.Close()
			}
		}
		closeProxies()
		return nil, err
	}
	for i, m := range members {
		m.PeerProxy = proxies[i]
	}
	return members, nil
}

// startEtcdMember starts the member name of the cluster initialCluster
// (etcd's --initial-cluster), whose peer port is peerPort and whose peer URL
// is advertised ("": its peer port's); with no cluster, a cluster of this
// one member, on a peer port of its own.
func startEtcdMember(o EtcdOptions, name string, peerPort int, advertised, initialCluster string) (*Etcd, error) {
	bin, err := etcdBinary(o.Version)
	if err != nil {
		return nil, err
	}
	proc, err := newProc(os.TempDir(), "etcd", nil, o.TLS)
	if err != nil {
		return nil, err
	}
	var jwt []string
	if o.JWTTTL != 0 {
		if jwt, err = writeJWTKeys(proc.Dir, o.JWTTTL); err != nil {
			proc.Close()
			return nil, err
		}
	}
	if peerPort == 0 { // the member's data names its peer URL: one for good
		if peerPort, err = FreePort(); err != nil {
			proc.Close()
			return nil, err
		}
	}
	e := &Etcd{proc: proc, Version: o.Version, name: name}
	if i := slices.Index(o.Flags, "--listen-client-http-urls"); i >= 0 && i+1 < len(o.Flags) {
		e.httpURL = o.Flags[i+1]
	}
	proc.command = func() *exec.Cmd {
		client := e.clientURL()
		peer := fmt.Sprintf("http://127.0.0.1:%d", peerPort)
		if advertised == "" {
			advertised = peer
		}
		e.peerURL = advertised
		cluster := initialCluster
		if cluster == "" {
			cluster = name + "=" + peer
		}
		cmd := exec.Command(bin, "--name", name, "--data-dir", "data", "--listen-client-urls", client,
			"--advertise-client-urls", client, "--listen-peer-urls", peer, "--initial-advertise-peer-urls", advertised,
			"--initial-cluster", cluster, "--heartbeat-interval", "10", "--election-timeout", "100",
			"--logger", "zap", "--log-outputs", "stderr", "--cert-file", "server.crt", "--key-file", "server.key")
		if !o.TLS {
			cmd.Args = cmd.Args[:len(cmd.Args)-4]
		}
		cmd.Args = append(cmd.Args, jwt...)
		cmd.Args = append(cmd.Args, o.Flags...)
		if o.TLS && o.ClientCertAuth {
			cmd.Args = append(cmd.Args, "--client-cert-auth", "--trusted-ca-file", "ca.crt")
		}
		for _, kv := range os.Environ() { // it reads ETCD_* variables as flags
			if !strings.HasPrefix(kv, "ETCD") {
				cmd.Env = append(cmd.Env, kv)
			}
		}
		return cmd
	}
	// Ready once /health names a leader; with authentication on, 3.4 says
	// "false" to a request without a user, but only once it runs.
	proc.ready = func() error {
		body, err := e.get("/health")
		if err == nil && !strings.Contains(body, `"health":"true"`) && (e.Root == "" || !strings.Contains(body, `"health"`)) {
			err = errors.New(body)
		}
		return err
	}
	if err := proc.launch(); err != nil {
		return nil, err
	}
	e.Endpoint = e.addr()
	e.URL = "etcd://" + e.Endpoint
	if o.TLS {
		e.URL = "etcds://" + e.Endpoint + "?cacert=" + e.CertFile
	}
	return e, nil
}

// StartEtcdLearner adds a new member to the cluster of members as a
// learner (etcdctl member add --learner), starts it with o, and returns it
// once it serves.
func StartEtcdLearner(members []*Etcd, o EtcdOptions) (*Etcd, error) {
	peerPort, err := FreePort()
	if err != nil {
		return nil, err
	}
	peer := fmt.Sprintf("http://127.0.0.1:%d", peerPort)
	name := fmt.Sprintf("learner%d", peerPort)
	cluster := []string{name + "=" + peer}
	// A cluster takes a new member only once its members have been
	// connected to each other for a while ("unhealthy cluster" before).
	err = members[0].admin("add a learner", func(ctx context.Context, c *clientv3.Client) error {
		for {
			_, err := c.MemberAddAsLearner(ctx, []string{peer})
			if err == nil || !strings.Contains(err.Error(), "unhealthy cluster") {
				return err
			}
			select {
			case <-ctx.Done():
				return err
			case <-time.After(100 * time.Millisecond):
			}
		}
	})
	if err != nil {
		return nil, err
	}
	for _, m := range members {
		cluster = append(cluster, m.name+"="+m.peerURL)
	}
	o.Flags = append(o.Flags, "--initial-cluster-state", "existing")
	l, err := startEtcdMember(o, name, peerPort, peer, strings.Join(cluster, ","))
	if err != nil {
		return nil, err
	}
	l.Root = members[0].Root
	return l, nil
}

// StartEtcdGRPCProxy starts `etcd grpc-proxy start` of release version (""
// the system's) in front of endpoints (HOST:PORT), on a free port, and
// returns it once a read through it is answered. Its Endpoint is the
// proxy's; Stop, Start and the rest apply to the proxy.
func StartEtcdGRPCProxy(version string, endpoints []string) (*Etcd, error) {
	bin, err := etcdBinary(version)
	if err != nil {
		return nil, err
	}
	proc, err := newProc(os.TempDir(), "etcd-grpc-proxy", nil, false)
	if err != nil {
		return nil, err
	}
	e := &Etcd{proc: proc, Version: version}
	proc.command = func() *exec.Cmd {
		// The proxy of etcd 3.5 and later connects to its own advertised
		// address, and exits when nothing answers there.
		return exec.Command(bin, "grpc-proxy", "start", "--endpoints", strings.Join(endpoints, ","), "--listen-addr", e.addr(), "--advertise-client-url", e.addr())
	}
	proc.ready = func() error {
		c, err := clientv3.New(clientv3.Config{Endpoints: []string{e.addr()}, DialTimeout: time.Second, Logger: zap.NewNop()})
		if err != nil {
			return err
		}
		defer c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err = c.Get(ctx, "health")
		if err != nil && strings.Contains(err.Error(), "user name is empty") {
			err = nil // authentication is on: the proxy serves
		}
		return err
	}
	if err := proc.launch(); err != nil {
		return nil, err
	}
	e.Endpoint = e.addr()
	e.URL = "etcd://" + e.Endpoint
	return e, nil
}

// RequireEtcd is [StartEtcd] for t.
func RequireEtcd(t testing.TB, opts ...EtcdOptions) *Etcd {
	e, err := StartEtcd(opts...)
	missing := ErrNoEtcd
	if len(opts) > 0 && opts[0].Version != "" {
		missing = ErrNoEtcdVersion
	}
	return require(t, e, err, missing)
}

// writeJWTKeys writes an RSA key pair into dir and returns the server's
// flags that sign its auth tokens with it, valid for ttl.
func writeJWTKeys(dir string, ttl time.Duration) ([]string, error) {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, fmt.Errorf("testenv: %w", err)
	}
	pub, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return nil, fmt.Errorf("testenv: %w", err)
	}
	files := map[string][]byte{
		"jwt.key": pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}),
		"jwt.pub": pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}),
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			return nil, fmt.Errorf("testenv: %w", err)
		}
	}
	return []string{"--auth-token", fmt.Sprintf("jwt,pub-key=jwt.pub,priv-key=jwt.key,sign-method=RS256,ttl=%s", ttl)}, nil
}

// clientURL is the address of the client port, http or, with TLS, https.
func (e *Etcd) clientURL() string {
	if e.CertFile != "" {
		return "https://" + e.addr()
	}
	return "http://" + e.addr()
}

// get reads path from the client port (its HTTP side).
func (e *Etcd) get(path string) (string, error) {
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: e.tlsConfig()}}
	defer c.CloseIdleConnections()
	base := e.clientURL()
	if e.httpURL != "" {
		base = e.httpURL
	}
	resp, err := c.Get(base + path)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return string(body), err
}

// Client returns a client of the server for a test's own checks, as root
// once Root is set. The caller must Close it.
func (e *Etcd) Client() (*clientv3.Client, error) {
	cfg := clientv3.Config{Endpoints: []string{e.Endpoint}, DialTimeout: 10 * time.Second, Logger: zap.NewNop(), Username: "root", Password: e.Root}
	if e.Root == "" {
		cfg.Username = ""
	}
	if e.CertFile != "" {
		cfg.TLS = e.tlsConfig()
	}
	return clientv3.New(cfg)
}

// EtcdEveryKey, as the prefix of [Etcd.AddUser], grants every key.
const EtcdEveryKey = "\x00"

// AddUser creates user name with password, whose role may read and write
// the keys under prefix and nothing else: "" no key at all, EtcdEveryKey
// every key. Users are made as root once authentication is on.
func (e *Etcd) AddUser(name, password, prefix string) error {
	return e.admin("add etcd user "+name, func(ctx context.Context, c *clientv3.Client) error {
		return addUser(ctx, c, name, password, prefix)
	})
}

func addUser(ctx context.Context, c *clientv3.Client, name, password, prefix string) error {
	_, err := c.UserAdd(ctx, name, password)
	if err == nil && prefix != "" {
		role, end := name+"-role", clientv3.GetPrefixRangeEnd(prefix)
		if prefix == EtcdEveryKey {
			end = EtcdEveryKey // from the smallest key to the end of the key space
		}
		if _, err = c.RoleAdd(ctx, role); err == nil {
			_, err = c.RoleGrantPermission(ctx, role, prefix, end, clientv3.PermissionType(clientv3.PermReadWrite))
		}
		if err == nil {
			_, err = c.UserGrantRole(ctx, name, role)
		}
	}
	return err
}

// admin runs fn with a client of the server's (as root once authentication
// is on), bounded by 30s; an error of fn says it failed at doing.
func (e *Etcd) admin(doing string, fn func(context.Context, *clientv3.Client) error) error {
	c, err := e.Client()
	if err != nil {
		return err
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := fn(ctx, c); err != nil {
		return fmt.Errorf("testenv: %s: %w", doing, err)
	}
	return nil
}

// EnableAuth creates root with rootPassword and turns authentication on,
// as etcdctl user add root and etcdctl auth enable do; Client logs in as
// root from then on. Make the other users first: with JWTs of a short TTL,
// root's token can run out in the middle of a set-up on a busy machine,
// and the official client does not always fetch a new one.
func (e *Etcd) EnableAuth(rootPassword string) error {
	err := e.admin("enable etcd authentication", func(ctx context.Context, c *clientv3.Client) error {
		_, err := c.UserAdd(ctx, "root", rootPassword)
		if err == nil {
			_, err = c.UserGrantRole(ctx, "root", "root")
		}
		if err == nil {
			_, err = c.AuthEnable(ctx)
		}
		return err
	})
	if err != nil {
		return err
	}
	e.Root = rootPassword
	return nil
}

// URLAs is the server's URL with user and password in it.
func (e *Etcd) URLAs(user, password string) string {
	u, err := url.Parse(e.URL)
	if err != nil {
		panic(err) // built by StartEtcd
	}
	u.User = url.UserPassword(user, password)
	return u.String()
}

// tlsConfig is how a test's own checks speak TLS to the server: trusting
// it, and showing the server's own pair to a server that asks for a client
// certificate.
func (e *Etcd) tlsConfig() *tls.Config {
	cfg := &tls.Config{InsecureSkipVerify: true} // a test's own server
	if e.CertFile != "" {
		dir := filepath.Dir(e.CertFile)
		if pair, err := tls.LoadX509KeyPair(filepath.Join(dir, "server.crt"), filepath.Join(dir, "server.key")); err == nil {
			cfg.Certificates = []tls.Certificate{pair}
		}
	}
	return cfg
}

// Close stops the server for good, removes its files, and closes its
// PeerProxy.
func (e *Etcd) Close() error {
	err := e.proc.Close()
	if e.PeerProxy != nil {
		e.PeerProxy.Close()
	}
	return err
}

// Watchers is how many watches the server has open (its metric
// etcd_debugging_mvcc_watcher_total): a waiter of withlock, etcdctl lock or
// concurrency.Mutex watches the key it waits for, so tests wait for a
// waiter by waiting for its watch.
func (e *Etcd) Watchers() (int, error) {
	return e.metric("etcd_debugging_mvcc_watcher_total")
}

// Reads is how many reads the server has served (its metric
// etcd_mvcc_range_total): the reads of keys, including those in
// transactions and their comparisons.
func (e *Etcd) Reads() (int, error) {
	return e.metric("etcd_mvcc_range_total")
}

// metric is the value of the server's metric name, from its /metrics.
func (e *Etcd) metric(name string) (int, error) {
	metrics, err := e.get("/metrics")
	_, v, ok := strings.Cut(metrics, "\n"+name+" ")
	v, _, _ = strings.Cut(v, "\n")
	if n, perr := strconv.ParseFloat(v, 64); err == nil && ok && perr == nil {
		return int(n), nil
	}
	return 0, fmt.Errorf("testenv: no %s in the server's /metrics (%v)", name, err)
}

// ServerVersion is the release the server says it runs (its /version):
// "3.4.23", say.
func (e *Etcd) ServerVersion() (string, error) {
	body, err := e.get("/version")
	if err != nil {
		return "", err
	}
	var v struct {
		Server string `json:"etcdserver"`
	}
	if err := json.Unmarshal([]byte(body), &v); err != nil || v.Server == "" {
		return "", fmt.Errorf("testenv: no version in the server's /version: %q", body)
	}
	return v.Server, nil
}
