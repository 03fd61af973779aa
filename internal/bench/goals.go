package main

import (
	"fmt"
	"math"
	"strings"
)

// results are the figures of a run the goals are judged by, each under
// its table and its row's name as the table prints it: "wall" and "cpu"
// (overhead, seconds), "handoff" and "handoff p90" (ms), "contention"
// (acquisitions/s), "rss", "rss semaphore" and "rss shared" (MB, by
// backend), "waiter cpu" (% of a core per waiter, by backend).
type results map[[2]string]float64

var measured = results{}

func (r results) set(table, row string, v float64) { r[[2]string{table, row}] = v }

// get is a figure of the run, NaN when the run did not take it.
func (r results) get(table, row string) float64 {
	if v, ok := r[[2]string{table, row}]; ok {
		return v
	}
	return math.NaN()
}

// ratio is table's figure of a ÷ b's.
func (r results) ratio(table, a, b string) float64 {
	return r.get(table, a) / r.get(table, b)
}

// worst is the largest figure of table over rows, and its row; NaN when
// one is missing.
func (r results) worst(table string, rows []string) (float64, string) {
	v, at := math.Inf(-1), ""
	for _, row := range rows {
		x := r.get(table, row)
		if math.IsNaN(x) {
			return x, row
		}
		if x > v {
			v, at = x, row
		}
	}
	return v, at
}

// backends are every backend the bench measures.
var backends = []string{"file", "postgres", "redis", "mongodb", "etcd", "mysql", "k8s", "s3"}

// sharedBackends are those of backends with shared locks (--shared).
var sharedBackends = []string{"file", "postgres", "redis", "mongodb", "etcd"}

// A goal is one line of the product's performance contract, judged by a
// figure of the run: at most limit (at least, with atLeast). measure
// returns the figure and, when it is the worst of several, where it was
// taken; nil when the bench does not take the figure the goal needs.
type goal struct {
	text    string
	format  string // of the figure
	limit   float64
	atLeast bool
	measure func(r results) (float64, string)
}

// ratioOf measures a goal by table's figure of a ÷ b's.
func ratioOf(table, a, b string) func(results) (float64, string) {
	return func(r results) (float64, string) { return r.ratio(table, a, b), "" }
}

