// Command bench measures withlock side by side with flock(1), psql, a
// redis-cli script, the mysql client, etcdctl lock and the npm package
// advisory-lock's withlock, in one run so that the
// ratios hold on a noisy machine. It starts its own servers as the tests do,
// and prints one Markdown table per figure, then a table of the product's
// performance goals judged by them (goals.go). Run it with `make bench`, which
// passes -doc ../../docs/performance.md: the page then holds this run's
// tables, when and where they were measured, and charts of the hand-off and
// the contention (report.go). It runs from its own directory, in a module
// of its own, so that the plotting library stays out of the product.
//
// Tools: hyperfine (whole-process wall time), /usr/bin/time -v (peak RSS);
// both are installed with apt-get when missing and run as root.
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/withlock/withlock/internal/testenv"
)

const (
	overheadRuns   = 40
	handoffTrials  = 50
	contenders     = 16 // a crowd of deploy pods or cron hosts
	acquisitions   = 25
	npmAcquisition = 5 // per contender: the npm withlock costs ~0.3s a run
	// contentionRounds: the contention table's rows take turns, each
	// running a share of its acquisitions per round, so that a busy moment
	// of the machine falls on every row alike rather than on the row that
	// was measuring then, as the hand-off's trials do.
	contentionRounds = 5
)

var (
	onlyWaiting  = flag.Bool("waiting", false, "measure only what waiters cost the server")
	waitBackends = flag.String("backends", strings.Join(backends, ","), "with -waiting, -handoff, -contention or -steps: the backends measured, comma-separated, among them "+redisSetupNames()+" (-handoff or -contention without it: every row; -steps without it: file and postgres)")
	onlyHandoff  = flag.Bool("handoff", false, "measure only the hand-off table")
	onlyContend  = flag.Bool("contention", false, "with -backends: measure only the contention table's rows of those backends")
	onlyInit     = flag.Bool("init", false, "measure only package initialisation, by module")
	onlySteps    = flag.Bool("steps", false, "measure only what a lock across steps (withlock acquire) costs beside the run form (with -backends: on those backends)")
	binary       = flag.String("withlock", "", "the withlock binary to measure (default: build this checkout), to compare two versions")
	doc          = flag.String("doc", "", "write the run's tables and charts to this Markdown file (make bench: docs/performance.md)")
)

