package testenv

import (
	"bufio"
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// ping sends PING over a plain net.Conn, as RESP, and returns the reply line.
func ping(t *testing.T, addr string) string {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := conn.Write([]byte("*1\r\n$4\r\nPING\r\n")); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSuffix(line, "\r\n")
}

func redisDo(t *testing.T, url string, args ...string) string {
	t.Helper()
	reply, err := RedisDo(ctx(t), url, args...)
	if err != nil {
		t.Fatalf("RedisDo %q: %v", args, err)
	}
	return reply
}

func TestStartRedisTwice(t *testing.T) {
	start := time.Now()
	a := RequireRedis(t)
	t.Logf("first server: %v", time.Since(start))
	start = time.Now()
	b := RequireRedis(t)
	t.Logf("second server: %v", time.Since(start))
	if a.Port == b.Port || a.Dir == b.Dir {
		t.Fatalf("servers share port or dir: %+v %+v", a, b)
	}
	for _, r := range []*Redis{a, b} {
		if got := ping(t, r.addr()); got != "+PONG" {
			t.Errorf("PING = %q", got)
		}
		if want := "redis://127.0.0.1:" + strconv.Itoa(r.Port) + "/0"; r.URL != want {
			t.Errorf("URL = %q, want %q", r.URL, want)
		}
	}
	for _, tc := range []struct{ param, want string }{
		{"save", "save\n"},
		{"appendonly", "appendonly\nno"},
		{"bind", "bind\n127.0.0.1"},
		{"requirepass", "requirepass\n"},
	} {
		if got := redisDo(t, a.URL, "CONFIG", "GET", tc.param); got != tc.want {
			t.Errorf("CONFIG GET %s = %q, want %q", tc.param, got, tc.want)
		}
	}
}

func TestStartRedisParallel(t *testing.T) {
	for i := range 4 {
		t.Run(strconv.Itoa(i), func(t *testing.T) {
			t.Parallel()
			r := RequireRedis(t)
			redisDo(t, r.URL, "SET", "k", "v")
		})
	}
}

func TestRedisDo(t *testing.T) {
	r := RequireRedis(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"SET", "withlock:job", "tok", "PX", "60000", "NX"}, "OK"},
		{[]string{"SET", "withlock:job", "other", "PX", "60000", "NX"}, "(nil)"},
		{[]string{"GET", "withlock:job"}, "tok"},
		{[]string{"INCR", "n"}, "1"},
		{[]string{"RPUSH", "l", "a", "b c"}, "2"},
		{[]string{"LRANGE", "l", "0", "-1"}, "a\nb c"},
	} {
		if got := redisDo(t, r.URL, tc.args...); got != tc.want {
			t.Errorf("%q = %q, want %q", tc.args, got, tc.want)
		}
	}
	if pttl, _ := strconv.Atoi(redisDo(t, r.URL, "PTTL", "withlock:job")); pttl <= 0 || pttl > 60000 {
		t.Errorf("PTTL = %d", pttl)
	}
	// Another database through the URL's path.
	redisDo(t, strings.TrimSuffix(r.URL, "/0")+"/3", "SET", "in3", "x")
	if got := redisDo(t, r.URL, "EXISTS", "in3"); got != "0" {
		t.Errorf("EXISTS in3 in db 0 = %q", got)
	}
	_, err := RedisDo(ctx(t), r.URL, "NOSUCHCOMMAND")
	if err == nil || !strings.HasPrefix(err.Error(), "ERR unknown command") {
		t.Errorf("unknown command: %v", err)
	}
}

func TestRedisPassword(t *testing.T) {
	const pw = `s3cr"et pw`
	r := RequireRedisWithPassword(t, pw)
	want := "redis://:s3cr%22et%20pw@127.0.0.1:" + strconv.Itoa(r.Port) + "/0"
	if r.URL != want {
		t.Errorf("URL = %q, want %q", r.URL, want)
	}
	if got := redisDo(t, r.URL, "PING"); got != "PONG" {
		t.Errorf("PING with the password = %q", got)
	}
	noPW := "redis://" + r.addr() + "/0"
	if _, err := RedisDo(ctx(t), noPW, "PING"); err == nil || !strings.HasPrefix(err.Error(), "NOAUTH") {
		t.Errorf("PING without password: %v, want NOAUTH", err)
	}
	wrong := "redis://:wrong-pw-123@" + r.addr() + "/0"
	if _, err := RedisDo(ctx(t), wrong, "PING"); err == nil || !strings.HasPrefix(err.Error(), "WRONGPASS") {
		t.Errorf("PING with a wrong password: %v, want WRONGPASS", err)
	}
	if _, err := StartRedisWithPassword(""); err == nil {
		t.Error("StartRedisWithPassword(\"\") succeeded")
	}
}

