package file

import (
	"net/url"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/withlock/withlock/internal/lock"
)

func init() {
	lock.Register("file", open)
}

// FileName returns the lock file's name for a lock name: its escaped form
// (lock.EscapeName: no name can leave the directory, collide with another
// or hide from ls) and ".lock".
func FileName(name string) string { return lock.EscapeName(name) + ".lock" }

// SlotName is the name of semaphore slot k of the lock file f (a
// FileName).
func SlotName(f string, k int) string { return f + "." + strconv.Itoa(k) }

// SharedName is the name of the k-th shared holder's record file of the
// lock file f.
func SharedName(f string, k int) string { return f + ".shared" + strconv.Itoa(k) }

// MarkName is the name of the writer-waiting mark of the lock file f.
func MarkName(f string) string { return f + ".writer" }

// nameOf returns the lock name that FileName turns into f, or "" when f is
// hashed or was not made by FileName.
func nameOf(f string) string {
	esc, ok := strings.CutSuffix(f, ".lock")
	if !ok || strings.HasPrefix(esc, "sha256-") {
		return ""
	}
	var b strings.Builder
	for i := 0; i < len(esc); i++ {
		if esc[i] == '%' && i+2 < len(esc) {
			if v, err := strconv.ParseUint(esc[i+1:i+3], 16, 8); err == nil {
				b.WriteByte(byte(v))
				i += 2
				continue
			}
		}
		b.WriteByte(esc[i])
	}
	if FileName(b.String()) != f {
		return ""
	}
	return b.String()
}

// isFileOf reports whether the directory entry e is one of the files of the
// lock file f: f itself, a slot, a shared holder's record file or the mark.
func isFileOf(e, f string) bool {
	rest, ok := strings.CutPrefix(e, f)
	if !ok {
		return false
	}
	if rest == "" || rest == ".writer" {
		return true
	}
	digits, ok := strings.CutPrefix(rest, ".shared")
	if !ok {
		digits, ok = strings.CutPrefix(rest, ".")
	}
	if !ok || digits == "" {
		return false
	}
	for _, c := range digits {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// backend is one client of DIR. Exclusive and shared locks wait in flock(2)
// itself (waiting); a semaphore waits for "any of N slots", which no single
// flock can, so it is woken by the kernel when a file of the lock is closed
// (semaphore, a lock.Notifier).
type backend struct {
	dir  string
	opts lock.Options
	held *lease   // the lock taken through this backend, if any
	try  *attempt // a semaphore waiter's open files, kept between attempts
}

// waiting is the backend of exclusive and shared locks: a lock.Waiter.
type waiting struct{ *backend }

// semaphore is the backend of semaphores: a lock.Notifier.
type semaphore struct{ *backend }

func open(u *url.URL, opts lock.Options) (lock.Backend, error) {
	if u.Opaque != "" || (u.Host != "" && u.Host != "localhost") || u.Path == "" {
		return nil, lock.Errorf(lock.ErrUsage, "a file URL names an absolute directory on this host: file:///var/lock/withlock")
	}
	if u.RawQuery != "" {
		return nil, lock.Errorf(lock.ErrUsage, "file URLs take no query parameters")
	}
	b := &backend{dir: filepath.Clean(u.Path), opts: opts}
	if opts.Mode == lock.Semaphore {
		return semaphore{b}, nil
	}
	return waiting{b}, nil
}

func (b *backend) path(f string) string { return filepath.Join(b.dir, f) }

// Close unlocks whatever is still held through b: the open files are the
// session.
func (b *backend) Close() error {
	b.dropAttempt()
	if b.held == nil {
		return nil
	}
	err := b.held.close()
	b.held = nil
	return err
}
