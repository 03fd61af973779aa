package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/withlock/withlock/internal/testenv"
)

// Waiting cost: one holder, and waiters withlocks waiting for
// the same NAME, as the pods of a deployment would. The figures are taken
// on the server process over window, once settle has passed since the
// last waiter began to wait: past the first second, in which a waiter
// polls fast on purpose.
const (
	waiters = 30
	window  = 10 * time.Second
	settle  = 3 * time.Second
)

// waitCost is what the server spent over a window: CPU seconds per second
// (1.0 is one core) and operations per second.
type waitCost struct {
	cpu, ops float64
}

// serverMeter reads a server's cumulative CPU time and operation count.
type serverMeter struct {
	pid int
	ops func() (int64, error)
}

// measure returns what the server spent over window.
func (m serverMeter) measure() (waitCost, error) {
	cpu0, err := cpuTime(m.pid)
	if err != nil {
		return waitCost{}, err
	}
	ops0, err := m.ops()
	if err != nil {
		return waitCost{}, err
	}
	start := time.Now()
	time.Sleep(window) // the measurement window itself
	cpu1, err := cpuTime(m.pid)
	if err != nil {
		return waitCost{}, err
	}
	ops1, err := m.ops()
	if err != nil {
		return waitCost{}, err
	}
	took := time.Since(start).Seconds()
	return waitCost{cpu: (cpu1 - cpu0).Seconds() / took, ops: float64(ops1-ops0) / took}, nil
}

// waiting measures the server with the holder alone, then with the
// waiters behind it, and lets them all finish.
func waiting(work, wl, url string, m serverMeter) (alone, crowd waitCost, err error) {
	dir := filepath.Join(work, "waiting")
	os.RemoveAll(dir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return alone, crowd, err
	}
	f := func(n string) string { return filepath.Join(dir, n) }
	holder := command([]string{wl, "--db", url, "waiting", "--", "sh", "-c",
		fmt.Sprintf("echo x > %s; while [ ! -f %s ]; do sleep 0.1; done", f("held"), f("done"))})
	if err := holder.Start(); err != nil {
		return alone, crowd, err
	}
	defer func() {
		os.WriteFile(f("done"), []byte("x\n"), 0o644)
		holder.Wait()
	}()
	for !exists(f("held")) {
		time.Sleep(10 * time.Millisecond)
	}
	if alone, err = m.measure(); err != nil {
		return alone, crowd, err
	}

	var procs []*exec.Cmd
	defer func() {
		os.WriteFile(f("done"), []byte("x\n"), 0o644)
		for _, p := range procs {
			p.Wait()
		}
	}()
	for i := range waiters {
		log, err := os.Create(f(fmt.Sprintf("waiter%d.log", i)))
		if err != nil {
			return alone, crowd, err
		}
		p := exec.Command(wl, "-v", "--db", url, "waiting", "--", "true")
		p.Stderr = log
		if err := p.Start(); err != nil {
			log.Close()
			return alone, crowd, err
		}
		log.Close()
		procs = append(procs, p)
	}
	for i := range waiters {
		for {
			b, _ := os.ReadFile(f(fmt.Sprintf("waiter%d.log", i)))
			if strings.Contains(string(b), "held; waiting") {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	time.Sleep(settle) // past the first second of each wait, by design
	crowd, err = m.measure()
	return alone, crowd, err
}

// cpuTime is the user + system CPU time of a server: its process and
// every descendant (PostgreSQL's backends, one per connection), with the
// children they have reaped, from /proc/PID/stat.
func cpuTime(pid int) (time.Duration, error) {
	procs, err := allStats()
	if err != nil {
		return 0, err
	}
	if _, ok := procs[pid]; !ok {
		return 0, fmt.Errorf("no process %d", pid)
	}
	var ticks int64
	tree := map[int]bool{pid: true}
	for changed := true; changed; {
		changed = false
		for p, st := range procs {
			if !tree[p] && tree[st.ppid] {
				tree[p], changed = true, true
			}
		}
	}
	for p := range tree {
		ticks += procs[p].ticks
	}
	return time.Duration(ticks) * time.Second / clockTicks, nil
}

type procStat struct {
	ppid  int
	ticks int64 // utime + stime + cutime + cstime
}

// allStats reads /proc/PID/stat of every process.
func allStats() (map[int]procStat, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	procs := map[int]procStat{}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue // gone meanwhile
		}
		// The command name (field 2) may hold spaces; the fields after it
		// count from its closing parenthesis. ppid is field 4; utime,
		// stime, cutime and cstime are fields 14 to 17, in clock ticks.
		s := string(data)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(f) < 15 {
			return nil, fmt.Errorf("/proc/%d/stat: %q", pid, s)
		}
		st := procStat{}
		st.ppid, _ = strconv.Atoi(f[1])
		for _, v := range f[11:15] {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return nil, fmt.Errorf("/proc/%d/stat: %q", pid, s)
			}
			st.ticks += n
		}
		procs[pid] = st
	}
	return procs, nil
}

