package main

import (
	"bytes"
	"context"
	"encoding/base64"
	stdjson "encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	osexec "os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/jackc/pgx/v5"
	"github.com/rogpeppe/go-internal/testscript"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"golang.org/x/sys/unix"

	"github.com/withlock/withlock/internal/lock"
	"github.com/withlock/withlock/internal/lock/etcd"
	"github.com/withlock/withlock/internal/lock/k8s"
	"github.com/withlock/withlock/internal/lock/mongodb"
	"github.com/withlock/withlock/internal/lock/redis"
	"github.com/withlock/withlock/internal/stress/faultproxy"
	"github.com/withlock/withlock/internal/testenv"
)

// The scripts in testdata/script run the real withlock binary, built as
// users get it (buildWithlock), against real servers:
//
//	testdata/script/cli       no backend needed: usage, version, help
//	testdata/script/all       every backend runs each of these, with $DB set
//	                          to a fresh lock space of its own ($BACKEND names it)
//	testdata/script/postgres  PostgreSQL only; $NPMDIR holds the npm package
//	                          advisory-lock and hold.js
//	testdata/script/file      file:// only
//	testdata/script/lease     every lease backend (Redis, MongoDB, etcd)
//	                          (Redis runs all and lease twice: on one server,
//	                          and on a three-master cluster, rediscluster)
//	testdata/script/etcd      etcd only; etcdctl is set up ($ETCDCTL_ENDPOINTS)
//	                          (etcd runs on each release, Debian's 3.4 and
//	                          those the tests build, with authentication
//	                          off, etcd35, and on, etcd35auth, where [auth];
//	                          lease too where it is on; all on etcd and on
//	                          the newest with it on: etcdBackends)
//	testdata/script/mysql     MySQL (a MariaDB server) only; $MYSQLPORT is its
//	                          port, for the mysql client (the user and password
//	                          are in $MYSQL_USER and $MYSQL_PWD)
//	testdata/script/k8s       Kubernetes only: one kube-apiserver for all the
//	                          scripts, a namespace ($NS) and a kubeconfig
//	                          ($KUBECONFIG) each; see kubeScript
func TestMain(m *testing.M) {
	testscript.Main(m, map[string]func(){
		"exits": expectExit,
		"pgtx":  holdTransaction,
		"eof":   expectEOF,
	})
}

// holdTransaction is the program "pgtx READYFILE SQL": it begins a
// transaction on $DB (a postgres URL), runs SQL in it, writes READYFILE,
// and keeps the transaction open until it is killed; its locks go with it.
func holdTransaction() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: pgtx READYFILE SQL")
		os.Exit(2)
	}
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, os.Getenv("DB"))
	if err == nil {
		_, err = conn.Exec(ctx, "begin; "+os.Args[2])
	}
	if err == nil {
		err = os.WriteFile(os.Args[1], []byte("ready\n"), 0o666)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "pgtx:", err)
		os.Exit(1)
	}
	select {}
}

// expectExit is the program "exits N PROG [ARG...]": it runs PROG with
// stdio passed through, forwards the usual signals to it (so that "kill" of
// a background "exec exits ..." reaches PROG), and exits 0 if PROG exited
// with status N, else 1. testscript's exec only tells zero from non-zero.
// When PROG is withlock and N one of its own statuses (ownStatus), it also
// fails if withlock's stderr holds a line that is not withlock's own: a
// driver's logger writing there, say. Every failure a script provokes
// through "exec exits" is checked so.
func expectExit() {
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: exits N PROG [ARG...]")
		os.Exit(2)
	}
	want, err := strconv.Atoi(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, "exits: N must be a number")
		os.Exit(2)
	}
	c := osexec.Command(os.Args[2], os.Args[3:]...)
	c.Stdin, c.Stdout, c.Stderr = os.Stdin, os.Stdout, os.Stderr
	var stderr bytes.Buffer
	checked := filepath.Base(os.Args[2]) == "withlock" && ownStatus(want)
	if checked {
		c.Stderr = io.MultiWriter(os.Stderr, &stderr)
	}
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGWINCH)
	if err := c.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "exits:", err)
		os.Exit(1)
	}
	go func() {
		for s := range sigs {
			c.Process.Signal(s)
		}
	}()
	c.Wait()
	got := c.ProcessState.ExitCode()
	if ws, ok := c.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		got = 128 + int(ws.Signal())
	}
	if got != want {
		fmt.Fprintf(os.Stderr, "exits: %s exited %d, want %d\n", os.Args[2], got, want)
		os.Exit(1)
	}
	if checked {
		if line, ok := onlyOwnLines(stderr.String(), slices.Contains(os.Args, "--log-format=json") || isFlag(os.Args, "--log-format", "json")); !ok {
			fmt.Fprintf(os.Stderr, "exits: withlock's stderr has a line that is not its own (docs/behaviour.md, Output): %q\n", line)
			os.Exit(1)
		}
	}
	os.Exit(0)
}

// expectEOF is the program "eof PROG [ARG...]": it runs PROG with its
// stdout and stderr on pipes, passed through, and exits with PROG's
// status once both pipes have reached EOF; if one is still open 10s after
// PROG exited (a process PROG left behind holds it, as a CI runner or
// $(...) would wait for), it says so and exits 99. What a CI step or a
// command substitution sees.
func expectEOF() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: eof PROG [ARG...]")
		os.Exit(2)
	}
	c := osexec.Command(os.Args[1], os.Args[2:]...)
	c.Stdin = os.Stdin
	stdout, err1 := c.StdoutPipe()
	stderr, err2 := c.StderrPipe()
	if err := errors.Join(err1, err2, c.Start()); err != nil {
		fmt.Fprintln(os.Stderr, "eof:", err)
		os.Exit(2)
	}
	done := make(chan string, 2)
	for name, p := range map[string]io.Reader{"stdout": stdout, "stderr": stderr} {
		w := io.Writer(os.Stdout)
		if name == "stderr" {
			w = os.Stderr
		}
		go func() {
			io.Copy(w, p)
			done <- name
		}()
	}
	// Wait, not c.Wait: that would close the pipes itself.
	state, err := c.Process.Wait()
	if err != nil {
		fmt.Fprintln(os.Stderr, "eof:", err)
		os.Exit(2)
	}
	timeout := time.After(10 * time.Second)
	for range 2 {
		select {
		case <-done:
		case <-timeout:
			fmt.Fprintf(os.Stderr, "eof: %s's stdout or stderr is still open 10s after it exited: a process it left holds it\n", os.Args[1])
			os.Exit(99)
		}
	}
	code := state.ExitCode()
	if ws, ok := state.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		code = 128 + int(ws.Signal())
	}
	os.Exit(code)
}

// ownStatus says whether withlock exits with status n only when the
// command never ran, so that its stderr is all withlock's own: usage (64),
// unavailable (69), not acquired (75), a command that could not start
// (126, 127). After others the command ran, and its stderr passes through
// (docs/behaviour.md, Running the command): its own status, a lost lock (70; a shell says "Terminated"),
// a signal (128+).
func ownStatus(n int) bool {
	return n == 64 || n == 69 || n == 75 || n == 126 || n == 127
}

// isFlag says whether args hold flag followed by value.
func isFlag(args []string, flag, value string) bool {
	for i, a := range args[:len(args)-1] {
		if a == flag && args[i+1] == value {
			return true
		}
	}
	return false
}

// onlyOwnLines checks that every line of stderr is withlock's own
// (docs/behaviour.md, Output): prefixed "withlock: ", or with json a JSON object with time, level
// and msg. It returns the first line that is not.
func onlyOwnLines(stderr string, json bool) (string, bool) {
	for _, line := range strings.Split(strings.TrimSuffix(stderr, "\n"), "\n") {
		if line == "" && stderr == "" {
			break
		}
		if !json && strings.HasPrefix(line, "withlock: ") {
			continue
		}
		var m map[string]any
		if json && stdjson.Unmarshal([]byte(line), &m) == nil && m["time"] != nil && m["level"] != nil && m["msg"] != nil {
			continue
		}
		return line, false
	}
	return "", true
}

