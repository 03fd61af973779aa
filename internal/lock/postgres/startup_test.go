package postgres_test

import (
	"bufio"
	"encoding/binary"
	"errors"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/withlock/withlock/internal/lock"
	"github.com/withlock/withlock/internal/lock/locktest"
	"github.com/withlock/withlock/internal/stress/faultproxy"
	"github.com/withlock/withlock/internal/testenv"
)

// cutAt starts a fault proxy in front of a PostgreSQL server that cuts
// (closes both ways) its first times connections at one step of the
// start-up, the moment the client begins that step, and passes everything
// else through. It reads the client's side of the protocol to know the
// step (see splitSteps); after TLS starts it sees only the handshake's
// first bytes. It returns the proxy's host:port.
func cutAt(t *testing.T, target, step string, times int64) string {
	p, err := faultproxy.Start(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	p.SetSplit(splitSteps)
	p.SetRule(func(m faultproxy.Message) faultproxy.Action {
		if m.Conn <= times && m.Kind == step {
			return faultproxy.Action{Cut: faultproxy.CloseBefore}
		}
		return faultproxy.Action{}
	})
	return p.Addr()
}

// splitSteps returns a Split of one connection's start-up: it names each
// message by its step (see next), and once TLS has begun, passes on the
// bytes as they come ("tls").
func splitSteps() faultproxy.Split {
	started, opaque := false, false
	return func(r *bufio.Reader) (string, []byte, error) {
		if opaque {
			b := make([]byte, 32<<10)
			n, err := r.Read(b)
			return "tls", b[:n], err
		}
		step, msg, err := next(r, started)
		if step == "tls-handshake" {
			opaque = true
			b := make([]byte, r.Buffered())
			n, err := r.Read(b)
			return step, b[:n], err
		}
		started = started || step == "startup"
		return step, msg, err
	}
}

// next reads the client's next message and names its step: tls-request
// (SSLRequest), tls-handshake (the first TLS bytes; msg is empty), startup
// (StartupMessage), auth (a password or SASL message), query, other.
func next(r *bufio.Reader, started bool) (step string, msg []byte, err error) {
	if !started {
		b, err := r.Peek(1)
		if err != nil {
			return "", nil, err
		}
		if b[0] == 0x16 { // a TLS record: the ClientHello
			return "tls-handshake", nil, nil
		}
		msg, err = readN(r, 0)
		if err != nil {
			return "", nil, err
		}
		if len(msg) == 8 && binary.BigEndian.Uint32(msg[4:]) == 80877103 {
			return "tls-request", msg, nil
		}
		return "startup", msg, nil
	}
	kind, err := r.ReadByte()
	if err != nil {
		return "", nil, err
	}
	msg, err = readN(r, kind)
	switch kind {
	case 'p':
		return "auth", msg, err
	case 'P', 'Q':
		return "query", msg, err
	}
	return "other", msg, err
}

// readN reads a length-prefixed message body, with its type byte (if not 0)
// and length in front.
func readN(r *bufio.Reader, kind byte) ([]byte, error) {
	var head [4]byte
	if _, err := io.ReadFull(r, head[:]); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(head[:])
	if n < 4 || n > 1<<20 {
		return nil, errors.New("bad message length")
	}
	msg := make([]byte, 0, n+1)
	if kind != 0 {
		msg = append(msg, kind)
	}
	msg = append(msg, head[:]...)
	body := make([]byte, n-4)
	if _, err := io.ReadFull(r, body); err != nil {
		return nil, err
	}
	return append(msg, body...), nil
}

// via returns dbURL with its host:port replaced by addr and its query by
// query.
func via(dbURL, addr, query string) string {
	u, _ := url.Parse(dbURL)
	u.Host, u.RawQuery = addr, query
	return u.String()
}

// TestStartupCut: a connection cut at any step of the start-up, with or
// without TLS, is an outage that lock.Acquire retries (ErrUnavailable),
// never a refusal. pgx alone, with sslmode=prefer against a server without
// TLS, reported such a cut of its second connection as a TLS refusal.
func TestStartupCut(t *testing.T) {
	plain := testenv.RequirePostgres(t)
	withTLS := testenv.RequirePostgres(t)
	if _, err := withTLS.EnableTLS(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		server *testenv.Postgres
		query  string
		steps  []string
	}{
		{plain, "", []string{"tls-request", "startup", "auth", "query"}},
		{plain, "sslmode=disable", []string{"startup", "auth", "query"}},
		{withTLS, "", []string{"tls-request", "tls-handshake"}},
		{withTLS, "sslmode=require", []string{"tls-request", "tls-handshake"}},
	} {
		tlsName := "plain server"
		if tc.server == withTLS {
			tlsName = "TLS server"
		}
		for _, step := range tc.steps {
			t.Run(tlsName+"/"+tc.query+"/"+step, func(t *testing.T) {
				target := "127.0.0.1:" + strconv.Itoa(tc.server.Port)
				addr := cutAt(t, target, step, 1<<30)
				_, err := locktest.Open(t, via(tc.server.URL, addr, tc.query), lock.Options{}).TryAcquire(locktest.Context(t), "job")
				if !errors.Is(err, lock.ErrUnavailable) || errors.Is(err, lock.ErrRefused) {
					t.Fatalf("TryAcquire through a connection cut at %s: %v; want an error matching lock.ErrUnavailable only", step, err)
				}
				want := "cannot reach postgres at " + addr + " (connection closed)"
				if err.Error() != want {
					t.Errorf("TryAcquire: %q; want %q", err, want)
				}
				// Cut twice, then passed through: the wait goes on and takes it.
				addr = cutAt(t, target, step, 2)
				opts := lock.Options{ConnectTimeout: 30 * time.Second}
				h, err := locktest.Open(t, via(tc.server.URL, addr, tc.query), opts).Acquire(locktest.Context(t), "job")
				if err != nil {
					t.Fatalf("Acquire through two connections cut at %s, then a good one: %v", step, err)
				}
				h.Release(locktest.Context(t))
			})
		}
	}
}

// connections counts the connections a server has accepted, from its log
// (log_connections = on): every one costs the server a process.
func connections(t *testing.T, p *testenv.Postgres) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(p.Dir, "server.out"))
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(b), "connection received:")
}

