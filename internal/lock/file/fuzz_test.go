package file

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/withlock/withlock/internal/lock"
)

// filesOf lists every file a lock on name can make in DIR: the lock file,
// the mark, and a few slots and shared holders' records.
func filesOf(name string) []string {
	f := FileName(name)
	files := []string{f, MarkName(f)}
	for _, k := range []int{0, 1, 2, 9, 10, 99} {
		files = append(files, SlotName(f, k), SharedName(f, k))
	}
	return files
}

// FuzzFileName checks the escaping of docs/file.md for file:// on any pair of valid
// names: every file a name makes stays in DIR, has a legal name, and is
// no file of another name, except where both are hashed and SHA-256
// collides; nameOf undoes FileName; isFileOf tells each name's files
// apart. `go test -fuzz FuzzFileName ./internal/lock/file/` searches for
// more; the seeds run in make test.
func FuzzFileName(f *testing.F) {
	long := strings.Repeat("x", 200)
	for _, seed := range [][2]string{
		{"job", "job.lock"},
		{"../../etc/passwd", "..%2F..%2Fetc%2Fpasswd"},
		{"a/b", "a%2Fb"},
		{".", ".."},
		{"%41", "A"},
		{"job.lock", "job"},
		{"job.lock.1", "job"},
		{"job.lock.writer", "job.lock.shared1"},
		{long, long + "y"},
		{strings.Repeat("/", 67), strings.Repeat("/", 66)}, // 201 and 198 escaped bytes
		{"sha256-" + strings.Repeat("0", 64), "x"},
		{"naïve ☃", "na%C3%AFve %E2%98%83"},
		{"\x00", "\n"},
	} {
		f.Add(seed[0], seed[1])
	}
	dir := "/var/lock/withlock"
	f.Fuzz(func(t *testing.T, a, b string) {
		for _, name := range []string{a, b} {
			if lock.CheckName(name) != nil {
				return
			}
		}
		for _, name := range []string{a, b} {
			fn := FileName(name)
			if n := nameOf(fn); n != name && !strings.HasPrefix(fn, "sha256-") {
				t.Errorf("nameOf(FileName(%q)) = %q", name, n)
			}
			for _, e := range filesOf(name) {
				switch {
				case e == "" || e == "." || e == "..", strings.ContainsAny(e, "/\x00"), len(e) > 255:
					t.Fatalf("name %q makes the file name %q", name, e)
				case filepath.Dir(filepath.Join(dir, e)) != dir:
					t.Fatalf("name %q makes %q, outside %s", name, filepath.Join(dir, e), dir)
				case !isFileOf(e, fn):
					t.Errorf("isFileOf(%q, %q) = false for one of its own files", e, fn)
				}
			}
		}
		if a == b {
			return
		}
		fa, fb := FileName(a), FileName(b)
		if fa == fb {
			t.Fatalf("names %q and %q share the lock file %q", a, b, fa)
		}
		for _, e := range filesOf(b) {
			if isFileOf(e, fa) {
				t.Errorf("%q, a file of name %q, counts as a file of name %q (%q)", e, b, a, fa)
			}
		}
	})
}