// buildWithlock builds the withlock binary as a user gets it (static, no
// race detector) into a directory of its own, for the scripts to run: a
// race-instrumented test binary re-executed as withlock would be several
// times slower and not what users run. The product's races are the unit
// tests' business (go test -race).
func buildWithlock(t *testing.T) string {
	dir := t.TempDir()
	cmd := osexec.Command("go", "build", "-trimpath", "-o", filepath.Join(dir, "withlock"), ".")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building withlock for the scripts: %v\n%s", err, out)
	}
	return dir
}

// binDir holds the withlock binary the scripts run; see buildWithlock.
var binDir string

func TestScripts(t *testing.T) {
	binDir = buildWithlock(t)
	var dbs atomic.Int64
	// Each backend's scripts need only its own server: its require starts
	// what they share, or skips (fails under CI) their subtest alone.
	none := func(*testing.T) {}
	var pg *testenv.Postgres
	var npmDir string
	var kube *testenv.Kube
	backends := []struct {
		name    string
		require func(t *testing.T)
		// db returns the URL of a lock space of the script's own, and the
		// script's own server if it has one.
		db func(e *testscript.Env) (string, server, error)
	}{
		{"file", none, func(e *testscript.Env) (string, server, error) {
			return "file://" + filepath.Join(e.WorkDir, "locks"), nil, nil
		}},
		{"postgres", func(t *testing.T) {
			pg, npmDir = testenv.RequirePostgres(t), testenv.RequireNPM(t)
		}, func(e *testscript.Env) (string, server, error) {
			e.Setenv("NPMDIR", npmDir) // the npm package advisory-lock, installed
			e.Setenv("PGHOSTPORT", fmt.Sprintf("127.0.0.1:%d", pg.Port))
			e.Setenv("CLOSED", "postgres://u:hunter22@127.0.0.1:1/db")
			// Advisory locks are per database: a database per script keeps
			// scripts that run at once out of each other's way. Scripts that
			// stop the server start one of their own ("server start").
			db, err := pg.CreateDatabase(fmt.Sprintf("script%d", dbs.Add(1)))
			return db, nil, err
		}},
		{"mongodb", func(t *testing.T) { testenv.RequireMongo(t) }, func(e *testscript.Env) (string, server, error) {
			m, err := testenv.StartMongo() // ~15ms: one per script
			if err != nil {
				return "", nil, err
			}
			e.Setenv("CLOSED", "mongodb://u:hunter22@127.0.0.1:1/")
			return m.URL, m, nil
		}},
		{"s3", func(t *testing.T) { testenv.RequireS3(t) }, func(e *testscript.Env) (string, server, error) {
			// A versitygw of its own (a fraction of a second) and a bucket
			// on it; the URL carries the keys, whose secret must never show.
			s, err := testenv.StartS3()
			if err != nil {
				return "", nil, err
			}
			// A directory of its root is a bucket (testenv.S3.Bucket).
			bucket := "script"
			if err := os.Mkdir(filepath.Join(s.Root, bucket), 0o755); err != nil {
				s.Close()
				return "", nil, err
			}
			e.Setenv("CLOSED", "s3://ak:hunter22@b?endpoint=http://127.0.0.1:1&path_style=true")
			e.Setenv("S3BUCKET", bucket)
			return s.URL(bucket), s, nil
		}},
		{"redis", func(t *testing.T) { testenv.RequireRedis(t) }, func(e *testscript.Env) (string, server, error) {
			// ~15ms: one per script. With a password, so that every script
			// also checks that it never shows.
			r, err := testenv.StartRedis(testenv.RedisOptions{Password: "s3cret-pw"})
			if err != nil {
				return "", nil, err
			}
			e.Setenv("CLOSED", "redis://:hunter22@127.0.0.1:1/0")
			e.Setenv("DBHOSTPORT", fmt.Sprintf("127.0.0.1:%d", r.Port))
			return r.URL, r, nil
		}},
		{"rediscluster", func(t *testing.T) { testenv.RequireRedis(t) }, func(e *testscript.Env) (string, server, error) {
			// A Redis Cluster of three masters (about 2s to start, as its
			// nodes meet), given by all its nodes' addresses.
			c, err := testenv.StartRedisCluster(testenv.RedisOptions{Password: "s3cret-pw"})
			if err != nil {
				return "", nil, err
			}
			e.Setenv("CLOSED", "redis://:hunter22@127.0.0.1:1?addr=127.0.0.1:2")
			return c.URL, c, nil
		}},
		{"redissentinel", func(t *testing.T) { testenv.RequireRedis(t) }, func(e *testscript.Env) (string, server, error) {
			// A primary, its replica and three Sentinels, given by the
			// Sentinels' addresses.
			s, err := testenv.StartRedisSentinel(testenv.RedisOptions{Password: "s3cret-pw"})
			if err != nil {
				return "", nil, err
			}
			e.Setenv("CLOSED", "redis+sentinel://:hunter22@127.0.0.1:1/locks")
			return s.URL, s, nil
		}},
		{"mysql", func(t *testing.T) { testenv.RequireMariaDB(t) }, func(e *testscript.Env) (string, server, error) {
			// About a second: one per script, since GET_LOCK's names are
			// the whole server's.
			m, err := testenv.StartMariaDB()
			if err != nil {
				return "", nil, err
			}
			e.Setenv("CLOSED", "mysql://u:hunter22@127.0.0.1:1/db")
			e.Setenv("MYSQLPORT", strconv.Itoa(m.Port))
			e.Setenv("MYSQL_USER", testenv.MariaDBUser)
			e.Setenv("MYSQL_PWD", testenv.MariaDBPassword)
			e.Setenv("UNPRIVILEGED", m.UnprivilegedURL())
			return m.URL, m, nil
		}},
	}
	type backend = struct {
		name    string
		require func(t *testing.T)
		db      func(e *testscript.Env) (string, server, error)
	}
	backends = append(backends, backend{"k8s", func(t *testing.T) { kube = testenv.RequireKube(t) }, func(e *testscript.Env) (string, server, error) {
		return kubeScript(e, kube, int(dbs.Add(1)))
	}})
	for _, eb := range etcdBackends() {
		backends = append(backends, backend{eb.name, func(t *testing.T) { testenv.RequireEtcd(t, eb.opts) }, eb.script})
	}
	t.Run("cli", func(t *testing.T) {
		testscript.Run(t, params("testdata/script/cli", "", nil))
	})
	for _, b := range backends {
		setup := func(e *testscript.Env) error {
			db, srv, err := b.db(e)
			if err != nil {
				return err
			}
			e.Values[stateKey{}].(*scriptState).server = srv
			e.Setenv("DB", db)
			e.Setenv("BACKEND", b.name)
			return nil
		}
		t.Run(b.name, func(t *testing.T) {
			if isEtcd(b.name) && !etcdAllScripts[b.name] {
				// The etcd set-ups that run a few scripts each run side by
				// side, once the others are done, so that none waits for
				// another's slowest script.
				t.Parallel()
			}
			b.require(t)
			if !isEtcd(b.name) || etcdAllScripts[b.name] {
				t.Run("all", func(t *testing.T) { testscript.Run(t, params("testdata/script/all", b.name, setup)) })
			}
			if leaseBackends[b.name] || isEtcd(b.name) && (etcdAllScripts[b.name] || strings.HasSuffix(b.name, "auth")) {
				t.Run("lease", func(t *testing.T) { testscript.Run(t, params("testdata/script/lease", b.name, setup)) })
			}
			dir := "testdata/script/" + b.name
			if isEtcd(b.name) {
				dir = "testdata/script/etcd"
			}
			if _, err := os.Stat(dir); err == nil {
				t.Run("only", func(t *testing.T) { testscript.Run(t, params(dir, b.name, setup)) })
			}
			if b.name == "etcd" {
				t.Run("versions", testEtcdVersions)
			}
		})
	}
}

