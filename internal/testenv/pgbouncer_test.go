package testenv

import (
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
)

// TestPgBouncer: pgbouncer answers connections itself (its own cancel key,
// so its own "pid") and, in transaction mode, hands one server session to
// client after client.
func TestPgBouncer(t *testing.T) {
	p := RequirePostgres(t)
	b := RequirePgBouncer(t, p.URL, "transaction", 1)
	if strings.Contains(b.URL, "sslmode") || !strings.Contains(b.URL, "/postgres") {
		t.Errorf("URL %q: want the server's database and no sslmode", b.URL)
	}
	var pids []string
	for range 2 {
		c, err := pgx.Connect(ctx(t), b.URL)
		if err != nil {
			t.Fatal(err)
		}
		// The simple protocol: pgx's prepared statements do not survive
		// transaction pooling.
		res, err := c.PgConn().Exec(ctx(t), "select pg_backend_pid()").ReadAll()
		if err != nil {
			t.Fatal(err)
		}
		pid := string(res[0].Rows[0][0])
		if pid == strconv.FormatUint(uint64(c.PgConn().PID()), 10) {
			t.Errorf("server pid %s is the pid pgbouncer gave the connection", pid)
		}
		pids = append(pids, pid)
		c.Close(ctx(t))
	}
	if pids[0] != pids[1] {
		t.Errorf("two clients one after the other, pool size 1: server pids %v, want the same", pids)
	}
}
