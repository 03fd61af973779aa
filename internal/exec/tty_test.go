package exec_test

import (
	"bytes"
	"fmt"
	"io"
	"os"
	osexec "os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"
)

// openPTY returns the master of a new pseudo-terminal and its slave, opened
// without making it anyone's controlling terminal.
func openPTY(t *testing.T) (master, slave *os.File) {
	t.Helper()
	master, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY|syscall.O_CLOEXEC, 0)
	if err != nil {
		t.Skipf("no pseudo-terminals here: %v", err)
	}
	t.Cleanup(func() { master.Close() })
	var n uint32
	var unlock int32
	ioctl := func(req uintptr, arg unsafe.Pointer) error {
		rc, err := master.SyscallConn()
		if err != nil {
			return err
		}
		var errno syscall.Errno
		if err := rc.Control(func(fd uintptr) {
			_, _, errno = syscall.Syscall(syscall.SYS_IOCTL, fd, req, uintptr(arg))
		}); err != nil {
			return err
		}
		if errno != 0 {
			return errno
		}
		return nil
	}
	if err := ioctl(syscall.TIOCGPTN, unsafe.Pointer(&n)); err != nil {
		t.Fatalf("TIOCGPTN: %v", err)
	}
	if err := ioctl(syscall.TIOCSPTLCK, unsafe.Pointer(&unlock)); err != nil {
		t.Fatalf("TIOCSPTLCK: %v", err)
	}
	slave, err = os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY|syscall.O_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("open slave: %v", err)
	}
	return master, slave
}

// Ctrl-C typed on the terminal reaches the command exactly once, straight from
// the terminal, and not the wrapper; the command can read the terminal; and
// the terminal is the wrapper's again once the command has exited.
func TestTerminalInterrupt(t *testing.T) {
	master, slave := openPTY(t)
	dir := t.TempDir()
	got, line, ready, result := filepath.Join(dir, "got"), filepath.Join(dir, "line"), filepath.Join(dir, "ready"), filepath.Join(dir, "result")

	// The wrapper runs in a new session whose controlling terminal is the
	// pty, as withlock does when a user types it into a shell.
	helper := osexec.Command(os.Args[0])
	helper.Env = append(os.Environ(), helperEnv+"=tty", "RESULT="+result,
		"F="+got, "L="+line, "R="+ready,
		`SCRIPT=trap 'echo got >> "$F"; exit 7' INT
read x
echo "$x" > "$L"
echo ready > "$R"
while :; do sleep 0.1; done`)
	helper.Stdin, helper.Stdout, helper.Stderr = slave, slave, slave
	helper.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	if err := helper.Start(); err != nil {
		t.Fatal(err)
	}
	slave.Close()
	exited := make(chan error, 1)
	go func() { exited <- helper.Wait() }()
	defer func() {
		select {
		case <-exited:
		default:
			helper.Process.Kill()
			<-exited
		}
	}()

	// Everything the terminal shows, for failure messages. The read ends
	// with EIO once nobody holds the slave any more.
	var mu sync.Mutex
	var screen bytes.Buffer
	go io.Copy(writerFunc(func(b []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return screen.Write(b)
	}), master)
	shown := func() string {
		mu.Lock()
		defer mu.Unlock()
		return screen.String()
	}

	// waitFile, failing at once if the helper exits first.
	waitFor := func(path string) string {
		t.Helper()
		deadline := time.After(long)
		for {
			if b, err := os.ReadFile(path); err == nil && len(b) > 0 {
				return string(b)
			}
			select {
			case err := <-exited:
				exited <- err
				t.Fatalf("helper exited (%v) before %s was written; terminal:\n%s", err, filepath.Base(path), shown())
			case <-deadline:
				t.Fatalf("%s not written within %v; terminal:\n%s", filepath.Base(path), long, shown())
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	write := func(s string) {
		t.Helper()
		master.SetWriteDeadline(time.Now().Add(long))
		if _, err := master.Write([]byte(s)); err != nil {
			t.Fatalf("write to terminal: %v; terminal:\n%s", err, shown())
		}
	}

	// If the command were not in the foreground, its read would stop it
	// with SIGTTIN and the test would time out here.
	write("hello\n")
	waitFor(ready)
	if s := waitFor(line); s != "hello\n" {
		t.Errorf("command read %q from the terminal, want %q", s, "hello\n")
	}

	write("\x03")
	select {
	case err := <-exited:
		exited <- err
		if err != nil {
			t.Fatalf("helper: %v; terminal:\n%s", err, shown())
		}
	case <-time.After(long):
		t.Fatalf("helper still running after Ctrl-C; terminal:\n%s", shown())
	}
	if s, want := strings.TrimSpace(waitFile(t, result)), "code=7 ints=0 foreground=true"; s != want {
		t.Errorf("helper result %q, want %q", s, want)
	}
	if l := lines(t, got); len(l) != 1 {
		t.Errorf("command saw INT %d times, want once", len(l))
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(b []byte) (int, error) { return f(b) }
