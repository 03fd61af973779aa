package main

import (
	"bytes"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// figures are what the charts of docs/performance.md draw, collected as
// the run prints its tables.
type figures struct {
	handoff    []bars // milliseconds: median, p90
	contention []bars // acquisitions a second
}

// bars are one contender's values, one per series of a chart.
type bars struct {
	name   string
	values []float64
}

var collected figures

// teeStdout sends what the run prints to stdout to w as well, until the
// returned function is called.
func teeStdout(w io.Writer) (restore func(), err error) {
	r, pw, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	real := os.Stdout
	os.Stdout = pw
	done := make(chan struct{})
	go func() {
		io.Copy(io.MultiWriter(real, w), r)
		close(done)
	}()
	return func() {
		os.Stdout = real
		pw.Close()
		<-done
		r.Close()
	}, nil
}

// writeDoc writes the run's output to doc (docs/performance.md), under a
// header that says when, at which commit and on which machine it was
// measured, with the charts of f beside it as SVG files. Only the latest
// run is kept; earlier ones are in git's history of the file. at is the
// commit the run measured, read when it began: the charts written here
// would otherwise count as changes.
func writeDoc(doc, output string, f figures, r results, when time.Time, at string) error {
	dir := filepath.Dir(doc)
	var charts []string
	if len(f.handoff) > 0 {
		name := "performance-handoff.svg"
		if err := barChart(filepath.Join(dir, name), "Hand-off: the holder's command exits, the waiter's starts",
			"milliseconds (less is better)", []string{"median", "p90"}, f.handoff); err != nil {
			return err
		}
		charts = append(charts, fmt.Sprintf("![Hand-off per backend, beside flock, psql, etcdctl lock, the mysql client and a redis-cli script](%s)", name))
	}
	if len(f.contention) > 0 {
		name := "performance-contention.svg"
		if err := barChart(filepath.Join(dir, name), fmt.Sprintf("Contention: %d processes on one lock", contenders),
			"acquisitions a second (more is better)", []string{"acquisitions/s"}, f.contention); err != nil {
			return err
		}
		charts = append(charts, fmt.Sprintf("![Contention per backend, beside flock, psql, a redis-cli script, the mysql client, etcdctl lock and the npm withlock](%s)", name))
	}

	var b bytes.Buffer
	fmt.Fprintf(&b, "# Performance\n\n")
	fmt.Fprintf(&b, "Measured by `make bench` on %s, at commit %s, on %s.\n", when.UTC().Format("2006-01-02"), at, machine())
	fmt.Fprintf(&b, "Run `make bench` to measure on your machine.")
	if strings.Contains(output, "\n## Goals\n") {
		fmt.Fprintf(&b, " The goals withlock sets itself, and which\nthis run meets, are under [Goals](#goals), at the end.")
	}
	fmt.Fprintf(&b, "\n\n")
	b.WriteString(costs(r))
	for _, c := range charts {
		fmt.Fprintf(&b, "%s\n\n", c)
	}
	// The run's own title gives way to the page's.
	output = strings.TrimPrefix(output, "# withlock benchmarks\n\n")
	b.WriteString(output)
	if !strings.HasSuffix(output, "\n") {
		b.WriteString("\n")
	}
	return os.WriteFile(doc, b.Bytes(), 0o644)
}

// barChart draws one horizontal bar per contender and series, the
// contenders top down in the order given, as an SVG file.
func barChart(file, title, unit string, series []string, rows []bars) error {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = unit
	p.X.Min = 0
	width := vg.Points(7)
	names := make([]string, len(rows))
	for i, r := range rows {
		names[len(rows)-1-i] = r.name // plot's y axis grows upwards
	}
	for s, label := range series {
		values := make(plotter.Values, len(rows))
		for i, r := range rows {
			if s < len(r.values) {
				values[len(rows)-1-i] = r.values[s]
			}
		}
		b, err := plotter.NewBarChart(values, width)
		if err != nil {
			return fmt.Errorf("%s: %w", file, err)
		}
		b.Horizontal = true
		b.LineStyle.Width = 0
		b.Color = plotutil.Color(s)
		b.Offset = width * vg.Length(float64(s)-float64(len(series)-1)/2)
		p.Add(b)
		if len(series) > 1 {
			p.Legend.Add(label, b)
		}
	}
	// Room on the right for the legend, beside the longest bar.
	longest := 0.0
	for _, r := range rows {
		for _, v := range r.values {
			longest = max(longest, v)
		}
	}
	if longest > 0 {
		p.X.Max = longest * 1.3
	}
	p.Legend.Top = true
	p.NominalY(names...)
	height := vg.Points(60) + vg.Length(len(rows))*width*vg.Length(len(series)+1)
	return p.Save(7*vg.Inch, height, file)
}

// commit is the checkout's commit, with "+changes" when it has some.
func commit() string {
	out, err := exec.Command("git", "rev-parse", "--short=12", "HEAD").Output()
	if err != nil {
		return "unknown"
	}
	c := strings.TrimSpace(string(out))
	if err := exec.Command("git", "diff", "--quiet", "HEAD").Run(); err != nil {
		c += "+changes"
	}
	return c
}

// machine describes where the run was measured: CPU, cores, kernel, Go.
func machine() string {
	kernel := "Linux"
	if out, err := exec.Command("uname", "-r").Output(); err == nil {
		kernel += " " + strings.TrimSpace(string(out))
	}
	return fmt.Sprintf("%s, %d cores, %s, %s", cpuModel(), numCPU(), kernel, runtime.Version())
}

// backendNames are the backends as the page names them, by the name the
// run's rows give them ("withlock postgres").
var backendNames = []struct{ row, name string }{
	{"file", "file://"}, {"postgres", "PostgreSQL"}, {"mysql", "MySQL"}, {"redis", "Redis"},
	{"mongodb", "MongoDB"}, {"etcd", "etcd"}, {"k8s", "Kubernetes"}, {"s3", "S3"},
}

// costs is the page's opening for a user: what withlock costs, per
// backend, in the run's figures, and how they were measured. It says
// nothing of a figure the run did not take.
func costs(r results) string {
	var b strings.Builder
	b.WriteString("## What it costs\n\n")
	list := func(of func(row string) float64, format string) string {
		var parts []string
		for _, bk := range backendNames {
			v := of("withlock " + bk.row)
			if !math.IsNaN(v) {
				parts = append(parts, fmt.Sprintf(format+" (%s)", v, bk.name))
			}
		}
		return strings.Join(parts, ", ")
	}
	base := r.get("wall", "true")
	if s := list(func(row string) float64 { return (r.get("wall", row) - base) * 1000 }, "%.0f ms"); s != "" {
		fmt.Fprintf(&b, "- **Per run.** Locking around a command adds, once per run, the time to start, connect, lock, unlock and exit: %s, median wall time beyond the command's own.\n", s)
	}
	if s := list(func(row string) float64 { return r.get("handoff", row) }, "%.0f ms"); s != "" {
		fmt.Fprintf(&b, "- **Hand-off.** From the holder's command exiting to the next waiter's starting: %s, median.\n", s)
	}
	if s := list(func(row string) float64 { return r.get("contention", row) }, "%.0f"); s != "" {
		fmt.Fprintf(&b, "- **Contention.** %d processes taking one lock in turn get through %s acquisitions a second.\n", contenders, s)
	}
	var rss []float64
	for _, bk := range backendNames {
		if v := r.get("rss", bk.row); !math.IsNaN(v) {
			rss = append(rss, v)
		}
	}
	if len(rss) > 0 {
		fmt.Fprintf(&b, "- **Memory.** A holding withlock's peak RSS is %.0f to %.0f MB, by backend.\n", slices.Min(rss), slices.Max(rss))
	}
	// "waiter cpu" rows are by backend, not "withlock BACKEND".
	if s := list(func(row string) float64 { return r.get("waiter cpu", strings.TrimPrefix(row, "withlock ")) }, "%.2f%%"); s != "" {
		fmt.Fprintf(&b, "- **Waiting.** Each waiter costs the server %s of a core.\n", s)
	}
	b.WriteString("\nHow: whole processes as users run them (default flags, URLs as written), timed by hyperfine; hand-off trials and contention rounds taken by each contender in turn, so that a busy moment falls on all alike; memory by `/usr/bin/time -v`; servers started by the benchmark on the same machine, so network time is a loopback's. Absolute times scale with the machine; the ratios to flock(1), psql, redis-cli, the mysql client and `etcdctl lock` below carry over better.\n\n")
	return b.String()
}