func main() {
	flag.Parse()
	if err := runDoc(); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// runDoc runs the benchmarks and, with -doc, writes what they printed to
// the page, once the whole run has succeeded.
func runDoc() error {
	if *doc == "" {
		return run()
	}
	if *onlyWaiting || *onlyHandoff || *onlyContend || *onlyInit {
		return errors.New("-doc takes the whole run, not -waiting, -handoff, -contention or -init")
	}
	var out bytes.Buffer
	restore, err := teeStdout(&out)
	if err != nil {
		return err
	}
	started, at := time.Now(), commit() // before the run writes anything
	err = run()
	restore()
	if err != nil {
		return err
	}
	return writeDoc(*doc, out.String(), collected, measured, started, at)
}

type contender struct {
	name string
	argv []string // the command, for hyperfine and exec
}

func run() error {
	work, err := os.MkdirTemp("", "withlock-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	if err := ensureTools(); err != nil {
		return err
	}
	wl := *binary
	if wl == "" {
		wl = filepath.Join(work, "withlock")
		build := exec.Command("go", "build", "-tags", "grpcnotrace", "-trimpath", "-ldflags", "-s -w", "-o", wl, ".")
		build.Dir = filepath.Join("..", "..") // the product, from internal/bench
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		build.Stderr = os.Stderr
		if err := build.Run(); err != nil {
			return fmt.Errorf("build: %w", err)
		}
	}
	if *onlyWaiting {
		return waitingFigures(work, wl, strings.Split(*waitBackends, ","))
	}
	if *onlyInit {
		return initByModule(wl)
	}
	if *onlyHandoff && flagGiven("backends") {
		return handoffFigures(work, wl, strings.Split(*waitBackends, ","))
	}
	if *onlySteps && flagGiven("backends") {
		return stepsOn(work, wl, strings.Split(*waitBackends, ","))
	}
	if *onlyContend {
		if !flagGiven("backends") {
			return errors.New("-contention measures the backends of -backends: name them, e.g. -contention -backends redis")
		}
		return contentionFigures(work, wl, strings.Split(*waitBackends, ","))
	}

	pg, err := testenv.StartPostgres()
	if err != nil {
		return err
	}
	defer pg.Close()
	if *onlySteps {
		return stepsFigures(work, wl, pg)
	}
	// URLs as users write them: no sslmode (libpq's default, prefer), against
	// a server without TLS and one with it.
	pgTLS, err := testenv.StartPostgres()
	if err != nil {
		return err
	}
	defer pgTLS.Close()
	if _, err := pgTLS.EnableTLS(); err != nil {
		return err
	}
	asUsersWrite := func(u string) string { return strings.Replace(u, "?sslmode=disable", "", 1) }
	pgURL, pgTLSURL := asUsersWrite(pg.URL), asUsersWrite(pgTLS.URL)
	hello, err := buildHello(work)
	if err != nil {
		return err
	}
	rd, err := testenv.StartRedis()
	if err != nil {
		return err
	}
	defer rd.Close()
	// The other Redis set-ups, beside the single server in the hand-off and
	// contention tables.
	var setups []struct{ name, url string }
	for _, r := range redisSetups {
		url, stop, err := r.start()
		if err != nil {
			return fmt.Errorf("%s: %w", r.name, err)
		}
		defer stop()
		setups = append(setups, struct{ name, url string }{r.name, url})
	}
	mg, err := testenv.StartMongo()
	if err != nil {
		return err
	}
	defer mg.Close()
	et, err := testenv.StartEtcd()
	if err != nil {
		return err
	}
	defer et.Close()
	etcdctl := func(name string, argv ...string) []string {
		return append([]string{"etcdctl", "--endpoints", et.Endpoint, "lock", name, "--"}, argv...)
	}
	md, err := testenv.StartMariaDB()
	if err != nil {
		return err
	}
	defer md.Close()
	// The mysql client's GET_LOCK, the floor of the mysql backend; its
	// password from the environment, as withlock's from the URL.
	os.Setenv("MYSQL_PWD", testenv.MariaDBPassword)
	mysqlClient := func(sql ...string) []string {
		argv := []string{"mysql", "-h", "127.0.0.1", "-P", strconv.Itoa(md.Port), "-u", testenv.MariaDBUser, "-N", "-B"}
		for _, q := range sql {
			argv = append(argv, "-e", q)
		}
		return argv
	}
	kube, kubeURL, err := startKube(work)
	if err != nil {
		return err
	}
	defer kube.Close()
	s3, s3URL, err := startS3()
	if err != nil {
		return err
	}
	defer s3.Close()
	npmDir, err := testenv.NPMDir()
	if err != nil {
		return err
	}
	npmWithlock := filepath.Join(npmDir, "node_modules", ".bin", "withlock")
	psql, err := realPsql()
	if err != nil {
		return err
	}
	dbs := []struct{ name, url string }{
		{"file", "file://" + filepath.Join(work, "locks")},
		{"postgres", pgURL},
		{"redis", rd.URL},
		{"mongodb", mg.URL},
		{"etcd", et.URL},
		{"mysql", md.URL},
		{"k8s", kubeURL},
		{"s3", s3URL},
	}
	flockFile := filepath.Join(work, "flock.lock")

	fmt.Printf("# withlock benchmarks\n\n%s, %d cores, %s; withlock binary %s\n\n", cpuModel(), numCPU(), time.Now().UTC().Format("2006-01-02"), size(wl))

	if !*onlyHandoff {
		// Overhead: locking around `true`, uncontended.
		var over []contender
		over = append(over, contender{"true", []string{"true"}})
		over = append(over, contender{"static Go hello-world", []string{hello}})
		over = append(over, contender{"withlock version", []string{wl, "version"}})
		over = append(over, contender{"flock FILE true", []string{"flock", flockFile, "true"}})
		for _, db := range dbs {
			over = append(over, contender{"withlock " + db.name, []string{wl, "--db", db.url, "bench", "--", "true"}})
		}
		// The floor: psql's lock and unlock with no command between them.
		floor := func(url string) []string {
			return []string{psql, url, "-c", "select pg_advisory_lock(1); select pg_advisory_unlock(1)"}
		}
		over = append(over,
			contender{"withlock postgres, server with TLS", []string{wl, "--db", pgTLSURL, "bench", "--", "true"}},
			contender{"withlock postgres, sslmode=disable", []string{wl, "--db", pg.URL, "bench", "--", "true"}},
			contender{"psql same job", psqlJob(psql, pgURL, 1, "true")},
			contender{"psql same job, server with TLS", psqlJob(psql, pgTLSURL, 1, "true")},
			contender{"psql floor", floor(pgURL)},
			contender{"psql floor, server with TLS", floor(pgTLSURL)},
			contender{"redis-cli script", redisCLIScript(rd.URL, "bench", "true")},
			contender{"mysql client same job", mysqlClient("SELECT GET_LOCK('bench', 3600); system true; SELECT RELEASE_LOCK('bench')")},
			contender{"mysql client floor", mysqlClient("SELECT GET_LOCK('bench', 0); SELECT RELEASE_LOCK('bench')")},
			contender{"npm withlock (postgres)", []string{npmWithlock, "bench", "--db", pgURL, "--", "true"}},
			contender{"etcdctl lock (etcd)", etcdctl("bench", "true")},
		)
		stats, err := hyperfine(work, over)
		if err != nil {
			return err
		}
		flockMed, psqlMed := stats["flock FILE true"].median, stats["psql same job"].median
		fmt.Printf("## Overhead: whole-process wall time of locking around `true` (%d runs after warm-up)\n\n", overheadRuns)
		fmt.Println("| contender | median | p90 | CPU (user+sys, mean) | ÷ flock | ÷ psql same job |")
		fmt.Println("|---|---:|---:|---:|---:|---:|")
		for _, c := range over {
			s := stats[c.name]
			fmt.Printf("| %s | %s | %s | %s | %.2f× | %.2f× |\n", c.name, ms(s.median), ms(s.p90), ms(s.cpu), s.median/flockMed, s.median/psqlMed)
			measured.set("wall", c.name, s.median)
			measured.set("cpu", c.name, s.cpu)
		}
		ratio := func(a, b string) float64 { return stats[a].median / stats[b].median }
		cpuRatio := func(a, b string) float64 { return stats[a].cpu / stats[b].cpu }
		npm, wpg := stats["npm withlock (postgres)"], stats["withlock postgres"]
		fmt.Printf("\nnpm withlock ÷ withlock postgres: %.1f× wall, %.1f× CPU\n", npm.median/wpg.median, npm.cpu/wpg.cpu)
		fmt.Printf("withlock postgres ÷ psql same job: %.2f× wall, %.2f× CPU; with TLS: %.2f× wall, %.2f× CPU\n",
			ratio("withlock postgres", "psql same job"), cpuRatio("withlock postgres", "psql same job"),
			ratio("withlock postgres, server with TLS", "psql same job, server with TLS"), cpuRatio("withlock postgres, server with TLS", "psql same job, server with TLS"))
		fmt.Printf("withlock postgres ÷ psql floor: %.2f× wall, %.2f× CPU\n", ratio("withlock postgres", "psql floor"), cpuRatio("withlock postgres", "psql floor"))
		fmt.Printf("withlock redis ÷ redis-cli script: %.2f×\n", ratio("withlock redis", "redis-cli script"))
		fmt.Printf("withlock version ÷ static Go hello-world: %.2f×\n", ratio("withlock version", "static Go hello-world"))
		fmt.Printf("withlock file ÷ flock: %.2f×\n", ratio("withlock file", "flock FILE true"))
		fmt.Printf("withlock mysql ÷ mysql client same job: %.2f×\n\n", ratio("withlock mysql", "mysql client same job"))
		if err := initByModule(wl); err != nil {
			return err
		}
		if err := stepsTable(work, wl, dbs); err != nil {
			return err
		}
	}

	// Hand-off: the holder's command exits -> the waiter's command starts.
	fmt.Printf("## Hand-off: holder's command exits → waiter's command starts (%d trials)\n\n", handoffTrials)
	fmt.Println("| contender | median | p90 | ÷ flock |")
	fmt.Println("|---|---:|---:|---:|")
	lockCmd := func(db string) func(cmd string) []string {
		if db == "" {
			return func(cmd string) []string { return []string{"flock", flockFile, "sh", "-c", cmd} }
		}
		return func(cmd string) []string { return []string{wl, "--db", db, "handoff", "--", "sh", "-c", cmd} }
	}
	rows := []handoffRow{{"flock", lockCmd("")}}
	withSetups := append(dbs[:len(dbs):len(dbs)], setups...)
	for _, db := range withSetups {
		rows = append(rows, handoffRow{"withlock " + db.name, lockCmd(db.url)})
	}
	rows = append(rows,
		handoffRow{"etcdctl lock (etcd)", func(cmd string) []string { return etcdctl("handoff", "sh", "-c", cmd) }},
		handoffRow{"psql", func(cmd string) []string { return psqlJob(psql, pgURL, 8, cmd) }},
		handoffRow{"redis-cli script", func(cmd string) []string { return redisCLIScript(rd.URL, "handoff", cmd) }},
	)
	// The mysql client holding GET_LOCK around the same commands.
	// The client ends a "system" command at the first ';': the command goes
	// in a file.
	scripts := 0
	script := func(cmd string) string {
		scripts++
		f := filepath.Join(work, fmt.Sprintf("mysql-client-%d.sh", scripts))
		os.WriteFile(f, []byte(cmd+"\n"), 0o644)
		return f
	}
	rows = append(rows, handoffRow{"mysql client", func(cmd string) []string {
		return mysqlClient("SELECT GET_LOCK('handoff', 3600); system sh " + script(cmd) + "; SELECT RELEASE_LOCK('handoff')")
	}})
	hand, err := handoffAll(work, rows)
	if err != nil {
		return err
	}
	for _, r := range rows {
		n := r.name
		fmt.Printf("| %s | %s | %s | %.2f× |\n", n, ms(hand[n].median), ms(hand[n].p90), hand[n].median/hand["flock"].median)
		collected.handoff = append(collected.handoff, bars{n, []float64{hand[n].median * 1000, hand[n].p90 * 1000}})
		measured.set("handoff", n, hand[n].median*1000)
		measured.set("handoff p90", n, hand[n].p90*1000)
	}
	if *onlyHandoff {
		return nil
	}

	// Contention: contenders processes, each acquiring in turn around a critical
	// section that notices overlaps.
	critical := criticalSection(work)
	conts := contentionRows(work, wl, withSetups)
	conts = append(conts,
		cont{"psql lock/command/unlock", acquisitions, psqlJob(psql, pgURL, 7, critical)},
		cont{"redis-cli script", acquisitions, redisCLIScript(rd.URL, "contention", critical)},
		cont{"mysql client lock/command/unlock", acquisitions, mysqlClient("SELECT GET_LOCK('contention', 3600); system sh " + script(critical) + "; SELECT RELEASE_LOCK('contention')")},
		cont{fmt.Sprintf("npm withlock (%d each)", npmAcquisition), npmAcquisition, []string{npmWithlock, "contention", "--db", pgURL, "--", "sh", "-c", critical}},
		cont{"etcdctl lock (etcd)", acquisitions, etcdctl("contention", "sh", "-c", critical)},
	)
	if err := contentionTable(work, conts); err != nil {
		return err
	}

	// Memory: peak RSS of withlock while it holds the lock. A semaphore's
	// and a shared lock's holders too (the same bound); a backend without
	// the mode has "-" there.
	fmt.Println("\n## Memory: peak RSS of withlock holding a lock for 1s")
	fmt.Println("\n| backend | peak RSS | holding a semaphore of 3 | holding a shared lock |")
	fmt.Println("|---|---:|---:|---:|")
	for _, db := range dbs {
		rss, err := peakRSS(wl, db.url)
		if err != nil {
			return err
		}
		measured.set("rss", db.name, float64(rss)/1024)
		inMode := func(table string, flags ...string) string {
			kb, err := peakRSS(wl, db.url, flags...)
			if err != nil {
				fmt.Fprintf(os.Stderr, "bench: %s %s: %v\n", db.name, strings.Join(flags, " "), err)
				return "-"
			}
			measured.set(table, db.name, float64(kb)/1024)
			return fmt.Sprintf("%.1f MB", float64(kb)/1024)
		}
		sem := inMode("rss semaphore", "--max-holders", "3")
		shared := "-"
		if slices.Contains(sharedBackends, db.name) {
			shared = inMode("rss shared", "--shared")
		}
		fmt.Printf("| %s | %.1f MB | %s | %s |\n", db.name, float64(rss)/1024, sem, shared)
	}
	if err := waitingOn(work, wl, dbs, servers{pg: pg, rd: rd, mg: mg, et: et, md: md, kube: kube, s3: s3}); err != nil {
		return err
	}
	fmt.Printf("\n%s", goalsTable(measured))
	return nil
}

// stepsTable measures what a lock across steps costs on each backend: a
// step that takes NAME (withlock acquire, which leaves a keeper) and one
// that releases it, beside the run form around true, which does both in
// one process; and with --detach lease on the backends that have leases.
func stepsTable(work, wl string, dbs []struct{ name, url string }) error {
	var cs []contender
	lease := map[string]bool{"redis": true, "mongodb": true, "etcd": true, "k8s": true, "s3": true}
	for _, db := range dbs {
		steps := func(flags string) []string {
			return []string{"sh", "-c", fmt.Sprintf(`H=$(%s acquire --db '%s' steps%s --max-hold 1m) && %s release --db '%s' --handle "$H"`, wl, db.url, flags, wl, db.url)}
		}
		cs = append(cs,
			contender{"run form " + db.name, []string{wl, "--db", db.url, "steps", "--", "true"}},
			contender{"acquire + release " + db.name, steps("")})
		if lease[db.name] {
			cs = append(cs, contender{"acquire --detach lease + release " + db.name, steps(" --detach lease")})
		}
	}
	stats, err := hyperfine(work, cs)
	if err != nil {
		return err
	}
	fmt.Printf("## Across steps: `withlock acquire` then `release --handle`, two steps, beside the run form around `true` (%d runs after warm-up)\n\n", overheadRuns)
	fmt.Println("| backend | run form | acquire + release (keeper) | ÷ run form | acquire + release (--detach lease) | ÷ run form |")
	fmt.Println("|---|---:|---:|---:|---:|---:|")
	for _, db := range dbs {
		run, keeper := stats["run form "+db.name], stats["acquire + release "+db.name]
		leaseCells := "- | -"
		if l, ok := stats["acquire --detach lease + release "+db.name]; ok {
			leaseCells = fmt.Sprintf("%s | %.2f×", ms(l.median), l.median/run.median)
			measured.set("steps lease", db.name, l.median)
		}
		fmt.Printf("| %s | %s | %s | %.2f× | %s |\n", db.name, ms(run.median), ms(keeper.median), keeper.median/run.median, leaseCells)
		measured.set("steps keeper", db.name, keeper.median)
	}
	fmt.Println()
	return nil
}

// stepsFigures is the steps table alone, on the file and PostgreSQL
// backends (bench -steps without -backends).
func stepsFigures(work, wl string, pg *testenv.Postgres) error {
	return stepsTable(work, wl, []struct{ name, url string }{
		{"file", "file://" + filepath.Join(work, "locks")},
		{"postgres", strings.Replace(pg.URL, "?sslmode=disable", "", 1)},
	})
}

// stepsOn starts the servers of the backends named, and measures the
// steps table on them alone (bench -steps -backends).
func stepsOn(work, wl string, names []string) error {
	_, dbs, stop, err := startServers(work, names)
	defer stop()
	if err != nil {
		return err
	}
	return stepsTable(work, wl, dbs)
}

// servers are the test servers of a run, for the waiting figure.
type servers struct {
	pg   *testenv.Postgres
	rd   *testenv.Redis
	mg   *testenv.Mongo
	et   *testenv.Etcd
	md   *testenv.MariaDB
	kube *testenv.Kube
	s3   *testenv.S3
}

// s3Bucket is the bucket of the bench's S3 server that its s3:// URL names.
const s3Bucket = "withlock-bench"

// startS3 starts an S3 server with an empty bucket s3Bucket, made as the
// tests make theirs (a directory of its Root), and returns the s3:// URL of
// the bucket, with the server's keys.
func startS3() (*testenv.S3, string, error) {
	s, err := testenv.StartS3()
	if err != nil {
		return nil, "", err
	}
	if err := os.Mkdir(filepath.Join(s.Root, s3Bucket), 0o755); err != nil {
		s.Close()
		return nil, "", err
	}
	return s, s.URL(s3Bucket), nil
}

// startKube starts a kube-apiserver with a namespace "bench" where the
// user leaser may use Leases, and points $KUBECONFIG (which every withlock
// the bench starts inherits) at it, as leaser. It returns the k8s:// URL.
func startKube(work string) (*testenv.Kube, string, error) {
	k, err := testenv.StartKube()
	if err != nil {
		return nil, "", err
	}
	kc := filepath.Join(work, "kubeconfig")
	err = errors.Join(k.Namespace("bench"), k.Grant("bench", "leaser"))
	if err == nil {
		err = k.Kubeconfig(kc, "bench", k.UserToken("leaser"))
	}
	if err != nil {
		k.Close()
		return nil, "", err
	}
	os.Setenv("KUBECONFIG", kc)
	os.Setenv("KUBERNETES_SERVICE_HOST", "")
	return k, "k8s://bench", nil
}

// waitingFigures starts the servers of the backends named, and measures
// what waiters cost them.
func waitingFigures(work, wl string, names []string) error {
	s, dbs, stop, err := startServers(work, names)
	defer stop()
	if err != nil {
		return err
	}
	return waitingOn(work, wl, dbs, s)
}

// handoffFigures starts the servers of the backends named, and measures
// their hand-off beside flock's, PostgreSQL's beside psql's and etcd's
// beside etcdctl lock's: the hand-off table's rows of those backends alone.
func handoffFigures(work, wl string, names []string) error {
	s, dbs, stop, err := startServers(work, names)
	defer stop()
	if err != nil {
		return err
	}
	flockFile := filepath.Join(work, "flock.lock")
	rows := []handoffRow{{"flock", func(cmd string) []string { return []string{"flock", flockFile, "sh", "-c", cmd} }}}
	for _, db := range dbs {
		rows = append(rows, handoffRow{"withlock " + db.name, func(cmd string) []string {
			return []string{wl, "--db", db.url, "handoff", "--", "sh", "-c", cmd}
		}})
	}
	if s.pg != nil {
		psql, err := realPsql()
		if err != nil {
			return err
		}
		rows = append(rows, handoffRow{"psql", func(cmd string) []string { return psqlJob(psql, s.pg.URL, 8, cmd) }})
	}
	if s.et != nil {
		rows = append(rows, handoffRow{"etcdctl lock (etcd)", func(cmd string) []string {
			return []string{"etcdctl", "--endpoints", s.et.Endpoint, "lock", "handoff", "--", "sh", "-c", cmd}
		}})
	}
	hand, err := handoffAll(work, rows)
	if err != nil {
		return err
	}
	fmt.Printf("## Hand-off: holder's command exits → waiter's command starts (%d trials)\n\n", handoffTrials)
	fmt.Println("| contender | median | p90 | ÷ flock |")
	fmt.Println("|---|---:|---:|---:|")
	for _, r := range rows {
		h := hand[r.name]
		fmt.Printf("| %s | %s | %s | %.2f× |\n", r.name, ms(h.median), ms(h.p90), h.median/hand["flock"].median)
	}
	return nil
}

// contentionFigures starts the servers of the backends named, and measures
// their contention beside flock's, PostgreSQL's beside psql's loop and
// etcd's beside etcdctl lock's: the contention table's rows of those
// backends alone.
func contentionFigures(work, wl string, names []string) error {
	s, dbs, stop, err := startServers(work, names)
	defer stop()
	if err != nil {
		return err
	}
	conts := contentionRows(work, wl, dbs)
	if s.pg != nil {
		psql, err := realPsql()
		if err != nil {
			return err
		}
		conts = append(conts, cont{"psql lock/command/unlock", acquisitions, psqlJob(psql, s.pg.URL, 7, criticalSection(work))})
	}
	if s.et != nil {
		// etcd's goal is etcdctl lock's rate: measured beside it.
		conts = append(conts, cont{"etcdctl lock (etcd)", acquisitions, []string{"etcdctl", "--endpoints", s.et.Endpoint, "lock", "contention", "--", "sh", "-c", criticalSection(work)}})
	}
	return contentionTable(work, conts)
}

// cont is a contender of the contention table: n acquisitions each, argv
// the command that acquires once around the critical section.
type cont struct {
	name string
	n    int
	argv []string
}

// criticalSection is the contention table's command under the lock: it
// notices an overlap, in work/overlaps, when two run at once.
func criticalSection(work string) string {
	return fmt.Sprintf("mkdir %[1]s/inside 2>/dev/null || echo x >> %[1]s/overlaps; sleep 0.002; rmdir %[1]s/inside", work)
}

// psqlJob is psql doing withlock's job in one session: it takes the
// advisory lock key, runs the shell command cmd (\! runs it as sh -c does)
// and unlocks.
func psqlJob(psql, url string, key int, cmd string) []string {
	return []string{psql, "-q", url, "-c", fmt.Sprintf("select pg_advisory_lock(%d)", key), "-c", `\! ` + cmd, "-c", fmt.Sprintf("select pg_advisory_unlock(%d)", key)}
}

// redisCLIScript is the lock people script with redis-cli: SET NX with an
// expiry and a value of its own, tried every 10 ms until it is set, then
// the shell command cmd, then a compare-and-delete, so that a lock that
// ran out and was taken by another is not deleted.
func redisCLIScript(url, key, cmd string) []string {
	script := fmt.Sprintf(`until [ "$(redis-cli -u %[1]s SET %[2]s $$ NX PX 30000)" = OK ]; do sleep 0.01; done
%[3]s
redis-cli -u %[1]s EVAL "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0" 1 %[2]s $$ >/dev/null`, url, key, cmd)
	return []string{"sh", "-c", script}
}

// contentionRows are flock's row and withlock's rows on dbs of the
// contention table.
func contentionRows(work, wl string, dbs []struct{ name, url string }) []cont {
	critical := criticalSection(work)
	conts := []cont{{"flock", acquisitions, []string{"flock", filepath.Join(work, "flock.lock"), "sh", "-c", critical}}}
	for _, db := range dbs {
		conts = append(conts, cont{"withlock " + db.name, acquisitions, []string{wl, "--db", db.url, "contention", "--", "sh", "-c", critical}})
	}
	return conts
}

// contentionTable measures and prints the contention of conts, their
// rounds in turn (contentionRounds); a row's rate is its acquisitions over
// the time its rounds took.
func contentionTable(work string, conts []cont) error {
	fmt.Printf("\n## Contention: %d processes × %d acquisitions of one lock, 2 ms critical section\n\n", contenders, acquisitions)
	fmt.Println("| contender | acquisitions/s | overlaps |")
	fmt.Println("|---|---:|---:|")
	type tally struct {
		acquired int
		took     float64 // seconds
		overlaps int
	}
	tallies := make([]tally, len(conts))
	for range contentionRounds {
		for i, c := range conts {
			n := max(1, c.n/contentionRounds)
			rate, overlaps, err := contention(work, n, c.argv)
			if err != nil {
				return fmt.Errorf("%s: %w", c.name, err)
			}
			t := &tallies[i]
			t.acquired += contenders * n
			t.took += float64(contenders*n) / rate
			t.overlaps += overlaps
		}
	}
	for i, c := range conts {
		t := tallies[i]
		rate := float64(t.acquired) / t.took
		fmt.Printf("| %s | %.1f | %d |\n", c.name, rate, t.overlaps)
		collected.contention = append(collected.contention, bars{c.name, []float64{rate}})
		measured.set("contention", c.name, rate)
	}
	return nil
}

// redisSetups are the Redis set-ups that the hand-off and contention tables
// measure beside the single server ("redis"); -backends names them too.
var redisSetups = []redisSetup{
	{"redis cluster", func() (string, func() error, error) {
		c, err := testenv.StartRedisCluster() // three masters
		if err != nil {
			return "", nil, err
		}
		return c.URL, c.Close, nil
	}},
	{"redis sentinel", func() (string, func() error, error) {
		s, err := testenv.StartRedisSentinel() // a master, a replica, three Sentinels
		if err != nil {
			return "", nil, err
		}
		return s.URL, s.Close, nil
	}},
}

// redisSetup is a Redis set-up of the bench: start starts its servers and
// returns the URL that reaches them, and stop, which stops them.
type redisSetup struct {
	name  string
	start func() (url string, stop func() error, err error)
}

// redisSetupNames lists the names of redisSetups, quoted, for -backends.
func redisSetupNames() string {
	var names []string
	for _, r := range redisSetups {
		names = append(names, strconv.Quote(r.name))
	}
	return strings.Join(names, ", ")
}

// startServers starts the servers of the backends named; stop stops those
// that started, also when err says why the others did not.
func startServers(work string, names []string) (s servers, dbs []struct{ name, url string }, stop func(), err error) {
	var closers []func() error
	stop = func() {
		for _, c := range slices.Backward(closers) {
			c()
		}
	}
	for _, n := range names {
		url := ""
		switch n {
		case "file":
			url = "file://" + filepath.Join(work, "locks")
		case "postgres":
			if s.pg, err = testenv.StartPostgres(); err == nil {
				closers = append(closers, s.pg.Close)
				url = s.pg.URL
			}
		case "redis":
			if s.rd, err = testenv.StartRedis(); err == nil {
				closers = append(closers, s.rd.Close)
				url = s.rd.URL
			}
		case "mongodb":
			if s.mg, err = testenv.StartMongo(); err == nil {
				closers = append(closers, s.mg.Close)
				url = s.mg.URL
			}
		case "etcd":
			if s.et, err = testenv.StartEtcd(); err == nil {
				closers = append(closers, s.et.Close)
				url = s.et.URL
			}
		case "mysql":
			if s.md, err = testenv.StartMariaDB(); err == nil {
				closers = append(closers, s.md.Close)
				url = s.md.URL
			}
		case "k8s":
			if s.kube, url, err = startKube(work); err == nil {
				closers = append(closers, s.kube.Close)
			}
		case "s3":
			if s.s3, url, err = startS3(); err == nil {
				closers = append(closers, s.s3.Close)
			}
		default:
			i := slices.IndexFunc(redisSetups, func(r redisSetup) bool { return r.name == n })
			if i < 0 {
				err = fmt.Errorf("-backends: no backend %q; name one of %s, %s", n, strings.Join(backends, ", "), redisSetupNames())
				break
			}
			var stopSetup func() error
			if url, stopSetup, err = redisSetups[i].start(); err == nil {
				closers = append(closers, stopSetup)
			}
		}
		if err != nil {
			return s, nil, stop, err
		}
		dbs = append(dbs, struct{ name, url string }{n, url})
	}
	return s, dbs, stop, nil
}

// flagGiven reports whether the flag name was on the command line.
func flagGiven(name string) bool {
	given := false
	flag.Visit(func(f *flag.Flag) { given = given || f.Name == name })
	return given
}

// waitingOn measures what waiters cost the servers of dbs.
func waitingOn(work, wl string, dbs []struct{ name, url string }, s servers) error {
	var targets []waitTarget
	for _, db := range dbs {
		t := waitTarget{name: db.name, url: db.url}
		var closeOps func()
		var err error
		switch db.name {
		case "postgres":
			t.pid, t.counter = s.pg.PID(), "transactions (pg_stat_database xact_commit + xact_rollback)"
			t.ops, closeOps, err = postgresOps(db.url)
		case "redis":
			t.pid, t.counter = s.rd.PID(), "commands (INFO stats total_commands_processed)"
			t.ops, closeOps, err = redisOps(db.url)
		case "mongodb":
			t.pid, t.counter = s.mg.PID(), "commands (serverStatus metrics.commands)"
			t.ops, closeOps, err = mongoOps(db.url)
		case "etcd":
			t.pid, t.counter = s.et.PID(), "gRPC messages received (/metrics grpc_server_msg_received_total)"
			t.ops = etcdOps(s.et.Port)
		case "mysql":
			t.pid, t.counter = s.md.PID(), "statements (SHOW GLOBAL STATUS Questions)"
			t.ops = mysqlOps(db.url)
		case "k8s":
			t.pid, t.counter = s.kube.PID(), "requests (/metrics apiserver_request_total)"
			t.ops, err = kubeOps(s.kube)
		case "s3":
			t.pid, t.counter = s.s3.PID(), "requests (counted by a proxy in front of versitygw)"
			t.url, t.ops, closeOps, err = s3Ops(s.s3, db.url)
		case "file": // no server
		default:
			return fmt.Errorf("-waiting: %s: not measured; name among %s", db.name, strings.Join(backends, ", "))
		}
		if err != nil {
			return fmt.Errorf("%s: counting operations: %w", db.name, err)
		}
		if closeOps != nil {
			defer closeOps()
		}
		targets = append(targets, t)
	}
	return waitingTable(work, wl, targets)
}

type summary struct{ median, p90, cpu float64 } // seconds; cpu: mean user + sys

func summarize(xs []float64) summary {
	slices.Sort(xs)
	at := func(q float64) float64 { return xs[int(math.Ceil(q*float64(len(xs))))-1] }
	return summary{median: at(0.5), p90: at(0.9)}
}

func ms(s float64) string { return fmt.Sprintf("%.2f ms", s*1000) }

// buildHello builds a static Go hello-world, the floor of any Go program's
// start, which withlock version is measured against.
func buildHello(work string) (string, error) {
	dir := filepath.Join(work, "hello")
	os.MkdirAll(dir, 0o755)
	os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module hello\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "main.go"), []byte("package main\n\nimport \"fmt\"\n\nfunc main() { fmt.Println(\"hello\") }\n"), 0o644)
	build := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w", "-o", "hello", ".")
	build.Dir, build.Env = dir, append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=", "GOWORK=off")
	if out, err := build.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build hello-world: %v\n%s", err, out)
	}
	return filepath.Join(dir, "hello"), nil
}

