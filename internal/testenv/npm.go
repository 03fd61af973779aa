package testenv

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

// ErrNoNode is returned by [NPMDir] when node or npm is not installed. Its
// message says how to install them.
var ErrNoNode = errors.New("testenv: node and npm not found in PATH; install them with: apt-get install nodejs npm (or run scripts/test-deps as root)")

// NPMDir returns internal/testenv/npm, where the npm package advisory-lock
// is installed at the version its package-lock.json pins, running "npm ci"
// there first if it is not. The directory holds hold.js; run it and the
// package's own CLI (node_modules/.bin/withlock) with node.
var NPMDir = sync.OnceValues(func() (string, error) {
	dir, err := moduleDir("npm")
	if err != nil {
		return "", err
	}
	if findProgram("node") == "" || findProgram("npm") == "" {
		return "", ErrNoNode
	}
	unlock, err := lockFile(filepath.Join(dir, ".npm-install.lock")) // as scripts/test-deps
	if err != nil {
		return "", err
	}
	defer unlock()
	if npmInstalled(dir) {
		return dir, nil
	}
	cmd := exec.Command("npm", "ci", "--no-audit", "--no-fund")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil || !npmInstalled(dir) {
		return "", fmt.Errorf("testenv: npm ci in %s did not install advisory-lock as locked: %v\n%s", dir, err, out)
	}
	return dir, nil
})

// RequireNPM is [NPMDir] for t: without node and npm, t fails under CI and
// is skipped elsewhere.
func RequireNPM(t testing.TB) string {
	dir, err := NPMDir()
	require(t, io.NopCloser(nil), err, ErrNoNode)
	return dir
}

// npmInstalled says whether npm finished installing (it writes
// node_modules/.package-lock.json last) the locked version of advisory-lock.
func npmInstalled(dir string) bool {
	var lock struct {
		Packages map[string]struct{ Version string }
	}
	var installed struct{ Version string }
	read := func(name string, v any) bool {
		b, err := os.ReadFile(filepath.Join(dir, name))
		return err == nil && json.Unmarshal(b, v) == nil
	}
	return read("package-lock.json", &lock) && read("node_modules/.package-lock.json", &struct{}{}) &&
		read("node_modules/advisory-lock/package.json", &installed) &&
		installed.Version != "" && installed.Version == lock.Packages["node_modules/advisory-lock"].Version
}
