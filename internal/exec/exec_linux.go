package exec

import (
	"bytes"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"syscall"
	"unsafe"
)

// Start looks argv[0] up in PATH as a shell would (see lookPath) and starts
// it with env as its environment and this process's own stdin, stdout and
// stderr: the same open files, no pipes, no copying.
//
// The child leads a new process group, so that Stop can reach every process
// it starts. If stdin is a terminal whose foreground group is ours, the
// child's group becomes the foreground group: the command can then read the
// terminal, and Ctrl-C reaches it exactly once, straight from the terminal,
// which no longer signals this process at all. The terminal is given back to
// our group when the child exits. Otherwise (cron, CI, pipes) the child simply
// runs in its own group and only signals the caller forwards reach it.
//
// The child is sent SIGKILL if this process dies, so that no command outlives
// its wrapper.
//
// Errors wrap ErrNotFound or ErrNotExecutable when the command cannot be
// run, and are prefixed "exec: " otherwise (fork failure).
func Start(argv []string, env []string) (*Process, error) {
	if len(argv) == 0 {
		return nil, fmt.Errorf("%w: empty command", ErrNotFound)
	}
	path, err := Find(argv[0])
	if err != nil {
		return nil, err
	}
	return StartFound(path, argv, env)
}

// Find looks name up in PATH as Start does, with Start's errors. A caller
// that waits before it starts its command (withlock, for its lock) finds it
// first and starts it with StartFound, so that the start does not pay for
// the search, as os/exec's Command searches before its Start.
func Find(name string) (string, error) {
	if name == "" {
		return "", fmt.Errorf("%w: empty command", ErrNotFound)
	}
	return lookPath(name)
}

// StartFound is Start with argv[0] already found at path (Find).
func StartFound(path string, argv []string, env []string) (*Process, error) {
	p := &Process{
		exited:  make(chan struct{}),
		done:    make(chan struct{}),
		stopped: make(chan struct{}),
	}
	started := make(chan error, 1)
	go p.run(path, argv, env, started)
	if err := <-started; err != nil {
		return nil, err
	}
	return p, nil
}

// run starts the child and then is its only waiter.
//
// The parent-death signal is tied not to this process but to the thread that
// forked the child: Linux sends it when that thread exits (golang/go#27505),
// and the Go runtime ends a thread whenever a goroutine exits while locked to
// it, which any goroutine of the program may do. So the fork happens on a
// thread this goroutine locks, and keeps busy in waitid, until the child is
// reaped. It never unlocks, so the runtime ends this thread when run returns,
// once no child of it is left.
func (p *Process) run(path string, argv, env []string, started chan<- error) {
	runtime.LockOSThread()

	fg := stdinForeground()
	attr := &syscall.ProcAttr{
		Env:   env,
		Files: []uintptr{0, 1, 2}, // inherited as they are; the runtime keeps 0-2 open
		Sys: &syscall.SysProcAttr{
			Setpgid:    true,
			Foreground: fg, // Go's child does TIOCSPGRP with signals blocked, so no SIGTTOU
			Ctty:       0,  // with Foreground, a descriptor of this process: stdin
			Pdeathsig:  syscall.SIGKILL,
		},
	}
	// Registered before the child can exit, and reaped below before it is
	// forgotten, so that a reaper of orphans never takes it (reap_linux.go).
	startReaper()
	reaper.mu.Lock()
	pid, err := syscall.ForkExec(path, argv, attr)
	if err == nil {
		reaper.commands[pid] = true
	}
	reaper.mu.Unlock()
	if err != nil {
		started <- startError(argv[0], err)
		return
	}
	p.pid = pid
	started <- nil

	waitExit(pid)
	close(p.exited)

	p.mu.Lock()
	if p.stopping {
		// Stop still signals the group; keep the zombie so that the group
		// id cannot be recycled under it.
		p.mu.Unlock()
		<-p.stopped
		p.mu.Lock()
	}
	if fg {
		restoreForeground(pid)
	}
	var ws syscall.WaitStatus
	reaper.mu.Lock()
	for {
		_, err = syscall.Wait4(pid, &ws, 0, nil)
		if err != syscall.EINTR {
			break
		}
	}
	delete(reaper.commands, pid)
	reaper.mu.Unlock()
	p.reaped = true
	p.mu.Unlock()

	switch {
	case err != nil:
		p.code = -1 // someone else reaped it (SIGCHLD ignored): status lost
	case ws.Signaled():
		p.code = 128 + int(ws.Signal())
	default:
		p.code = ws.ExitStatus()
	}
	close(p.done)
}

// startError sorts an execve failure as a shell would: a missing file (or
// interpreter named by "#!") is "not found", anything the kernel refuses to
// run is "not executable".
func startError(name string, err error) error {
	switch err {
	case syscall.ENOENT, syscall.ENOTDIR:
		return notFound(name)
	case syscall.EACCES, syscall.EPERM, syscall.ENOEXEC, syscall.EISDIR,
		syscall.ETXTBSY, syscall.ELIBBAD, syscall.ELOOP:
		return notExecutable(name, err)
	}
	return fmt.Errorf("exec: start %s: %w", name, err)
}

