package testenv

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// ErrNoMongo is returned by [StartMongo] when the MongoDB-compatible test server
// cannot be built: no go command in PATH, or its modules cannot be downloaded. Its
// message says what to do.
var ErrNoMongo = errors.New("testenv: cannot build the MongoDB-compatible test server (FerretDB, internal/testenv/ferretdb): it needs the go command in PATH and, the first time, the Go module proxy; run scripts/test-deps to build it ahead")

// Mongo is a running throwaway MongoDB wire-protocol server on 127.0.0.1 in a
// temporary directory: FerretDB v1 with its SQLite handler, built from the module
// in internal/testenv/ferretdb. It needs no credentials (see URL).
//
// FerretDB is not MongoDB. Where a lease lock cares (checked by the tests in
// internal/testenv/ferretdb, whose TestFacts shows each point):
//   - findAndModify, update and delete are not atomic: they read the matching
//     documents, then write each back by _id alone without checking the filter
//     again. Two clients taking over the same expired lock with
//     findAndModify({_id, exp: {$lte: now}}) can both succeed, and a release
//     (delete {_id, token}) can delete a lock another client has just taken.
//     Only inserts are atomic: an upsert or insert of an existing _id fails with
//     duplicate key, code 11000, reliably under concurrency.
//   - No $$NOW (in $project it comes back as the string "$$NOW"), no $expr
//     comparisons (code 238), no update pipelines (code 14): a query cannot
//     compare with the server's clock. $currentDate works, and hello, isMaster
//     and serverStatus return the server's clock as localTime.
//   - No TTL indexes: createIndexes with expireAfterSeconds fails with code 238.
//     Unique indexes work (11000).
//   - writeConcern {w: "majority", j: true} is accepted (and means nothing).
//     Transactions are not supported.
//   - Authentication is not checked: a URL with credentials must say
//     ?authMechanism=PLAIN (then any user and password pass); the driver's
//     default SCRAM mechanisms fail with AuthenticationFailed (18).
//
// Like [Postgres], it has a watchdog that kills the server and removes Dir when the
// test process exits, however it dies; the server also exits by itself when the
// test process does, since its stdin is the watchdog's pipe.
type Mongo struct {
	Dir  string // data/ holds the SQLite databases, server.out the server's log
	Port int    // TCP port on 127.0.0.1, the same across Stop and Start
	URL  string // mongodb://127.0.0.1:PORT/

	bin  string
	proc *serverProc
}

// StartMongo starts a new server on a free port and returns it running. The
// caller must Close it.
//
// The first call in a process finds the server binary in the user's cache
// directory (withlock-testenv/ferretdb-KEY, keyed by the ferretdb module's go.mod,
// go.sum and sources), or builds it there with "go build" under a flock, so
// concurrent test binaries build it once. A cold build takes about a minute; a
// start takes milliseconds. If it cannot be built for want of the go command or
// the module proxy, the error is [ErrNoMongo].
func StartMongo() (*Mongo, error) {
	bin, err := ferretdbBinary()
	if err != nil {
		return nil, err
	}
	proc, err := newServerProc("withlock-mongo-")
	if err != nil {
		return nil, err
	}
	m := &Mongo{Dir: proc.dir, bin: bin, proc: proc}
	// Port 0: the server picks a free port and says which in its ready file, so
	// there is no race for the port.
	if err := m.start(); err != nil {
		m.Close()
		return nil, err
	}
	m.URL = "mongodb://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(m.Port)) + "/"
	return m, nil
}

func (m *Mongo) readyFile() string { return filepath.Join(m.Dir, "ready") }

