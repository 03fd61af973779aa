package testenv

import (
	"errors"
	"net"
	"os"
	"strconv"
	"testing"

	"github.com/go-sql-driver/mysql"
)

func mysqlOK(t *testing.T, url, query string) []string {
	t.Helper()
	rows, err := MySQLExec(ctx(t), url, query)
	if err != nil {
		t.Fatalf("MySQLExec %q: %v", query, err)
	}
	return rows
}

func TestMariaDB(t *testing.T) {
	m := RequireMariaDB(t)
	if got := mysqlOK(t, m.URL, "select current_user(), @@performance_schema, 1 + 1; select null"); len(got) != 2 || got[0] != MariaDBUser+"@% 1 2" || got[1] != "NULL" {
		t.Errorf("rows = %q", got)
	}
	// The unprivileged account may not end others' sessions.
	id := mysqlOK(t, m.URL, "select connection_id()")[0]
	_, err := MySQLExec(ctx(t), m.UnprivilegedURL(), "kill "+id)
	var myErr *mysql.MySQLError
	if !errors.As(err, &myErr) || myErr.Number != 1094 && myErr.Number != 1095 {
		t.Errorf("KILL by %s: %v; want error 1095 (not owner) or 1094 (unknown thread)", MariaDBUnprivileged, err)
	}
	// A wrong password is refused (1045).
	bad := m.urlFor(MariaDBUser, "wrong")
	if _, err := MySQLExec(ctx(t), bad, "select 1"); !errors.As(err, &myErr) || myErr.Number != 1045 {
		t.Errorf("wrong password: %v; want error 1045", err)
	}

	// Stop keeps the data and the port; Start brings them back.
	mysqlOK(t, m.URL, "create table withlock.t (x int); insert into withlock.t values (7)")
	if err := m.Stop(); err != nil {
		t.Fatal(err)
	}
	if c, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(m.Port))); err == nil {
		c.Close()
		t.Fatal("the port accepts connections after Stop")
	}
	if err := m.Start(); err != nil {
		t.Fatal(err)
	}
	if got := mysqlOK(t, m.URL, "select x from withlock.t"); len(got) != 1 || got[0] != "7" {
		t.Errorf("after Start: %q", got)
	}
	dir, pid := m.Dir, m.proc.pid()
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Dir after Close: %v", err)
	}
	if alive(pid) {
		t.Errorf("server %d alive after Close", pid)
	}
}

func TestMariaDBWithoutPerformanceSchema(t *testing.T) {
	m := RequireMariaDBWith(t, MariaDBOptions{NoPerformanceSchema: true})
	if got := mysqlOK(t, m.URL, "select @@performance_schema"); len(got) != 1 || got[0] != "0" {
		t.Errorf("performance_schema = %q; want 0", got)
	}
}

func TestMariaDBWatchdogAfterKill(t *testing.T) {
	serverWatchdogAfterKill(t, "TestMariaDBWatchdogAfterKill", func() (string, int, error) {
		m, err := StartMariaDB()
		if err != nil {
			return "", 0, err
		}
		return m.Dir, m.proc.pid(), nil
	})
}

func TestMariaDBMissingPolicy(t *testing.T) {
	serverMissingPolicy(t, "mariadb", "apt-get install mariadb-server")
}
