package file

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/withlock/withlock/internal/lock"
)

// breakSignal is what withlock release --force sends to the withlock that
// holds a file lock: signal 42 (SIGRTMIN+8 as glibc counts), which tells it
// that its lock is broken. A flock can be let go only by its holder, so the
// breaker asks it to.
//
// Why this one: withlock forwards INT, TERM, HUP, QUIT, USR1, USR2 and WINCH
// to its command (docs/behaviour.md, Signals), so none of those can mean anything to withlock
// itself. Of the signals whose default action is harmless, SIGURG is sent
// by the Go runtime to itself to preempt goroutines, SIGCHLD comes with
// every exit of the command, and SIGCONT with every fg and bg of a shell.
// A real-time signal has no meaning to anyone but those who ask for it, and
// a Go program ignores one it has not asked for, so a withlock that holds
// no file lock shrugs it off. A program in another language would die of
// it: release --force signals only a process it has checked to be the
// withlock that holds the lock (Break).
const breakSignal = syscall.Signal(42)

// listening is the leases of this process that hold a file lock. The
// signal is for the process, which cannot tell which lock it was about: it
// breaks them all. withlock holds one lock.
var listening struct {
	once   sync.Once
	mu     sync.Mutex
	leases map[*lease]bool
}

// listenForBreak makes breakSignal break l, until l is let go.
func listenForBreak(l *lease) {
	startBreakListener()
	listening.mu.Lock()
	listening.leases[l] = true
	listening.mu.Unlock()
}

// startBreakListener starts, once per process, what listenForBreak
// registers leases with.
func startBreakListener() {
	listening.once.Do(func() {
		listening.leases = map[*lease]bool{}
		c := make(chan os.Signal, 1)
		// Never stopped: a signal that comes just after the last lease was
		// let go must find a listener that ignores it, not a default action.
		signal.Notify(c, breakSignal)
		go func() {
			for range c {
				listening.mu.Lock()
				var broken []*lease
				for l := range listening.leases {
					broken = append(broken, l)
				}
				clear(listening.leases)
				listening.mu.Unlock()
				for _, l := range broken {
					l.breakNow()
				}
			}
		}()
	})
}

func stopListening(l *lease) {
	listening.mu.Lock()
	delete(listening.leases, l)
	listening.mu.Unlock()
}

// Break breaks name's lock: it signals each holding withlock (breakSignal),
// which lets go of the lock at once and stops its command, and returns once
// none of them holds the lock file any more (bounded by ctx).
//
// It signals a process only after checking that it is the withlock that
// holds the lock, not a process that got a dead holder's pid: /proc/locks
// shows it holding the file; it wrote a withlock record naming itself, pid
// and start time, in the file it holds; it has the lock file open (per
// /proc/PID/fd). It checks every holder before it signals any: a lock held
// by flock(1) or another tool (no record), or by a withlock on another host
// (a shared filesystem), cannot be broken from here, and Break says so with
// an error wrapping ErrHeld, having signalled no one.
func (b *backend) Break(ctx context.Context, name string) ([]lock.Holder, error) {
	f := FileName(name)
	s, err := b.look(f)
	if err != nil || len(s.holders) == 0 {
		return nil, err
	}
	procs := map[int]*os.Process{}
	defer func() {
		for _, p := range procs {
			p.Release()
		}
	}()
	var broken []lock.Holder
	for _, h := range s.holders {
		switch {
		case h.remote:
			return nil, lock.Errorf(lock.ErrHeld, "%q is held by withlock pid %d on %s, not on this host (a shared filesystem?): run withlock release --force there", name, h.PID, h.Host)
		case h.rec == nil:
			what := "unknown command"
			if len(h.Command) > 0 {
				what = strings.Join(h.Command, " ")
			}
			return nil, lock.Errorf(lock.ErrHeld, "%q is held by pid %d (%s), which is not a withlock: stop that process to free the lock", name, h.pid, what)
		}
		broken = append(broken, h.Holder)
		if procs[h.pid] != nil {
			continue
		}
		p, err := verify(name, h, s.id)
		if err != nil {
			return nil, err
		}
		procs[h.pid] = p
	}

	// Listen before signalling, so that no let-go goes unheard.
	closed, stop, err := watchCloses(b.dir, f)
	if err != nil {
		b.opts.Log.Debug("cannot watch the lock's files; checking every second", "err", err)
	} else {
		defer stop()
	}
	for pid, p := range procs {
		err := p.Signal(breakSignal)
		switch {
		case err == nil, errors.Is(err, os.ErrProcessDone):
		case errors.Is(err, syscall.EPERM):
			return nil, lock.Errorf(lock.ErrRefused, "not allowed to signal pid %d, which holds %q: run withlock release --force as root or as its user", pid, name)
		default:
			return nil, lock.Errorf(lock.ErrUnavailable, "signal pid %d: %v", pid, err)
		}
	}
	b.opts.Log.Debug("signalled the holders", "signal", int(breakSignal), "pids", len(procs))

	// A safety net in case a close is not heard (no inotify).
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		locks, err := procLocks([]fileID{s.id})
		if err != nil {
			return broken, err
		}
		var still []string
		for _, lk := range locks[s.id] {
			if procs[lk.pid] != nil {
				still = append(still, fmt.Sprint(lk.pid))
			}
		}
		if len(still) == 0 {
			return broken, nil
		}
		select {
		case <-ctx.Done():
			return broken, lock.Errorf(lock.ErrHeld, "%q is still held by pid %s, signalled to let go (%v)", name, strings.Join(still, ", "), context.Cause(ctx))
		case <-closed:
		case <-tick.C:
		}
	}
}

// verify checks that h's process is the withlock that wrote h's record and
// holds the lock file id, and returns it. The process is found first (a
// pidfd on Linux) and checked after, so the signal that follows reaches the
// process checked or none.
func verify(name string, h holder, id fileID) (*os.Process, error) {
	p, err := os.FindProcess(h.pid)
	if err != nil {
		return nil, lock.Errorf(lock.ErrUnavailable, "find pid %d: %v", h.pid, err)
	}
	start, err := procStart(h.pid)
	if err != nil || start != h.rec.Start {
		p.Release()
		return nil, lock.Errorf(lock.ErrHeld, "%q is held by pid %d, which is not the withlock that recorded it (it started at another time): stop that process to free the lock", name, h.pid)
	}
	open, err := hasOpen(h.pid, id)
	switch {
	case errors.Is(err, os.ErrPermission):
		p.Release()
		return nil, lock.Errorf(lock.ErrRefused, "cannot see the open files of pid %d, which holds %q: run withlock release --force as root or as its user", h.pid, name)
	case err != nil:
		p.Release()
		return nil, lock.Errorf(lock.ErrUnavailable, "read the open files of pid %d: %v", h.pid, err)
	case !open:
		p.Release()
		return nil, lock.Errorf(lock.ErrHeld, "%q is held by pid %d, which does not have its lock file open as the withlock that recorded it would: stop that process to free the lock", name, h.pid)
	}
	return p, nil
}
