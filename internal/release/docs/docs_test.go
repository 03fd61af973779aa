package main

import (
	"bytes"
	"compress/gzip"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
	"unicode"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/withlock/withlock/cmd"
)

// root is the repository's root, seen from this package's directory.
var root = filepath.Join("..", "..", "..")

// readerDocs are the Markdown files written for readers: README.md and the
// pages beside it, and docs/.
func readerDocs(t *testing.T) []string {
	t.Helper()
	files := []string{"README.md", "CONTRIBUTING.md", "RELEASING.md", "CHANGELOG.md"}
	pages, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	if len(pages) == 0 {
		t.Fatal("no docs/*.md")
	}
	for _, p := range pages {
		rel, _ := filepath.Rel(root, p)
		files = append(files, rel)
	}
	return files
}

// Every page renders with man -l, as groff reads it, without a warning.
func TestManPages(t *testing.T) {
	man, err := exec.LookPath("man")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("man not found: apt-get install man-db groff-base")
		}
		t.Skip("man not found: apt-get install man-db groff-base")
	}
	dir := t.TempDir()
	if err := write(dir, "1.2.3", time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)); err != nil {
		t.Fatal(err)
	}
	pages, _ := filepath.Glob(filepath.Join(dir, "man", "*.1.gz"))
	want := []string{"withlock.1.gz", "withlock-run.1.gz", "withlock-status.1.gz", "withlock-release.1.gz", "withlock-check.1.gz", "withlock-version.1.gz"}
	for _, w := range want {
		if _, err := os.Stat(filepath.Join(dir, "man", w)); err != nil {
			t.Errorf("no page %s", w)
		}
	}
	for _, page := range pages {
		t.Run(filepath.Base(page), func(t *testing.T) {
			c := exec.Command(man, "--warnings=w", "-E", "UTF-8", "-l", page)
			c.Env = append(os.Environ(), "MANWIDTH=80", "LC_ALL=C.UTF-8")
			var stdout, stderr bytes.Buffer
			c.Stdout, c.Stderr = &stdout, &stderr
			if err := c.Run(); err != nil || stderr.Len() > 0 {
				t.Errorf("man --warnings=w -l %s: %v\n%s", filepath.Base(page), err, stderr.String())
			}
			// Bold is overstruck (S\bS) when man writes to a pipe.
			if !strings.Contains(overstrike.ReplaceAllString(stdout.String(), ""), "SYNOPSIS") {
				t.Errorf("man -l %s printed no SYNOPSIS:\n%s", filepath.Base(page), stdout.String())
			}
		})
	}
}

var overstrike = regexp.MustCompile(".\b")

// The pages of withlock, status, release and check stand alone: each says
// the environment and the exit status, check's what each verdict means, and
// withlock's names every scheme.
func TestManPagesStandAlone(t *testing.T) {
	dir := t.TempDir()
	if err := write(dir, "1.2.3", time.Now()); err != nil {
		t.Fatal(err)
	}
	need := map[string][]string{
		"withlock.1.gz":         {`.SH ENVIRONMENT`, `.SH EXIT STATUS`, `.SH SIGNALS`, `.SH FILES`, `.SH EXAMPLE`, `WITHLOCK_TOKEN`, `WITHLOCK_DB`, `--kill-after`, `\fBflock\fP(1)`},
		"withlock-status.1.gz":  {`.SH ENVIRONMENT`, `.SH EXIT STATUS`, `.SH EXAMPLE`},
		"withlock-release.1.gz": {`.SH ENVIRONMENT`, `.SH EXIT STATUS`, `.SH EXAMPLE`},
		"withlock-check.1.gz":   {`.SH OUTPUT`, `.SH VERDICTS`, `.SH ENVIRONMENT`, `.SH EXIT STATUS`, `.SH EXAMPLE`, `--fs-shares-locks`},
		"withlock-version.1.gz": {`.SH EXIT STATUS`, `.SH EXAMPLE`},
	}
	for _, scheme := range []string{"postgres://", "postgresql://", "mysql://", "redis://", "rediss://", "mongodb://", "mongodb+srv://", "etcd://", "etcds://", "k8s://", "kubernetes://", "file://"} {
		need["withlock.1.gz"] = append(need["withlock.1.gz"], scheme)
	}
	for page, want := range need {
		text := readPage(t, filepath.Join(dir, "man", page))
		for _, w := range want {
			if !strings.Contains(text, w) {
				t.Errorf("%s lacks %q", page, w)
			}
		}
	}
}

