package exec

import (
	"os"
	"os/signal"
	"sync"
	"syscall"
)

// A process whose parent exits is handed to the init process of its PID
// namespace, PID 1, which must reap it once it exits: until then it stays a
// zombie and keeps its slot in the process table. When withlock is a
// container's entrypoint (an init container) it is PID 1, and everything the
// command leaves running behind it ("(sleep 5 &)", a daemon that forks
// twice) ends up withlock's child. So withlock as PID 1 reaps them, as tini
// and docker's --init do.
//
// Only as PID 1. Anywhere else an init already reaps orphans (systemd, a
// container's own init, the pause container of a pod that shares its PID
// namespace), and becoming a child subreaper (PR_SET_CHILD_SUBREAPER) would
// only change whose child they are: a daemon that the command detaches on
// purpose would belong to withlock until withlock exits, then be handed on.
//
// The reaper must never take a status that someone else waits for: the
// command's, whose waiter keeps it a zombie until Stop is done with its
// process group, nor that of a program withlock runs through os/exec (a
// credential plugin), which os/exec waits for by pid. waitid(P_ALL) cannot
// skip them: with WNOWAIT it reports the same kept zombie again and again,
// and without it takes whatever comes. So on each SIGCHLD the reaper looks
// in /proc for zombies whose parent is withlock and reaps each by its pid,
// leaving alone:
//   - the commands Start started and has not reaped yet. Each is registered
//     under reaper.mu from before its fork until after its reaping, and a
//     sweep holds reaper.mu, so a command that exits at once is never taken
//     for an orphan.
//   - every process in withlock's own process group. The command leads a
//     group of its own, and its orphans stay in that group or leave it for
//     one of their own (setsid); what withlock starts otherwise, os/exec
//     children included, inherits withlock's group and must stay in it.
var reaper = struct {
	once sync.Once
	mu   sync.Mutex
	// commands holds the pids of the commands Start started and their
	// waiters have not reaped yet.
	commands map[int]bool
}{commands: make(map[int]bool)}

// startReaper starts reaping orphans if this process is PID 1 of its PID
// namespace; otherwise it does nothing. Start calls it before every fork.
func startReaper() {
	reaper.once.Do(func() {
		if os.Getpid() != 1 {
			return
		}
		// /proc numbers processes as the PID namespace it was mounted
		// for. In one of another namespace the command's pid would name
		// some other process, and the sweep could take the command's
		// status: no reaping then, only leaked zombies, as before.
		if self, err := os.Readlink("/proc/self"); err != nil || self != "1" {
			return
		}
		// One pending notification is enough: a sweep sees every zombie
		// that exists when it reads /proc, and a child that exits during
		// a sweep sends a SIGCHLD of its own.
		sigchld := make(chan os.Signal, 1)
		signal.Notify(sigchld, syscall.SIGCHLD)
		go func() {
			for {
				reapOrphans()
				<-sigchld
			}
		}()
	})
}

// reapOrphans reaps every zombie child of this process that is neither a
// command of Start's nor in this process's own process group.
func reapOrphans() {
	reaper.mu.Lock()
	defer reaper.mu.Unlock()
	self, own := os.Getpid(), syscall.Getpgrp()
	eachProc(func(e procEntry) bool {
		if e.ppid != self || e.state != 'Z' || e.pgrp == own || reaper.commands[e.pid] {
			return true
		}
		// A zombie keeps its pid until it is reaped, and nothing else
		// here waits for this one, so the pid is still this zombie's.
		// WNOHANG: a group leader whose other threads still run shows as
		// a zombie but cannot be reaped yet; its last thread's exit
		// sends another SIGCHLD.
		var ws syscall.WaitStatus
		for {
			_, err := syscall.Wait4(e.pid, &ws, syscall.WNOHANG, nil)
			if err != syscall.EINTR {
				break
			}
		}
		return true
	})
}
