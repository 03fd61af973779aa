package main

import (
	"slices"
	"strings"
	"testing"
)

// figures as a run records them (a run of 2026-11-26, in milliseconds for
// the wall and CPU times; only ratios of them are judged; S3's hand-off
// from a run of 2026-12-05 on a busy machine).
func sampleResults() results {
	r := results{}
	for name, v := range map[string][2]float64{
		"static Go hello-world":              {1.40, 1.09},
		"withlock version":                   {4.04, 3.84},
		"flock FILE true":                    {1.55, 1.44},
		"withlock file":                      {5.51, 5.07},
		"withlock postgres":                  {11.67, 7.33},
		"withlock etcd":                      {9.24, 6.72},
		"withlock postgres, server with TLS": {13.30, 8.80},
		"psql same job":                      {13.88, 10.93},
		"psql same job, server with TLS":     {18.73, 15.00},
		"withlock redis":                     {7.82, 7.90},
		"redis-cli script":                   {12.10, 6.05},
		"npm withlock (postgres)":            {163.62, 159.98},
		"etcdctl lock (etcd)":                {10.64, 9.53},
	} {
		r.set("wall", name, v[0])
		r.set("cpu", name, v[1])
	}
	for name, v := range map[string][2]float64{
		"flock":               {2.02, 3.41},
		"withlock file":       {2.93, 3.77},
		"withlock postgres":   {3.34, 4.69},
		"withlock redis":      {3.31, 7.28},
		"withlock mongodb":    {45.01, 87.32},
		"withlock etcd":       {6.53, 14.29},
		"withlock mysql":      {3.19, 4.36},
		"withlock k8s":        {15.73, 27.33},
		"withlock s3":         {25.92, 40.90},
		"etcdctl lock (etcd)": {3.77, 9.20},
		"mysql client":        {3.08, 5.11},
		"psql":                {3.10, 4.02},
	} {
		r.set("handoff", name, v[0])
		r.set("handoff p90", name, v[1])
	}
	for name, v := range map[string]float64{
		"flock": 109.3, "withlock file": 110.3, "withlock postgres": 59.5, "withlock etcd": 66.6,
		"withlock mysql": 123.0, "psql lock/command/unlock": 86.4,
		"mysql client lock/command/unlock": 118.2, "etcdctl lock (etcd)": 86.0,
	} {
		r.set("contention", name, v)
	}
	for _, b := range backends {
		r.set("rss", b, 13)
		r.set("rss semaphore", b, 13)
		if slices.Contains(sharedBackends, b) {
			r.set("rss shared", b, 13.5)
		}
		if b != "file" {
			r.set("waiter cpu", b, 0.03)
		}
	}
	r.set("rss", "postgres", 14.7)
	r.set("waiter cpu", "mongodb", 0.40)
	return r
}

// judged is the figure and verdict of the goal whose text starts so.
func judged(t *testing.T, r results, text string) (string, string) {
	t.Helper()
	for _, g := range goals {
		if strings.HasPrefix(g.text, text) {
			return g.judge(r)
		}
	}
	t.Fatalf("no goal %q", text)
	return "", ""
}

func TestGoals(t *testing.T) {
	r := sampleResults()
	for _, c := range []struct{ goal, figure, verdict string }{
		{"PostgreSQL: wall time at most 1.0× psql locking, running the command and unlocking, server without", "0.84×", "met"},
		{"PostgreSQL: wall time at most 1.0× psql locking, running the command and unlocking, server with TLS", "0.71×", "met"},
		{"PostgreSQL: CPU time at most psql's for the same job, server without", "0.67×", "met"},
		{"PostgreSQL: the npm withlock's wall time at least 10×", "14.0×", "met"},
		{"etcd:", "0.87×", "met"},
		{"Redis:", "0.65×", "met"},
		{"MySQL:", "–", "not measured"},
		{"Start-up: `withlock version`", "2.89×", "met"},
		{"Start-up: `file://`", "3.55×", "met"},
		{"Hand-off, file:", "1.45×", "missed"},
		{"Hand-off, PostgreSQL:", "1.08×", "missed"},
		{"Hand-off, MySQL:", "1.04×", "missed"},
		{"Hand-off: median and p90 under 1 s", "87.32 ms (mongodb p90)", "met"},
		{"Hand-off, MongoDB: p90 under 100 ms", "87.32 ms", "met"},
		{"Contention, 16 contenders: acquisitions/s at least flock's", "1.01×", "met"},
		{"Contention, 16 contenders: acquisitions/s at least psql's", "0.69×", "missed"},
		{"Waiting:", "0.40% (mongodb)", "missed"},
		{"Memory: peak RSS of a holding withlock at most 20 MB, every backend, exclusive", "14.7 MB (postgres)", "met"},
		{"Memory: peak RSS of a holding withlock at most 20 MB, every backend with shared locks, shared", "13.5 MB (file)", "met"},
	} {
		figure, verdict := judged(t, r, c.goal)
		if figure != c.figure || verdict != c.verdict {
			t.Errorf("%s: %s, %s; want %s, %s", c.goal, figure, verdict, c.figure, c.verdict)
		}
	}
}

