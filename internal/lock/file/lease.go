package file

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"

	"github.com/withlock/withlock/internal/lock"
)

var _ lock.Watcher = (*lease)(nil)

// lease is a lock held through its open files: the lock file, and the slot
// of a semaphore or shared holder. Its methods are called by one goroutine
// at a time, but release --force (breakNow, on breakSignal) may close it
// from another.
type lease struct {
	path     string // the lock file
	slotPath string // the slot's, if any
	// slotCounts says the slot is a semaphore's, whose removal would let
	// a newcomer make N+1 holders; a shared holder's record file excludes
	// no one.
	slotCounts bool

	mu       sync.Mutex
	main     *os.File
	slot     *os.File
	recorded *os.File // main or slot, once it holds our record
	closed   bool

	broken chan struct{} // closed once release --force has broken the lock
}

func newLease(path string, main *os.File) *lease {
	return &lease{path: path, main: main, broken: make(chan struct{})}
}

// record writes r into the slot if the lease has one, else into the lock
// file: either way through the descriptor that holds the lock.
func (l *lease) record(r record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return errors.New("broken before it could write its record")
	}
	f := l.main
	if l.slot != nil {
		f = l.slot
	}
	if err := writeRecord(f, r); err != nil {
		return err
	}
	l.recorded = f
	return nil
}

func (l *lease) errBroken() error {
	return lock.Errorf(lock.ErrLost, "withlock release --force broke it (%s)", l.path)
}

// Keep checks that the lock was not broken and that the files that
// exclude others (the lock file, a semaphore's slot) are still the ones
// locked: if someone removed or replaced one, a newcomer can lock the new
// file while we hold the old one, so our lock no longer excludes anyone.
func (l *lease) Keep(context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	select {
	case <-l.broken:
		return l.errBroken()
	default:
	}
	if l.closed {
		return lock.Errorf(lock.ErrLost, "%s was let go", l.path)
	}
	for _, held := range []struct {
		f    *os.File
		path string
	}{{l.main, l.path}, {l.slot, l.slotPath}} {
		if held.f == nil || held.f == l.slot && !l.slotCounts {
			continue
		}
		same, err := samePath(held.f, held.path)
		if errors.Is(err, os.ErrNotExist) || err == nil && !same {
			return lock.Errorf(lock.ErrLost, "%s was removed or replaced", held.path)
		}
		if err != nil {
			return fmt.Errorf("file: check %s: %w", held.path, err)
		}
	}
	return nil
}

// Watch returns ErrLost as soon as withlock release --force breaks the
// lock (it signals this process: see breakSignal); nil when ctx ends.
func (l *lease) Watch(ctx context.Context) error {
	select {
	case <-ctx.Done():
		return nil
	case <-l.broken:
		return l.errBroken()
	}
}

// Release clears the record and unlocks by closing the files. The files
// themselves stay: removing one would let a waiter that already opened it
// lock an unlinked file while a newcomer locks a new one.
func (l *lease) Release(context.Context) error {
	return l.close()
}

func (l *lease) close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	l.closed = true
	stopListening(l)
	if l.recorded != nil {
		clearRecord(l.recorded)
	}
	var err error
	if l.slot != nil {
		err = l.slot.Close()
	}
	return errors.Join(err, l.main.Close())
}

// breakNow lets go of the lock at once and then says it is lost: release
// --force returns once the lock is free, and the holder's Watch, which
// stops its command, learns of it.
func (l *lease) breakNow() {
	l.close()
	close(l.broken)
}
