package file

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/withlock/withlock/internal/lock"
)

// Exclusive and shared locks wait in flock(2); a semaphore's waiters are
// woken when a file of the lock is closed.
var (
	_ lock.Waiter   = waiting{}
	_ lock.Notifier = semaphore{}
)

// TryAcquire makes one attempt, in the backend's mode:
//   - exclusive: LOCK_EX|LOCK_NB on the lock file, as flock -n does;
//   - shared: LOCK_SH|LOCK_NB on the writer-waiting mark (held elsewhere
//     means a writer waits: queue behind it), then on the lock file, then a
//     free record file;
//   - semaphore: the same, then LOCK_EX|LOCK_NB on the first free slot
//     below N.
func (b *backend) TryAcquire(ctx context.Context, name string) (lock.Lease, error) {
	f := FileName(name)
	switch b.opts.Mode {
	case lock.Shared:
		mark, err := b.lockFile(MarkName(f), syscall.LOCK_SH|syscall.LOCK_NB)
		if err != nil {
			return nil, err
		}
		main, err := b.lockFile(f, syscall.LOCK_SH|syscall.LOCK_NB)
		mark.Close()
		if err != nil {
			return nil, err
		}
		return b.hold(name, f, newLease(b.path(f), main))
	case lock.Semaphore:
		return b.trySemaphore(name, f)
	}
	main, err := b.lockFile(f, syscall.LOCK_EX|syscall.LOCK_NB)
	if err != nil {
		return nil, err
	}
	return b.hold(name, f, newLease(b.path(f), main))
}

// Acquire waits in flock(2) itself, so the kernel hands the lock over the
// moment it is free. A writer first takes the writer-waiting mark
// exclusively and keeps it while it waits for the lock: new shared holders,
// which take the mark shared on their way in, then wait behind it, and the
// shared holders already in drain away. A shared waiter takes the mark
// shared, so it waits only while a writer waits or holds.
// The lock's life counts from when the kernel granted it, a moment ago.
func (w waiting) Acquire(ctx context.Context, name string) (lock.Lease, time.Time, error) {
	l, err := w.acquire(ctx, name)
	return l, time.Now(), err
}

func (w waiting) acquire(ctx context.Context, name string) (lock.Lease, error) {
	f := FileName(name)
	how := syscall.LOCK_EX
	if w.opts.Mode == lock.Shared {
		how = syscall.LOCK_SH
	}
	// Both files are opened here, so that a wait given up creates nothing
	// afterwards.
	mark, err := w.openLock(w.path(MarkName(f)))
	if err != nil {
		return nil, err
	}
	main, err := w.openLock(w.path(f))
	if err != nil {
		mark.Close()
		return nil, err
	}
	type result struct {
		l   *lease
		err error
	}
	readyToHold()
	// A blocked flock cannot be interrupted, so it blocks on another
	// goroutine. If ctx ends first, that goroutine lets go of whatever it
	// gets, whenever it gets it, and goes no further.
	done := make(chan result, 1)
	go func() {
		l, err := w.wait(ctx, f, mark, main, how)
		done <- result{l, err}
	}()
	select {
	case r := <-done:
		if r.err != nil {
			return nil, r.err
		}
		return w.hold(name, f, r.l)
	case <-ctx.Done():
		go func() {
			if r := <-done; r.err == nil {
				r.l.close()
			}
		}()
		return nil, fmt.Errorf("file: wait for %s: %w", w.path(f), context.Cause(ctx))
	}
}

// wait blocks until it holds the mark and then the lock file in mode how,
// and lets go of the mark.
func (b *backend) wait(ctx context.Context, f string, mark, main *os.File, how int) (*lease, error) {
	err := b.lockWaiting(ctx, &mark, MarkName(f), how)
	if mark != nil {
		defer mark.Close()
	}
	if err == nil {
		err = b.lockWaiting(ctx, &main, f, how)
	}
	if err != nil {
		if main != nil {
			main.Close()
		}
		return nil, err
	}
	return newLease(b.path(f), main), nil
}

