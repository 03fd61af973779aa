package file

import (
	"errors"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"

	"github.com/withlock/withlock/internal/lock"
)

// openFlags are used for every file opened in DIR. O_NOFOLLOW: a symbolic
// link planted at a lock file's name is refused, not followed to wherever
// it points. O_NONBLOCK: opening a FIFO planted there does not hang (it is
// then refused for not being a regular file).
const openFlags = syscall.O_CLOEXEC | syscall.O_NOFOLLOW | syscall.O_NONBLOCK | syscall.O_NOCTTY

// openLock opens the lock file path for locking, creating DIR and the file
// if missing. It opens it for writing where it may, to write the record;
// read-only otherwise (as flock(1) does, any user who can read the file can
// lock it; such a holder just has no record). An existing file is opened
// without O_CREAT, so that a root withlock can lock a file another user
// made in a sticky directory (fs.protected_regular).
func (b *backend) openLock(path string) (*os.File, error) {
	if err := makeDir(b.dir); err != nil {
		return nil, err
	}
	for range 100 {
		fd, err := openat(path, openFlags|syscall.O_RDWR, 0)
		if errors.Is(err, syscall.EACCES) || errors.Is(err, syscall.EROFS) || errors.Is(err, syscall.EISDIR) {
			// A directory is refused below, for what it is.
			fd, err = openat(path, openFlags|syscall.O_RDONLY, 0)
		}
		if errors.Is(err, syscall.ENOENT) {
			// World-writable before the umask, like flock(1)'s files.
			fd, err = openat(path, openFlags|syscall.O_RDWR|syscall.O_CREAT|syscall.O_EXCL, 0o666)
			if errors.Is(err, syscall.EEXIST) {
				continue // made by someone else meanwhile: open what is there
			}
			if errors.Is(err, syscall.EACCES) {
				return nil, b.cannotCreate(path, err)
			}
		}
		if err != nil {
			return nil, openError(path, err)
		}
		return checkLockFile(fd, path)
	}
	return nil, lock.Errorf(lock.ErrUnavailable, "file: %s keeps appearing and disappearing", path)
}

// makeDir makes DIR if it is missing, with its parents. DIR itself is
// made 1777, as /tmp is: every user of a lock may be another user of the
// host, and each NAME is a file that its first user creates; the sticky bit
// keeps users from removing or replacing each other's files. Parents are
// made as mkdir -p makes them.
func makeDir(dir string) error {
	if _, err := os.Stat(dir); err == nil {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o777); err != nil {
		return classify(fmt.Errorf("file: create %s: %w", filepath.Dir(dir), err))
	}
	switch err := os.Mkdir(dir, 0o777); {
	case errors.Is(err, os.ErrExist):
		return nil // made meanwhile, or not a directory (refused when opened)
	case err != nil:
		return classify(fmt.Errorf("file: create %s: %w", dir, err))
	}
	if err := os.Chmod(dir, 0o777|os.ModeSticky); err != nil {
		return classify(fmt.Errorf("file: make %s writable for every user (chmod 1777): %w", dir, err))
	}
	return nil
}

// cannotCreate is the error of a lock file that DIR does not let this user
// create: it names DIR's owner and mode, and the fix.
func (b *backend) cannotCreate(path string, err error) error {
	var st syscall.Stat_t
	if syscall.Stat(b.dir, &st) != nil {
		return openError(path, err)
	}
	owner := strconv.FormatUint(uint64(st.Uid), 10)
	if u, err := user.LookupId(owner); err == nil {
		owner = u.Username
	}
	return lock.Errorf(lock.ErrRefused, "file: cannot create %s: permission denied; %s belongs to %s (mode %04o), and every user of a lock must be able to create files there: chmod 1777 %s, as withlock makes a directory it creates",
		path, b.dir, owner, st.Mode&0o7777, b.dir)
}

// openRead opens an existing file of DIR for reading (status); nil, nil if
// there is none.
func openRead(path string) (*os.File, error) {
	fd, err := openat(path, openFlags|syscall.O_RDONLY, 0)
	if errors.Is(err, syscall.ENOENT) {
		return nil, nil
	}
	if err != nil {
		return nil, openError(path, err)
	}
	return checkLockFile(fd, path)
}

