package file_test

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/withlock/withlock/internal/lock"
	"github.com/withlock/withlock/internal/lock/file"
	"github.com/withlock/withlock/internal/lock/locktest"
)

// TestConformance: the shared suite on one directory. For status and
// release --force, a holder is this test process itself (OwnProcess): Break
// checks and signals the real holding process, and the leases of this
// process, which all hear that signal, let go. A semaphore's N is kept in
// its slots' records.
func TestConformance(t *testing.T) {
	dir := t.TempDir()
	locktest.Run(t, locktest.Config{
		Open: func(t *testing.T, opts lock.Options) *lock.Client {
			return locktest.Open(t, "file://"+dir, opts)
		},
		Operators: locktest.Operators{OwnProcess: true},
		Modes:     locktest.Modes{RecordsN: true},
	})
}

func TestFileName(t *testing.T) {
	for _, tc := range []struct{ name, want string }{
		{"plain", "plain.lock"},
		{"Az09._-", "Az09._-.lock"},
		{"../../etc/passwd", "%2E.%2F..%2Fetc%2Fpasswd.lock"},
		// A leading dot would hide the file from ls.
		{".hidden", "%2Ehidden.lock"},
		{"a.b.", "a.b..lock"},
		{"a b", "a%20b.lock"},
		{"a%2Fb", "a%252Fb.lock"},
		{"\x00\x1f~*\xab\xff", "%00%1F%7E%2A%AB%FF.lock"},
		{"zü", "z%C3%BC.lock"},
		{strings.Repeat("x", 200), strings.Repeat("x", 200) + ".lock"},
		// 66 slashes escape to 198 bytes: 200 in all, kept.
		{strings.Repeat("/", 66) + "ab", strings.Repeat("%2F", 66) + "ab.lock"},
		// One byte more is hashed. The sums are from sha256sum(1).
		{strings.Repeat("x", 201), "sha256-84a0678c90937f5dcf9994d5866668da6b995109c8ad845410559b48a4ecafed.lock"},
		{strings.Repeat("/", 67), "sha256-3eb1349aab9dc074e2028d6801ffe27e5de46b30e87a4e66e5fbb0b764f514e1.lock"},
	} {
		got := file.FileName(tc.name)
		if got != tc.want {
			t.Errorf("FileName(%q) = %q, want %q", tc.name, got, tc.want)
		}
	}
}

// TestFileNameStaysInDir checks what makes FileName safe as a path element,
// for names of every length.
func TestFileNameStaysInDir(t *testing.T) {
	for _, name := range []string{".", "..", "/", "a/../../b", strings.Repeat("ü", 127), strings.Repeat("/", 255)} {
		got := file.FileName(name)
		if strings.Contains(got, "/") || got == "." || got == ".." || len(got) > 255 || filepath.Base(got) != got {
			t.Errorf("FileName(%q) = %q: not a single path element of at most 255 bytes", name, got)
		}
	}
}

func TestOpenURL(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		url string
		ok  bool
	}{
		{"file://" + dir, true},
		{"file://localhost" + dir, true},
		{"FILE://" + dir, true},
		{"file://host" + dir, false},
		{"file:relative/dir", false},
		{"file://", false},
		{"file://" + dir + "?mode=0600", false},
	} {
		b, err := lock.Open(tc.url, lock.Options{})
		switch {
		case tc.ok && err != nil:
			t.Errorf("Open(%q): %v", tc.url, err)
		case !tc.ok && !errors.Is(err, lock.ErrUsage):
			t.Errorf("Open(%q): %v; want an error matching lock.ErrUsage", tc.url, err)
		}
		if b != nil {
			b.Close()
		}
	}
}

