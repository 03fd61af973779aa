package testenv

import (
	"strings"
	"testing"
)

func TestStandby(t *testing.T) {
	p := RequirePostgres(t)
	execOK(t, p.URL, "create table t (x int); insert into t values (42)")
	s, err := p.StartStandby()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.Port == p.Port {
		t.Fatalf("standby on the primary's port %d", p.Port)
	}
	if got := strings.Join(execOK(t, s.URL, "select pg_is_in_recovery(); select x from t"), "|"); got != "t|42" {
		t.Errorf("standby: pg_is_in_recovery and the primary's row: %q, want t|42", got)
	}
	if _, err := Exec(ctx(t), s.URL, "insert into t values (1)"); err == nil || !strings.Contains(err.Error(), "read-only") {
		t.Errorf("insert on the standby: %v; want a read-only error", err)
	}
	if got := strings.Join(execOK(t, p.URL, "select pg_is_in_recovery()"), "|"); got != "f" {
		t.Errorf("primary: pg_is_in_recovery() = %q", got)
	}
}