func openat(path string, flags int, mode uint32) (int, error) {
	for {
		fd, err := syscall.Open(path, flags, mode)
		if !errors.Is(err, syscall.EINTR) {
			return fd, err
		}
	}
}

// checkLockFile keeps fd only if it is a regular file with one name: a
// FIFO, a device or a directory planted at a lock file's name is not a
// lock file, nor is a hard link to some other file, which withlock would
// otherwise write its record into.
func checkLockFile(fd int, path string) (*os.File, error) {
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		syscall.Close(fd)
		return nil, lock.Errorf(lock.ErrUnavailable, "file: stat %s: %w", path, err)
	}
	switch {
	case st.Mode&syscall.S_IFMT != syscall.S_IFREG:
		syscall.Close(fd)
		return nil, lock.Errorf(lock.ErrRefused, "file: %s is not a regular file (%s): withlock locks only plain files; remove it", path, fileType(st.Mode))
	case st.Nlink > 1:
		syscall.Close(fd)
		return nil, lock.Errorf(lock.ErrRefused, "file: %s has %d hard links, so it may be another file's: withlock locks only files of one name; remove it", path, st.Nlink)
	}
	// Back to blocking, so that os.File treats it as the plain file it is.
	if err := syscall.SetNonblock(fd, false); err != nil {
		syscall.Close(fd)
		return nil, lock.Errorf(lock.ErrUnavailable, "file: %s: %w", path, err)
	}
	return os.NewFile(uintptr(fd), path), nil
}

func fileType(mode uint32) string {
	switch mode & syscall.S_IFMT {
	case syscall.S_IFDIR:
		return "a directory"
	case syscall.S_IFIFO:
		return "a FIFO"
	case syscall.S_IFSOCK:
		return "a socket"
	case syscall.S_IFCHR, syscall.S_IFBLK:
		return "a device"
	}
	return "not a plain file"
}

func openError(path string, err error) error {
	if errors.Is(err, syscall.ELOOP) {
		return lock.Errorf(lock.ErrRefused, "file: %s is a symbolic link, which withlock does not follow in a lock directory; remove it", path)
	}
	return classify(fmt.Errorf("file: open %s: %w", path, err))
}

func classify(err error) error {
	if errors.Is(err, os.ErrPermission) || errors.Is(err, syscall.EROFS) || errors.Is(err, syscall.ENOTDIR) {
		return lock.Errorf(lock.ErrRefused, "%w", err)
	}
	return lock.Errorf(lock.ErrUnavailable, "%w", err)
}

// flock makes one flock(2) call (retried on EINTR only): nil, ErrHeld if
// LOCK_NB found the lock taken, or another error. It never closes f.
func flock(f *os.File, how int) error {
	for {
		err := syscall.Flock(int(f.Fd()), how)
		switch {
		case err == nil:
			return nil
		case errors.Is(err, syscall.EINTR):
			continue
		case errors.Is(err, syscall.EWOULDBLOCK):
			return lock.ErrHeld
		default:
			return classify(fmt.Errorf("file: flock %s: %w", f.Name(), err))
		}
	}
}

// samePath reports whether path still names the file f has open.
func samePath(f *os.File, path string) (bool, error) {
	fi, err := f.Stat()
	if err != nil {
		return false, err
	}
	pi, err := os.Lstat(path)
	if err != nil {
		return false, err
	}
	return os.SameFile(fi, pi), nil
}

// fileID is a file as /proc/locks names it: the device's major and minor
// numbers and the inode number.
type fileID struct {
	major, minor uint32
	ino          uint64
}

func idOf(f *os.File) (fileID, error) {
	fi, err := f.Stat()
	if err != nil {
		return fileID{}, err
	}
	return statID(fi.Sys().(*syscall.Stat_t)), nil
}

// statID decodes st_dev as glibc's major() and minor() do.
func statID(st *syscall.Stat_t) fileID {
	dev := uint64(st.Dev)
	return fileID{
		major: uint32((dev>>8)&0xfff | (dev>>32)&^0xfff),
		minor: uint32(dev&0xff | (dev>>12)&^0xff),
		ino:   st.Ino,
	}
}
