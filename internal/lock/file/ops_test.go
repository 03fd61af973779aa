package file_test

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/withlock/withlock/internal/lock"
	"github.com/withlock/withlock/internal/lock/file"
	"github.com/withlock/withlock/internal/lock/locktest"
)

// me is this test process as a holder.
func me(command ...string) lock.Holder {
	return lock.Holder{Host: lock.Hostname(), PID: os.Getpid(), Command: command}
}

// recordIn reads the record in a lock file or slot: its one JSON line.
func recordIn(t *testing.T, path string) map[string]any {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var r map[string]any
	if !strings.HasSuffix(string(data), "\n") || strings.Count(string(data), "\n") != 1 || json.Unmarshal(data, &r) != nil {
		t.Fatalf("%s holds %q; want one line of JSON", path, data)
	}
	return r
}

func size(t *testing.T, path string) int64 {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}

// TestRecord: a holder's record is in the file it holds (an exclusive
// holder's in the lock file, a shared or semaphore holder's in its slot),
// says who holds it, and is cleared when the holder lets go.
func TestRecord(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, file.FileName("job"))
	for _, tc := range []struct {
		opts lock.Options
		in   string // where the record is
	}{
		{lock.Options{}, path},
		{lock.Options{Mode: lock.Shared}, file.SharedName(path, 0)},
		{lock.Options{Mode: lock.Semaphore, MaxHolders: 2}, file.SlotName(path, 0)},
	} {
		t.Run(string(tc.opts.Mode), func(t *testing.T) {
			tc.opts.Holder = me("make", "deploy")
			c := locktest.Open(t, "file://"+dir, tc.opts)
			before := time.Now()
			l, err := c.TryAcquire(locktest.Context(t), "job")
			if err != nil {
				t.Fatal(err)
			}
			r := recordIn(t, tc.in)
			mode := tc.opts.Mode
			if mode == "" {
				mode = lock.Exclusive
			}
			at, _ := time.Parse(time.RFC3339Nano, fmt.Sprint(r["acquired_at"]))
			if r["withlock"] != 1.0 || r["name"] != "job" || r["mode"] != string(mode) || r["host"] != lock.Hostname() ||
				r["pid"] != float64(os.Getpid()) || fmt.Sprint(r["command"]) != "[make deploy]" || at.Before(before.Add(-time.Second)) {
				t.Errorf("record %v; want this process's, for %q in mode %s", r, "job", mode)
			}
			if mode == lock.Semaphore && r["max_holders"] != 2.0 {
				t.Errorf("semaphore record %v; want max_holders 2", r)
			}
			if tc.in != path && size(t, path) != 0 {
				t.Errorf("a %s holder wrote into the lock file, which other holders share", mode)
			}
			if err := l.Release(locktest.Context(t)); err != nil {
				t.Fatal(err)
			}
			if n := size(t, tc.in); n != 0 {
				t.Errorf("%d bytes left in %s after release; want the record cleared", n, tc.in)
			}
		})
	}
}