func TestRedisStopStart(t *testing.T) {
	r := RequireRedis(t)
	redisDo(t, r.URL, "SET", "gone", "soon")
	port := r.Port
	if err := r.Stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := RedisDo(ctx(t), r.URL, "PING"); err == nil {
		t.Fatal("PING succeeded on a stopped server")
	}
	if err := r.Stop(); err == nil {
		t.Error("second Stop succeeded")
	}
	start := time.Now()
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	t.Logf("restart: %v", time.Since(start))
	if r.Port != port {
		t.Errorf("port changed from %d to %d", port, r.Port)
	}
	if got := redisDo(t, r.URL, "GET", "gone"); got != "(nil)" {
		t.Errorf("after restart GET = %q, want (nil): no persistence", got)
	}
	if err := r.Start(); err == nil {
		t.Error("Start on a running server succeeded")
	}
}

// A new server is marked fresh with its run_id; after a restart the key is
// gone, and the run_id is another.
func TestRedisFresh(t *testing.T) {
	r := RequireRedis(t)
	runID := func() string {
		_, after, _ := strings.Cut(redisDo(t, r.URL, "INFO", "server"), "run_id:")
		id, _, _ := strings.Cut(after, "\r\n")
		return id
	}
	first := runID()
	if got := redisDo(t, r.URL, "GET", RedisFreshKey); got != first || len(got) != 40 {
		t.Errorf("GET %s = %q, want the run_id %q", RedisFreshKey, got, first)
	}
	if err := r.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	if got := redisDo(t, r.URL, "GET", RedisFreshKey); got != "(nil)" {
		t.Errorf("after a restart GET %s = %q, want (nil)", RedisFreshKey, got)
	}
	if runID() == first {
		t.Error("the run_id did not change with the restart")
	}
}

func TestRedisTLS(t *testing.T) {
	r := RequireRedisWith(t, RedisOptions{TLS: true, Password: "tls-pw-1"})
	if !strings.HasPrefix(r.URL, "rediss://") {
		t.Errorf("URL = %q, want rediss://", r.URL)
	}
	if got := redisDo(t, r.URL, "PING"); got != "PONG" {
		t.Errorf("PING over TLS = %q", got)
	}
	// Only TLS: a plaintext PING gets no reply.
	c, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	if _, err := RedisDo(c, "redis://:tls-pw-1@"+r.addr()+"/0", "PING"); err == nil {
		t.Error("plaintext PING to the TLS server succeeded")
	}
	pemData, err := os.ReadFile(r.CertFile)
	if err != nil || !strings.Contains(string(pemData), "BEGIN CERTIFICATE") {
		t.Errorf("CertFile %s: %v %.40q", r.CertFile, err, pemData)
	}
}

func TestRedisReplica(t *testing.T) {
	p := RequireRedisWithPassword(t, "repl-pw-1")
	r := RequireRedisWith(t, RedisOptions{Password: "repl-pw-1", ReplicaOf: p})
	if got := redisDo(t, r.URL, "ROLE"); !strings.HasPrefix(got, "slave\n") {
		t.Errorf("ROLE = %q, want slave", got)
	}
	if _, err := RedisDo(ctx(t), r.URL, "SET", "k", "v"); err == nil || !strings.HasPrefix(err.Error(), "READONLY") {
		t.Errorf("SET on the replica: %v, want READONLY", err)
	}
	// It follows its primary (once the first sync is done).
	redisDo(t, p.URL, "SET", "k", "from-primary")
	deadline := time.Now().Add(30 * time.Second)
	for redisDo(t, r.URL, "GET", "k") != "from-primary" {
		if time.Now().After(deadline) {
			t.Fatal("the replica did not get the primary's write within 30s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestRedisStartPortTaken(t *testing.T) {
	r := RequireRedis(t)
	if err := r.Stop(); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", r.addr())
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	err = r.Start()
	if err == nil || !errors.Is(err, errPortInUse) {
		t.Fatalf("Start on a taken port: %v", err)
	}
}

func TestRedisPauseResume(t *testing.T) {
	r := RequireRedis(t)
	if err := r.Pause(); err != nil {
		t.Fatal(err)
	}
	c, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	if _, err := RedisDo(c, r.URL, "PING"); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("PING while paused: %v, want a timeout", err)
	}
	if err := r.Resume(); err != nil {
		t.Fatal(err)
	}
	if got := redisDo(t, r.URL, "PING"); got != "PONG" {
		t.Errorf("PING after Resume = %q", got)
	}
}

func TestRedisCloseRemovesEverything(t *testing.T) {
	for _, before := range []string{"", "stop", "pause"} {
		t.Run("after "+before, func(t *testing.T) {
			r := RequireRedis(t)
			pid := r.proc.pid()
			switch before {
			case "stop":
				if err := r.Stop(); err != nil {
					t.Fatal(err)
				}
			case "pause":
				if err := r.Pause(); err != nil {
					t.Fatal(err)
				}
			}
			if err := r.Close(); err != nil {
				t.Fatal(err)
			}
			if err := r.Close(); err != nil {
				t.Errorf("second Close: %v", err)
			}
			checkServerGone(t, r.Dir, pid, r.Port)
			if err := r.Start(); err == nil {
				t.Error("Start after Close succeeded")
			}
		})
	}
}

func checkServerGone(t *testing.T, dir string, pid, port int) {
	t.Helper()
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Dir after Close: %v", err)
	}
	if alive(pid) {
		t.Errorf("server %d still alive after Close", pid)
	}
	if c, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port))); err == nil {
		c.Close()
		t.Errorf("port %d still accepts connections", port)
	}
}