// hyperfine times every contender in one hyperfine run.
func hyperfine(work string, cs []contender) (map[string]summary, error) {
	out := filepath.Join(work, "hyperfine.json")
	args := []string{"-N", "--warmup", "5", "--runs", strconv.Itoa(overheadRuns), "--export-json", out, "--style", "none"}
	for _, c := range cs {
		args = append(args, "-n", c.name, shellJoin(c.argv))
	}
	cmd := exec.Command("hyperfine", args...)
	cmd.Stderr = os.Stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("hyperfine: %w", err)
	}
	data, err := os.ReadFile(out)
	if err != nil {
		return nil, err
	}
	var res struct {
		Results []struct {
			Command string    `json:"command"`
			Times   []float64 `json:"times"`
			User    float64   `json:"user"`
			System  float64   `json:"system"`
		} `json:"results"`
	}
	if err := json.Unmarshal(data, &res); err != nil {
		return nil, err
	}
	m := map[string]summary{}
	for _, r := range res.Results {
		sum := summarize(r.Times)
		sum.cpu = r.User + r.System
		m[r.Command] = sum
	}
	return m, nil
}

// handoffRow is a contender of the hand-off table: lockCmd(cmd) runs the
// shell command cmd under its lock.
type handoffRow struct {
	name    string
	lockCmd func(cmd string) []string
}