// waitExit blocks until the child has terminated, without reaping it.
// Leaving the zombie in place keeps its pid and group id reserved while Stop
// may still signal the group. An error other than EINTR means there is no
// child left to wait for.
func waitExit(pid int) {
	const pPID = 1     // idtype_t P_PID
	var info [128]byte // siginfo_t, filled in and ignored
	for {
		_, _, errno := syscall.Syscall6(syscall.SYS_WAITID, pPID, uintptr(pid),
			uintptr(unsafe.Pointer(&info)), syscall.WEXITED|syscall.WNOWAIT, 0, 0)
		if errno != syscall.EINTR {
			return
		}
	}
}

// stdinForeground reports whether stdin is a terminal whose foreground
// process group is ours, which is when a shell would hand the terminal to the
// job. TIOCGPGRP fails on anything that is not our controlling terminal.
func stdinForeground() bool {
	var pgrp int32
	_, _, errno := syscall.Syscall(syscall.SYS_IOCTL, 0, syscall.TIOCGPGRP, uintptr(unsafe.Pointer(&pgrp)))
	return errno == 0 && int(pgrp) == syscall.Getpgrp()
}

// restoreForeground gives the terminal back to our process group if the
// child's group (pgid) still has it. It does nothing if someone else, such as
// the user's shell after a job-control change, has taken the terminal since.
//
// We are a background group at this point, and tcsetpgrp from the background
// raises SIGTTOU (which would stop us) unless SIGTTOU is ignored or blocked.
// Shells ignore it; we block it on this thread only, which the kernel treats
// the same way, instead of changing the process-wide disposition that the
// caller's signal handling may rely on. This goroutine is locked to its
// thread, so the mask cannot leak to other goroutines.
func restoreForeground(pgid int) {
	var cur int32
	_, _, errno := syscall.Syscall(syscall.SYS_IOCTL, 0, syscall.TIOCGPGRP, uintptr(unsafe.Pointer(&cur)))
	if errno != 0 || int(cur) != pgid {
		return
	}
	const sigBlock, sigSetmask = 0, 2
	set := uint64(1) << (syscall.SIGTTOU - 1)
	var old uint64
	if _, _, errno := syscall.RawSyscall6(syscall.SYS_RT_SIGPROCMASK, sigBlock,
		uintptr(unsafe.Pointer(&set)), uintptr(unsafe.Pointer(&old)), 8, 0, 0); errno != 0 {
		return
	}
	ours := int32(syscall.Getpgrp())
	syscall.Syscall(syscall.SYS_IOCTL, 0, syscall.TIOCSPGRP, uintptr(unsafe.Pointer(&ours)))
	syscall.RawSyscall6(syscall.SYS_RT_SIGPROCMASK, sigSetmask,
		uintptr(unsafe.Pointer(&old)), 0, 8, 0, 0)
}

// groupHasLive reports whether any process other than a zombie is in process
// group pgid, by reading /proc/*/stat.
func groupHasLive(pgid int) bool {
	found := false
	eachProc(func(e procEntry) bool {
		found = e.pgrp == pgid && e.state != 'Z' && e.state != 'X'
		return !found
	})
	return found
}

// procEntry is what this package reads of a process in /proc/PID/stat. The
// numbers are those of the PID namespace that /proc was mounted for.
type procEntry struct {
	pid   int
	state byte // R, S, D, T, Z (zombie), X (dead)...
	ppid  int
	pgrp  int
}

// eachProc calls fn for the processes in /proc, in no particular order,
// until fn returns false. A process that exits meanwhile may or may not be
// seen. Without /proc it sees nothing.
func eachProc(fn func(procEntry) bool) {
	d, err := os.Open("/proc")
	if err != nil {
		return
	}
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil {
		return
	}
	for _, name := range names {
		if name[0] < '0' || name[0] > '9' {
			continue
		}
		pid, err := strconv.Atoi(name)
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + name + "/stat")
		if err != nil {
			continue // gone meanwhile
		}
		// "pid (comm) state ppid pgrp ...": comm may hold spaces and
		// parentheses, so fields are counted from the last ')'.
		i := bytes.LastIndexByte(b, ')')
		if i < 0 {
			continue
		}
		f := bytes.Fields(b[i+1:])
		if len(f) < 3 {
			continue
		}
		ppid, err1 := strconv.Atoi(string(f[1]))
		pgrp, err2 := strconv.Atoi(string(f[2]))
		if err1 != nil || err2 != nil {
			continue
		}
		if !fn(procEntry{pid: pid, state: f[0][0], ppid: ppid, pgrp: pgrp}) {
			return
		}
	}
}
