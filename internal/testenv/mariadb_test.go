package testenv

import (
	"context"
	"errors"
	"testing"

	"github.com/go-sql-driver/mysql"
)

func TestMariaDB(t *testing.T) {
	m := RequireMariaDB(t)
	rows, err := MySQLExec(t.Context(), m.URL, "select current_user(), @@performance_schema, 1 + 1; select null")
	if err != nil || len(rows) != 2 || rows[0] != MariaDBUser+"@% 1 2" || rows[1] != "NULL" {
		t.Fatalf("MySQLExec: %q, %v", rows, err)
	}
	// The unprivileged account may not end others' sessions.
	id, err := MySQLExec(t.Context(), m.URL, "select connection_id()")
	if err != nil {
		t.Fatal(err)
	}
	_, err = MySQLExec(t.Context(), m.UnprivilegedURL(), "kill "+id[0])
	var myErr *mysql.MySQLError
	if !errors.As(err, &myErr) || myErr.Number != 1094 && myErr.Number != 1095 {
		t.Errorf("KILL by %s: %v; want error 1095 (not owner) or 1094 (unknown thread)", MariaDBUnprivileged, err)
	}
	// As MariaDB ships: no performance_schema.
	plain := RequireMariaDBWith(t, MariaDBOptions{NoPerformanceSchema: true})
	if rows, err := MySQLExec(t.Context(), plain.URL, "select @@performance_schema"); err != nil || rows[0] != "0" {
		t.Errorf("performance_schema without it: %q, %v", rows, err)
	}
	// With TLS: the server offers it (the mysql package tests use it).
	s := RequireMariaDBWith(t, MariaDBOptions{TLS: true})
	if rows, err := MySQLExec(t.Context(), s.URL, "select @@have_ssl"); err != nil || rows[0] != "YES" {
		t.Errorf("have_ssl with TLS: %q, %v", rows, err)
	}
	checkLifecycle(t, m.proc, func(ctx context.Context) error { _, err := MySQLExec(ctx, m.URL, "select 1"); return err })
}