func (m *Mongo) start() error {
	os.Remove(m.readyFile())
	cmd := exec.Command(m.bin,
		"-dir", filepath.Join(m.Dir, "data"),
		"-port", strconv.Itoa(m.Port),
		"-ready-file", m.readyFile(),
		"-log-level", "info",
		"-grace", "100ms",
	)
	logName := filepath.Join(m.Dir, "server.out")
	var logOffset int64
	if fi, err := os.Stat(logName); err == nil {
		logOffset = fi.Size()
	}
	err := m.proc.start(cmd, m.proc.wdRead, func() bool {
		_, err := os.Stat(m.readyFile())
		return err == nil
	})
	if err != nil {
		err = fmt.Errorf("testenv: ferretdb (port %d): %w\nserver log %s:\n%s", m.Port, err, logName, logTail(logName, logOffset, 20))
		if ee, ok := errors.AsType[*exec.ExitError](err); ok && ee.ExitCode() == 3 {
			return errors.Join(errPortInUse, err)
		}
		return err
	}
	b, err := os.ReadFile(m.readyFile())
	if err != nil {
		return fmt.Errorf("testenv: %w", err)
	}
	port, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || (m.Port != 0 && port != m.Port) {
		m.proc.kill()
		return fmt.Errorf("testenv: ferretdb wrote %q to %s", b, m.readyFile())
	}
	m.Port = port
	return nil
}

// Stop shuts the server down (SIGTERM; it waits at most 100ms for clients) and
// keeps the data, so Start can bring it back on the same port.
func (m *Mongo) Stop() error { return m.proc.stop() }

// Start starts the server again after Stop, on the same port with the same data.
// It fails if something else took the port meanwhile.
func (m *Mongo) Start() error {
	return m.proc.locked(func() error { return m.start() })
}

// Pause stops the server with SIGSTOP: connections stay open and requests go
// unanswered, as with a hung server or a network partition, until Resume.
func (m *Mongo) Pause() error { return m.proc.pause() }

// Resume continues a server stopped by Pause.
func (m *Mongo) Resume() error { return m.proc.signal(syscall.SIGCONT) }

// Close kills the server and removes Dir. It is safe to call twice, after Stop
// and while paused.
func (m *Mongo) Close() error { return m.proc.close() }

// RequireMongo starts a server with [StartMongo] and closes it when t's test
// ends. If the server cannot be built ([ErrNoMongo]), t fails under CI (CI=true)
// and is skipped elsewhere, with the hint either way; any other error fails t.
func RequireMongo(t testing.TB) *Mongo {
	t.Helper()
	m, err := StartMongo()
	if err != nil {
		missing(t, err, ErrNoMongo)
	}
	t.Cleanup(func() {
		if err := m.Close(); err != nil {
			t.Errorf("testenv: close mongo: %v", err)
		}
	})
	return m
}

// ferretdbBuildArgs are the go build flags; part of the binary's key.
var ferretdbBuildArgs = []string{"build", "-trimpath", "-tags", "ferretdb_no_postgresql"}

// ferretdbEnv is the environment of the go commands that build the server: pure
// Go (modernc.org/sqlite needs no cgo), the module's own go.mod and go.sum only.
func ferretdbEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "GOFLAGS=") || strings.HasPrefix(kv, "GOWORK=") || strings.HasPrefix(kv, "CGO_ENABLED=") {
			continue
		}
		env = append(env, kv)
	}
	return append(env, "GOFLAGS=-mod=readonly -buildvcs=false", "GOWORK=off", "CGO_ENABLED=0")
}