// lockWaiting flocks *fp, DIR/f, with how (blocking), again on the file
// the path names now if the file was removed or replaced meanwhile (see
// lockKept). Once ctx is done it goes no further: it closes *fp, and sets
// it to nil, whatever it got.
func (b *backend) lockWaiting(ctx context.Context, fp **os.File, f string, how int) error {
	path := b.path(f)
	for {
		err := flock(*fp, how)
		if err == nil && ctx.Err() == nil {
			if same, _ := samePath(*fp, path); same {
				return nil
			}
		}
		(*fp).Close()
		*fp = nil
		switch {
		case err != nil:
			return err
		case ctx.Err() != nil:
			return ctx.Err()
		}
		if *fp, err = b.openLock(path); err != nil {
			return err
		}
	}
}

// attempt is a semaphore waiter's files, kept open from one attempt to the
// next: a failed attempt then closes nothing, and so wakes no other waiter
// through Notify (which hears the lock's files being closed), nor itself.
type attempt struct {
	f          string
	mark, main *os.File
	slots      []*os.File // slot k, once opened
}

func (b *backend) trySemaphore(name, f string) (lock.Lease, error) {
	n := b.opts.MaxHolders
	if b.try != nil && b.try.f != f {
		b.dropAttempt()
	}
	if b.try == nil {
		b.try = &attempt{f: f, slots: make([]*os.File, n)}
	}
	a := b.try
	err := b.lockKept(&a.mark, MarkName(f), syscall.LOCK_SH|syscall.LOCK_NB)
	if err == nil {
		err = b.lockKept(&a.main, f, syscall.LOCK_SH|syscall.LOCK_NB)
		flock(a.mark, syscall.LOCK_UN)
	}
	if err != nil {
		if !errors.Is(err, lock.ErrHeld) {
			b.dropAttempt()
		}
		return nil, err
	}
	for k := range n {
		err := b.lockKept(&a.slots[k], SlotName(f, k), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			l := newLease(b.path(f), a.main)
			l.slot, l.slotPath, l.slotCounts = a.slots[k], b.path(SlotName(f, k)), true
			a.main, a.slots[k] = nil, nil
			b.dropAttempt()
			return b.hold(name, f, l)
		}
		if !errors.Is(err, lock.ErrHeld) {
			b.dropAttempt()
			return nil, err
		}
	}
	flock(a.main, syscall.LOCK_UN)
	// Every slot is taken. If their holders asked for another N, waiting
	// would be in vain: say so now.
	for _, s := range a.slots {
		if r, ok := readRecord(s); ok && r.live() {
			if err := b.conflict(name, r); err != nil {
				b.dropAttempt()
				return nil, err
			}
		}
	}
	readyToHold() // the next attempt may be the one that gets a slot
	return nil, lock.ErrHeld
}

func (b *backend) dropAttempt() {
	if b.try == nil {
		return
	}
	for _, f := range append([]*os.File{b.try.mark, b.try.main}, b.try.slots...) {
		if f != nil {
			f.Close()
		}
	}
	b.try = nil
}

// lockFile opens DIR/f and flocks it with how.
func (b *backend) lockFile(f string, how int) (*os.File, error) {
	var file *os.File
	if err := b.lockKept(&file, f, how); err != nil {
		if file != nil {
			file.Close()
		}
		return nil, err
	}
	return file, nil
}

// lockKept flocks *fp, DIR/f, with how, opening it first if *fp is nil.
// Someone may have removed or replaced the file since it was opened: a lock
// on a file no longer at its path excludes nobody, so it then locks what
// the path names now. On ErrHeld *fp stays open; on other errors it is
// closed and nil.
func (b *backend) lockKept(fp **os.File, f string, how int) error {
	path := b.path(f)
	for {
		if *fp == nil {
			file, err := b.openLock(path)
			if err != nil {
				return err
			}
			*fp = file
		}
		err := flock(*fp, how)
		if err != nil && !errors.Is(err, lock.ErrHeld) {
			(*fp).Close()
			*fp = nil
			return err
		}
		if same, _ := samePath(*fp, path); same {
			return err
		}
		(*fp).Close()
		*fp = nil
	}
}

