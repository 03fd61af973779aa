// Package file is the file:///DIR backend: flock(2) on DIR/<escaped NAME>.lock,
// the same file and the same lock that flock(1) takes, so the two exclude
// each other. It works on one host only.
package file

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/withlock/withlock/internal/lock"
)

func init() {
	lock.Register("file", open)
}

// maxEscaped is the longest escaped name used as a file name; longer ones
// are hashed, which keeps the file name under NAME_MAX (255) with room for
// ".lock".
const maxEscaped = 200

// FileName returns the lock file's name for a lock name: every byte outside
// [A-Za-z0-9._-] becomes %XX, so no name can leave the directory or collide
// with another, and an escaped form longer than 200 bytes becomes
// sha256-<hex>. The result ends in ".lock".
func FileName(name string) string {
	var b strings.Builder
	for i := 0; i < len(name); i++ {
		c := name[i]
		if 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-' {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	if b.Len() > maxEscaped {
		sum := sha256.Sum256([]byte(name))
		return "sha256-" + hex.EncodeToString(sum[:]) + ".lock"
	}
	return b.String() + ".lock"
}

type backend struct {
	dir  string
	held *os.File // the file of the lock taken through this backend, if any
}

func open(u *url.URL, opts lock.Options) (lock.Backend, error) {
	if opts.Mode != lock.Exclusive {
		return nil, lock.Errorf(lock.ErrUsage, "%s locks are not supported by the file backend yet", opts.Mode)
	}
	if u.Opaque != "" || (u.Host != "" && u.Host != "localhost") || u.Path == "" {
		return nil, lock.Errorf(lock.ErrUsage, "a file URL names an absolute directory on this host: file:///var/lock/withlock")
	}
	if u.RawQuery != "" {
		return nil, lock.Errorf(lock.ErrUsage, "file URLs take no query parameters")
	}
	return &backend{dir: filepath.Clean(u.Path)}, nil
}

// Close unlocks whatever is still held through b: the open file is the
// session.
func (b *backend) Close() error {
	if b.held == nil {
		return nil
	}
	err := b.held.Close()
	b.held = nil
	if errors.Is(err, os.ErrClosed) {
		return nil
	}
	return err
}

func (b *backend) TryAcquire(ctx context.Context, name string) (lock.Lease, error) {
	return b.acquire(ctx, name, false)
}

// Acquire waits in flock(2) itself, so the kernel hands the lock over the
// moment it is free.
func (b *backend) Acquire(ctx context.Context, name string) (lock.Lease, error) {
	return b.acquire(ctx, name, true)
}

func (b *backend) acquire(ctx context.Context, name string, wait bool) (lock.Lease, error) {
	path := filepath.Join(b.dir, FileName(name))
	for {
		f, err := b.openFile(path)
		if err != nil {
			return nil, err
		}
		if wait {
			err = flockWait(ctx, f)
		} else {
			err = flock(f, syscall.LOCK_EX|syscall.LOCK_NB)
		}
		if err != nil {
			return nil, err
		}
		// Someone may have removed or replaced the file between our open and
		// our flock; a lock on an unlinked file excludes nobody, so take the
		// lock on whatever the path names now.
		if same, _ := samePath(f, path); same {
			b.held = f
			return &lease{f: f, path: path}, nil
		}
		f.Close()
	}
}

func (b *backend) openFile(path string) (*os.File, error) {
	if err := os.MkdirAll(b.dir, 0o777); err != nil {
		return nil, classify(fmt.Errorf("file: create %s: %w", b.dir, err))
	}
	// Read-only and world-writable-before-umask like flock(1), so that any
	// user who can read the file can take the lock.
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE, 0o666)
	if err != nil {
		return nil, classify(fmt.Errorf("file: open %s: %w", path, err))
	}
	return f, nil
}

func classify(err error) error {
	if errors.Is(err, os.ErrPermission) || errors.Is(err, syscall.EROFS) || errors.Is(err, syscall.ENOTDIR) {
		return lock.Errorf(lock.ErrRefused, "%w", err)
	}
	return lock.Errorf(lock.ErrUnavailable, "%w", err)
}

func flock(f *os.File, how int) error {
	for {
		err := syscall.Flock(int(f.Fd()), how)
		switch {
		case err == nil:
			return nil
		case errors.Is(err, syscall.EINTR):
			continue
		case errors.Is(err, syscall.EWOULDBLOCK):
			f.Close()
			return lock.ErrHeld
		default:
			f.Close()
			return classify(fmt.Errorf("file: flock %s: %w", f.Name(), err))
		}
	}
}

// flockWait blocks in flock(2) on another goroutine, since a blocked flock
// cannot be interrupted. If ctx ends first, that goroutine closes the file
// whenever its flock returns, so nothing stays locked.
func flockWait(ctx context.Context, f *os.File) error {
	done := make(chan error, 1)
	go func() { done <- flock(f, syscall.LOCK_EX) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		go func() {
			if <-done == nil {
				f.Close()
			}
		}()
		return fmt.Errorf("file: wait for %s: %w", f.Name(), context.Cause(ctx))
	}
}

// samePath reports whether path still names the file f has open.
func samePath(f *os.File, path string) (bool, error) {
	fi, err := f.Stat()
	if err != nil {
		return false, err
	}
	pi, err := os.Stat(path)
	if err != nil {
		return false, err
	}
	return os.SameFile(fi, pi), nil
}

type lease struct {
	f    *os.File
	path string
}

// Keep checks that the lock file is still the one we locked: if someone
// removed or replaced it, a newcomer can lock the new file while we hold the
// old one, so our lock no longer excludes anyone.
func (l *lease) Keep(context.Context) error {
	same, err := samePath(l.f, l.path)
	if errors.Is(err, os.ErrNotExist) || err == nil && !same {
		return lock.Errorf(lock.ErrLost, "%s was removed or replaced", l.path)
	}
	if err != nil {
		return fmt.Errorf("file: check %s: %w", l.path, err)
	}
	return nil
}

// Release unlocks by closing the file. The file itself stays: removing it
// would let a waiter that already opened it lock an unlinked file while a
// newcomer locks a new one.
func (l *lease) Release(context.Context) error {
	return l.f.Close()
}