// TestForeignContent: a lock file that holds something other than a
// record (flock(1) users may write into theirs) is locked, never written.
func TestForeignContent(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, file.FileName("job"))
	if err := os.WriteFile(path, []byte("4242\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c := locktest.Open(t, "file://"+dir, lock.Options{Holder: me("true")})
	l, err := c.TryAcquire(locktest.Context(t), "job")
	if err != nil {
		t.Fatal(err)
	}
	l.Release(locktest.Context(t))
	if data, _ := os.ReadFile(path); string(data) != "4242\n" {
		t.Errorf("the lock file holds %q; want its own content untouched", data)
	}
}

// TestPlanted: something planted at the name of any file of a lock (the
// lock file, a slot, a shared holder's record file, the writer mark) is
// refused, and nothing outside DIR
// is created or written: not through a symbolic link, nor a hard link.
// A FIFO does not hang the open. As root (the tests' usual user), nothing
// but these checks stands in the way.
func TestPlanted(t *testing.T) {
	for _, where := range []string{"lock", "slot", "shared", "mark"} {
		for _, what := range []string{"symlink", "dangling", "hardlink", "fifo", "dir"} {
			t.Run(where+"/"+what, func(t *testing.T) {
				root := t.TempDir()
				dir := filepath.Join(root, "locks")
				os.Mkdir(dir, 0o777)
				outside := filepath.Join(root, "victim")
				if err := os.WriteFile(outside, []byte("precious\n"), 0o644); err != nil {
					t.Fatal(err)
				}
				opts := lock.Options{Holder: me("true")}
				at := filepath.Join(dir, file.FileName("job"))
				switch where {
				case "slot":
					opts.Mode, opts.MaxHolders = lock.Semaphore, 2
					at = file.SlotName(at, 0)
				case "shared":
					opts.Mode = lock.Shared
					at = file.SharedName(at, 0)
				case "mark":
					opts.Mode = lock.Shared
					at = file.MarkName(at)
				}
				var err error
				switch what {
				case "symlink":
					err = os.Symlink(outside, at)
				case "dangling":
					err = os.Symlink(filepath.Join(root, "created"), at)
				case "hardlink":
					err = os.Link(outside, at)
				case "fifo":
					err = syscall.Mkfifo(at, 0o666)
				case "dir":
					err = os.Mkdir(at, 0o777)
				}
				if err != nil {
					t.Fatal(err)
				}
				c := locktest.Open(t, "file://"+dir, opts)
				l, err := c.TryAcquire(locktest.Context(t), "job")
				if err == nil {
					l.Release(locktest.Context(t))
				}
				if !errors.Is(err, lock.ErrRefused) {
					t.Errorf("TryAcquire with a %s planted at the %s: %v; want an error matching ErrRefused", what, where, err)
				}
				if data, _ := os.ReadFile(outside); string(data) != "precious\n" {
					t.Errorf("the file outside DIR now holds %q", data)
				}
				if _, err := os.Lstat(filepath.Join(root, "created")); err == nil {
					t.Error("a file was created outside DIR")
				}
				if where == "lock" {
					if _, err := c.Inspect(locktest.Context(t), "job"); !errors.Is(err, lock.ErrRefused) {
						t.Errorf("Inspect: %v; want an error matching ErrRefused", err)
					}
					if _, err := c.List(locktest.Context(t)); err != nil {
						t.Errorf("List with something planted in DIR: %v", err)
					}
				}
			})
		}
	}
}

// flockHolder starts flock(1) with args, holding until the test ends, and
// returns it once it holds.
func flockHolder(t *testing.T, args ...string) *exec.Cmd {
	t.Helper()
	if _, err := exec.LookPath("flock"); err != nil {
		t.Skip("flock(1) (util-linux) not installed")
	}
	cmd := exec.Command("flock", append(args, "sh", "-c", "echo locked; exec cat >/dev/null")...)
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stdin.Close()
		cmd.Wait()
	})
	if line, err := bufio.NewReader(stdout).ReadString('\n'); err != nil || line != "locked\n" {
		t.Fatalf("flock(1) did not say it holds the lock: %q, %v", line, err)
	}
	return cmd
}

// TestOtherTools: a lock held by flock(1), which leaves no record, is shown
// by status with what /proc shows (pid, command line), exclusive or shared;
// release --force refuses to break it (not a withlock: ErrHeld) and leaves
// it held.
func TestOtherTools(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, file.FileName("nightly/zü"))
	c := locktest.Open(t, "file://"+dir, lock.Options{Holder: me("true")})
	fl := flockHolder(t, path)

	st, err := c.Inspect(locktest.Context(t), "nightly/zü")
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode != lock.Exclusive || len(st.Holders) != 1 {
		t.Fatalf("Inspect of a lock flock(1) holds: mode %q, holders %+v", st.Mode, st.Holders)
	}
	h := st.Holders[0]
	if h.PID != fl.Process.Pid || h.Host != lock.Hostname() || len(h.Command) < 2 || h.Command[0] != "flock" || h.Command[1] != path || !h.AcquiredAt.IsZero() {
		t.Errorf("holder %+v; want flock(1)'s pid %d and command line, on this host, since an unknown time", h, fl.Process.Pid)
	}
	all, err := c.List(locktest.Context(t))
	if err != nil || !slices.ContainsFunc(all, func(s lock.State) bool { return s.Name == "nightly/zü" && len(s.Holders) == 1 }) {
		t.Errorf("List: %+v, %v; want the lock flock(1) holds, by its name", all, err)
	}
	_, err = c.Break(locktest.Context(t), "nightly/zü")
	if !errors.Is(err, lock.ErrHeld) || !strings.Contains(err.Error(), "not a withlock") {
		t.Errorf("Break of flock(1)'s lock: %v; want ErrHeld saying it is not a withlock", err)
	}
	if fl.ProcessState != nil || syscall.Kill(fl.Process.Pid, 0) != nil {
		t.Error("flock(1) is gone")
	}
	if _, err := c.TryAcquire(locktest.Context(t), "nightly/zü"); !errors.Is(err, lock.ErrHeld) {
		t.Errorf("TryAcquire after a refused Break: %v; want ErrHeld", err)
	}
}

