package cmd

import (
	"os"
	"strconv"
	"strings"
	"syscall"
)

// processStart is when process pid started, in clock ticks since boot
// (/proc/PID/stat's 22nd field): with the pid, it names one process. A
// zombie, ended but not yet reaped, is not found.
func processStart(pid int) (uint64, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false
	}
	// The command name, in parentheses, may hold spaces: count after it.
	s := string(b)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(fields) < 20 || fields[0] == "Z" || fields[0] == "X" {
		return 0, false
	}
	start, err := strconv.ParseUint(fields[19], 10, 64)
	return start, err == nil
}

// keeperAttr is how withlock acquire starts its keeper: in a session of
// its own, so that no terminal's signals and no process group of the
// caller's reach it. (Not with a parent-death signal: Linux keeps that per
// thread, and the keeper could not undo it on the thread that has it.)
func keeperAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setsid: true} }

// closeInheritedOnExec marks every descriptor above stderr close-on-exec,
// so that the keeper inherits none that withlock acquire got from its
// caller: a CI runner's or a shell's copy of a step's output would keep the
// step open as long as the keeper lives. (The keeper's own pipes are
// passed explicitly, and are not affected.)
func closeInheritedOnExec() {
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return
	}
	for _, e := range entries {
		if fd, err := strconv.Atoi(e.Name()); err == nil && fd > 2 {
			syscall.CloseOnExec(fd)
		}
	}
}