func TestRedisWatchdogAfterKill(t *testing.T) {
	serverWatchdogAfterKill(t, "TestRedisWatchdogAfterKill", func() (string, int, error) {
		r, err := StartRedis()
		if err != nil {
			return "", 0, err
		}
		return r.Dir, r.proc.pid(), nil
	})
}

// serverWatchdogAfterKill runs the test named name in a child test binary, where
// start starts a server; kills the child with SIGKILL; and expects the watchdog to
// kill the server and remove its directory.
func serverWatchdogAfterKill(t *testing.T, name string, start func() (dir string, pid int, err error)) {
	if os.Getenv("TESTENV_SERVER_CHILD") == name {
		dir, pid, err := start()
		if err != nil {
			os.Stdout.WriteString("error " + err.Error() + "\n")
			os.Exit(1)
		}
		os.Stdout.WriteString(dir + " " + strconv.Itoa(pid) + "\n")
		time.Sleep(time.Minute)
		os.Exit(2)
	}
	// The same start in this process first, for the skip/fail policy.
	switch name {
	case "TestRedisWatchdogAfterKill":
		RequireRedis(t)
	case "TestMongoWatchdogAfterKill":
		RequireMongo(t)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^"+name+"$")
	cmd.Env = append(os.Environ(), "TESTENV_SERVER_CHILD="+name)
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
	if !alive(pid) {
		t.Fatalf("server %d not running in the child", pid)
	}
	cmd.Process.Kill()
	cmd.Wait()
	deadline := time.Now().Add(20 * time.Second)
	for {
		_, statErr := os.Stat(dir)
		if !alive(pid) && errors.Is(statErr, os.ErrNotExist) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("20s after the test binary died: server %d alive=%v, %s: %v", pid, alive(pid), dir, statErr)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestRedisMissingPolicy runs TestServerMissingChild in a child test binary with an
// empty PATH, with and without CI=true.
func TestRedisMissingPolicy(t *testing.T) {
	serverMissingPolicy(t, "redis", "apt-get install redis-server")
}

// serverMissingPolicy runs TestServerMissingChild for server in a child test
// binary with an empty PATH and an empty cache directory, with and without
// CI=true, and expects a skip or a failure with hint.
func serverMissingPolicy(t *testing.T, server, hint string) {
	if testing.Short() {
		t.Skip("runs the test binary")
	}
	for _, tc := range []struct {
		ci   string
		want string
	}{
		{"", "--- SKIP: TestServerMissingChild"},
		{"false", "--- SKIP: TestServerMissingChild"},
		{"true", "--- FAIL: TestServerMissingChild"},
	} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestServerMissingChild$", "-test.v")
		cmd.Env = append(os.Environ(), "TESTENV_MISSING_SERVER="+server, "CI="+tc.ci, "XDG_CACHE_HOME="+t.TempDir())
		out, _ := cmd.CombinedOutput()
		s := string(out)
		if !strings.Contains(s, tc.want) {
			t.Errorf("CI=%q: want %q in:\n%s", tc.ci, tc.want, s)
		}
		if !strings.Contains(s, hint) {
			t.Errorf("CI=%q: no hint %q in:\n%s", tc.ci, hint, s)
		}
	}
}

func TestServerMissingChild(t *testing.T) {
	server := os.Getenv("TESTENV_MISSING_SERVER")
	if server == "" {
		t.Skip("run by TestRedisMissingPolicy and TestMongoMissingPolicy")
	}
	t.Setenv("PATH", t.TempDir())
	switch server {
	case "redis":
		RequireRedis(t)
	case "mongo":
		RequireMongo(t)
	}
}