// TestTLSNegotiation: TLS is negotiated as libpq does, on one connection
// however it goes: with no sslmode (prefer) or allow, TLS where the server
// has it, else plaintext on the same connection; require and verify-full
// never fall back.
func TestTLSNegotiation(t *testing.T) {
	plain := testenv.RequirePostgres(t)
	withTLS := testenv.RequirePostgres(t)
	root, err := withTLS.EnableTLS("log_connections = on")
	if err != nil {
		t.Fatal(err)
	}
	if err := plain.Configure("log_connections = on"); err != nil {
		t.Fatal(err)
	}
	// The counter counts: pgx on its own opens two connections here.
	before := connections(t, plain)
	conn, err := pgx.Connect(locktest.Context(t), via(plain.URL, "127.0.0.1:"+strconv.Itoa(plain.Port), ""))
	if err != nil {
		t.Fatal(err)
	}
	conn.Close(locktest.Context(t))
	if n := connections(t, plain) - before; n != 2 {
		t.Fatalf("pgx.Connect with sslmode=prefer, server without TLS: %d connections; the test expects pgx's 2", n)
	}

	for _, tc := range []struct {
		desc    string
		server  *testenv.Postgres
		query   string
		wantTLS bool
	}{
		{"no sslmode, server without TLS", plain, "", false},
		{"prefer, server without TLS", plain, "sslmode=prefer", false},
		{"allow, server without TLS", plain, "sslmode=allow", false},
		{"disable, server without TLS", plain, "sslmode=disable", false},
		{"no sslmode, TLS server", withTLS, "", true},
		{"allow, TLS server", withTLS, "sslmode=allow", true},
		{"require, TLS server", withTLS, "sslmode=require", true},
		{"verify-full, TLS server", withTLS, "sslmode=verify-full&sslrootcert=" + url.QueryEscape(root), true},
		{"disable, TLS server", withTLS, "sslmode=disable", false},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			// The session of the subtest before ends on the server some time
			// after its client closed it.
			testenv.WaitFor(t, "no withlock session left", func() bool {
				return query(t, tc.server.URL, `select count(*) from pg_stat_activity where application_name like 'withlock %'`) == "0"
			})
			before := connections(t, tc.server)
			l, err := locktest.Open(t, via(tc.server.URL, "127.0.0.1:"+strconv.Itoa(tc.server.Port), tc.query), lock.Options{}).TryAcquire(locktest.Context(t), "job")
			if err != nil {
				t.Fatalf("TryAcquire: %v", err)
			}
			if n := connections(t, tc.server) - before; n != 1 {
				t.Errorf("%d connections; want 1", n)
			}
			got := query(t, tc.server.URL, `select ssl from pg_stat_ssl join pg_stat_activity using (pid)
				where application_name like 'withlock %'`)
			if want := map[bool]string{true: "t", false: "f"}[tc.wantTLS]; got != want {
				t.Errorf("pg_stat_ssl.ssl of the withlock session: %q, want %q", got, want)
			}
			l.Release(locktest.Context(t))
		})
	}

	// Refusals: no plaintext retry, no second connection.
	refused := func(t *testing.T, server *testenv.Postgres, query, says string) {
		before := connections(t, server)
		_, err := locktest.Open(t, via(server.URL, "127.0.0.1:"+strconv.Itoa(server.Port), query), lock.Options{}).TryAcquire(locktest.Context(t), "job")
		if !errors.Is(err, lock.ErrRefused) {
			t.Fatalf("TryAcquire: %v; want an error matching lock.ErrRefused", err)
		}
		if !strings.Contains(err.Error(), says) {
			t.Errorf("TryAcquire: %q; want it to say %q", err, says)
		}
		if n := connections(t, server) - before; n != 1 {
			t.Errorf("%d connections; want 1", n)
		}
	}
	t.Run("require, server without TLS", func(t *testing.T) {
		refused(t, plain, "sslmode=require", "refused: the server does not offer TLS, which the URL's sslmode requires")
	})
	t.Run("verify-full, certificate of another CA", func(t *testing.T) {
		// plain's certificate, now that it is done as a server without TLS.
		other, err := plain.EnableTLS()
		if err != nil {
			t.Fatal(err)
		}
		refused(t, withTLS, "sslmode=verify-full&sslrootcert="+url.QueryEscape(other), "refused: TLS handshake: tls: failed to verify certificate")
	})
}
