package testenv

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// One smoke test per server: it starts, answers, stops and starts again on
// its port, freezes, and leaves nothing behind.

func TestPostgres(t *testing.T) {
	p := RequirePostgres(t)
	db, err := p.CreateDatabase("smoke")
	if err != nil {
		t.Fatal(err)
	}
	rows, err := Exec(t.Context(), db, "select current_database(), pg_is_in_recovery()")
	if err != nil || strings.Join(rows, ";") != "smoke f" {
		t.Fatalf("Exec: %q, %v", rows, err)
	}
	ca, err := p.EnableTLS()
	if err != nil {
		t.Fatal(err)
	}
	if rows, err := Exec(t.Context(), strings.Replace(db, "sslmode=disable", "sslmode=verify-full&sslrootcert="+ca, 1), "select ssl from pg_stat_ssl where pid = pg_backend_pid()"); err != nil || rows[0] != "t" {
		t.Fatalf("over TLS with the CA: %q, %v", rows, err)
	}
	s, err := p.StartStandby()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if rows, err := Exec(t.Context(), s.URL, "select pg_is_in_recovery()"); err != nil || rows[0] != "t" {
		t.Fatalf("standby: %q, %v", rows, err)
	}
	b := RequirePgBouncer(t, db, "transaction", 1)
	if rows, err := Exec(t.Context(), b.URL, "select current_database()"); err != nil || rows[0] != "smoke" {
		t.Fatalf("through pgbouncer: %q, %v", rows, err)
	}
	checkLifecycle(t, p.proc, func(ctx context.Context) error { _, err := Exec(ctx, p.URL, "select 1"); return err })
}

func TestRedis(t *testing.T) {
	p := RequireRedisWith(t, RedisOptions{Password: "pw"})
	r := RequireRedisWith(t, RedisOptions{Password: "pw", ReplicaOf: p})
	s := RequireRedisWith(t, RedisOptions{TLS: true})
	if got, err := RedisDo(t.Context(), s.URL, "GET", RedisFreshKey); err != nil || len(got) != 40 {
		t.Fatalf("a new server's mark: %q, %v", got, err)
	}
	if got, err := RedisDo(t.Context(), r.URL, "ROLE"); err != nil || !strings.HasPrefix(got, "slave\n") {
		t.Fatalf("ROLE of the replica: %q, %v", got, err)
	}
	checkLifecycle(t, r.proc, func(ctx context.Context) error { _, err := RedisDo(ctx, r.URL, "PING"); return err })
}

func TestMongo(t *testing.T) {
	m := RequireMongo(t)
	ping := func(ctx context.Context) error { return mongoPing(ctx, m.URL) }
	if err := ping(t.Context()); err != nil {
		t.Fatal(err)
	}
	checkLifecycle(t, m.proc, ping)
}

func TestNPM(t *testing.T) {
	dir := RequireNPM(t)
	cmd := exec.Command("node", "-e", "require('advisory-lock')")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("require('advisory-lock') in %s: %v\n%s", dir, err, out)
	}
}

// checkLifecycle stops, starts, pauses, resumes and closes a server that
// ping reaches, and checks that each did what it says.
func checkLifecycle(t *testing.T, p *proc, ping func(context.Context) error) {
	t.Helper()
	short := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(t.Context(), 300*time.Millisecond)
	}
	if err := p.Stop(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := short()
	defer cancel()
	if ping(ctx) == nil {
		t.Error("answered after Stop")
	}
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	if err := ping(t.Context()); err != nil {
		t.Fatalf("after Start: %v", err)
	}
	if err := p.Pause(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel = short()
	defer cancel()
	if ping(ctx) == nil {
		t.Error("answered while paused")
	}
	if err := p.Resume(); err != nil {
		t.Fatal(err)
	}
	if err := ping(t.Context()); err != nil {
		t.Fatalf("after Resume: %v", err)
	}
	pid := p.cmd.Process.Pid
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p.Dir); !os.IsNotExist(err) || syscall.Kill(pid, 0) == nil {
		t.Errorf("after Close: %s still there (%v), or server %d still running", p.Dir, err, pid)
	}
}

// TestCrash: a test process killed outright takes its servers with it, and
// the next one removes what it left.
func TestCrash(t *testing.T) {
	if os.Getenv("TESTENV_CRASH") != "" {
		r, err := StartRedis()
		if err != nil {
			os.Exit(1)
		}
		os.WriteFile(os.Getenv("TESTENV_CRASH"), fmt.Appendf(nil, "%s %d", r.Dir, r.cmd.Process.Pid), 0o644)
		select {}
	}
	RequireRedis(t) // skips here, not in the child, if there is no redis-server
	out := filepath.Join(t.TempDir(), "dir")
	child := exec.Command(os.Args[0], "-test.run=^TestCrash$")
	child.Env = append(os.Environ(), "TESTENV_CRASH="+out)
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	var written []byte
	for deadline := time.Now().Add(time.Minute); len(written) == 0; time.Sleep(10 * time.Millisecond) {
		if written, _ = os.ReadFile(out); time.Now().After(deadline) {
			t.Fatal("the child started no server within a minute")
		}
	}
	var dir string
	var pid int
	fmt.Sscan(string(written), &dir, &pid)
	child.Process.Kill()
	child.Wait()
	for deadline := time.Now().Add(time.Minute); syscall.Kill(pid, 0) == nil; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the crashed child's redis-server still runs a minute later")
		}
	}
	RequireRedis(t)
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("the crashed child's directory is still there after the next start: %v", err)
	}
}

func mongoPing(ctx context.Context, url string) error {
	c, err := mongo.Connect(options.Client().ApplyURI(url))
	if err != nil {
		return err
	}
	defer c.Disconnect(context.WithoutCancel(ctx))
	return c.Ping(ctx, nil)
}

func TestEtcd(t *testing.T) {
	e := RequireEtcdWith(t, EtcdOptions{TLS: true})
	c, err := e.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	put := func(ctx context.Context) error { _, err := c.Put(ctx, "k", "v"); return err }
	if n, err := e.Watchers(); err != nil || n != 0 {
		t.Fatalf("Watchers: %d, %v", n, err)
	}
	checkLifecycle(t, e.proc, put)
}