var goals = []goal{
	{"PostgreSQL: wall time at most 1.0× psql locking, running the command and unlocking, server without TLS", "%.2f×", 1, false,
		ratioOf("wall", "withlock postgres", "psql same job")},
	{"PostgreSQL: wall time at most 1.0× psql locking, running the command and unlocking, server with TLS", "%.2f×", 1, false,
		ratioOf("wall", "withlock postgres, server with TLS", "psql same job, server with TLS")},
	{"PostgreSQL: CPU time at most psql's for the same job, server without TLS", "%.2f×", 1, false,
		ratioOf("cpu", "withlock postgres", "psql same job")},
	{"PostgreSQL: CPU time at most psql's for the same job, server with TLS", "%.2f×", 1, false,
		ratioOf("cpu", "withlock postgres, server with TLS", "psql same job, server with TLS")},
	{"PostgreSQL: the npm withlock's wall time at least 10× withlock's", "%.1f×", 10, true,
		ratioOf("wall", "npm withlock (postgres)", "withlock postgres")},
	{"etcd: wall time at most 1.0× `etcdctl lock NAME -- true`", "%.2f×", 1, false,
		ratioOf("wall", "withlock etcd", "etcdctl lock (etcd)")},
	{"Redis: wall time at most 1.0× redis-cli's SET NX, the command, and a compare-and-delete script", "%.2f×", 1, false,
		ratioOf("wall", "withlock redis", "redis-cli script")},
	{"MySQL: wall time at most 1.0× the mysql client's GET_LOCK, the command, and RELEASE_LOCK", "%.2f×", 1, false,
		ratioOf("wall", "withlock mysql", "mysql client same job")},
	{"Start-up: `withlock version` at most 8× a static Go hello-world, quiet machine", "%.2f×", 8, false,
		ratioOf("wall", "withlock version", "static Go hello-world")},
	{"Start-up: `file://` at most 8× flock(1), quiet machine", "%.2f×", 8, false,
		ratioOf("wall", "withlock file", "flock FILE true")},
	{"Hand-off, file: median at most flock's", "%.2f×", 1, false,
		ratioOf("handoff", "withlock file", "flock")},
	{"Hand-off, PostgreSQL: median at most psql's", "%.2f×", 1, false,
		ratioOf("handoff", "withlock postgres", "psql")},
	{"Hand-off, etcd: median at most etcdctl lock's", "%.2f×", 1, false,
		ratioOf("handoff", "withlock etcd", "etcdctl lock (etcd)")},
	{"Hand-off, MySQL: median at most the mysql client's", "%.2f×", 1, false,
		ratioOf("handoff", "withlock mysql", "mysql client")},
	{"Hand-off: median and p90 under 1 s, every backend", "%.2f ms", 1000, false,
		func(r results) (float64, string) { // a p90 is at least its median
			v, at := r.worst("handoff p90", prefixed("withlock ", backends))
			return v, strings.TrimPrefix(at, "withlock ") + " p90"
		}},
	{"Hand-off, MongoDB: p90 under 100 ms", "%.2f ms", 100, false,
		func(r results) (float64, string) { return r.get("handoff p90", "withlock mongodb"), "" }},
	{"Contention, 16 contenders: acquisitions/s at least flock's, file", "%.2f×", 1, true,
		ratioOf("contention", "withlock file", "flock")},
	{"Contention, 16 contenders: acquisitions/s at least psql's, PostgreSQL", "%.2f×", 1, true,
		ratioOf("contention", "withlock postgres", "psql lock/command/unlock")},
	{"Contention, 16 contenders: acquisitions/s at least etcdctl lock's, etcd", "%.2f×", 1, true,
		ratioOf("contention", "withlock etcd", "etcdctl lock (etcd)")},
	{"Contention, 16 contenders: acquisitions/s at least the mysql client's, MySQL", "%.2f×", 1, true,
		ratioOf("contention", "withlock mysql", "mysql client lock/command/unlock")},
	{fmt.Sprintf("Waiting: server CPU at most 0.1%% of a core per waiter, every backend with a server (measured with %d waiters, not 100)", waiters),
		"%.2f%%", 0.1, false,
		func(r results) (float64, string) { return r.worst("waiter cpu", backends[1:]) }}, // file has no server
	{"Memory: peak RSS of a holding withlock at most 20 MB, every backend, exclusive", "%.1f MB", 20, false,
		func(r results) (float64, string) { return r.worst("rss", backends) }},
	{"Memory: peak RSS of a holding withlock at most 20 MB, every backend, a semaphore of 3", "%.1f MB", 20, false,
		func(r results) (float64, string) { return r.worst("rss semaphore", backends) }},
	{"Memory: peak RSS of a holding withlock at most 20 MB, every backend with shared locks, shared", "%.1f MB", 20, false,
		func(r results) (float64, string) { return r.worst("rss shared", sharedBackends) }},
}

func prefixed(prefix string, names []string) []string {
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = prefix + n
	}
	return out
}

// judge is a goal's figure, as the table prints it, and its verdict:
// met, missed or not measured.
func (g goal) judge(r results) (figure, verdict string) {
	if g.measure == nil {
		return "–", "not measured"
	}
	v, at := g.measure(r)
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return "–", "not measured"
	}
	figure = fmt.Sprintf(g.format, v)
	if at != "" {
		figure += " (" + at + ")"
	}
	if g.atLeast && v >= g.limit || !g.atLeast && v <= g.limit {
		return figure, "met"
	}
	return figure, "missed"
}

// goalsTable is the Goals section: every goal, the run's figure for it and
// whether it is met.
func goalsTable(r results) string {
	var b strings.Builder
	count := map[string]int{}
	fmt.Fprintf(&b, "## Goals\n\n")
	fmt.Fprintf(&b, "The performance goals, each judged by this run's figures above.\n\n")
	fmt.Fprintf(&b, "| goal | measured | verdict |\n|---|---:|---|\n")
	for _, g := range goals {
		figure, verdict := g.judge(r)
		count[verdict]++
		fmt.Fprintf(&b, "| %s | %s | %s |\n", g.text, figure, verdict)
	}
	fmt.Fprintf(&b, "\nThis run meets %d of the %d goals, misses %d, and does not measure %d.\n", count["met"], len(goals), count["missed"], count["not measured"])
	return b.String()
}