// TestLockFilePath checks where the lock is: DIR/FileName(NAME), DIR created
// if missing, and nothing outside DIR, whatever NAME says.
func TestLockFilePath(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "a", "b")
	b := locktest.Open(t, "file://"+dir, lock.Options{})
	name := "../../escape"
	l, err := b.TryAcquire(locktest.Context(t), name)
	if err != nil {
		t.Fatalf("TryAcquire: %v", err)
	}
	defer l.Release(locktest.Context(t))
	if _, err := os.Stat(filepath.Join(dir, file.FileName(name))); err != nil {
		t.Errorf("lock file: %v", err)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("%s holds %d entries, want the one lock file", dir, len(entries))
	}
	if _, err := os.Stat(filepath.Join(root, "escape")); err == nil {
		t.Errorf("the name %q made a file outside DIR", name)
	}
}

// TestNotADirectory: a DIR that cannot be created is a refusal, not worth
// retrying. (As root, permissions would not refuse anything.)
func TestNotADirectory(t *testing.T) {
	f := filepath.Join(t.TempDir(), "plain-file")
	if err := os.WriteFile(f, nil, 0o666); err != nil {
		t.Fatal(err)
	}
	b := locktest.Open(t, "file://"+filepath.Join(f, "dir"), lock.Options{})
	_, err := b.TryAcquire(locktest.Context(t), "x")
	if !errors.Is(err, lock.ErrRefused) {
		t.Errorf("TryAcquire under a plain file: %v; want an error matching lock.ErrRefused", err)
	}
}

func TestRemovedFileIsLost(t *testing.T) {
	for _, replace := range []bool{false, true} {
		t.Run(map[bool]string{false: "removed", true: "replaced"}[replace], func(t *testing.T) {
			dir := t.TempDir()
			a, b := locktest.Open(t, "file://"+dir, lock.Options{}), locktest.Open(t, "file://"+dir, lock.Options{})
			l, err := a.TryAcquire(locktest.Context(t), "job")
			if err != nil {
				t.Fatalf("TryAcquire: %v", err)
			}
			defer l.Release(locktest.Context(t))
			path := filepath.Join(dir, file.FileName("job"))
			if err := os.Remove(path); err != nil {
				t.Fatal(err)
			}
			if replace {
				if err := os.WriteFile(path, nil, 0o666); err != nil {
					t.Fatal(err)
				}
			}
			if err := l.Keep(locktest.Context(t)); !errors.Is(err, lock.ErrLost) {
				t.Errorf("Keep after the lock file was %s: %v; want an error matching lock.ErrLost", t.Name(), err)
			}
			// This is why: a newcomer locks the new file.
			lb, err := b.TryAcquire(locktest.Context(t), "job")
			if err != nil {
				t.Fatalf("TryAcquire by a newcomer: %v", err)
			}
			lb.Release(locktest.Context(t))
		})
	}
}