// The pages follow man-pages(7): OPTIONS right after DESCRIPTION, before
// the reference sections; EXAMPLES and SEE ALSO last; each flag's value
// named; no default shown that is not the default (--kill-after's depends
// on --ttl).
func TestManPageLayout(t *testing.T) {
	dir := t.TempDir()
	if err := write(dir, "1.2.3", time.Now()); err != nil {
		t.Fatal(err)
	}
	pages, _ := filepath.Glob(filepath.Join(dir, "man", "*.1.gz"))
	for _, page := range pages {
		text := readPage(t, page)
		var heads []string
		for _, l := range strings.Split(text, "\n") {
			if h, ok := strings.CutPrefix(l, ".SH "); ok {
				heads = append(heads, strings.Trim(h, `"`))
			}
		}
		if len(heads) < 4 || heads[0] != "NAME" || heads[1] != "SYNOPSIS" || heads[2] != "DESCRIPTION" || heads[3] != "OPTIONS" || heads[len(heads)-1] != "SEE ALSO" {
			t.Errorf("%s: sections %q; want NAME, SYNOPSIS, DESCRIPTION, OPTIONS first and SEE ALSO last", filepath.Base(page), heads)
		}
		for _, bad := range []string{"=0s", `="`, `\fIduration`, `\fIstring`, `\fIint`} {
			if strings.Contains(text, bad) {
				t.Errorf("%s shows %q, cobra's form of a flag and its default", filepath.Base(page), bad)
			}
		}
	}
}

