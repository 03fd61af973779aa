package testenv

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
)

// ErrNoNode is returned by [NPMDir] when node or npm is not installed. Its message
// says how to install them.
var ErrNoNode = errors.New("testenv: node and npm not found in PATH; install them with: apt-get install nodejs npm (or run scripts/test-deps as root)")

var npmMu sync.Mutex

// NPMDir returns the absolute path of internal/testenv/npm, where the npm package
// advisory-lock is installed at the version pinned in its package-lock.json, after
// making sure node_modules is installed: if it is missing or stale, it runs
// "npm ci --no-audit --no-fund" there (under a flock, as scripts/test-deps does,
// so concurrent test binaries install once). The directory holds hold.js; run it
// and the package's own CLI (node_modules/.bin/withlock) with node.
//
// If node or npm is missing, the error is [ErrNoNode].
func NPMDir() (string, error) {
	dir, err := npmDir()
	if err != nil {
		return "", err
	}
	if _, err := exec.LookPath("node"); err != nil {
		return "", ErrNoNode
	}
	npmMu.Lock()
	defer npmMu.Unlock()
	if npmInstalled(dir) {
		return dir, nil
	}
	if _, err := exec.LookPath("npm"); err != nil {
		return "", ErrNoNode
	}
	unlock, err := lockFile(filepath.Join(dir, ".npm-install.lock"))
	if err != nil {
		return "", err
	}
	defer unlock()
	if npmInstalled(dir) {
		return dir, nil
	}
	cmd := exec.Command("npm", "ci", "--no-audit", "--no-fund")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("testenv: npm ci in %s: %w\n%s", dir, err, out)
	}
	if !npmInstalled(dir) {
		return "", fmt.Errorf("testenv: npm ci in %s did not install advisory-lock as locked", dir)
	}
	return dir, nil
}

// npmDir finds internal/testenv/npm: next to this source file, else from the
// module root above the working directory (for binaries built with -trimpath).
func npmDir() (string, error) {
	if _, file, _, ok := runtime.Caller(0); ok && filepath.IsAbs(file) {
		dir := filepath.Join(filepath.Dir(file), "npm")
		if _, err := os.Stat(filepath.Join(dir, "package-lock.json")); err == nil {
			return dir, nil
		}
	}
	wd, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("testenv: %w", err)
	}
	for d := wd; ; d = filepath.Dir(d) {
		b, err := os.ReadFile(filepath.Join(d, "go.mod"))
		if err == nil && strings.Contains(string(b), "module github.com/withlock/withlock\n") {
			return filepath.Join(d, "internal", "testenv", "npm"), nil
		}
		if d == filepath.Dir(d) {
			return "", fmt.Errorf("testenv: internal/testenv/npm not found above %s", wd)
		}
	}
}

// npmInstalled reports whether npm finished installing (it writes
// node_modules/.package-lock.json last) the locked version of advisory-lock.
func npmInstalled(dir string) bool {
	var lock struct {
		Packages map[string]struct{ Version string } `json:"packages"`
	}
	var installed struct{ Version string }
	b, err := os.ReadFile(filepath.Join(dir, "package-lock.json"))
	if err != nil || json.Unmarshal(b, &lock) != nil {
		return false
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", ".package-lock.json")); err != nil {
		return false
	}
	b, err = os.ReadFile(filepath.Join(dir, "node_modules", "advisory-lock", "package.json"))
	if err != nil || json.Unmarshal(b, &installed) != nil {
		return false
	}
	want := lock.Packages["node_modules/advisory-lock"].Version
	return want != "" && installed.Version == want
}