// clockTicks is the kernel's USER_HZ, the unit of /proc/PID/stat's times:
// 100 on every Linux architecture Go supports.
const clockTicks = 100

// A waitTarget is one backend's server as the waiting figure measures
// it: its URL, its process, and an operation counter of its own.
type waitTarget struct {
	name, url string
	pid       int
	counter   string // what ops counts, for the table
	ops       func() (int64, error)
}

// postgresOps counts the transactions of every database of a PostgreSQL
// server (pg_stat_database: xact_commit + xact_rollback). A statement is a
// transaction of its own unless the client opens one; each backend
// reports its counts when it goes idle, at most once a second.
func postgresOps(url string) (func() (int64, error), func(), error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		return nil, nil, err
	}
	count := func() (int64, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		var n int64
		err := c.QueryRow(ctx, "select sum(xact_commit + xact_rollback)::bigint from pg_stat_database").Scan(&n)
		return n, err
	}
	return count, func() { c.Close(context.Background()) }, nil
}

// redisOps counts the commands a Redis server has processed (INFO stats:
// total_commands_processed).
func redisOps(url string) (func() (int64, error), func(), error) {
	o, err := redis.ParseURL(url)
	if err != nil {
		return nil, nil, err
	}
	c := redis.NewClient(o)
	count := func() (int64, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		info, err := c.Info(ctx, "stats").Result()
		if err != nil {
			return 0, err
		}
		_, v, ok := strings.Cut(info, "total_commands_processed:")
		if !ok {
			return 0, fmt.Errorf("redis INFO stats has no total_commands_processed")
		}
		v, _, _ = strings.Cut(v, "\r\n")
		return strconv.ParseInt(strings.TrimSpace(v), 10, 64)
	}
	return count, func() { c.Close() }, nil
}

// etcdOps counts the gRPC messages an etcd server has received, over every
// method (its /metrics: grpc_server_msg_received_total): one per unary
// call, one per message of a stream (a watch's, a lease's keep-alives).
func etcdOps(port int) func() (int64, error) {
	return func() (int64, error) {
		c := &http.Client{Timeout: 10 * time.Second}
		defer c.CloseIdleConnections()
		resp, err := c.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", port))
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			return 0, err
		}
		return sumMetric(body, "grpc_server_msg_received_total", "etcd")
	}
}

// mysqlOps counts the statements clients have sent a MySQL or MariaDB
// server (SHOW GLOBAL STATUS: Questions).
func mysqlOps(url string) func() (int64, error) {
	return func() (int64, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		rows, err := testenv.MySQLExec(ctx, url, "SHOW GLOBAL STATUS LIKE 'Questions'")
		if err != nil {
			return 0, err
		}
		if len(rows) != 1 {
			return 0, fmt.Errorf("SHOW GLOBAL STATUS LIKE 'Questions': %q", rows)
		}
		_, v, _ := strings.Cut(rows[0], " ")
		return strconv.ParseInt(v, 10, 64)
	}
}

// mongoOps counts the commands a MongoDB-wire server has answered (its
// serverStatus metrics; the serverStatus commands themselves excluded).
func mongoOps(url string) (func() (int64, error), func(), error) {
	c, err := mongo.Connect(options.Client().ApplyURI(url))
	if err != nil {
		return nil, nil, err
	}
	count := func() (int64, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		var st struct {
			Metrics struct {
				Commands map[string]struct {
					Total int64 `bson:"total"`
				} `bson:"commands"`
			} `bson:"metrics"`
		}
		if err := c.Database("admin").RunCommand(ctx, bson.D{{Key: "serverStatus", Value: 1}}).Decode(&st); err != nil {
			return 0, err
		}
		var n int64
		for cmd, m := range st.Metrics.Commands {
			if cmd != "serverStatus" {
				n += m.Total
			}
		}
		return n, nil
	}
	return count, func() { c.Disconnect(context.Background()) }, nil
}

