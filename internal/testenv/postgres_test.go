package testenv

import (
	"bufio"
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

func execOK(t *testing.T, url, sql string) []string {
	t.Helper()
	rows, err := Exec(ctx(t), url, sql)
	if err != nil {
		t.Fatalf("Exec(%q): %v", sql, err)
	}
	return rows
}

func TestStartPostgresTwice(t *testing.T) {
	start := time.Now()
	a := RequirePostgres(t)
	t.Logf("first cluster: %v", time.Since(start))
	start = time.Now()
	b := RequirePostgres(t)
	t.Logf("second cluster: %v", time.Since(start))
	if a.Port == b.Port || a.Dir == b.Dir {
		t.Fatalf("clusters share port or dir: %+v %+v", a, b)
	}
	for _, p := range []*Postgres{a, b} {
		if got := execOK(t, p.URL, "select 1"); strings.Join(got, "|") != "1" {
			t.Errorf("select 1 = %q", got)
		}
		want := "postgres://withlock:secret@127.0.0.1:" + strconv.Itoa(p.Port) + "/postgres?sslmode=disable"
		if p.URL != want {
			t.Errorf("URL = %q, want %q", p.URL, want)
		}
	}
	got := execOK(t, a.URL, "show max_connections; show fsync; show listen_addresses")
	if strings.Join(got, "|") != "200|off|127.0.0.1" {
		t.Errorf("settings = %q", got)
	}
}

func TestStartPostgresParallel(t *testing.T) {
	for i := range 4 {
		t.Run(strconv.Itoa(i), func(t *testing.T) {
			t.Parallel()
			p := RequirePostgres(t)
			execOK(t, p.URL, "select 1")
		})
	}
}

func TestCreateDatabaseAndExec(t *testing.T) {
	p := RequirePostgres(t)
	url, err := p.CreateDatabase("Odd name")
	if err != nil {
		t.Fatal(err)
	}
	if got := execOK(t, url, "select current_database(), current_user"); strings.Join(got, "|") != "Odd name withlock" {
		t.Errorf("got %q", got)
	}
	got := execOK(t, url, "create table t(a int, b text); insert into t values (1, 'x'), (2, null); select * from t order by a; select true, false")
	if want := "1 x|2 NULL|t f"; strings.Join(got, "|") != want {
		t.Errorf("got %q, want %q", strings.Join(got, "|"), want)
	}
	if _, err := p.CreateDatabase("Odd name"); err == nil {
		t.Error("creating a database twice succeeded")
	}
	_, err = Exec(ctx(t), url, "select 1; select nonsense")
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "42703" {
		t.Errorf("bad SQL: err = %v, want SQLSTATE 42703", err)
	}
}

func TestStopStartKeepsData(t *testing.T) {
	p := RequirePostgres(t)
	execOK(t, p.URL, "create table kept(v text); insert into kept values ('here')")
	port := p.Port
	if err := p.Stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := Exec(ctx(t), p.URL, "select 1"); err == nil {
		t.Fatal("Exec succeeded on a stopped server")
	}
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	if p.Port != port {
		t.Errorf("port changed from %d to %d", port, p.Port)
	}
	if got := execOK(t, p.URL, "select v from kept"); strings.Join(got, "|") != "here" {
		t.Errorf("after restart: %q", got)
	}
}

func TestWrongPasswordRefused(t *testing.T) {
	p := RequirePostgres(t)
	bad := strings.Replace(p.URL, ":"+PostgresPassword+"@", ":wrong-pw-123@", 1)
	_, err := Exec(ctx(t), bad, "select 1")
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "28P01" {
		t.Fatalf("wrong password: err = %v, want SQLSTATE 28P01", err)
	}
	if strings.Contains(err.Error(), "wrong-pw-123") {
		t.Errorf("error shows the password: %v", err)
	}
	noPW := strings.Replace(p.URL, ":"+PostgresPassword+"@", "@", 1)
	if _, err := Exec(ctx(t), noPW, "select 1"); err == nil {
		t.Error("connected without a password")
	}
}

func TestCloseRemovesEverything(t *testing.T) {
	p, err := StartPostgres()
	if errors.Is(err, ErrNoPostgres) {
		RequirePostgres(t) // skips or fails by policy
	}
	if err != nil {
		t.Fatal(err)
	}
	pid := p.postmasterPID()
	if pid <= 0 {
		t.Fatal("no postmaster.pid")
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if _, err := os.Stat(p.Dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Dir after Close: %v", err)
	}
	if alive(pid) {
		t.Errorf("postmaster %d still alive after Close", pid)
	}
	if c, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p.Port))); err == nil {
		c.Close()
		t.Errorf("port %d still accepts connections", p.Port)
	}
}

func TestCloseAfterStop(t *testing.T) {
	p := RequirePostgres(t)
	if err := p.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p.Dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Dir after Close: %v", err)
	}
}

func alive(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return false
	}
	// A zombie (not yet reaped) counts as dead.
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return false
	}
	_, after, _ := strings.Cut(string(b), ") ")
	return !strings.HasPrefix(after, "Z")
}

// TestWatchdogAfterKill starts a cluster in a child test binary, kills the child
// with SIGKILL, and expects the watchdog to stop the server and remove its files.
func TestWatchdogAfterKill(t *testing.T) {
	if os.Getenv("TESTENV_WATCHDOG_CHILD") == "1" {
		p, err := StartPostgres()
		if err != nil {
			os.Stdout.WriteString("error " + err.Error() + "\n")
			os.Exit(1)
		}
		os.Stdout.WriteString(p.Dir + " " + strconv.Itoa(p.postmasterPID()) + "\n")
		time.Sleep(time.Minute)
		os.Exit(2)
	}
	RequirePostgres(t) // for the skip/fail policy
	cmd := exec.Command(os.Args[0], "-test.run=^TestWatchdogAfterKill$")
	cmd.Env = append(os.Environ(), "TESTENV_WATCHDOG_CHILD=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || strings.HasPrefix(line, "error ") {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("child: %q %v", line, err)
	}
	dir, pidText, _ := strings.Cut(strings.TrimSpace(line), " ")
	pid, _ := strconv.Atoi(pidText)
	cmd.Process.Kill()
	cmd.Wait()
	deadline := time.Now().Add(20 * time.Second)
	for {
		_, statErr := os.Stat(dir)
		if !alive(pid) && errors.Is(statErr, os.ErrNotExist) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("20s after the test binary died: postmaster %d alive=%v, %s: %v", pid, alive(pid), dir, statErr)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func BenchmarkStartPostgres(b *testing.B) {
	if _, err := StartPostgres(); err != nil { // warm the template
		b.Skip(err)
	}
	for b.Loop() {
		p, err := StartPostgres()
		if err != nil {
			b.Fatal(err)
		}
		p.Close()
	}
}