// TestRemovedFileLosesHeld: the keeper loop notices the removal by itself.
func TestRemovedFileLosesHeld(t *testing.T) {
	dir := t.TempDir()
	b := locktest.Open(t, "file://"+dir, lock.Options{TTL: 300 * time.Millisecond, Grace: 100 * time.Millisecond})
	h, err := b.Acquire(locktest.Context(t), "job")
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	defer h.Release(locktest.Context(t))
	if err := os.Remove(filepath.Join(dir, file.FileName("job"))); err != nil {
		t.Fatal(err)
	}
	select {
	case <-h.Lost():
		if !errors.Is(h.Err(), lock.ErrLost) {
			t.Errorf("Err: %v; want an error matching lock.ErrLost", h.Err())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Lost not closed 30s after the lock file was removed")
	}
}

// TestFlockInterop: flock(1) on DIR/FileName(NAME) and withlock exclude
// each other, both ways.
func TestFlockInterop(t *testing.T) {
	if _, err := exec.LookPath("flock"); err != nil {
		t.Skip("flock(1) (util-linux) not installed")
	}
	dir := t.TempDir()
	b := locktest.Open(t, "file://"+dir, lock.Options{})
	name := "nightly/zü"
	path := filepath.Join(dir, file.FileName(name))
	flockN := func() error { return exec.Command("flock", "-n", path, "true").Run() }

	l, err := b.TryAcquire(locktest.Context(t), name)
	if err != nil {
		t.Fatalf("TryAcquire: %v", err)
	}
	if err := flockN(); err == nil {
		t.Error("flock -n succeeded while withlock held the lock")
	}
	if err := l.Release(locktest.Context(t)); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if err := flockN(); err != nil {
		t.Errorf("flock -n after withlock released: %v", err)
	}

	// flock(1) holds the lock until its cat reads EOF; it prints once it
	// holds it.
	cmd := exec.Command("flock", path, "sh", "-c", "echo locked; exec cat >/dev/null")
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	line := make([]byte, len("locked\n"))
	if _, err := io.ReadFull(stdout, line); err != nil {
		t.Fatalf("flock(1) did not say it holds the lock: %v", err)
	}
	if l, err := b.TryAcquire(locktest.Context(t), name); !errors.Is(err, lock.ErrHeld) {
		if err == nil {
			l.Release(locktest.Context(t))
		}
		t.Errorf("TryAcquire while flock(1) held the lock: %v; want an error matching lock.ErrHeld", err)
	}
	stdin.Close()
	if err := cmd.Wait(); err != nil {
		t.Fatalf("flock(1): %v", err)
	}
	l, err = b.TryAcquire(locktest.Context(t), name)
	if err != nil {
		t.Fatalf("TryAcquire after flock(1) exited: %v", err)
	}
	l.Release(locktest.Context(t))
}

// TestDirForEveryUser: a DIR that withlock creates is 1777, as /tmp is,
// whatever the umask: its users may be several users of the host, and each
// NAME's file is created by its first user.
func TestDirForEveryUser(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "locks")
	l, err := locktest.Open(t, "file://"+dir, lock.Options{}).TryAcquire(locktest.Context(t), "job")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(locktest.Context(t))
	st, err := os.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o777 || st.Mode()&os.ModeSticky == 0 {
		t.Errorf("DIR made with mode %v; want drwxrwxrwt (1777)", st.Mode())
	}
}

// TestDirOfAnotherUser: a user who may not create files in DIR is refused
// with DIR's owner, its mode and the fix. Run as nobody when the tests
// run as root (root may create files anywhere).
func TestDirOfAnotherUser(t *testing.T) {
	if dir := os.Getenv("WITHLOCK_TEST_DIR"); dir != "" {
		_, err := locktest.Open(t, "file://"+dir, lock.Options{}).TryAcquire(locktest.Context(t), "job")
		os.Stdout.WriteString(fmt.Sprint(err))
		return
	}
	base, err := os.MkdirTemp("", "withlock-dir-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(base, "locks")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestDirOfAnotherUser$")
	owner := "root"
	if os.Geteuid() == 0 {
		// The test binary, where nobody may run it.
		bin := filepath.Join(base, "file.test")
		data, err := os.ReadFile(os.Args[0])
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(bin, data, 0o755); err != nil {
			t.Fatal(err)
		}
		cmd = exec.Command(bin, "-test.run=^TestDirOfAnotherUser$")
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		cmd.Dir = base
	} else {
		if err := os.Chmod(dir, 0o555); err != nil {
			t.Fatal(err)
		}
		u, err := user.Current()
		if err != nil {
			t.Fatal(err)
		}
		owner = u.Username
	}
	cmd.Env = append(os.Environ(), "WITHLOCK_TEST_DIR="+dir, "HOME="+base)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("the other user's TryAcquire: %v\n%s", err, out)
	}
	want := "permission denied; " + dir + " belongs to " + owner + " (mode 0"
	if !strings.Contains(string(out), want) || !strings.Contains(string(out), "chmod 1777 "+dir) {
		t.Errorf("the other user's TryAcquire: %s; want it to say %q and the chmod that fixes it", out, want)
	}
}
