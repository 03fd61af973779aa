package testenv

import (
	"context"
	"errors"
	"fmt"
	"net"
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
// its port, freezes, and leaves nothing behind. What the options do is
// tested where they are used (internal/lock/*, script_test.go).

func TestPostgres(t *testing.T) {
	p := RequirePostgres(t)
	db, err := p.CreateDatabase("smoke")
	if err != nil {
		t.Fatal(err)
	}
	b := RequirePgBouncer(t, db, "transaction", 1)
	if rows, err := Exec(t.Context(), b.URL, "select current_database(), null"); err != nil || strings.Join(rows, ";") != "smoke NULL" {
		t.Fatalf("through pgbouncer: %q, %v", rows, err)
	}
	checkLifecycle(t, p.proc, func(ctx context.Context) error { _, err := Exec(ctx, p.URL, "select 1"); return err })
}

func TestRedis(t *testing.T) {
	r := RequireRedis(t, RedisOptions{Password: "pw"})
	if got, err := RedisDo(t.Context(), r.URL, "GET", RedisFreshKey); err != nil || len(got) != 40 {
		t.Fatalf("a new server's mark: %q, %v", got, err)
	}
	checkLifecycle(t, r.proc, func(ctx context.Context) error { _, err := RedisDo(ctx, r.URL, "PING"); return err })
}

func TestMongo(t *testing.T) {
	m := RequireMongo(t)
	checkLifecycle(t, m.proc, func(ctx context.Context) error {
		c, err := mongo.Connect(options.Client().ApplyURI(m.URL))
		if err != nil {
			return err
		}
		defer c.Disconnect(context.WithoutCancel(ctx))
		return c.Ping(ctx, nil)
	})
}

func TestEtcd(t *testing.T) {
	e := RequireEtcd(t, EtcdOptions{TLS: true})
	c, err := e.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if n, err := e.Watchers(); err != nil || n != 0 {
		t.Fatalf("Watchers: %d, %v", n, err)
	}
	checkLifecycle(t, e.proc, func(ctx context.Context) error { _, err := c.Put(ctx, "k", "v"); return err })
}

// Each etcd release of EtcdVersions is built (scripts/test-deps runs this
// ahead, so that no test's time is charged for it), runs, and is the
// release it claims to be; one of them with JWT auth tokens.
func TestEtcdVersions(t *testing.T) {
	for _, v := range EtcdVersions {
		t.Run(v, func(t *testing.T) {
			e := RequireEtcd(t, EtcdOptions{Version: v, JWTTTL: time.Minute})
			got, err := e.ServerVersion()
			if err != nil || !strings.HasPrefix(got, v+".") {
				t.Fatalf("ServerVersion: %q, %v; want %s.x", got, err, v)
			}
			c, err := e.Client()
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if _, err := c.Put(t.Context(), "k", "v"); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestMariaDB(t *testing.T) {
	m := RequireMariaDB(t)
	rows, err := MySQLExec(t.Context(), m.URL, "select current_user(), @@performance_schema; select null")
	if err != nil || strings.Join(rows, ";") != MariaDBUser+"@% 1;NULL" {
		t.Fatalf("MySQLExec: %q, %v", rows, err)
	}
	checkLifecycle(t, m.proc, func(ctx context.Context) error { _, err := MySQLExec(ctx, m.URL, "select 1"); return err })
}

func TestNPM(t *testing.T) {
	cmd := exec.Command("node", "-e", "require('advisory-lock')")
	cmd.Dir = RequireNPM(t)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("require('advisory-lock') in %s: %v\n%s", cmd.Dir, err, out)
	}
}

// checkLifecycle stops, starts, pauses, resumes and closes a server that
// ping reaches, and checks that each did what it says.
func checkLifecycle(t *testing.T, p *proc, ping func(context.Context) error) {
	t.Helper()
	step := func(name string, do func() error, answers bool) {
		if err := do(); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		timeout := time.Minute
		if !answers {
			timeout = 300 * time.Millisecond // enough for a loopback round trip
		}
		ctx, cancel := context.WithTimeout(t.Context(), timeout)
		defer cancel()
		if err := ping(ctx); (err == nil) != answers {
			t.Fatalf("after %s: ping: %v", name, err)
		}
	}
	step("Stop", p.Stop, false)
	step("Start", p.Start, true)
	step("Pause", p.Pause, false)
	step("Resume", p.Resume, true)
	pid := p.PID()
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
	if out := os.Getenv("TESTENV_CRASH"); out != "" {
		if r, err := StartRedis(); err == nil {
			os.WriteFile(out, fmt.Appendf(nil, "%s %d", r.Dir, r.PID()), 0o644)
			select {}
		}
		os.Exit(1)
	}
	RequireRedis(t) // skips here, not in the child, if there is no redis-server
	out := filepath.Join(t.TempDir(), "dir")
	child := exec.Command(os.Args[0], "-test.run=^TestCrash$")
	child.Env = append(os.Environ(), "TESTENV_CRASH="+out)
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	var dir string
	var pid int
	WaitFor(t, "the child to start a server", func() bool { b, _ := os.ReadFile(out); fmt.Sscan(string(b), &dir, &pid); return pid != 0 })
	child.Process.Kill()
	child.Wait()
	WaitFor(t, "the crashed child's redis-server to end", func() bool { return syscall.Kill(pid, 0) != nil })
	RequireRedis(t)
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("the crashed child's directory is still there after the next start: %v", err)
	}
}

func TestKube(t *testing.T) {
	k := RequireKube(t)
	for range 2 { // the second time finds them there
		if err := errors.Join(k.Namespace("smoke"), k.Grant("smoke", "leaser")); err != nil {
			t.Fatal(err)
		}
	}
	sa, err := k.ServiceAccountToken("smoke", "locker")
	if err != nil || sa == "" {
		t.Fatalf("ServiceAccountToken: %q, %v", sa, err)
	}
	leases := "/apis/coordination.k8s.io/v1/namespaces/smoke/leases"
	lease := map[string]any{"metadata": map[string]any{"name": "l"}}
	for _, c := range []struct {
		who, token, method string
		want               int // 0: 2xx
	}{
		{"leaser", k.UserToken("leaser"), "POST", 0},
		{"leaser", k.UserToken("leaser"), "GET", 0},
		{"nobody", k.UserToken("nobody"), "GET", 403},
		{"a bad token", "bad", "GET", 401},
		{"the service account, not granted", sa, "GET", 403},
	} {
		path, body := leases+"/l", any(nil)
		if c.method == "POST" {
			path, body = leases, lease
		}
		var e *KubeError
		if err := k.do(t.Context(), c.token, c.method, path, body, nil); err != nil && !errors.As(err, &e) || e != nil && e.Code != c.want || e == nil && c.want != 0 {
			t.Errorf("%s %s as %s: %v, want %d", c.method, path, c.who, err, c.want)
		}
	}
	checkLifecycle(t, k.proc, func(ctx context.Context) error { return k.do(ctx, k.AdminToken, "GET", "/readyz", nil, nil) })
}

// TestFreePort: the ports handed out are distinct, free, below the
// ephemeral range, and reserved against every other test process for as
// long as the one that took them lives.
func TestFreePort(t *testing.T) {
	if out := os.Getenv("TESTENV_PORTS"); out != "" {
		var ports []string
		for range 20 {
			port, err := FreePort()
			if err != nil {
				os.Exit(1)
			}
			ports = append(ports, fmt.Sprint(port))
		}
		os.WriteFile(out, []byte(strings.Join(ports, " ")), 0o644)
		select {}
	}
	out := filepath.Join(t.TempDir(), "ports")
	child := exec.Command(os.Args[0], "-test.run=^TestFreePort$")
	child.Env = append(os.Environ(), "TESTENV_PORTS="+out)
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	defer child.Wait()
	defer child.Process.Kill()
	var theirs []int
	WaitFor(t, "the child to reserve its ports", func() bool {
		b, _ := os.ReadFile(out)
		theirs = nil
		for _, f := range strings.Fields(string(b)) {
			var port int
			fmt.Sscan(f, &port)
			theirs = append(theirs, port)
		}
		return len(theirs) == 20
	})
	lockedBy := func(port int) int32 { // the pid holding port's byte, 0: none
		f, err := os.Open(filepath.Join(os.TempDir(), "withlock-testenv-ports"))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close() // drops nothing: this process holds no lock through f
		lk := syscall.Flock_t{Type: syscall.F_RDLCK, Start: int64(port), Len: 1}
		if err := syscall.FcntlFlock(f.Fd(), syscall.F_GETLK, &lk); err != nil {
			t.Fatal(err)
		}
		if lk.Type == syscall.F_UNLCK {
			return 0
		}
		return lk.Pid
	}
	for _, port := range theirs {
		if pid := lockedBy(port); pid != int32(child.Process.Pid) {
			t.Errorf("port %d: reserved by pid %d, want the child's, %d", port, pid, child.Process.Pid)
		}
	}
	seen := map[int]bool{}
	for _, port := range theirs {
		seen[port] = true
	}
	for range 500 {
		port, err := FreePort()
		if err != nil {
			t.Fatal(err)
		}
		if seen[port] || port < portsFrom || port >= portsTo {
			t.Fatalf("FreePort gave %d: taken already, or outside [%d, %d)", port, portsFrom, portsTo)
		}
		seen[port] = true
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			t.Fatalf("FreePort gave %d, not free: %v", port, err)
		}
		l.Close()
	}
	child.Process.Kill()
	child.Wait()
	if pid := lockedBy(theirs[0]); pid != 0 {
		t.Errorf("port %d still reserved by pid %d after the child died", theirs[0], pid)
	}
}
