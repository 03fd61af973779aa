package stress

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/withlock/withlock/internal/testenv"
)

// Backend is one backend the stress test runs against. Adding a backend
// (etcd, MySQL, Kubernetes) is adding one entry to Backends.
type Backend struct {
	Name string
	// Start starts a server for t, stopped when t ends, and returns the URL
	// of a fresh lock space on it, as a user would write it.
	Start func(t testing.TB) string
	// StartServer, if set instead of Start, does the same and returns the
	// server too, for the faults that restart and freeze it.
	StartServer func(t testing.TB) (string, Server)
	// Shared means the backend has shared locks (--shared): MySQL's
	// GET_LOCK has none.
	Shared bool
	// Network means withlock reaches the server at the URL's host:port over
	// TCP: the harness puts the fault proxy there and injects faults.
	Network bool
	// Tokens means the backend gives WITHLOCK_TOKEN: every section must get
	// one, and they must grow strictly in the order the sections entered.
	Tokens bool
	// Via is Start for a backend whose URL does not say where its server
	// is (k8s:// names a namespace; a kubeconfig says where the API server
	// is): it returns the URL, the server's host:port, and reach, which
	// gives the environment withlock needs to reach the server at addr (the
	// fault proxy's, or the server's own).
	Via func(t testing.TB) (url, hostport string, reach func(addr string) []string)
}

// start starts b's server for t and returns the URL withlock is given and
// what its environment needs besides. With proxy (a Network backend under
// faults), withlock reaches the server through the proxy that proxy
// starts in front of target and returns the address of.
func (b Backend) start(t testing.TB, proxy func(target string) string) (string, []string, Server) {
	if b.Via != nil {
		u, hostport, reach := b.Via(t)
		if proxy != nil {
			hostport = proxy(hostport)
		}
		return u, reach(hostport), nil
	}
	dbURL, srv := b.Start, Server(nil)
	var u0 string
	if b.StartServer != nil {
		u0, srv = b.StartServer(t)
	} else {
		u0 = dbURL(t)
	}
	if proxy == nil {
		return u0, nil, srv
	}
	u, err := url.Parse(u0)
	if err != nil {
		t.Fatalf("stress: %s URL: %v", b.Name, err)
	}
	u.Host = proxy(u.Host)
	return u.String(), nil, srv
}

// Backends are the backends the stress test covers.
var Backends = []Backend{
	{Name: "postgres", Network: true, Shared: true, StartServer: func(t testing.TB) (string, Server) {
		p := testenv.RequirePostgres(t)
		db, err := p.CreateDatabase("stress")
		if err != nil {
			t.Fatal(err)
		}
		// Without sslmode, as users write it (libpq's prefer): pgx then
		// asks for TLS first and, refused, connects again in plain text.
		// A cut of that second connection once made withlock exit 69.
		u, err := url.Parse(db)
		if err != nil {
			t.Fatal(err)
		}
		q := u.Query()
		q.Del("sslmode")
		u.RawQuery = q.Encode()
		return u.String(), p
	}},
	{Name: "redis", Network: true, Tokens: true, Shared: true, StartServer: func(t testing.TB) (string, Server) {
		r := testenv.RequireRedis(t)
		return r.URL, r
	}},
	{Name: "mongodb", Network: true, Tokens: true, Shared: true, StartServer: func(t testing.TB) (string, Server) {
		m := testenv.RequireMongo(t)
		return m.URL, m
	}},
	{Name: "etcd", Network: true, Tokens: true, Shared: true, StartServer: func(t testing.TB) (string, Server) {
		e := testenv.RequireEtcd(t)
		return e.URL, e
	}},
	// A server of its own: GET_LOCK's names are the whole server's.
	{Name: "mysql", Network: true, StartServer: func(t testing.TB) (string, Server) {
		m := testenv.RequireMariaDB(t)
		return m.URL, m
	}},
	// A single-node Galera cluster, which withlock takes as a plain server
	// (a multi-node one is refused); a restart bootstraps it again.
	{Name: "galera", Network: true, StartServer: func(t testing.TB) (string, Server) {
		m := testenv.RequireGaleraNode(t, nil)
		return m.URL, m
	}},
	// A namespace of its own on a kube-apiserver of its own; withlock
	// reaches it as a user allowed leases there only (the Role of docs/kubernetes.md).
	{Name: "k8s", Network: true, Tokens: true, Via: func(t testing.TB) (string, string, func(string) []string) {
		k := testenv.RequireKube(t)
		const ns = "stress"
		if err := errors.Join(k.Namespace(ns), k.Grant(ns, "leaser")); err != nil {
			t.Fatal(err)
		}
		dir := t.TempDir()
		return "k8s://" + ns, strings.TrimPrefix(k.URL, "https://"), func(addr string) []string {
			kc := filepath.Join(dir, "kubeconfig")
			// The server's certificate is for 127.0.0.1, as the proxy's address is.
			if err := k.Kubeconfig(kc, ns, k.UserToken("leaser")); err != nil {
				t.Fatal(err)
			}
			data, err := os.ReadFile(kc)
			if err == nil {
				err = os.WriteFile(kc, []byte(strings.Replace(string(data), k.URL, "https://"+addr, 1)), 0o600)
			}
			if err != nil {
				t.Fatal(err)
			}
			return []string{"KUBECONFIG=" + kc, "KUBERNETES_SERVICE_HOST="}
		}
	}},
	// A bucket of its own on a versitygw of its own. withlock finds the
	// store (the fault proxy's address) through AWS_ENDPOINT_URL_S3, as
	// the AWS SDKs do, so the URL says only the bucket and the keys.
	{Name: "s3", Network: true, Tokens: true, Via: func(t testing.TB) (string, string, func(string) []string) {
		s := testenv.RequireS3(t)
		bucket := s.Bucket(t)
		u := fmt.Sprintf("s3://%s@%s?region=%s&path_style=true", url.UserPassword(s.AccessKey, s.SecretKey), bucket, s.Region)
		return u, strings.TrimPrefix(s.Endpoint, "http://"), func(addr string) []string {
			return []string{"AWS_ENDPOINT_URL_S3=http://" + addr}
		}
	}},
	// Local: no network to break, so no faults; it checks the harness and
	// the file backend under the same contention.
	{Name: "file", Shared: true, Start: func(t testing.TB) string {
		return "file://" + t.TempDir()
	}},
}
