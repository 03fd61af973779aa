package exec_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	osexec "os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/withlock/withlock/internal/exec"
)

// long bounds every wait in these tests: generous, because the machines that
// run them are slow and shared. No test asserts anything tighter.
const long = 60 * time.Second

// helperEnv names the variable that turns the re-executed test binary into
// one of the helper processes of helpers_test.go.
const helperEnv = "WITHLOCK_EXEC_TEST_HELPER"

func TestMain(m *testing.M) {
	if h := os.Getenv(helperEnv); h != "" {
		os.Exit(runHelper(h))
	}
	os.Exit(m.Run())
}

// start starts argv with the test's environment plus extra, and stops the
// process at the end of the test whatever happens.
func start(t *testing.T, argv []string, extra ...string) *exec.Process {
	t.Helper()
	p, err := exec.Start(argv, append(os.Environ(), extra...))
	if err != nil {
		t.Fatalf("Start(%q): %v", argv, err)
	}
	t.Cleanup(func() { p.Stop(time.Second) })
	return p
}

func waitDone(t *testing.T, p *exec.Process) int {
	t.Helper()
	select {
	case <-p.Done():
		return p.ExitCode()
	case <-time.After(long):
		t.Fatalf("pid %d still running after %v", p.Pid(), long)
		return -1
	}
}