// TestSharedWithFlock: --shared is flock -s: withlock's shared holders and
// flock(1)'s share the lock, and status shows them all.
func TestSharedWithFlock(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, file.FileName("schema"))
	flockHolder(t, "-s", path)
	flockHolder(t, "-s", path)
	shared := locktest.Open(t, "file://"+dir, lock.Options{Mode: lock.Shared, Holder: me("read", "schema")})
	l, err := shared.TryAcquire(locktest.Context(t), "schema")
	if err != nil {
		t.Fatalf("a shared TryAcquire next to two flock -s: %v", err)
	}
	defer l.Release(locktest.Context(t))
	st, err := shared.Inspect(locktest.Context(t), "schema")
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode != lock.Shared || len(st.Holders) != 3 {
		t.Fatalf("Inspect: mode %q, %d holders; want shared, 3", st.Mode, len(st.Holders))
	}
	// withlock's own holder has a record, so it comes first (the others'
	// start is unknown).
	if h := st.Holders[0]; h.PID != os.Getpid() || h.AcquiredAt.IsZero() || fmt.Sprint(h.Command) != "[read schema]" {
		t.Errorf("first holder %+v; want this process's record", h)
	}
	x := locktest.Open(t, "file://"+dir, lock.Options{})
	if _, err := x.TryAcquire(locktest.Context(t), "schema"); !errors.Is(err, lock.ErrHeld) {
		t.Errorf("exclusive TryAcquire while shared: %v; want ErrHeld", err)
	}
}

// TestWriterNotStarved: once an exclusive waiter waits, a new shared holder
// waits behind it (the writer-waiting mark) instead of joining the shared
// holders already in, which would starve the writer.
func TestWriterNotStarved(t *testing.T) {
	dir := t.TempDir()
	mark := file.MarkName(filepath.Join(dir, file.FileName("job")))
	open := func(mode lock.Mode) *lock.Client {
		return locktest.Open(t, "file://"+dir, lock.Options{Mode: mode})
	}
	s1, x, s2 := open(lock.Shared), open(lock.Exclusive), open(lock.Shared)
	l1, err := s1.TryAcquire(locktest.Context(t), "job")
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		h   *lock.Held
		err error
	}
	got := make(chan result, 1)
	go func() {
		h, err := x.Acquire(locktest.Context(t), "job")
		got <- result{h, err}
	}()
	// The writer waits once it holds the mark.
	deadline := time.Now().Add(30 * time.Second)
	for !lockedElsewhere(t, mark) {
		if time.Now().After(deadline) {
			t.Fatal("the exclusive waiter did not mark itself within 30s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := s2.TryAcquire(locktest.Context(t), "job"); !errors.Is(err, lock.ErrHeld) {
		t.Fatalf("a shared TryAcquire while a writer waits: %v; want ErrHeld", err)
	}
	l1.Release(locktest.Context(t))
	r := <-got
	if r.err != nil {
		t.Fatalf("the writer's Acquire: %v", r.err)
	}
	if _, err := s2.TryAcquire(locktest.Context(t), "job"); !errors.Is(err, lock.ErrHeld) {
		t.Errorf("a shared TryAcquire while the writer holds: %v; want ErrHeld", err)
	}
	r.h.Release(locktest.Context(t))
	l2, err := s2.TryAcquire(locktest.Context(t), "job")
	if err != nil {
		t.Fatalf("a shared TryAcquire after the writer: %v", err)
	}
	l2.Release(locktest.Context(t))
}

// lockedElsewhere reports whether someone holds path exclusively.
func lockedElsewhere(t *testing.T, path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	return syscall.Flock(int(f.Fd()), syscall.LOCK_SH|syscall.LOCK_NB) != nil
}

// TestSemaphoreNotify: a semaphore's waiter is woken when a slot is let go,
// and not by its own failed attempts (which would make it spin).
func TestSemaphoreNotify(t *testing.T) {
	dir := t.TempDir()
	opts := lock.Options{Mode: lock.Semaphore, MaxHolders: 1}
	a, b := locktest.Open(t, "file://"+dir, opts), locktest.Open(t, "file://"+dir, opts)
	la, err := a.TryAcquire(locktest.Context(t), "job")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.TryAcquire(locktest.Context(t), "job"); !errors.Is(err, lock.ErrHeld) {
		t.Fatalf("TryAcquire of a full semaphore: %v", err)
	}
	n, ok := b.Backend.(lock.Notifier)
	if !ok {
		t.Fatal("a semaphore's backend is not a lock.Notifier")
	}
	released, stop, err := n.Notify(locktest.Context(t), "job")
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	for range 3 {
		if _, err := b.TryAcquire(locktest.Context(t), "job"); !errors.Is(err, lock.ErrHeld) {
			t.Fatalf("TryAcquire of a full semaphore: %v", err)
		}
	}
	select {
	case <-released:
		t.Fatal("woken by its own failed attempts")
	case <-time.After(300 * time.Millisecond): // it must not happen, so a wait is the check
	}
	la.Release(locktest.Context(t))
	select {
	case <-released:
	case <-time.After(10 * time.Second):
		t.Fatal("not woken within 10s of the slot's release")
	}
	lb, err := b.TryAcquire(locktest.Context(t), "job")
	if err != nil {
		t.Fatalf("TryAcquire once woken: %v", err)
	}
	lb.Release(locktest.Context(t))
}

// TestBreakReusedPID: a record whose pid now belongs to another process
// (here flock(1), with the record's start time off by one) is not that
// process's: Break refuses (ErrHeld) and signals no one.
func TestBreakReusedPID(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, file.FileName("job"))
	fl := flockHolder(t, path)
	start := procStart(t, fl.Process.Pid)
	rec := fmt.Sprintf(`{"withlock":1,"name":"job","mode":"exclusive","host":%q,"pid":%d,"start":%d,"command":["x"],"acquired_at":"2026-01-01T00:00:00Z"}`+"\n",
		lock.Hostname(), fl.Process.Pid, start-1)
	if err := os.WriteFile(path, []byte(rec), 0o644); err != nil {
		t.Fatal(err)
	}
	c := locktest.Open(t, "file://"+dir, lock.Options{})
	st, err := c.Inspect(locktest.Context(t), "job")
	if err != nil || len(st.Holders) != 1 || fmt.Sprint(st.Holders[0].Command) == "[x]" {
		t.Errorf("Inspect: %+v, %v; want flock(1) as /proc shows it, not the stale record", st, err)
	}
	if _, err := c.Break(locktest.Context(t), "job"); !errors.Is(err, lock.ErrHeld) {
		t.Errorf("Break: %v; want ErrHeld", err)
	}
	if syscall.Kill(fl.Process.Pid, 0) != nil {
		t.Error("flock(1) is gone")
	}
}