var ferretdbBinary = sync.OnceValues(func() (string, error) {
	src, err := ferretdbDir()
	if err != nil {
		return "", err
	}
	key, err := ferretdbKey(src)
	if err != nil {
		return "", err
	}
	base, err := ferretdbCacheBase()
	if err != nil {
		return "", err
	}
	bin := filepath.Join(base, "ferretdb-"+key)
	if isExecutable(bin) {
		return bin, nil
	}
	unlock, err := lockFile(bin + ".lock")
	if err != nil {
		return "", err
	}
	defer unlock()
	if isExecutable(bin) { // built while we waited
		return bin, nil
	}
	goCmd, err := exec.LookPath("go")
	if err != nil {
		return "", fmt.Errorf("%w (go: %v)", ErrNoMongo, err)
	}
	download := exec.Command(goCmd, "mod", "download")
	download.Dir, download.Env = src, ferretdbEnv()
	if out, err := download.CombinedOutput(); err != nil {
		return "", fmt.Errorf("%w\ngo mod download in %s: %v\n%s", ErrNoMongo, src, err, out)
	}
	tmp := fmt.Sprintf("%s.tmp-%d", bin, os.Getpid())
	build := exec.Command(goCmd, append(slices.Clone(ferretdbBuildArgs), "-o", tmp, ".")...)
	build.Dir, build.Env = src, ferretdbEnv()
	out, err := build.CombinedOutput()
	if err != nil {
		os.Remove(tmp)
		return "", fmt.Errorf("testenv: go build in %s: %w\n%s", src, err, out)
	}
	if err := os.Rename(tmp, bin); err != nil {
		os.Remove(tmp)
		return "", fmt.Errorf("testenv: %w", err)
	}
	return bin, nil
})

// ferretdbKey hashes what the binary is built from: the platform, the build
// flags, go.mod, go.sum and the non-test Go files (in byte order of their names).
// scripts/test-deps computes the same key in its ferretdb_key, to build the
// binary ahead; TestFerretDBKeyMatchesTestDeps checks that they agree.
func ferretdbKey(src string) (string, error) {
	files, err := filepath.Glob(filepath.Join(src, "*.go"))
	if err != nil {
		return "", fmt.Errorf("testenv: %w", err)
	}
	files = slices.DeleteFunc(files, func(f string) bool { return strings.HasSuffix(f, "_test.go") })
	slices.Sort(files)
	files = append([]string{filepath.Join(src, "go.mod"), filepath.Join(src, "go.sum")}, files...)
	h := sha256.New()
	fmt.Fprintf(h, "withlock-ferretdb %s/%s %s\n", runtime.GOOS, runtime.GOARCH, strings.Join(ferretdbBuildArgs, " "))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return "", fmt.Errorf("testenv: %w", err)
		}
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil))[:16], nil
}

// ferretdbCacheBase is the directory for built binaries: withlock-testenv in the
// user's cache directory ($XDG_CACHE_HOME or ~/.cache), else in os.TempDir.
func ferretdbCacheBase() (string, error) {
	if dir, err := os.UserCacheDir(); err == nil {
		base := filepath.Join(dir, "withlock-testenv")
		if err := os.MkdirAll(base, 0o755); err == nil {
			return base, nil
		}
	}
	base := filepath.Join(os.TempDir(), fmt.Sprintf("withlock-testenv-%d", os.Geteuid()))
	if err := os.MkdirAll(base, 0o700); err != nil {
		return "", fmt.Errorf("testenv: %w", err)
	}
	if fi, err := os.Lstat(base); err != nil || !fi.IsDir() || !ownedBy(fi, uint32(os.Geteuid())) || fi.Mode().Perm()&0o022 != 0 {
		return "", fmt.Errorf("testenv: %s is not a directory owned by uid %d and writable only by it", base, os.Geteuid())
	}
	return base, nil
}

func isExecutable(name string) bool {
	fi, err := os.Stat(name)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}

// ferretdbDir finds internal/testenv/ferretdb: next to this source file, else
// from the module root above the working directory (for binaries built with
// -trimpath).
func ferretdbDir() (string, error) {
	if _, file, _, ok := runtime.Caller(0); ok && filepath.IsAbs(file) {
		dir := filepath.Join(filepath.Dir(file), "ferretdb")
		if _, err := os.Stat(filepath.Join(dir, "go.sum")); err == nil {
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
			return filepath.Join(d, "internal", "testenv", "ferretdb"), nil
		}
		if d == filepath.Dir(d) {
			return "", fmt.Errorf("testenv: internal/testenv/ferretdb not found above %s", wd)
		}
	}
}

// PID is the server process's id (0 while it is stopped), for measuring what
// it spends (/proc/PID/stat).
func (m *Mongo) PID() int { return m.proc.pid() }