// handoffAll measures the hand-off of every row, handoffTrials times, one
// trial of each row in turn, so that a busy moment of the machine falls on
// every row alike rather than on the row that was measuring then.
func handoffAll(work string, rows []handoffRow) (map[string]summary, error) {
	lat := map[string][]float64{}
	for range handoffTrials {
		for _, r := range rows {
			d, err := handoff(work, r.lockCmd)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", r.name, err)
			}
			lat[r.name] = append(lat[r.name], d)
		}
	}
	hand := map[string]summary{}
	for n, xs := range lat {
		hand[n] = summarize(xs)
	}
	return hand, nil
}

// handoff is one trial: the time, in seconds, from the end of the holder's
// command to the start of the waiter's, under lockCmd's lock.
func handoff(work string, lockCmd func(cmd string) []string) (float64, error) {
	dir := filepath.Join(work, "handoff")
	os.RemoveAll(dir)
	os.MkdirAll(dir, 0o755)
	f := func(n string) string { return filepath.Join(dir, n) }
	holder := command(lockCmd(fmt.Sprintf("echo x > %s; sleep 0.3; date +%%s%%N > %s", f("held"), f("end"))))
	if err := holder.Start(); err != nil {
		return 0, err
	}
	for !exists(f("held")) {
		time.Sleep(2 * time.Millisecond)
	}
	waiter := command(lockCmd(fmt.Sprintf("date +%%s%%N > %s", f("start"))))
	if err := waiter.Start(); err != nil {
		return 0, err
	}
	if err := holder.Wait(); err != nil {
		return 0, fmt.Errorf("holder: %w", err)
	}
	if err := waiter.Wait(); err != nil {
		return 0, fmt.Errorf("waiter: %w", err)
	}
	end, start := readNanos(f("end")), readNanos(f("start"))
	return float64(start-end) / 1e9, nil
}

