package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The page holds the run's tables under a header saying when and where,
// and links two SVG charts that name every contender.
func TestWriteDoc(t *testing.T) {
	dir := t.TempDir()
	doc := filepath.Join(dir, "performance.md")
	f := figures{
		handoff: []bars{
			{"flock", []float64{1.2, 1.9}},
			{"withlock postgres", []float64{3.4, 5.6}},
			{"etcdctl lock (etcd)", []float64{40, 80}},
		},
		contention: []bars{
			{"flock", []float64{380}},
			{"withlock redis", []float64{150}},
		},
	}
	output := "# withlock benchmarks\n\nSome CPU, 2 cores, 2026-01-02\n\n## Hand-off\n\n| contender | median |\n|---|---:|\n| flock | 1.20 ms |\n\n## Goals\n\n| goal | measured | verdict |\n"
	r := results{}
	r.set("wall", "true", 0.002)
	r.set("wall", "withlock postgres", 0.0105)
	r.set("handoff", "withlock postgres", 3.4)
	r.set("handoff", "withlock s3", 25.9)
	r.set("rss", "postgres", 18.2)
	r.set("rss", "file", 12.9)
	if err := writeDoc(doc, output, f, r, time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), "0123456789ab"); err != nil {
		t.Fatal(err)
	}
	page, err := os.ReadFile(doc)
	if err != nil {
		t.Fatal(err)
	}
	text := string(page)
	for _, want := range []string{
		"# Performance\n",
		"Measured by `make bench` on 2026-01-02, at commit 0123456789ab, on ",
		"## What it costs\n",
		"median wall time beyond the command's own",
		": 8 ms (PostgreSQL),",
		"the next waiter's starting: 3 ms (PostgreSQL), 26 ms (S3), median.",
		"peak RSS is 13 to 18 MB",
		"](performance-handoff.svg)",
		"](performance-contention.svg)",
		"## Hand-off\n",
		"| flock | 1.20 ms |\n",
		"[Goals](#goals)",
		"\n## Goals\n",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("performance.md lacks %q:\n%s", want, text)
		}
	}
	if strings.Contains(text, "# withlock benchmarks") {
		t.Errorf("performance.md keeps the run's own title:\n%s", text)
	}
	for file, names := range map[string][]string{
		"performance-handoff.svg":    {"flock", "withlock postgres", "etcdctl lock (etcd)", "median", "p90"},
		"performance-contention.svg": {"flock", "withlock redis"},
	} {
		svg, err := os.ReadFile(filepath.Join(dir, file))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(svg), "<svg") {
			t.Errorf("%s is not SVG: %.100q", file, svg)
		}
		for _, n := range names {
			if !strings.Contains(string(svg), n) {
				t.Errorf("%s does not name %q", file, n)
			}
		}
	}
}

// A run without figures (none collected) writes the page without charts,
// nor a link to goals it did not judge.
func TestWriteDocWithoutFigures(t *testing.T) {
	doc := filepath.Join(t.TempDir(), "performance.md")
	if err := writeDoc(doc, "## Memory\n", figures{}, results{}, time.Now(), "0123456789ab"); err != nil {
		t.Fatal(err)
	}
	page, _ := os.ReadFile(doc)
	if strings.Contains(string(page), ".svg") || strings.Contains(string(page), "#goals") || !strings.Contains(string(page), "## Memory\n") || strings.Contains(string(page), "- **") {
		t.Errorf("performance.md:\n%s", page)
	}
}
