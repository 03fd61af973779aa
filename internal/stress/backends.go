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
	// Network means withlock reaches the server at the URL's host:port over
	// TCP: the harness puts the fault proxy there and injects faults.
	Network bool
	// Tokens means the backend gives WITHLOCK_TOKEN: every section must get
	// one, and they must grow strictly in the order the sections entered.
	Tokens bool
}

// Backends are the backends the stress test covers.
var Backends = []Backend{
	{Name: "postgres", Network: true, Start: func(t testing.TB) string {
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
		return u.String()
	}},
	{Name: "redis", Network: true, Tokens: true, Start: func(t testing.TB) string {
		return testenv.RequireRedis(t).URL
	}},
	{Name: "mongodb", Network: true, Tokens: true, Start: func(t testing.TB) string {
		return testenv.RequireMongo(t).URL
	}},
	{Name: "etcd", Network: true, Tokens: true, Start: func(t testing.TB) string {
		return testenv.RequireEtcd(t).URL
	}},
	// A server of its own: GET_LOCK's names are the whole server's.
	{Name: "mysql", Network: true, Start: func(t testing.TB) string {
		return testenv.RequireMariaDB(t).URL
	}},
	// Local: no network to break, so no faults; it checks the harness and
	// the file backend under the same contention.
	{Name: "file", Start: func(t testing.TB) string {
		return "file://" + t.TempDir()
	}},
}