// etcdScript starts a script's own etcd server (~200ms) with o, with
// etcdctl set up to reach it.
func etcdScript(o testenv.EtcdOptions) func(e *testscript.Env) (string, server, error) {
	return func(e *testscript.Env) (string, server, error) {
		s, err := testenv.StartEtcd(o)
		if err != nil {
			return "", nil, err
		}
		e.Setenv("CLOSED", "etcd://u:hunter22@127.0.0.1:1")
		// etcdctl (3.4 speaks the v3 API by default, to every later
		// release too) finds the script's server through its environment.
		e.Setenv("ETCDCTL_API", "3")
		e.Setenv("ETCDCTL_ENDPOINTS", s.Endpoint)
		// etcdctl's own requests (a lock's lease grant) give up after 5s
		// by default: too soon on a busy machine.
		e.Setenv("ETCDCTL_COMMAND_TIMEOUT", "30s")
		e.Setenv("ETCDHOSTPORT", s.Endpoint)
		return s.URL, s, nil
	}
}

// etcdBackend is a set-up of etcd the scripts run on: a release (""
// Debian's 3.4, else one of testenv.EtcdVersions), with authentication on
// or off. Its name is etcd, the release's digits, and auth if it is on.
type etcdBackend struct {
	name string
	opts testenv.EtcdOptions
	auth bool
}

// etcdBackends are every release with authentication off and on. With it
// on, the releases the tests build hand out JWTs that expire every 2s,
// within most scripts' holds; Debian's, simple tokens.
func etcdBackends() []etcdBackend {
	var ebs []etcdBackend
	for _, v := range append([]string{""}, testenv.EtcdVersions...) {
		name := "etcd" + strings.ReplaceAll(v, ".", "")
		ebs = append(ebs, etcdBackend{name: name, opts: testenv.EtcdOptions{Version: v}})
		o := testenv.EtcdOptions{Version: v}
		if v != "" {
			o.JWTTTL = 2 * time.Second
		}
		ebs = append(ebs, etcdBackend{name: name + "auth", opts: o, auth: true})
	}
	return ebs
}

// etcdAllScripts are the etcd set-ups that run the all scripts too: Debian's
// release, and the newest with authentication on. The others run the etcd
// scripts, where releases differ, and with authentication on the lease
// scripts too, whose holds outlive the auth tokens.
var etcdAllScripts = map[string]bool{
	"etcd": true,
	"etcd" + strings.ReplaceAll(testenv.EtcdVersions[len(testenv.EtcdVersions)-1], ".", "") + "auth": true,
}

// isEtcd says whether backend is one of etcd's set-ups: its scripts'
// custom commands and conditions are etcd's.
func isEtcd(backend string) bool { return strings.HasPrefix(backend, "etcd") }

// script starts a script's own etcd. With authentication on, $DB logs in as
// wl, a user who is not root and may read and write keys but not manage
// users, roles or authentication (the scripts' names, '../../etc/passwd' or
// 'zürich 日本' among them, and status without NAME, which reads every key,
// leave no narrower prefix to grant); etcdctl, and the scripts' own checks,
// log in as root.
func (eb etcdBackend) script(e *testscript.Env) (string, server, error) {
	const rootPW, userPW = "r00t-pw", "s3cret-pw"
	db, srv, err := etcdScript(eb.opts)(e)
	if err != nil || !eb.auth {
		return db, srv, err
	}
	s := srv.(*testenv.Etcd)
	if err := enableEtcdAuth(s, rootPW, "wl", userPW); err != nil {
		s.Close()
		return "", nil, err
	}
	e.Setenv("ETCDCTL_USER", "root:"+rootPW)
	return s.URLAs("wl", userPW), s, nil
}

// enableEtcdAuth adds user with userPW, whose role may read and write every
// key, and root with rootPW, and turns authentication on.
func enableEtcdAuth(s *testenv.Etcd, rootPW, user, userPW string) error {
	if err := s.AddUser(user, userPW, testenv.EtcdEveryKey); err != nil {
		return err
	}
	return s.EnableAuth(rootPW)
}

// testEtcdVersions runs testdata/script/etcd_versions on the system's etcd
// and on each release of testenv.EtcdVersions, with simple auth tokens and
// with JWTs that expire within a script's hold ($TOKENS says which); the
// rest of the etcd scripts run on the system's etcd alone.
func testEtcdVersions(t *testing.T) {
	for _, v := range append([]string{""}, testenv.EtcdVersions...) {
		for _, tokens := range []string{"simple", "jwt"} {
			o := testenv.EtcdOptions{Version: v}
			if tokens == "jwt" {
				o.JWTTTL = 2 * time.Second
			}
			name := v
			if v == "" {
				name = "system"
			}
			t.Run(name+"/"+tokens, func(t *testing.T) {
				t.Parallel()
				testenv.RequireEtcd(t, o) // built and found, or skipped (failed under CI=true)
				start := etcdScript(o)
				testscript.Run(t, params("testdata/script/etcd_versions", "etcd", func(e *testscript.Env) error {
					db, srv, err := start(e)
					if err != nil {
						return err
					}
					e.Values[stateKey{}].(*scriptState).server = srv
					e.Setenv("DB", db)
					e.Setenv("BACKEND", "etcd")
					e.Setenv("TOKENS", tokens)
					return nil
				}))
			})
		}
	}
}

// server is a test server of one script's own.
type server interface {
	Stop() error
	Start() error
	Close() error
}

// freezer is a server that can be frozen (SIGSTOP) to stop answering
// without closing any connection.
type freezer interface {
	Pause() error
	Resume() error
}

// scriptState is what one script's custom commands share.
type scriptState struct {
	server  server
	replica *testenv.Redis // started by "replica start"

	// galera are the nodes "galera start" started, by variable; galeraSeed
	// is the first, which the others join.
	galera     map[string]*testenv.MariaDB
	galeraSeed *testenv.MariaDB
}

type stateKey struct{}

// recordsN are the backends that record a semaphore's N (docs/modes.md).
var recordsN = map[string]bool{"s3": true, "redis": true, "rediscluster": true, "redissentinel": true, "mongodb": true, "file": true, "postgres": true, "etcd": true, "k8s": true}

// leaseBackends hold an expiring lease; the others a lock that lives with
// their connection or open file.
var leaseBackends = map[string]bool{"s3": true, "redis": true, "rediscluster": true, "redissentinel": true, "mongodb": true, "etcd": true, "k8s": true}