func procStart(t *testing.T, pid int) uint64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	var start uint64
	fields := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+1:]))
	fmt.Sscan(fields[19], &start)
	return start
}

// TestFileNamesFit: every file of every name (slots up to the largest N,
// record files as many)
// is one path element within NAME_MAX, and only lock files end in ".lock",
// so no name's slot or mark is another name's lock file.
func TestFileNamesFit(t *testing.T) {
	for _, name := range []string{"job", strings.Repeat("x", 200), strings.Repeat("/", 66) + "ab", strings.Repeat("ü", 127)} {
		f := file.FileName(name)
		for _, g := range []string{file.SlotName(f, 0), file.SlotName(f, int(^uint(0)>>1)), file.SharedName(f, int(^uint(0)>>1)), file.MarkName(f)} {
			if len(g) > 255 || strings.Contains(g, "/") || strings.HasSuffix(g, ".lock") {
				t.Errorf("%q (%d bytes): not a path element within NAME_MAX that only %q's lock uses", g, len(g), name)
			}
		}
	}
}

// TestRemovedSlot: a semaphore's slot excludes like the lock file (a
// newcomer could lock a new slot of that name, N+1 holders), so its
// removal is a loss; a shared holder's record file excludes no one, so its
// removal is not.
func TestRemovedSlot(t *testing.T) {
	for _, tc := range []struct {
		opts lock.Options
		file func(string, int) string
		lost bool
	}{
		{lock.Options{Mode: lock.Semaphore, MaxHolders: 2}, file.SlotName, true},
		{lock.Options{Mode: lock.Shared}, file.SharedName, false},
	} {
		t.Run(string(tc.opts.Mode), func(t *testing.T) {
			dir := t.TempDir()
			c := locktest.Open(t, "file://"+dir, tc.opts)
			l, err := c.TryAcquire(locktest.Context(t), "job")
			if err != nil {
				t.Fatal(err)
			}
			defer l.Release(locktest.Context(t))
			if err := os.Remove(tc.file(filepath.Join(dir, file.FileName("job")), 0)); err != nil {
				t.Fatal(err)
			}
			err = l.Keep(locktest.Context(t))
			if lost := errors.Is(err, lock.ErrLost); lost != tc.lost || !lost && err != nil {
				t.Errorf("Keep after its %s file was removed: %v; want lost: %v", tc.opts.Mode, err, tc.lost)
			}
		})
	}
}
