package file

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/withlock/withlock/internal/lock"
)

// procLock is a flock(2) lock as /proc/locks shows it: the process that
// took it (0 when it is not visible from here) and whether it is
// exclusive.
type procLock struct {
	pid   int
	write bool
}

// readProcLocks returns the flock(2) locks held on this host, by file.
// /proc/locks is the truth about who holds a lock; records only add
// details. Lines read
//
//	1: FLOCK  ADVISORY  WRITE 4242 fe:00:9977887 0 EOF
//	1: -> FLOCK  ADVISORY  WRITE 4243 fe:00:9977887 0 EOF
//
// the second being a waiter, which holds nothing. The device's major and
// minor numbers are in hex.
func readProcLocks() (map[fileID][]procLock, error) {
	data, err := os.ReadFile("/proc/locks")
	if err != nil {
		return nil, lock.Errorf(lock.ErrUnavailable, "file: cannot read /proc/locks, which says who holds a lock: %v", err)
	}
	locks := map[fileID][]procLock{}
	for line := range strings.Lines(string(data)) {
		fields := strings.Fields(line)
		if len(fields) < 6 || fields[1] != "FLOCK" {
			continue
		}
		pid, err1 := strconv.Atoi(fields[4])
		dev := strings.Split(fields[5], ":")
		if err1 != nil || len(dev) != 3 {
			continue
		}
		major, err1 := strconv.ParseUint(dev[0], 16, 32)
		minor, err2 := strconv.ParseUint(dev[1], 16, 32)
		ino, err3 := strconv.ParseUint(dev[2], 10, 64)
		if err1 != nil || err2 != nil || err3 != nil {
			continue
		}
		id := fileID{major: uint32(major), minor: uint32(minor), ino: ino}
		locks[id] = append(locks[id], procLock{pid: pid, write: fields[3] == "WRITE"})
	}
	return locks, nil
}

// procLocks returns the flock(2) locks held on the files ids. The kernel
// writes /proc/locks a page per read(2), so a long one is no snapshot:
// locks taken and let go meanwhile may be missed or seen twice. procLocks
// reads it until two reads in a row agree on ids and show nothing
// impossible (an exclusive lock beside another), up to a bound, and
// returns the last.
func procLocks(ids []fileID) (map[fileID][]procLock, error) {
	var last map[fileID][]procLock
	for range 50 {
		all, err := readProcLocks()
		if err != nil {
			return nil, err
		}
		now := map[fileID][]procLock{}
		sane := true
		for _, id := range ids {
			lks := all[id]
			slices.SortFunc(lks, func(a, b procLock) int { return cmp.Or(a.pid-b.pid, boolCmp(a.write, b.write)) })
			now[id] = lks
			for _, lk := range lks {
				sane = sane && (!lk.write || len(lks) == 1)
			}
		}
		if sane && last != nil && maps.EqualFunc(last, now, slices.Equal) {
			return now, nil
		}
		last = now
	}
	return last, nil
}

// cmdline is a process's argv, as far as this process may read it.
func cmdline(pid int) []string {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil || len(data) == 0 {
		return nil
	}
	return strings.Split(strings.TrimSuffix(string(data), "\x00"), "\x00")
}

// hasOpen reports whether process pid has the file id open, by looking at
// what its descriptors in /proc/PID/fd lead to.
func hasOpen(pid int, id fileID) (bool, error) {
	dir := "/proc/" + strconv.Itoa(pid) + "/fd"
	entries, err := os.ReadDir(dir)
	if err != nil {
		return false, err
	}
	for _, e := range entries {
		var st syscall.Stat_t
		if syscall.Stat(dir+"/"+e.Name(), &st) == nil && statID(&st) == id {
			return true, nil
		}
	}
	return false, nil
}

// watchCloses returns a channel that receives a value whenever one of the
// files of the lock file f (the lock, a slot, the mark) is closed by any
// process on this host, until stop is called. Closing is how a flock is let
// go, by a holder's release or by the kernel when the holder dies; other
// closes (a status that read a record) only wake the listener once more.
func watchCloses(dir, f string) (<-chan struct{}, func(), error) {
	fd, err := syscall.InotifyInit1(syscall.IN_CLOEXEC | syscall.IN_NONBLOCK)
	if err != nil {
		return nil, nil, fmt.Errorf("file: inotify: %w", err)
	}
	if _, err := syscall.InotifyAddWatch(fd, dir, syscall.IN_CLOSE_WRITE|syscall.IN_CLOSE_NOWRITE|syscall.IN_ONLYDIR); err != nil {
		syscall.Close(fd)
		return nil, nil, fmt.Errorf("file: inotify on %s: %w", dir, err)
	}
	// Non-blocking, so os.File reads it through the poller and Close ends
	// a Read in progress.
	in := os.NewFile(uintptr(fd), "inotify")
	c := make(chan struct{}, 1)
	go func() {
		buf := make([]byte, 64*(syscall.SizeofInotifyEvent+syscall.NAME_MAX+1))
		for {
			n, err := in.Read(buf)
			if err != nil {
				return
			}
			if closesOf(buf[:n], f) {
				select {
				case c <- struct{}{}:
				default:
				}
			}
		}
	}()
	return c, func() { in.Close() }, nil
}

// closesOf reports whether the inotify events in buf include a close of
// one of f's files, or an overflow (which may have hidden one).
func closesOf(buf []byte, f string) bool {
	for len(buf) >= syscall.SizeofInotifyEvent {
		mask := binary.NativeEndian.Uint32(buf[4:8])
		n := int(binary.NativeEndian.Uint32(buf[12:16]))
		if len(buf) < syscall.SizeofInotifyEvent+n {
			return true
		}
		name := string(bytes.TrimRight(buf[syscall.SizeofInotifyEvent:syscall.SizeofInotifyEvent+n], "\x00"))
		if mask&syscall.IN_Q_OVERFLOW != 0 || isFileOf(name, f) {
			return true
		}
		buf = buf[syscall.SizeofInotifyEvent+n:]
	}
	return false
}