// waitingTable measures every target in turn and prints the table. The
// file backend has no server: its waiters sleep in flock(2).
func waitingTable(work, wl string, targets []waitTarget) error {
	fmt.Printf("\n## Waiting: one holder and %d waiters on one NAME, the server process over %s, from %s after the last waiter began to wait\n\n", waiters, window, settle)
	fmt.Println("| backend | server CPU, holder alone | server CPU, holder and waiters | CPU per waiter | operations/s per waiter | operations counted |")
	fmt.Println("|---|---:|---:|---:|---:|---|")
	for _, t := range targets {
		if t.ops == nil {
			fmt.Printf("| %s | – | – | – | – | no server: waiters sleep in flock(2) |\n", t.name)
			continue
		}
		alone, crowd, err := waiting(work, wl, t.url, serverMeter{pid: t.pid, ops: t.ops})
		if err != nil {
			return fmt.Errorf("waiting on %s: %w", t.name, err)
		}
		fmt.Printf("| %s | %.1f%% | %.1f%% | %.2f%% | %.2f | %s |\n", t.name, 100*alone.cpu, 100*crowd.cpu,
			100*(crowd.cpu-alone.cpu)/waiters, (crowd.ops-alone.ops)/waiters, t.counter)
		measured.set("waiter cpu", t.name, 100*(crowd.cpu-alone.cpu)/waiters)
	}
	return nil
}

// kubeOps counts the requests a kube-apiserver has served (its /metrics,
// apiserver_request_total, summed over every verb, resource and code; a
// watch counts once, when it ends). The scrape itself is one of them.
func kubeOps(k *testenv.Kube) (func() (int64, error), error) {
	pem, err := os.ReadFile(k.CAFile)
	if err != nil {
		return nil, err
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pem)
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}}
	return func() (int64, error) {
		req, err := http.NewRequest("GET", k.URL+"/metrics", nil)
		if err != nil {
			return 0, err
		}
		req.Header.Set("Authorization", "Bearer "+k.AdminToken)
		resp, err := c.Do(req)
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			return 0, err
		}
		return sumMetric(body, "apiserver_request_total", "kube-apiserver")
	}, nil
}

// sumMetric sums the samples of the Prometheus counter metric, over all its
// labels, in body, a /metrics page of server.
func sumMetric(body []byte, metric, server string) (int64, error) {
	var n float64
	found := false
	for line := range strings.Lines(string(body)) {
		if !strings.HasPrefix(line, metric+"{") {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			return 0, fmt.Errorf("%s /metrics: %q", server, line)
		}
		n += v
		found = true
	}
	if !found {
		return 0, fmt.Errorf("%s /metrics has no %s", server, metric)
	}
	return int64(n), nil
}

// s3Ops counts the requests an S3 server answers. versitygw keeps no count
// that can be asked for (its metrics go only to StatsD servers, and the
// test server is given none): a proxy on 127.0.0.1, in front of it, counts
// each request and passes it on unchanged, its Host header too, so that
// its signature still holds, over connections it keeps open as the
// clients keep theirs. proxied is dbURL with the proxy as its endpoint:
// the holder and the waiters go through it. The server's CPU is still its
// process's alone; stop closes the proxy.
func s3Ops(s *testenv.S3, dbURL string) (proxied string, ops func() (int64, error), stop func(), err error) {
	target, err := url.Parse(s.Endpoint)
	if err != nil {
		return "", nil, nil, err
	}
	u, err := url.Parse(dbURL)
	if err != nil {
		return "", nil, nil, err
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, nil, err
	}
	var n atomic.Int64
	transport := &http.Transport{MaxIdleConnsPerHost: 4 * waiters}
	proxy := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.Out.URL.Scheme, r.Out.URL.Host = target.Scheme, target.Host
		},
		Transport: transport,
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		proxy.ServeHTTP(w, r)
	})}
	go srv.Serve(l)
	q := u.Query()
	q.Set("endpoint", "http://"+l.Addr().String())
	u.RawQuery = q.Encode()
	stop = func() {
		srv.Close()
		transport.CloseIdleConnections()
	}
	return u.String(), func() (int64, error) { return n.Load(), nil }, stop, nil
}