// readPage is the roff text of the gzipped man page at path.
func readPage(t *testing.T, path string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// Every flag of every command is documented in README.md or docs/.
func TestFlagsDocumented(t *testing.T) {
	var text strings.Builder
	for _, f := range readerDocs(t) {
		b, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		text.Write(b)
	}
	docs := text.String()
	c := cmd.Command()
	c.InitDefaultCompletionCmd()
	var visit func(*cobra.Command)
	visit = func(c *cobra.Command) {
		c.InitDefaultHelpFlag()
		c.Flags().VisitAll(func(f *pflag.Flag) {
			if !regexp.MustCompile(`(^|[^-\w])--` + regexp.QuoteMeta(f.Name) + `\b`).MatchString(docs) {
				t.Errorf("%s: --%s appears nowhere in README.md or docs/", c.CommandPath(), f.Name)
			}
			if f.Shorthand != "" && !strings.Contains(docs, "-"+f.Shorthand+", --"+f.Name) {
				t.Errorf("%s: -%s, --%s appears nowhere in README.md or docs/", c.CommandPath(), f.Shorthand, f.Name)
			}
		})
		for _, sub := range c.Commands() {
			visit(sub)
		}
	}
	visit(c)
}

// Markdown links and images: [text](target) and ![alt](target), outside
// code.
var linkRE = regexp.MustCompile(`!?\[[^\]]*\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)

// Every relative link in README.md and docs/ names a file that exists, and
// every anchor a heading of its page.
func TestLinks(t *testing.T) {
	anchors := map[string]map[string]bool{} // by file, relative to root
	anchorsOf := func(file string) map[string]bool {
		if a, ok := anchors[file]; ok {
			return a
		}
		b, err := os.ReadFile(filepath.Join(root, file))
		if err != nil {
			t.Fatal(err)
		}
		a := headingAnchors(string(b))
		anchors[file] = a
		return a
	}
	for _, file := range readerDocs(t) {
		b, err := os.ReadFile(filepath.Join(root, file))
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range proseLines(string(b)) {
			for _, m := range linkRE.FindAllStringSubmatch(line, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				path, anchor, _ := strings.Cut(target, "#")
				dest := file
				if path != "" {
					dest = filepath.Clean(filepath.Join(filepath.Dir(file), path))
					if strings.HasPrefix(dest, "..") {
						t.Errorf("%s:%d: %s leaves the repository", file, i+1, target)
						continue
					}
					if _, err := os.Stat(filepath.Join(root, dest)); err != nil {
						t.Errorf("%s:%d: %s: no such file", file, i+1, target)
						continue
					}
				}
				if anchor == "" {
					continue
				}
				if !strings.HasSuffix(dest, ".md") {
					t.Errorf("%s:%d: %s: an anchor into a file that is not Markdown", file, i+1, target)
					continue
				}
				if !anchorsOf(dest)[anchor] {
					t.Errorf("%s:%d: %s: %s has no heading #%s", file, i+1, target, dest, anchor)
				}
			}
		}
	}
}

// proseLines returns the page's lines with fenced code blocks and inline
// code emptied, keeping line numbers.
func proseLines(text string) []string {
	lines := strings.Split(text, "\n")
	inFence := false
	code := regexp.MustCompile("`[^`]*`")
	for i, l := range lines {
		if strings.HasPrefix(strings.TrimSpace(l), "```") {
			inFence = !inFence
			lines[i] = ""
			continue
		}
		if inFence {
			lines[i] = ""
			continue
		}
		lines[i] = code.ReplaceAllString(l, "")
	}
	return lines
}

// headingAnchors are the anchors GitHub gives a page's headings: lower
// case, spaces to hyphens, punctuation dropped, "-1", "-2" for repeats.
func headingAnchors(text string) map[string]bool {
	seen := map[string]int{}
	anchors := map[string]bool{}
	inFence := false
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "```") {
			inFence = !inFence
			continue
		}
		if inFence || !strings.HasPrefix(l, "#") {
			continue
		}
		h := strings.TrimSpace(strings.TrimLeft(l, "#"))
		var slug strings.Builder
		for _, r := range strings.ToLower(h) {
			switch {
			case unicode.IsLetter(r) || unicode.IsNumber(r) || r == '_' || r == '-':
				slug.WriteRune(r)
			case r == ' ':
				slug.WriteRune('-')
			}
		}
		s := slug.String()
		if n := seen[s]; n > 0 {
			anchors[s+"-"+itoa(n)] = true
		} else {
			anchors[s] = true
		}
		seen[s]++
	}
	return anchors
}

func itoa(n int) string {
	if n < 10 {
		return string(rune('0' + n))
	}
	return itoa(n/10) + string(rune('0'+n%10))
}

// selfReference is what the repository must not say of itself: it speaks
// of itself only, citing docs/ and the code, never a specification's
// sections or a tracker's issue numbers (a peer's issue, owner/repo#N, is
// fine).
var selfReference = regexp.MustCompile("SPEC" + ` §|[Ii]ssues? [0-9]+`)

// TestSpeaksOfItself: no Go file, Markdown page or test script cites
// SPEC sections or issue numbers.
func TestSpeaksOfItself(t *testing.T) {
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if name == "node_modules" || name == "dist" || name == "build" || (strings.HasPrefix(name, ".") && path != root) {
				return filepath.SkipDir
			}
			return nil
		}
		switch filepath.Ext(name) {
		case ".go", ".md", ".txtar":
		default:
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for i, line := range strings.Split(string(b), "\n") {
			if selfReference.MatchString(line) {
				rel, _ := filepath.Rel(root, path)
				t.Errorf("%s:%d cites a spec section or an issue: %s", rel, i+1, strings.TrimSpace(line))
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