// The hand-off goal holds every backend to it, S3, whose waiters poll,
// among them: its p90 over 1 s misses the goal, and a run without it does
// not measure the goal.
func TestHandoffGoalTakesS3(t *testing.T) {
	r := sampleResults()
	r.set("handoff p90", "withlock s3", 1200)
	if figure, v := judged(t, r, "Hand-off: median and p90 under 1 s"); figure != "1200.00 ms (s3 p90)" || v != "missed" {
		t.Errorf("S3's p90 at 1.2 s: %s, %s; want 1200.00 ms (s3 p90), missed", figure, v)
	}
	delete(r, [2]string{"handoff p90", "withlock s3"})
	if figure, v := judged(t, r, "Hand-off: median and p90 under 1 s"); figure != "–" || v != "not measured" {
		t.Errorf("without S3's hand-off: %s, %s; want not measured", figure, v)
	}
}

// A goal's limit is met when the figure equals it, in either direction.
func TestGoalLimitIsMet(t *testing.T) {
	r := results{}
	r.set("wall", "withlock etcd", 10)
	r.set("wall", "etcdctl lock (etcd)", 10)
	r.set("contention", "withlock file", 50)
	r.set("contention", "flock", 50)
	if _, v := judged(t, r, "etcd:"); v != "met" {
		t.Errorf("etcd at 1.00×: %s", v)
	}
	if _, v := judged(t, r, "Contention, 16 contenders: acquisitions/s at least flock's"); v != "met" {
		t.Errorf("file at 1.00× flock: %s", v)
	}
	r.set("contention", "withlock file", 49.9)
	if _, v := judged(t, r, "Contention, 16 contenders: acquisitions/s at least flock's"); v != "missed" {
		t.Errorf("file under flock: %s", v)
	}
}

// A figure the run lacks, even one backend's of several, is not measured,
// never a verdict.
func TestGoalWithoutFigures(t *testing.T) {
	r := sampleResults()
	delete(r, [2]string{"waiter cpu", "k8s"})
	delete(r, [2]string{"wall", "psql same job"})
	delete(r, [2]string{"rss shared", "etcd"})
	for _, text := range []string{"Waiting:", "PostgreSQL: wall time at most 1.0× psql locking, running the command and unlocking, server without", "Memory: peak RSS of a holding withlock at most 20 MB, every backend with shared locks"} {
		if figure, v := judged(t, r, text); figure != "–" || v != "not measured" {
			t.Errorf("%s: %s, %s", text, figure, v)
		}
	}
	for _, g := range goals {
		if figure, v := g.judge(results{}); figure != "–" || v != "not measured" {
			t.Errorf("%s, with no figures: %s, %s", g.text, figure, v)
		}
	}
}

// The section lists every goal and counts the verdicts.
func TestGoalsTable(t *testing.T) {
	table := goalsTable(sampleResults())
	if !strings.HasPrefix(table, "## Goals\n") || strings.Count(table, "\n| ") != len(goals)+1 {
		t.Errorf("goals table:\n%s", table)
	}
	for _, want := range []string{
		"| Waiting: server CPU at most 0.1% of a core per waiter, every backend with a server (measured with 30 waiters, not 100) | 0.40% (mongodb) | missed |\n",
		"| Redis: wall time at most 1.0× redis-cli's SET NX, the command, and a compare-and-delete script | 0.65× | met |\n",
		"| MySQL: wall time at most 1.0× the mysql client's GET_LOCK, the command, and RELEASE_LOCK | – | not measured |\n",
		"does not measure 1.",
	} {
		if !strings.Contains(table, want) {
			t.Errorf("goals table lacks %q:\n%s", want, table)
		}
	}
}
