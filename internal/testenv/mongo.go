package testenv

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
)

// ErrNoMongo is returned by [StartMongo] when the MongoDB-wire test server
// cannot be built. Its message says what to do.
var ErrNoMongo = errors.New("testenv: cannot build the MongoDB-wire test server (FerretDB, internal/testenv/ferretdb): it needs the go command in PATH and, the first time, the Go module proxy; run scripts/test-deps to build it ahead")

// Mongo is a running throwaway MongoDB-wire server on 127.0.0.1: FerretDB v1
// with its SQLite handler (in Dir/data), built from the module
// internal/testenv/ferretdb, whose TestFacts shows where it differs from
// MongoDB in ways a lease lock cares about (only inserts are atomic; no
// $$NOW, $expr, update pipelines, TTL indexes or transactions; credentials
// need ?authMechanism=PLAIN and are not checked). Its URL is
// mongodb://127.0.0.1:PORT/, with TLS ?tls=true (no CA).
type Mongo struct{ *proc }

// MongoOptions say how [StartMongo] starts a server.
type MongoOptions struct {
	TLS bool // TLS only, with a certificate for 127.0.0.1 only
}

// StartMongo starts a new server on a free port. The first call in a
// process finds the server binary in the user's cache
// (withlock-testenv/ferretdb-KEY, KEY a hash of the module's sources) or
// builds it there, which takes about a minute.
func StartMongo(opts ...MongoOptions) (*Mongo, error) {
	o := append(opts, MongoOptions{})[0]
	bin, err := ferretdbBinary()
	if err != nil {
		return nil, err
	}
	proc, err := newProc(os.TempDir(), "mongo", nil, o.TLS)
	if err != nil {
		return nil, err
	}
	m := &Mongo{proc: proc}
	ready := filepath.Join(m.Dir, "ready")
	proc.command = func() *exec.Cmd {
		os.Remove(ready)
		cmd := exec.Command(bin, "-dir", "data", "-port", strconv.Itoa(m.Port), "-ready-file", ready, "-grace", "100ms")
		if o.TLS {
			cmd.Args = append(cmd.Args, "-tls-cert", "server.crt", "-tls-key", "server.key")
		}
		cmd.Stdin = keepOpen() // it exits when its stdin ends
		return cmd
	}
	// It writes its ready file once it listens.
	proc.ready = func() error {
		_, err := os.Stat(ready)
		return err
	}
	if err := proc.launch(); err != nil {
		return nil, err
	}
	m.URL = "mongodb://" + m.addr() + "/"
	if o.TLS {
		m.URL += "?tls=true"
	}
	return m, nil
}

// RequireMongo is [StartMongo] for t.
func RequireMongo(t testing.TB, opts ...MongoOptions) *Mongo {
	m, err := StartMongo(opts...)
	return require(t, m, err, ErrNoMongo)
}

// keepOpen is the read end of a pipe whose write end (keepOpenW) the test
// process holds until it exits.
var keepOpen = sync.OnceValue(func() *os.File {
	r, w, err := os.Pipe()
	if err != nil {
		panic(err)
	}
	keepOpenW = w
	return r
})

var keepOpenW *os.File

// ferretdbBinary is pure Go: its SQLite needs no cgo.
var ferretdbBinary = sync.OnceValues(func() (string, error) {
	return cachedBuild("ferretdb", "github.com/withlock/withlock/internal/testenv/ferretdb", ErrNoMongo, "-tags", "ferretdb_no_postgresql")
})