// waitFile polls until path exists and is not empty, and returns its content.
func waitFile(t *testing.T, path string) string {
	t.Helper()
	deadline := time.Now().Add(long)
	for {
		b, err := os.ReadFile(path)
		if err == nil && len(b) > 0 {
			return string(b)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not written within %v", path, long)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func readPid(t *testing.T, path string) int {
	t.Helper()
	s := waitFile(t, path)
	pid, err := strconv.Atoi(strings.TrimSpace(s))
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return pid
}

// state returns the state letter of pid from /proc, or 0.
func state(pid int) byte {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return 0
	}
	return b[i+2]
}

// gone reports whether pid has exited (a zombie counts as exited: it runs no
// more code and only waits for its parent).
func gone(pid int) bool {
	if err := syscall.Kill(pid, 0); err == syscall.ESRCH {
		return true
	}
	s := state(pid)
	return s == 0 || s == 'Z' || s == 'X'
}

func waitGone(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(long)
	for !gone(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("pid %d still alive after %v", pid, long)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func lines(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	return strings.Fields(string(b))
}

func TestExitCode(t *testing.T) {
	for _, tc := range []struct {
		script string
		want   int
	}{
		{"exit 0", 0},
		{"exit 3", 3},
		{"kill -TERM $$", 143},
		{"kill -KILL $$", 137},
	} {
		t.Run(tc.script, func(t *testing.T) {
			p := start(t, []string{"sh", "-c", tc.script})
			if got := waitDone(t, p); got != tc.want {
				t.Errorf("exit code %d, want %d", got, tc.want)
			}
		})
	}
}

func TestArgvAndEnv(t *testing.T) {
	out := filepath.Join(t.TempDir(), "out")
	p := start(t, []string{"sh", "-c", `printf '%s|%s|%s' "$1" "$2" "$WITHLOCK_X" > "$OUT"`, "sh", "a b", "$HOME"},
		"WITHLOCK_X=x y", "OUT="+out)
	if code := waitDone(t, p); code != 0 {
		t.Fatalf("exit code %d", code)
	}
	if got, want := waitFile(t, out), "a b|$HOME|x y"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

func TestNotFound(t *testing.T) {
	for _, name := range []string{"withlock-no-such-command", "/nonexistent/withlock", filepath.Join(t.TempDir(), "missing")} {
		_, err := exec.Start([]string{name}, os.Environ())
		if !errors.Is(err, exec.ErrNotFound) {
			t.Errorf("Start(%q): %v, want ErrNotFound", name, err)
		}
	}
	_, err := exec.Start([]string{"migrat"}, os.Environ())
	if got, want := fmt.Sprint(err), "migrat: command not found"; got != want {
		t.Errorf("message %q, want %q", got, want)
	}
}

func TestNotExecutable(t *testing.T) {
	dir := t.TempDir()
	plain := filepath.Join(dir, "plain")
	if err := os.WriteFile(plain, []byte("#!/bin/sh\nexit 0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	garbage := filepath.Join(dir, "garbage") // executable, but no format the kernel knows: ENOEXEC
	if err := os.WriteFile(garbage, []byte{0, 1, 2, 3}, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{plain, dir, garbage} {
		_, err := exec.Start([]string{name}, os.Environ())
		if !errors.Is(err, exec.ErrNotExecutable) {
			t.Errorf("Start(%q): %v, want ErrNotExecutable", name, err)
		}
	}

	// Found in PATH only as a file without x: 126 in bash and dash, not 127.
	t.Setenv("PATH", dir+":"+os.Getenv("PATH"))
	_, err := exec.Start([]string{"plain"}, os.Environ())
	if !errors.Is(err, exec.ErrNotExecutable) {
		t.Errorf("Start(plain) through PATH: %v, want ErrNotExecutable", err)
	}
}

// A relative PATH entry works as in a shell, although os/exec refuses it.
func TestRelativePathEntry(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "here"), []byte("#!/bin/sh\nexit 5\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Chdir(dir)
	for _, path := range []string{".:" + os.Getenv("PATH"), ":" + os.Getenv("PATH")} {
		t.Setenv("PATH", path)
		p := start(t, []string{"here"})
		if code := waitDone(t, p); code != 5 {
			t.Errorf("PATH=%q: exit code %d, want 5", path, code)
		}
	}
}

func TestSignalOnce(t *testing.T) {
	dir := t.TempDir()
	got, ready := filepath.Join(dir, "got"), filepath.Join(dir, "ready")
	p := start(t, []string{"sh", "-c", `trap 'echo usr1 >> "$F"' USR1; echo ready > "$R"; while :; do sleep 0.1; done`},
		"F="+got, "R="+ready)
	waitFile(t, ready)
	if err := p.Signal(syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	waitFile(t, got)
	p.Stop(10 * time.Second)
	if l := lines(t, got); len(l) != 1 {
		t.Errorf("child saw USR1 %d times, want once", len(l))
	}
}

func TestAfterExit(t *testing.T) {
	p := start(t, []string{"true"})
	waitDone(t, p)
	if err := p.Signal(syscall.SIGTERM); err != nil {
		t.Errorf("Signal after exit: %v, want nil", err)
	}
	p.Stop(time.Hour) // must return at once
	if code := p.ExitCode(); code != 0 {
		t.Errorf("exit code %d after Stop, want 0", code)
	}
}

// Stop reaches the children of a "sh -c" wrapper, not only the wrapper.
func TestStopGroup(t *testing.T) {
	pidfile := filepath.Join(t.TempDir(), "pid")
	p := start(t, []string{"sh", "-c", `sleep 1000 & echo $! > "$P"; wait`}, "P="+pidfile)
	grandchild := readPid(t, pidfile)
	p.Stop(long)
	if code := p.ExitCode(); code != 143 {
		t.Errorf("exit code %d, want 143", code)
	}
	waitGone(t, grandchild)
}

func TestStopKillsAfterGrace(t *testing.T) {
	ready := filepath.Join(t.TempDir(), "ready")
	p := start(t, []string{"sh", "-c", `trap '' TERM; echo ready > "$R"; while :; do sleep 0.1; done`}, "R="+ready)
	waitFile(t, ready)
	const grace = 500 * time.Millisecond
	begin := time.Now()
	p.Stop(grace)
	if d := time.Since(begin); d < grace {
		t.Errorf("Stop returned after %v, before the grace of %v", d, grace)
	}
	if code := p.ExitCode(); code != 137 {
		t.Errorf("exit code %d, want 137", code)
	}
}

// When the wrapper dies of TERM at once, the programs it started still get
// their grace to clean up, and whatever ignores TERM is killed after it.
func TestStopGraceForGrandchildren(t *testing.T) {
	dir := t.TempDir()
	cleaned, polite, stubborn := filepath.Join(dir, "cleaned"), filepath.Join(dir, "polite"), filepath.Join(dir, "stubborn")
	p := start(t, []string{"sh", "-c", `
		sh -c 'trap "sleep 1; echo cleaned > \"$C\"; exit 0" TERM; echo $$ > "$P1"; while :; do sleep 0.1; done' 2>/dev/null &
		sh -c 'trap "" TERM; echo $$ > "$P2"; while :; do sleep 0.1; done' 2>/dev/null &
		wait`},
		"C="+cleaned, "P1="+polite, "P2="+stubborn)
	politePid, stubbornPid := readPid(t, polite), readPid(t, stubborn)
	const grace = 3 * time.Second
	begin := time.Now()
	p.Stop(grace)
	if d := time.Since(begin); d < grace {
		t.Errorf("Stop returned after %v, before the grace of %v although a process ignores TERM", d, grace)
	}
	if code := p.ExitCode(); code != 143 {
		t.Errorf("exit code %d, want 143 (the wrapper dies of TERM)", code)
	}
	if got := waitFile(t, cleaned); got != "cleaned\n" {
		t.Errorf("cleaned = %q", got)
	}
	waitGone(t, politePid)
	waitGone(t, stubbornPid)
}

// Stop continues a stopped job, so that it can act on the TERM.
func TestStopContinuesStoppedJob(t *testing.T) {
	ready := filepath.Join(t.TempDir(), "ready")
	p := start(t, []string{"sh", "-c", `exec 2>/dev/null; trap 'exit 9' TERM; echo ready > "$R"; while :; do sleep 0.1; done`}, "R="+ready)
	waitFile(t, ready)
	if err := p.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(long)
	for state(p.Pid()) != 'T' {
		if time.Now().After(deadline) {
			t.Fatalf("pid %d not stopped after %v", p.Pid(), long)
		}
		time.Sleep(20 * time.Millisecond)
	}
	p.Stop(long)
	if code := p.ExitCode(); code != 9 {
		t.Errorf("exit code %d, want 9 from the TERM trap", code)
	}
}

// Stop does not wait out the grace when the whole group has exited.
func TestStopReturnsEarly(t *testing.T) {
	pidfile := filepath.Join(t.TempDir(), "pid")
	p := start(t, []string{"sh", "-c", `sleep 1000 & echo $! > "$P"; wait`}, "P="+pidfile)
	readPid(t, pidfile)
	begin := time.Now()
	p.Stop(time.Hour)
	if d := time.Since(begin); d > long {
		t.Errorf("Stop took %v with a grace of an hour", d)
	}
}

func TestConcurrentStopAndSignal(t *testing.T) {
	ready := filepath.Join(t.TempDir(), "ready")
	p := start(t, []string{"sh", "-c", `echo ready > "$R"; while :; do sleep 0.1; done`}, "R="+ready)
	waitFile(t, ready)
	done := make(chan struct{})
	for range 4 {
		go func() {
			defer func() { done <- struct{}{} }()
			for {
				select {
				case <-p.Done():
					return
				default:
				}
				if err := p.Signal(syscall.SIGWINCH); err != nil {
					t.Errorf("Signal: %v", err)
					return
				}
			}
		}()
	}
	go func() { p.Stop(long); done <- struct{}{} }()
	p.Stop(long)
	for range 5 {
		<-done
	}
	if code := p.ExitCode(); code != 143 {
		t.Errorf("exit code %d, want 143", code)
	}
}

// If the process that called Start is SIGKILLed, the command dies too, even
// when other goroutines of that process lock and end OS threads meanwhile.
func TestParentDeathKillsChild(t *testing.T) {
	dir := t.TempDir()
	pidfile := filepath.Join(dir, "pid")
	helper := osexec.Command(os.Args[0])
	helper.Env = append(os.Environ(), helperEnv+"=pdeathsig", "PIDFILE="+pidfile)
	helper.Stderr = os.Stderr
	if err := helper.Start(); err != nil {
		t.Fatal(err)
	}
	defer helper.Process.Kill()
	child := readPid(t, pidfile)
	if gone(child) {
		t.Fatal("the command died while its parent churned OS threads")
	}
	if err := helper.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	helper.Wait()
	waitGone(t, child)
}