func params(dir, backend string, setup func(*testscript.Env) error) testscript.Params {
	return testscript.Params{
		Dir:                 dir,
		RequireExplicitExec: true,
		RequireUniqueNames:  true,
		Setup: func(e *testscript.Env) error {
			st := &scriptState{}
			e.Values[stateKey{}] = st
			e.Defer(func() {
				if st.replica != nil {
					st.replica.Close()
				}
				if st.server != nil {
					st.server.Close()
				}
			})
			e.Setenv("PATH", binDir+string(os.PathListSeparator)+e.Getenv("PATH"))
			// Scripts choose their backend through $DB; none leaks in.
			e.Setenv("WITHLOCK_DB", "")
			e.Setenv("PG_CONNECTION_STRING", "")
			if setup != nil {
				return setup(e)
			}
			return nil
		},
		Condition: func(cond string) (bool, error) {
			switch cond {
			case "root":
				return os.Geteuid() == 0, nil
			case "lease":
				return leaseBackends[backend] || isEtcd(backend), nil
			case "networked":
				// A backend on a network server, which can be unreachable.
				// (Not "net": testscript's own [net] means "this machine
				// reaches the internet" and is never asked here.)
				return backend != "file" && backend != "", nil
			case "records_n":
				// The backend records a semaphore's N and refuses another.
				return recordsN[backend] || isEtcd(backend), nil
			case "auth":
				// The backend's server has authentication on from the
				// start, and etcdctl logs in as root ($ETCDCTL_USER).
				return isEtcd(backend) && strings.HasSuffix(backend, "auth"), nil
			case "shared":
				// The backend has shared locks (MySQL's GET_LOCK and a
				// Kubernetes Lease have none).
				return backend != "mysql" && backend != "k8s" && backend != "s3", nil
			}
			return false, fmt.Errorf("unknown condition %q", cond)
		},
		Cmds: map[string]func(ts *testscript.TestScript, neg bool, args []string){
			"waitfile":   cmdWaitfile,
			"waitmatch":  cmdWaitmatch,
			"pidmatch":   cmdPidmatch,
			"pgwait":     cmdPgwait,
			"gone":       cmdGone,
			"pgsql":      cmdPgsql,
			"server":     cmdServer,
			"countlines": cmdCountlines,
			"signal":     cmdSignal,
			"sleep":      cmdSleep,
			"silent":     cmdSilent,
			"breaklease": cmdBreaklease,
			"s3ignoring": cmdS3ignoring,
			"waiters":    cmdWaiters,
			"replica":    cmdReplica,
			"nooverlap":  cmdNooverlap,
			"standby":    cmdStandby,
			"pgbouncer":  cmdPgbouncer,
			"mysqlsql":   cmdMysqlsql,
			"mysqlwait":  cmdMysqlwait,
			"galera":     cmdGalera,
			"mysqlrepl":  cmdMysqlrepl,
			"kubeget":    cmdKubeget,
			"kubesa":     cmdKubesa,
			"rediscmd":   cmdRediscmd,
			"handlejson": cmdHandlejson,
			"handlehost": cmdHandlehost,
		},
	}
}

