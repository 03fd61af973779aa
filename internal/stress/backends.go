package stress

import (
	"net/url"
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
		// A cut of that second connection is where issue 15 found its 69s.
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
	// Local: no network to break, so no faults; it checks the harness and
	// the file backend under the same contention.
	{Name: "file", Shared: true, Start: func(t testing.TB) string {
		return "file://" + t.TempDir()
	}},
}

// start starts b's server for t: its URL, and the server if the backend
// gives it (StartServer).
func (b Backend) start(t testing.TB) (string, Server) {
	if b.StartServer != nil {
		return b.StartServer(t)
	}
	return b.Start(t), nil
}