// hold makes l, a lock just taken, a held lease: a shared holder takes a
// record file; then the lease listens for release --force (before
// it writes the record, which is what a breaker looks for) and writes its
// record. Shared and semaphore holders then read the other holders'
// records, and give the lock back if those asked for another mode or N.
// Each writes before it reads, so of two holders that disagree at least
// one sees the other.
func (b *backend) hold(name, f string, l *lease) (lock.Lease, error) {
	if b.opts.Mode == lock.Shared {
		for k := 0; l.slot == nil; k++ {
			slot, err := b.lockFile(SharedName(f, k), syscall.LOCK_EX|syscall.LOCK_NB)
			switch {
			case err == nil:
				l.slot, l.slotPath = slot, b.path(SharedName(f, k))
			case !errors.Is(err, lock.ErrHeld):
				l.close()
				return nil, err
			}
		}
	}
	listenForBreak(l)
	r, err := self()
	if err == nil {
		r.Name, r.Mode, r.MaxHolders = name, b.opts.Mode, b.opts.MaxHolders
		r.Command, r.AcquiredAt = b.opts.Holder.Command, time.Now()
		err = l.record(r)
	}
	switch {
	case errors.Is(err, syscall.EBADF), errors.Is(err, errForeign):
		// Opened read-only (another user's file), or someone else's
		// content: the lock is held all the same. status shows what /proc
		// knows, and release --force cannot vouch for this holder.
		b.opts.Log.Debug("no holder record", "err", err)
	case err != nil:
		b.opts.Log.Warn(fmt.Sprintf("file: no holder record for %q: %v", name, err))
	}
	if b.opts.Mode != lock.Exclusive {
		if err := b.checkOthers(name, f, l.slotPath); err != nil {
			l.close()
			return nil, err
		}
	}
	b.held = l
	return l, nil
}

// readyToHold does before a wait what hold would otherwise do first once
// the lock is granted, so that the hand-off pays only for writing the
// record: it starts the listener for release --force, learns this
// process's identity and builds the record's encoder (encoding/json
// builds it at its first use). All three are the process's, done once.
var readyToHold = sync.OnceFunc(func() {
	startBreakListener()
	if r, err := self(); err == nil {
		r.encode()
	}
})

// checkOthers reads the records of every slot and shared holder's record
// file but own and returns an ErrUsage error if a live one asked for
// another mode or N.
func (b *backend) checkOthers(name, f, own string) error {
	for _, fileK := range []func(string, int) string{SlotName, SharedName} {
		for k := 0; ; k++ {
			path := b.path(fileK(f, k))
			if path == own {
				continue
			}
			s, _ := openRead(path)
			if s == nil {
				break // no such file (or not a plain one: never anyone's)
			}
			r, ok := readRecord(s)
			s.Close()
			if ok && r.live() {
				if err := b.conflict(name, r); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// conflict says why a holder whose record is r and this backend cannot
// hold name together, if they cannot: every holder of a semaphore must ask
// for the same N, and a semaphore is not a shared lock.
func (b *backend) conflict(name string, r record) error {
	mine, n := b.opts.Mode, b.opts.MaxHolders
	switch {
	case r.Mode == lock.Semaphore && mine == lock.Semaphore && r.MaxHolders != n:
		return lock.Errorf(lock.ErrUsage, "%q is a semaphore of %d (--max-holders %d); this holder asked for %d", name, r.MaxHolders, r.MaxHolders, n)
	case r.Mode == lock.Semaphore && mine == lock.Shared:
		return lock.Errorf(lock.ErrUsage, "%q is a semaphore of %d (--max-holders %d); this holder asked for a shared lock (--shared)", name, r.MaxHolders, r.MaxHolders)
	case r.Mode == lock.Shared && mine == lock.Semaphore:
		return lock.Errorf(lock.ErrUsage, "%q is held in shared mode (--shared); this holder asked for a semaphore of %d (--max-holders %d)", name, n, n)
	}
	return nil
}

// Notify wakes a semaphore's waiter whenever a file of name's lock is
// closed on this host: a slot may have been let go. A close that frees
// nothing (a status that read a record) wakes it for nothing; a release on
// another host through a shared filesystem does not wake it. It returns an
// error where inotify is not available.
func (s semaphore) Notify(ctx context.Context, name string) (<-chan struct{}, func(), error) {
	return watchCloses(s.dir, FileName(name))
}