// waitfile FILE... waits (up to 30s) until every FILE exists and is not
// empty. Children write these files to say they are ready; never sleep.
func cmdWaitfile(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) == 0 {
		ts.Fatalf("usage: waitfile FILE...")
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, f := range args {
		for {
			if fi, err := os.Stat(ts.MkAbs(f)); err == nil && fi.Size() > 0 {
				break
			}
			if time.Now().After(deadline) {
				ts.Fatalf("waitfile: %s did not appear within 30s", f)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// waitmatch FILE REGEXP waits (up to 30s) until a line of FILE matches
// REGEXP: a background withlock's -v output, say, redirected to FILE.
func cmdWaitmatch(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 2 {
		ts.Fatalf("usage: waitmatch FILE REGEXP")
	}
	re, err := regexp.Compile("(?m)" + args[1])
	ts.Check(err)
	deadline := time.Now().Add(30 * time.Second)
	for {
		data, _ := os.ReadFile(ts.MkAbs(args[0]))
		if re.Match(data) {
			return
		}
		if time.Now().After(deadline) {
			ts.Fatalf("waitmatch: no line of %s matched %q within 30s; it holds:\n%s", args[0], args[1], data)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// pidmatch PIDFILE asserts that the last command's stdout says "pid N",
// N being the pid in PIDFILE: status names the holding withlock.
func cmdPidmatch(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 1 {
		ts.Fatalf("usage: pidmatch PIDFILE")
	}
	pid := strings.TrimSpace(ts.ReadFile(args[0]))
	if !regexp.MustCompile(`\bpid ` + regexp.QuoteMeta(pid) + `\b`).MatchString(ts.ReadFile("stdout")) {
		ts.Fatalf("stdout does not say pid %s", pid)
	}
}

// pgwait SQL runs SQL against $DB until it answers a single "t" (up to 30s):
// for waiting until the server shows something, such as a waiter in pg_locks.
func cmdPgwait(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 1 {
		ts.Fatalf("usage: pgwait SQL")
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		rows, err := testenv.Exec(ctx, ts.Getenv("DB"), args[0])
		cancel()
		if err == nil && len(rows) == 1 && rows[0] == "t" {
			return
		}
		if time.Now().After(deadline) {
			ts.Fatalf("pgwait: %q did not answer t within 30s (last: %q, %v)", args[0], rows, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// mysqlwait SQL runs SQL against $DB (a mysql URL) until it answers a
// single 1 (up to 30s): for waiting until the server shows something, such
// as a lock held by a mysql client.
func cmdMysqlwait(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 1 {
		ts.Fatalf("usage: mysqlwait SQL")
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		rows, err := testenv.MySQLExec(ctx, ts.Getenv("DB"), args[0])
		cancel()
		if err == nil && len(rows) == 1 && rows[0] == "1" {
			return
		}
		if time.Now().After(deadline) {
			ts.Fatalf("mysqlwait: %q did not answer 1 within 30s (last: %q, %v)", args[0], rows, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// galera start VAR | pause VAR | wait VAR STATUS VALUE: "start" starts a
// node of a Galera cluster on loopback (the script's first: a cluster of
// its own; the next ones join it, their state sent by rsync), returns once
// it is Synced, and sets $VAR to its URL as the account without privileges;
// "pause" freezes that node (SIGSTOP), so that the others see it go;
// "wait" waits (up to a minute) until the node's status variable STATUS
// reads VALUE.
func cmdGalera(ts *testscript.TestScript, neg bool, args []string) {
	st := ts.Value(stateKey{}).(*scriptState)
	if neg || len(args) < 2 || ts.Getenv("BACKEND") != "mysql" {
		ts.Fatalf("usage: galera start|pause VAR, galera wait VAR STATUS VALUE (MySQL only)")
	}
	node := st.galera[args[1]]
	switch {
	case args[0] == "start" && len(args) == 2 && node == nil:
		m, err := testenv.StartGaleraNode(st.galeraSeed)
		ts.Check(err)
		ts.Defer(func() { m.Close() })
		if st.galera == nil {
			st.galera, st.galeraSeed = map[string]*testenv.MariaDB{}, m
		}
		st.galera[args[1]] = m
		ts.Setenv(args[1], m.UnprivilegedURL())
	case args[0] == "pause" && len(args) == 2 && node != nil:
		ts.Check(node.Pause())
	case args[0] == "wait" && len(args) == 4 && node != nil:
		ts.Check(node.WaitStatus(args[2], args[3]))
	default:
		ts.Fatalf("usage: galera start|pause VAR, galera wait VAR STATUS VALUE (MySQL only; start a new VAR, pause or wait on a started one)")
	}
}

// mysqlrepl starts a MariaDB primary and a replica of it (neither
// read-only), and sets $PRIMARY and $REPLICA to their URLs as the account
// without privileges.
func cmdMysqlrepl(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 0 || ts.Getenv("BACKEND") != "mysql" {
		ts.Fatalf("usage: mysqlrepl (MySQL only)")
	}
	primary, replica, err := testenv.StartMariaDBReplica()
	ts.Check(err)
	ts.Defer(func() { replica.Close(); primary.Close() })
	ts.Setenv("PRIMARY", primary.UnprivilegedURL())
	ts.Setenv("REPLICA", replica.UnprivilegedURL())
}

// mysqlsql SQL runs SQL against $DB (a mysql URL) and prints the rows, one
// line each, columns separated by a space.
func cmdMysqlsql(ts *testscript.TestScript, neg bool, args []string) {
	if len(args) != 1 {
		ts.Fatalf("usage: mysqlsql SQL")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rows, err := testenv.MySQLExec(ctx, ts.Getenv("DB"), args[0])
	if neg {
		if err == nil {
			ts.Fatalf("mysqlsql succeeded unexpectedly")
		}
		return
	}
	ts.Check(err)
	for _, r := range rows {
		fmt.Fprintln(ts.Stdout(), r)
	}
}

// gone [-within DURATION] PIDFILE waits until the process whose pid is in
// PIDFILE no longer exists (default: within 10s); "! gone" asserts it is
// still alive.
func cmdGone(ts *testscript.TestScript, neg bool, args []string) {
	within := 10 * time.Second
	if len(args) == 3 && args[0] == "-within" {
		d, err := time.ParseDuration(args[1])
		ts.Check(err)
		within, args = d, args[2:]
	}
	if len(args) != 1 {
		ts.Fatalf("usage: gone [-within DURATION] PIDFILE")
	}
	data, err := os.ReadFile(ts.MkAbs(args[0]))
	ts.Check(err)
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	ts.Check(err)
	alive := func() bool {
		// A zombie is gone for our purposes: it runs nothing.
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return false
		}
		fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
		return len(fields) > 0 && fields[0] != "Z" && syscall.Kill(pid, 0) == nil
	}
	if neg {
		if !alive() {
			ts.Fatalf("process %d is gone", pid)
		}
		return
	}
	deadline := time.Now().Add(within)
	for alive() {
		if time.Now().After(deadline) {
			ts.Fatalf("process %d still alive after %s", pid, within)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// pgsql SQL runs SQL against $DB (a postgres URL) and prints the rows, one
// line each, columns separated by a space.
func cmdPgsql(ts *testscript.TestScript, neg bool, args []string) {
	if len(args) != 1 {
		ts.Fatalf("usage: pgsql SQL")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rows, err := testenv.Exec(ctx, ts.Getenv("DB"), args[0])
	if neg {
		if err == nil {
			ts.Fatalf("pgsql succeeded unexpectedly")
		}
		return
	}
	ts.Check(err)
	for _, r := range rows {
		fmt.Fprintln(ts.Stdout(), r)
	}
}

// server start|stop|pause|resume|tls|tls-clientcert: the script's own
// server; pause freezes it (SIGSTOP), so that it stops answering without
// closing connections. Redis, MongoDB, etcd and MySQL scripts have one from
// the start; for PostgreSQL the first "server start" creates a cluster and
// points $DB at it (the shared one must not be stopped), and sets
// $DBHOSTPORT to its address ($DBPORT to its port). "server tls" gives a
// PostgreSQL server a certificate for 127.0.0.1 signed by a test CA,
// $CACERT, and turns ssl on (plaintext still works); for the others see
// serverTLS. "server configure SETTING..." (PostgreSQL, after "server
// start") adds postgresql.conf lines, name=value, and restarts the server.
func cmdServer(ts *testscript.TestScript, neg bool, args []string) {
	st := ts.Value(stateKey{}).(*scriptState)
	if pg, ok := st.server.(*testenv.Postgres); ok && !neg && len(args) > 1 && args[0] == "configure" {
		ts.Check(pg.Configure(strings.Join(args[1:], "\n")))
		return
	}
	if neg || len(args) != 1 {
		ts.Fatalf("usage: server start|stop|pause|resume|tls|configure")
	}
	if st.server == nil {
		if args[0] != "start" || ts.Getenv("BACKEND") != "postgres" {
			ts.Fatalf("server: this script has no server of its own to %s", args[0])
		}
		pg, err := testenv.StartPostgres()
		ts.Check(err)
		st.server = pg
		ts.Setenv("DB", pg.URL)
		ts.Setenv("DBHOSTPORT", fmt.Sprintf("127.0.0.1:%d", pg.Port))
		ts.Setenv("DBPORT", strconv.Itoa(pg.Port))
		return
	}
	f, canFreeze := st.server.(freezer)
	pg, isPostgres := st.server.(*testenv.Postgres)
	switch {
	case args[0] == "start":
		ts.Check(st.server.Start())
	case args[0] == "stop":
		ts.Check(st.server.Stop())
	case args[0] == "pause" && canFreeze:
		ts.Check(f.Pause())
	case args[0] == "resume" && canFreeze:
		ts.Check(f.Resume())
	case args[0] == "tls" && isPostgres:
		root, err := pg.EnableTLS()
		ts.Check(err)
		ts.Setenv("CACERT", root)
	case args[0] == "tls" || args[0] == "tls-clientcert":
		serverTLS(ts, st, args[0] == "tls-clientcert")
	default:
		ts.Fatalf("usage: server start|stop|pause|resume|tls|tls-clientcert (pause and resume: Redis, MongoDB, etcd; tls-clientcert: Redis, etcd)")
	}
}

// serverTLS replaces the script's own server by a new one that speaks TLS
// only, with a certificate for 127.0.0.1 (not localhost) signed by a CA of
// its own, $CACERT. $TLSPORT is its port; $DB is unchanged (the old server's
// URL, now closed). With clientCerts (Redis and etcd) the server refuses
// clients without a certificate signed by its CA; $CLIENTCERT and
// $CLIENTKEY are one. For etcd, its Common Name is "withlock test server",
// and $NOCNCERT and $NOCNKEY are one without a Common Name.
func serverTLS(ts *testscript.TestScript, st *scriptState, clientCerts bool) {
	var next server
	var ca string
	var port int
	switch old := st.server.(type) {
	case *testenv.Redis:
		r, err := testenv.StartRedis(testenv.RedisOptions{TLS: true, ClientCerts: clientCerts, Password: "s3cret-pw"})
		ts.Check(err)
		next, ca, port = r, r.CertFile, r.Port
		ts.Setenv("CLIENTCERT", filepath.Join(r.Dir, "server.crt"))
		ts.Setenv("CLIENTKEY", filepath.Join(r.Dir, "server.key"))
	case *testenv.Mongo:
		m, err := testenv.StartMongo(testenv.MongoOptions{TLS: true})
		ts.Check(err)
		next, ca, port = m, m.CertFile, m.Port
	case *testenv.Etcd:
		e, err := testenv.StartEtcd(testenv.EtcdOptions{TLS: true, ClientCertAuth: clientCerts, Version: old.Version})
		ts.Check(err)
		next, ca, port = e, e.CertFile, e.Port
		ts.Setenv("CLIENTCERT", filepath.Join(e.Dir, "server.crt"))
		ts.Setenv("CLIENTKEY", filepath.Join(e.Dir, "server.key"))
		ts.Setenv("NOCNCERT", filepath.Join(e.Dir, "client.crt"))
		ts.Setenv("NOCNKEY", filepath.Join(e.Dir, "client.key"))
	case *testenv.S3:
		s, err := testenv.StartS3(testenv.S3Options{TLS: true})
		ts.Check(err)
		ts.Check(os.Mkdir(filepath.Join(s.Root, ts.Getenv("S3BUCKET")), 0o755))
		next, ca, port = s, s.CertFile, s.Port
		u := s.URL(ts.Getenv("S3BUCKET"))
		ts.Setenv("TLSDB", u)
		ts.Setenv("TLSDB_LOCALHOST", strings.Replace(u, "https://127.0.0.1:", "https://localhost:", 1))
		ts.Setenv("PLAINDB", strings.Replace(u, "https://", "http://", 1))
	case *testenv.MariaDB:
		m, err := testenv.StartMariaDB(testenv.MariaDBOptions{TLS: true})
		ts.Check(err)
		next, ca, port = m, m.CertFile, m.Port
	default:
		ts.Fatalf("server tls: not for %T", old)
	}
	_, isRedis := next.(*testenv.Redis)
	if _, isEtcd := next.(*testenv.Etcd); clientCerts && !isRedis && !isEtcd {
		next.Close()
		ts.Fatalf("server tls-clientcert: Redis and etcd only")
	}
	st.server.Close()
	st.server = next
	ts.Setenv("CACERT", ca)
	ts.Setenv("TLSPORT", strconv.Itoa(port))
}

// standby starts a hot standby of the script's own PostgreSQL server ("server
// start" first), made with pg_basebackup -R as a user would, and sets $STANDBY
// to its URL, $STANDBYHOSTPORT to its address.
func cmdStandby(ts *testscript.TestScript, neg bool, args []string) {
	pg, ok := ts.Value(stateKey{}).(*scriptState).server.(*testenv.Postgres)
	if neg || len(args) != 0 || !ok {
		ts.Fatalf("usage: standby (after server start, PostgreSQL only)")
	}
	s, err := pg.StartStandby()
	ts.Check(err)
	ts.Defer(func() { s.Close() })
	ts.Setenv("STANDBY", s.URL)
	ts.Setenv("STANDBYHOSTPORT", fmt.Sprintf("127.0.0.1:%d", s.Port))
}

// pgbouncer MODE POOL [SETTING=VALUE...] starts pgbouncer (Debian's) with
// pool_mode MODE and default_pool_size POOL, and the settings given, in
// front of $DB's PostgreSQL server, and sets $BOUNCER to the URL of $DB's
// database through it, without sslmode.
func cmdPgbouncer(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) < 2 || ts.Getenv("BACKEND") != "postgres" {
		ts.Fatalf("usage: pgbouncer MODE POOL [SETTING=VALUE...] (PostgreSQL only)")
	}
	pool, err := strconv.Atoi(args[1])
	ts.Check(err)
	b, err := testenv.StartPgBouncer(ts.Getenv("DB"), args[0], pool, args[2:]...)
	ts.Check(err)
	ts.Defer(func() { b.Close() })
	ts.Setenv("BOUNCER", b.URL)
}

// breaklease NAME deletes NAME's lease behind its holder's back, as an
// operator or a buggy client might.
func cmdBreaklease(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 1 {
		ts.Fatalf("usage: breaklease NAME")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	backend := ts.Getenv("BACKEND")
	if isEtcd(backend) {
		backend = "etcd"
	}
	switch backend {
	case "redis", "rediscluster", "redissentinel":
		n, err := testenv.RedisDo(ctx, redisURL(ts, args[0]), "DEL", redis.Key(args[0]))
		ts.Check(err)
		if n != "1" {
			ts.Fatalf("breaklease: no lease %s to delete", redis.Key(args[0]))
		}
	case "mongodb":
		c, err := mongo.Connect(options.Client().ApplyURI(ts.Getenv("DB")))
		ts.Check(err)
		defer c.Disconnect(ctx)
		// Every document of the lock's chain, as an operator might.
		res, err := c.Database(mongodb.DefaultDatabase).Collection(mongodb.Collection).DeleteMany(ctx, bson.D{{Key: "name", Value: args[0]}})
		ts.Check(err)
		if res.DeletedCount == 0 {
			ts.Fatalf("breaklease: no documents of %q to delete", args[0])
		}
	case "etcd":
		c := etcdClient(ts)
		defer c.Close()
		resp, err := c.Delete(ctx, etcd.Prefix(args[0]), clientv3.WithPrefix())
		ts.Check(err)
		if resp.Deleted != 1 {
			ts.Fatalf("breaklease: %d keys under %s, not the one lease", resp.Deleted, etcd.Prefix(args[0]))
		}
	case "s3":
		s := ts.Value(stateKey{}).(*scriptState).server.(*testenv.S3)
		c := s3.New(s3.Options{Region: s.Region, BaseEndpoint: aws.String(s.Endpoint), UsePathStyle: true,
			Credentials: credentials.NewStaticCredentialsProvider(s.AccessKey, s.SecretKey, "")})
		bucket, key := ts.Getenv("S3BUCKET"), lock.EscapeName(args[0])
		_, err := c.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: &bucket, Key: &key})
		ts.Check(err)
	case "k8s":
		st := ts.Value(stateKey{}).(*scriptState)
		kp := st.server.(*kubeProxy)
		ts.Check(kp.kube.Do("DELETE", "/apis/coordination.k8s.io/v1/namespaces/"+ts.Getenv("NS")+"/leases/"+k8s.LeaseName(args[0]), nil, nil))
	default:
		ts.Fatalf("breaklease: not for backend %s", ts.Getenv("BACKEND"))
	}
}

// s3ignoring sets $IGNORING to the URL of $DB's bucket through a store that
// ignores the conditions (testenv.S3.IgnoringConditions; s3 scripts only).
func cmdS3ignoring(ts *testscript.TestScript, neg bool, args []string) {
	s, ok := ts.Value(stateKey{}).(*scriptState).server.(*testenv.S3)
	if neg || len(args) != 0 || !ok {
		ts.Fatalf("usage: s3ignoring (s3 scripts only)")
	}
	endpoint, stop, err := s.IgnoringConditions()
	ts.Check(err)
	ts.Defer(stop)
	u, err := url.Parse(ts.Getenv("DB"))
	ts.Check(err)
	q := u.Query()
	q.Set("endpoint", endpoint)
	u.RawQuery = q.Encode()
	ts.Setenv("IGNORING", u.String())
}

// countlines N FILE asserts that FILE has exactly N lines.
func cmdCountlines(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 2 {
		ts.Fatalf("usage: countlines N FILE")
	}
	want, err := strconv.Atoi(args[0])
	ts.Check(err)
	data, err := os.ReadFile(ts.MkAbs(args[1]))
	ts.Check(err)
	if got := strings.Count(string(data), "\n"); got != want {
		ts.Fatalf("%s has %d lines, want %d:\n%s", args[1], got, want, data)
	}
}

// signal [-group] SIG PIDFILE sends SIG (TERM, HUP, USR1, ...) to the
// process whose pid is in PIDFILE, or with -group to its process group.
// testscript's own kill knows only INT and KILL. A process sent STOP gets
// CONT when the script ends, whether it passed or failed.
func cmdSignal(ts *testscript.TestScript, neg bool, args []string) {
	group := len(args) == 3 && args[0] == "-group"
	if group {
		args = args[1:]
	}
	if neg || len(args) != 2 {
		ts.Fatalf("usage: signal [-group] SIG PIDFILE")
	}
	sig := unix.SignalNum("SIG" + args[0])
	if sig == 0 {
		ts.Fatalf("signal: unknown signal %s", args[0])
	}
	data, err := os.ReadFile(ts.MkAbs(args[1]))
	ts.Check(err)
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	ts.Check(err)
	if group {
		pid = -pid
	}
	if sig == unix.SIGSTOP {
		// A script that fails while a process is stopped would hang:
		// testscript's cleanup interrupts its background commands and
		// waits for them, and a stopped process handles no signal. The
		// script's own deferred work runs before that cleanup.
		ts.Defer(func() { syscall.Kill(pid, unix.SIGCONT) })
	}
	ts.Check(syscall.Kill(pid, sig))
}

// sleep DURATION pauses the script. Only for giving a process the chance
// to do something it must not do; to wait for something, use waitfile.
func cmdSleep(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 1 {
		ts.Fatalf("usage: sleep DURATION")
	}
	d, err := time.ParseDuration(args[0])
	ts.Check(err)
	time.Sleep(d)
}

// silent PORTFILE CONNFILE listens on a free port of 127.0.0.1, writes the
// port to PORTFILE, and accepts connections that it never answers (a server
// that hangs), until the script ends; it writes CONNFILE at the first one.
func cmdSilent(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 2 {
		ts.Fatalf("usage: silent PORTFILE CONNFILE")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	ts.Check(err)
	ts.Defer(func() { ln.Close() })
	conn := ts.MkAbs(args[1])
	go func() {
		var held []net.Conn
		defer func() {
			for _, c := range held {
				c.Close()
			}
		}()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			held = append(held, c)
			os.WriteFile(conn, []byte("connected\n"), 0o644)
		}
	}()
	ts.Check(os.WriteFile(ts.MkAbs(args[0]), []byte(strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)), 0o644))
}

// waiters NAME N waits (up to 30s) until N withlock processes wait for NAME
// on the server: on Redis, until N clients subscribe to NAME's release
// channel, which a waiter does after its first attempt found NAME held; on
// etcd, until the script's server has N watches open, whatever their NAME:
// a waiter of withlock or etcdctl lock watches the key before its own, and
// a withlock holder its own key, so N counts those holders too.
func cmdWaiters(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 2 {
		ts.Fatalf("usage: waiters NAME N (N+: at least N, etcd only)")
	}
	if e, ok := ts.Value(stateKey{}).(*scriptState).server.(*testenv.Etcd); ok {
		// N+ is at least N: after a restart, an etcd server once counted a
		// third watch beside the holder's and the waiter's for longer than
		// 30s on a busy machine; what follows the restart checks the lock.
		n, atLeast := strings.CutSuffix(args[1], "+")
		want, err := strconv.Atoi(n)
		ts.Check(err)
		deadline := time.Now().Add(30 * time.Second)
		for {
			n, err := e.Watchers()
			ts.Check(err)
			if n == want || atLeast && n > want {
				return
			}
			if time.Now().After(deadline) {
				ts.Fatalf("waiters: %d watches on the server, not %s, within 30s", n, args[1])
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	// In a cluster, waiters subscribe to a sharded channel on the master
	// of NAME's slot.
	url, numsub := redisURL(ts, args[0]), "NUMSUB"
	if ts.Getenv("BACKEND") == "rediscluster" {
		numsub = "SHARDNUMSUB"
	} else if ts.Getenv("BACKEND") != "redis" && ts.Getenv("BACKEND") != "redissentinel" {
		ts.Fatalf("waiters: not for backend %s", ts.Getenv("BACKEND"))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		// The reply is the channel and its number of subscribers.
		reply, err := testenv.RedisDo(ctx, url, "PUBSUB", numsub, redis.Channel(args[0]))
		if ctx.Err() != nil {
			ts.Fatalf("waiters: not %s waiters for %q within 30s (last: %q, %v)", args[1], args[0], reply, err)
		}
		ts.Check(err)
		if lines := strings.Split(reply, "\n"); lines[len(lines)-1] == args[1] {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// redisURL is the URL of the Redis server that holds NAME's keys: the
// script's, its cluster's master of NAME's slot, or the primary that its
// Sentinels name.
func redisURL(ts *testscript.TestScript, name string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	switch s := ts.Value(stateKey{}).(*scriptState).server.(type) {
	case *testenv.RedisCluster:
		return s.Nodes[s.NodeOf(redis.Slot(redis.Key(name)))].URL
	case *testenv.RedisSentinel:
		for {
			if p := s.Primary(ctx); p != nil {
				return p.URL
			}
			if ctx.Err() != nil {
				ts.Fatalf("no primary named by every Sentinel within 30s")
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	return ts.Getenv("DB")
}

// rediscmd ARG... runs one command on $DB's Redis server (as its admin)
// and writes the reply to stdout, an array one element a line; "! rediscmd"
// expects an error reply, written to stderr. $DBHOSTPORT is the server's
// address, for URLs of other users.
func cmdRediscmd(ts *testscript.TestScript, neg bool, args []string) {
	if len(args) == 0 || ts.Getenv("BACKEND") != "redis" {
		ts.Fatalf("usage: rediscmd ARG... (Redis only)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	reply, err := testenv.RedisDo(ctx, ts.Getenv("DB"), args...)
	switch {
	case err != nil && !neg:
		ts.Fatalf("rediscmd %s: %v", args[0], err)
	case err == nil && neg:
		ts.Fatalf("rediscmd %s: %q, want an error", args[0], reply)
	case err != nil:
		fmt.Fprintln(ts.Stderr(), err)
	default:
		fmt.Fprintln(ts.Stdout(), reply)
	}
}

// replica start|pause|resume: a Redis replica (replicaof) of the script's
// own server, with the same password; start sets $REPLICA to its URL. pause
// freezes it (SIGSTOP), so that it acknowledges nothing.
func cmdReplica(ts *testscript.TestScript, neg bool, args []string) {
	st := ts.Value(stateKey{}).(*scriptState)
	if neg || len(args) != 1 {
		ts.Fatalf("usage: replica start|pause|resume")
	}
	primary, ok := st.server.(*testenv.Redis)
	if !ok {
		ts.Fatalf("replica: only for Redis scripts")
	}
	switch {
	case args[0] == "start" && st.replica == nil:
		u, err := url.Parse(primary.URL)
		ts.Check(err)
		pw, _ := u.User.Password()
		r, err := testenv.StartRedis(testenv.RedisOptions{Password: pw, ReplicaOf: primary})
		ts.Check(err)
		st.replica = r
		ts.Setenv("REPLICA", r.URL)
	case args[0] == "pause" && st.replica != nil:
		ts.Check(st.replica.Pause())
	case args[0] == "resume" && st.replica != nil:
		ts.Check(st.replica.Resume())
	default:
		ts.Fatalf("usage: replica start|pause|resume (start once, first)")
	}
}

// nooverlap LOG checks a log that commands run under one lock append to:
// "enter TOKEN" when they start, "exit TOKEN" when they end. Every enter must
// be followed by its own exit before the next enter (no two commands inside
// at once), and the tokens must grow strictly from one command to the next.
func cmdNooverlap(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 1 {
		ts.Fatalf("usage: nooverlap LOG")
	}
	data, err := os.ReadFile(ts.MkAbs(args[0]))
	ts.Check(err)
	var inside string // the token of the command inside, if any
	var last int64
	for i, line := range strings.Split(strings.TrimSuffix(string(data), "\n"), "\n") {
		what, tok, _ := strings.Cut(line, " ")
		switch {
		case what == "enter" && inside == "":
			n, err := strconv.ParseInt(tok, 10, 64)
			if err != nil {
				ts.Fatalf("%s:%d: token %q is not an integer", args[0], i+1, tok)
			}
			if n <= last {
				ts.Fatalf("%s:%d: token %d after %d: tokens must grow\n%s", args[0], i+1, n, last, data)
			}
			inside, last = tok, n
		case what == "enter":
			ts.Fatalf("%s:%d: %q entered while %s was inside\n%s", args[0], i+1, tok, inside, data)
		case what == "exit" && tok == inside:
			inside = ""
		default:
			ts.Fatalf("%s:%d: unexpected %q (inside: %q)\n%s", args[0], i+1, line, inside, data)
		}
	}
	if inside != "" {
		ts.Fatalf("%s: %s never exited\n%s", args[0], inside, data)
	}
}

// etcdClient is a client of the script's own etcd server.
func etcdClient(ts *testscript.TestScript) *clientv3.Client {
	e, ok := ts.Value(stateKey{}).(*scriptState).server.(*testenv.Etcd)
	if !ok {
		ts.Fatalf("not an etcd script")
	}
	c, err := e.Client()
	ts.Check(err)
	return c
}

// kubeScript sets up a k8s script: a namespace of its own, $NS, where the
// user leaser may use Leases; a proxy of its own in front of the shared API
// server (the script's "server", which it may stop or pause without
// touching the other scripts); and $KUBECONFIG with the contexts test
// (leaser, through the proxy: current), admin (through the proxy),
// nobody (a user with no rights at all) and closed (a port where nothing
// listens, with a password that must never show). $DB is k8s://$NS.
func kubeScript(e *testscript.Env, k *testenv.Kube, n int) (string, server, error) {
	ns := fmt.Sprintf("script%d", n)
	if err := errors.Join(k.Namespace(ns), k.Grant(ns, "leaser")); err != nil {
		return "", nil, err
	}
	target := strings.TrimPrefix(k.URL, "https://")
	port, err := testenv.FreePort() // Start opens it again: not an ephemeral one
	if err != nil {
		return "", nil, err
	}
	p, err := faultproxy.StartAt(fmt.Sprintf("127.0.0.1:%d", port), target)
	if err != nil {
		return "", nil, err
	}
	kp := &kubeProxy{kube: k, addr: p.Addr(), target: target, p: p}
	kc := filepath.Join(e.WorkDir, ".kubeconfig")
	config := fmt.Sprintf(`apiVersion: v1
kind: Config
current-context: test
clusters:
- name: test
  cluster: {server: "https://%s", certificate-authority: %q}
- name: closed
  cluster: {server: "https://127.0.0.1:1", certificate-authority: %q}
users:
- name: leaser
  user: {token: %q}
- name: admin
  user: {token: %q}
- name: nobody
  user: {token: %q}
- name: closed
  user: {username: u, password: hunter22}
contexts:
- name: test
  context: {cluster: test, user: leaser, namespace: %s}
- name: admin
  context: {cluster: test, user: admin, namespace: %s}
- name: nobody
  context: {cluster: test, user: nobody, namespace: %s}
- name: closed
  context: {cluster: closed, user: closed, namespace: %s}
`, kp.addr, k.CAFile, k.CAFile, k.UserToken("leaser"), k.AdminToken, k.UserToken("nobody"), ns, ns, ns, ns)
	if err := os.WriteFile(kc, []byte(config), 0o600); err != nil {
		p.Close()
		return "", nil, err
	}
	e.Setenv("KUBECONFIG", kc)
	e.Setenv("KUBERNETES_SERVICE_HOST", "")
	e.Setenv("NS", ns)
	e.Setenv("CLOSED", "k8s://"+ns+"?context=closed")
	return "k8s://" + ns, kp, nil
}

// kubeProxy is a k8s script's "server": a proxy in front of the shared API
// server. Stop closes its port (connection refused), Start opens it again,
// Pause black-holes it (a partition: nothing answers).
type kubeProxy struct {
	kube         *testenv.Kube
	addr, target string
	p            *faultproxy.Proxy
}

func (k *kubeProxy) Stop() error { return k.p.Close() }

func (k *kubeProxy) Start() error {
	p, err := faultproxy.StartAt(k.addr, k.target)
	if err == nil {
		k.p = p
	}
	return err
}

func (k *kubeProxy) Close() error  { return k.p.Close() }
func (k *kubeProxy) Pause() error  { k.p.BlackHole(); return nil }
func (k *kubeProxy) Resume() error { k.p.Heal(); return nil }

// kubeget NAME prints the Lease of lock NAME in $NS, as JSON on one line,
// read as the admin: what kubectl get lease -o json shows.
func cmdKubeget(ts *testscript.TestScript, neg bool, args []string) {
	kp, ok := ts.Value(stateKey{}).(*scriptState).server.(*kubeProxy)
	if neg || len(args) != 1 || !ok {
		ts.Fatalf("usage: kubeget NAME (k8s scripts only)")
	}
	var raw stdjson.RawMessage
	ts.Check(kp.kube.Do("GET", "/apis/coordination.k8s.io/v1/namespaces/"+ts.Getenv("NS")+"/leases/"+k8s.LeaseName(args[0]), nil, &raw))
	var b bytes.Buffer
	ts.Check(stdjson.Compact(&b, raw))
	fmt.Fprintln(ts.Stdout(), b.String())
}

// kubesa NAME FILE creates the service account NAME in $NS, binds it to the
// Role of docs/kubernetes.md on leases in $NS (and nothing else), and writes FILE, a
// kubeconfig that reaches the API server (through the script's proxy) with
// a real token of that account from the TokenRequest API, in $NS.
func cmdKubesa(ts *testscript.TestScript, neg bool, args []string) {
	kp, ok := ts.Value(stateKey{}).(*scriptState).server.(*kubeProxy)
	if neg || len(args) != 2 || !ok {
		ts.Fatalf("usage: kubesa NAME FILE (k8s scripts only)")
	}
	ns := ts.Getenv("NS")
	token, err := kp.kube.ServiceAccountToken(ns, args[0])
	ts.Check(err)
	// The Role and RoleBinding of docs/kubernetes.md, verbatim but for the names.
	rbac := "/apis/rbac.authorization.k8s.io/v1/namespaces/" + ns
	ts.Check(kp.kube.Do("POST", rbac+"/roles", map[string]any{
		"metadata": map[string]any{"name": "withlock"},
		"rules": []any{map[string]any{"apiGroups": []string{"coordination.k8s.io"}, "resources": []string{"leases"},
			"verbs": []string{"get", "list", "watch", "create", "update"}}},
	}, nil))
	ts.Check(kp.kube.Do("POST", rbac+"/rolebindings", map[string]any{
		"metadata": map[string]any{"name": "withlock"},
		"roleRef":  map[string]any{"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "withlock"},
		"subjects": []any{map[string]any{"kind": "ServiceAccount", "name": args[0], "namespace": ns}},
	}, nil))
	// The context reaches the server through the proxy, as $DB does.
	data, err := os.ReadFile(ts.Getenv("KUBECONFIG"))
	ts.Check(err)
	config := strings.Replace(string(data), "current-context: test", "current-context: sa", 1)
	config = strings.Replace(config, "users:\n", fmt.Sprintf("users:\n- name: sa\n  user: {token: %q}\n", token), 1)
	config = strings.Replace(config, "contexts:\n", fmt.Sprintf("contexts:\n- name: sa\n  context: {cluster: test, user: sa, namespace: %s}\n", ns), 1)
	ts.Check(os.WriteFile(ts.MkAbs(args[1]), []byte(config), 0o600))
}

// handlejson FILE OUT writes to OUT what the handle in FILE holds, decoded:
// its JSON, for a script to look into (that it holds no password, say).
func cmdHandlejson(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 2 {
		ts.Fatalf("usage: handlejson FILE OUT")
	}
	h := strings.TrimSpace(ts.ReadFile(args[0]))
	prefix, data, ok := strings.Cut(h, ".")
	b, err := base64.RawURLEncoding.DecodeString(data)
	if !ok || prefix != "wlh1" || err != nil {
		ts.Fatalf("%q is not a handle: %v", h, err)
	}
	ts.Check(os.WriteFile(ts.MkAbs(args[1]), b, 0o644))
}

// handlehost FILE OUT HOST writes to OUT the handle in FILE as if its
// keeper ran on HOST: what a step on another host holds.
func cmdHandlehost(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 3 {
		ts.Fatalf("usage: handlehost FILE OUT HOST")
	}
	h := strings.TrimSpace(ts.ReadFile(args[0]))
	prefix, data, _ := strings.Cut(h, ".")
	b, err := base64.RawURLEncoding.DecodeString(data)
	ts.Check(err)
	var fields map[string]any
	ts.Check(stdjson.Unmarshal(b, &fields))
	fields["host"] = args[2]
	b, err = stdjson.Marshal(fields)
	ts.Check(err)
	ts.Check(os.WriteFile(ts.MkAbs(args[1]), []byte(prefix+"."+base64.RawURLEncoding.EncodeToString(b)+"\n"), 0o600))
}
