package exec_test

import (
	"errors"
	"os"
	osexec "os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// pid1 is a helperPID1 process.
type pid1 struct {
	cmd  *osexec.Cmd
	done chan struct{} // closed once the helper has been waited for
	err  error         // Wait's result, once done is closed
}

// startPID1 starts the helperPID1 process as PID 1 of a new PID namespace,
// with the test's environment plus extra. It skips the test where this
// process may not create a PID namespace.
func startPID1(t *testing.T, extra ...string) *pid1 {
	t.Helper()
	h := &pid1{cmd: osexec.Command(os.Args[0]), done: make(chan struct{})}
	h.cmd.Env = append(os.Environ(), append(extra, helperEnv+"=pid1")...)
	h.cmd.Stdout, h.cmd.Stderr = os.Stdout, os.Stderr
	h.cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID | syscall.CLONE_NEWNS}
	if err := h.cmd.Start(); err != nil {
		if errors.Is(err, syscall.EPERM) {
			t.Skipf("creating a PID namespace needs CAP_SYS_ADMIN: %v", err)
		}
		t.Fatal(err)
	}
	go func() { h.err = h.cmd.Wait(); close(h.done) }()
	t.Cleanup(func() {
		h.cmd.Process.Kill() // ends the whole namespace
		<-h.done
	})
	return h
}

// wait waits for the helper to exit 0 and returns what it wrote to result.
func (h *pid1) wait(t *testing.T, result string) string {
	t.Helper()
	select {
	case <-h.done:
		if h.err != nil {
			t.Fatalf("helper: %v", h.err)
		}
	case <-time.After(long):
		t.Fatalf("helper still running after %v", long)
	}
	b, err := os.ReadFile(result)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// As PID 1, orphans of the command are reaped while the command still runs,
// and a TERM sent to PID 1 from outside its namespace reaches the command
// once, whose status is the one reported.
func TestPID1ReapsOrphans(t *testing.T) {
	dir := t.TempDir()
	result, ready, left := filepath.Join(dir, "result"), filepath.Join(dir, "ready"), filepath.Join(dir, "left")
	got := filepath.Join(dir, "got")
	// Three orphans, one in a session of its own. The script waits (up to
	// 30s) for each to vanish from /proc, which only reaping does; then
	// it says ready if no zombie is left in the namespace.
	script := `
		(sleep 0.2 & echo $! > "$D/o1")
		(sleep 0.3 & echo $! > "$D/o2")
		(setsid sleep 0.2 & echo $! > "$D/o3")
		for o in o1 o2 o3; do
			pid=$(cat "$D/$o"); i=0
			while [ -e /proc/$pid ]; do
				i=$((i+1))
				if [ $i -gt 600 ]; then cat /proc/$pid/stat > "$D/left"; exit 1; fi
				sleep 0.05
			done
		done
		for f in /proc/[0-9]*/stat; do
			read -r l < "$f" && case "$l" in *") Z "*) echo "$l" >> "$D/left";; esac
		done 2>/dev/null
		[ -e "$D/left" ] && exit 1
		trap 'echo TERM >> "$D/got"; exit 7' TERM
		echo ready > "$D/ready"
		while :; do sleep 0.05; done`
	h := startPID1(t, "SCRIPT="+script, "D="+dir, "RESULT="+result)

	deadline := time.Now().Add(long)
	for {
		if _, err := os.Stat(ready); err == nil {
			break
		}
		if b, err := os.ReadFile(left); err == nil {
			t.Fatalf("zombies left while the command runs: %s", b)
		}
		select {
		case <-h.done:
			t.Fatalf("helper exited (%v) before the command was ready", h.err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("orphans not reaped within %v", long)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := h.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := h.wait(t, result); code != "7" {
		t.Errorf("exit code %s, want 7 from the TERM trap", code)
	}
	if l := lines(t, got); len(l) != 1 {
		t.Errorf("the command saw TERM %d times, want once", len(l))
	}
}

// As PID 1, reaping orphans never takes the status of the command, even when
// it exits at once among orphans that exit too, nor that of a program run
// through os/exec meanwhile.
func TestPID1KeepsStatuses(t *testing.T) {
	result := filepath.Join(t.TempDir(), "result")
	script := `i=0; while [ $i -lt 20 ]; do (true &); (sleep 0.01 &); i=$((i+1)); done; exit 3`
	const repeat = 30
	h := startPID1(t, "SCRIPT="+script, "REPEAT=30", "PLUGINS=1", "RESULT="+result)
	want := strings.TrimSpace(strings.Repeat("3 ", repeat))
	if got := h.wait(t, result); got != want {
		t.Errorf("exit codes %q, want %d times 3", got, repeat)
	}
}
