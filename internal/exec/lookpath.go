package exec

import (
	"errors"
	"io/fs"
	"os"
	osexec "os/exec"
	"path/filepath"
	"syscall"
)

// lookPath finds the file to execute for name the way a POSIX shell does: a
// name containing a slash is used as it is; any other name is searched in the
// directories of $PATH, an empty entry meaning the current directory.
//
// It differs from os/exec.LookPath in two ways, both to match the shell the
// user would otherwise have typed the command into:
//   - a command found through a relative PATH entry ("." or "") is run.
//     os/exec refuses it since Go 1.19 (exec.ErrDot) to protect programs that
//     run a fixed name from picking up a file of whatever directory they run
//     in; here the user chose both the name and PATH.
//   - a name found in PATH only as a file without execute permission is
//     ErrNotExecutable, not ErrNotFound, as in bash and dash (exit 126).
func lookPath(name string) (string, error) {
	path, err := osexec.LookPath(name)
	var reason error = err
	var ee *osexec.Error
	if errors.As(err, &ee) {
		reason = ee.Err
	}
	switch {
	case err == nil:
		return path, nil
	case errors.Is(err, osexec.ErrDot):
		return path, nil
	case errors.Is(err, osexec.ErrNotFound):
		if foundNotExecutable(name) {
			return "", notExecutable(name, fs.ErrPermission)
		}
		return "", notFound(name)
	case errors.Is(err, fs.ErrNotExist), errors.Is(err, syscall.ENOTDIR):
		return "", notFound(name)
	default:
		// EISDIR, EACCES: there is something, and it cannot be run.
		return "", notExecutable(name, reason)
	}
}

// foundNotExecutable reports whether some $PATH directory holds a file (not a
// directory) named name, which LookPath passed over as not executable.
func foundNotExecutable(name string) bool {
	for _, dir := range filepath.SplitList(os.Getenv("PATH")) {
		if dir == "" {
			dir = "."
		}
		if fi, err := os.Stat(filepath.Join(dir, name)); err == nil && !fi.IsDir() {
			return true
		}
	}
	return false
}
