package exec_test

import (
	"fmt"
	"os"
	osexec "os/exec"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/withlock/withlock/internal/exec"
)

func init() {
	if os.Getenv(helperEnv) == "pdeathsig" {
		// Keep the main goroutine on the main thread, where init runs, so
		// that no other goroutine runs there: the runtime never ends the
		// main thread, which would hide the thread exits this helper is
		// about.
		runtime.LockOSThread()
	}
}

// runHelper runs the helper process called name, in the re-executed test
// binary, and returns its exit status.
func runHelper(name string) int {
	var err error
	switch name {
	case "pdeathsig":
		err = helperPdeathsig()
	case "tty":
		err = helperTTY()
	case "pid1":
		err = helperPID1()
	default:
		err = fmt.Errorf("unknown helper %q", name)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "helper:", err)
		return 1
	}
	return 0
}

// helperPdeathsig starts "sleep 1000" the way golang/go#27505 breaks it: from
// a goroutine that is locked to its thread and then exits, which makes the
// runtime end that thread, while other goroutines do the same. It writes the
// sleep's pid to $PIDFILE once the threads have ended, then waits to be
// killed.
func helperPdeathsig() error {
	stop := make(chan struct{})
	for range 4 { // keep the scheduler busy moving goroutines between threads
		go func() {
			for {
				select {
				case <-stop:
					return
				default:
					_ = make([]byte, 1<<10)
					runtime.Gosched()
				}
			}
		}()
	}

	type result struct {
		p   *exec.Process
		err error
	}
	res := make(chan result)
	go func() {
		runtime.LockOSThread() // exits locked: this thread is ended
		p, err := exec.Start([]string{"sleep", "1000"}, os.Environ())
		res <- result{p, err}
	}()
	r := <-res
	if r.err != nil {
		return r.err
	}

	var wg sync.WaitGroup
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread() // exits locked: this thread is ended
			time.Sleep(time.Millisecond)
		}()
	}
	wg.Wait()
	close(stop)
	// The ended threads exit just after their goroutines; give them time.
	time.Sleep(200 * time.Millisecond)

	if err := os.WriteFile(os.Getenv("PIDFILE"), fmt.Appendf(nil, "%d\n", r.p.Pid()), 0o644); err != nil {
		return err
	}
	<-r.p.Done()
	return fmt.Errorf("sleep exited with %d before its parent was killed", r.p.ExitCode())
}

// helperTTY plays withlock on the terminal that is its stdin: it forwards
// the signals it receives, as withlock does, and counts the INTs among them.
// It runs $SCRIPT, and when that has exited writes to $RESULT the exit code,
// the INTs it received itself, and whether the terminal's foreground group is
// ours again.
func helperTTY() error {
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, exec.Forwarded...)
	p, err := exec.Start([]string{"sh", "-c", os.Getenv("SCRIPT")}, os.Environ())
	if err != nil {
		return err
	}
	var ints atomic.Int32
	go func() {
		for s := range sigs {
			if s == syscall.SIGINT {
				ints.Add(1)
			}
			p.Signal(s)
		}
	}()
	<-p.Done()
	var fg int32
	syscall.Syscall(syscall.SYS_IOCTL, 0, syscall.TIOCGPGRP, uintptr(unsafe.Pointer(&fg)))
	result := fmt.Sprintf("code=%d ints=%d foreground=%v\n", p.ExitCode(), ints.Load(), int(fg) == syscall.Getpgrp())
	return os.WriteFile(os.Getenv("RESULT"), []byte(result), 0o644)
}

// helperPID1 plays withlock as the init of a new PID namespace (the test
// starts it with CLONE_NEWPID and CLONE_NEWNS): it mounts a /proc of its own
// namespace, as a container runtime does, forwards the signals it receives,
// and runs $SCRIPT $REPEAT times (default once), one after the other. It
// writes to $RESULT the exit codes, separated by spaces. With $PLUGINS set
// it also runs "sh -c 'exit 4'" through os/exec, as a credential plugin
// would be run, over and over while the scripts run, and fails if one of
// them does not exit 4.
func helperPID1() error {
	if err := syscall.Mount("", "/", "", syscall.MS_REC|syscall.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("making mounts private: %w", err)
	}
	if err := syscall.Mount("proc", "/proc", "proc", syscall.MS_NOSUID|syscall.MS_NODEV|syscall.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mounting /proc: %w", err)
	}
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, exec.Forwarded...)
	var current atomic.Pointer[exec.Process]
	go func() {
		for s := range sigs {
			if p := current.Load(); p != nil {
				p.Signal(s)
			}
		}
	}()

	stop := make(chan struct{})
	plugins := make(chan error, 1)
	go func() {
		if os.Getenv("PLUGINS") == "" {
			plugins <- nil
			return
		}
		for n := 0; ; n++ {
			select {
			case <-stop:
				plugins <- nil
				return
			default:
			}
			c := osexec.Command("sh", "-c", "exit 4")
			if err := c.Run(); c.ProcessState == nil || c.ProcessState.ExitCode() != 4 {
				plugins <- fmt.Errorf("os/exec run %d: %v, want exit status 4", n, err)
				return
			}
		}
	}()

	repeat := 1
	if r := os.Getenv("REPEAT"); r != "" {
		var err error
		if repeat, err = strconv.Atoi(r); err != nil {
			return err
		}
	}
	var codes []string
	for range repeat {
		p, err := exec.Start([]string{"sh", "-c", os.Getenv("SCRIPT")}, os.Environ())
		if err != nil {
			return err
		}
		current.Store(p)
		<-p.Done()
		codes = append(codes, strconv.Itoa(p.ExitCode()))
	}
	close(stop)
	if err := <-plugins; err != nil {
		return err
	}
	return os.WriteFile(os.Getenv("RESULT"), []byte(strings.Join(codes, " ")+"\n"), 0o644)
}