// contention runs contenders processes, each running argv n times in turn,
// and returns acquisitions per second and the overlaps the critical section
// noticed.
func contention(work string, n int, argv []string) (float64, int, error) {
	os.Remove(filepath.Join(work, "overlaps"))
	var wg sync.WaitGroup
	var failed atomic.Value
	start := time.Now()
	for p := 0; p < contenders; p++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < n; i++ {
				if err := command(argv).Run(); err != nil {
					failed.Store(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	took := time.Since(start)
	if err, _ := failed.Load().(error); err != nil {
		return 0, 0, err
	}
	overlaps := 0
	if data, err := os.ReadFile(filepath.Join(work, "overlaps")); err == nil {
		overlaps = strings.Count(string(data), "\n")
	}
	return float64(contenders*n) / took.Seconds(), overlaps, nil
}

// peakRSS is the maximum resident set size of withlock holding a lock for
// a second, as /usr/bin/time -v reports it (the largest process: withlock);
// flags are withlock's (a mode).
func peakRSS(wl, db string, flags ...string) (int, error) {
	argv := append([]string{"-v", wl, "--db", db}, flags...)
	argv = append(argv, "memory", "--", "sleep", "1")
	out, err := exec.Command("/usr/bin/time", argv...).CombinedOutput()
	if err != nil {
		// withlock's own lines say why, else all of time's output.
		if said := regexp.MustCompile(`(?m)^withlock: .*$`).FindAll(out, -1); said != nil {
			out = bytes.Join(said, []byte("; "))
		}
		return 0, fmt.Errorf("time -v: %w: %s", err, out)
	}
	m := regexp.MustCompile(`Maximum resident set size \(kbytes\): (\d+)`).FindSubmatch(out)
	if m == nil {
		return 0, fmt.Errorf("time -v said no peak RSS: %s", out)
	}
	return strconv.Atoi(string(m[1]))
}

func command(argv []string) *exec.Cmd {
	c := exec.Command(argv[0], argv[1:]...)
	c.Stderr = os.Stderr
	return c
}

func exists(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Size() > 0
}

func readNanos(path string) int64 {
	data, _ := os.ReadFile(path)
	n, _ := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
	return n
}

// shellJoin quotes argv for hyperfine, which splits its commands like a shell.
func shellJoin(argv []string) string {
	q := make([]string, len(argv))
	for i, a := range argv {
		q[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	return strings.Join(q, " ")
}

// realPsql finds the psql binary itself: Debian's /usr/bin/psql is a Perl
// wrapper that would add its own start-up to the floor.
func realPsql() (string, error) {
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin/psql")
	if len(matches) == 0 {
		return "", fmt.Errorf("no psql in /usr/lib/postgresql/*/bin; apt-get install postgresql-client")
	}
	slices.Sort(matches)
	return matches[len(matches)-1], nil
}

// ensureTools installs hyperfine and GNU time when missing (as root).
func ensureTools() error {
	var missing []string
	if _, err := exec.LookPath("hyperfine"); err != nil {
		missing = append(missing, "hyperfine")
	}
	if _, err := os.Stat("/usr/bin/time"); err != nil {
		missing = append(missing, "time")
	}
	if len(missing) == 0 {
		return nil
	}
	if os.Geteuid() != 0 {
		return fmt.Errorf("missing %s: run apt-get install %s as root", strings.Join(missing, ", "), strings.Join(missing, " "))
	}
	fmt.Fprintln(os.Stderr, "bench: installing", strings.Join(missing, " "))
	for _, args := range [][]string{{"update", "-qq"}, append([]string{"install", "-y", "-qq"}, missing...)} {
		c := exec.Command("apt-get", args...)
		c.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
		if out, err := c.CombinedOutput(); err != nil {
			return fmt.Errorf("apt-get %s: %w: %s", args[0], err, out)
		}
	}
	return nil
}

func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return "unknown CPU"
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if k, v, ok := strings.Cut(s.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "unknown CPU"
}

func numCPU() int {
	data, _ := os.ReadFile("/proc/cpuinfo")
	return strings.Count(string(data), "processor\t:")
}

func size(path string) string {
	fi, err := os.Stat(path)
	if err != nil {
		return "?"
	}
	return fmt.Sprintf("%.1f MB", float64(fi.Size())/1e6)
}
