package mysql_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/withlock/withlock/internal/lock"
	"github.com/withlock/withlock/internal/lock/locktest"
	"github.com/withlock/withlock/internal/lock/mysql"
	"github.com/withlock/withlock/internal/testenv"
)

// logBuffer collects what a client logs.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func (b *logBuffer) logger() *slog.Logger { return slog.New(slog.NewTextHandler(b, nil)) }

// detect is mysql.Detect on a connection of its own.
func detect(t *testing.T, dbURL string) mysql.Server {
	t.Helper()
	db, err := testenv.MySQLDB(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	c, err := db.Conn(locktest.Context(t))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := mysql.Detect(locktest.Context(t), c)
	if err != nil {
		t.Fatalf("Detect: %v", err)
	}
	return s
}

// waitFree waits until name is free on the server: a refused attempt
// closes its session, which the server then ends, and its locks with it.
func waitFree(t *testing.T, dbURL, name string) {
	t.Helper()
	sql := fmt.Sprintf("SELECT IS_FREE_LOCK('%s')", mysql.Key(name))
	testenv.WaitFor(t, sql+" to answer 1", func() bool { return query(t, dbURL, sql) == "1" })
}

// waiting counts the sessions that wait in GET_LOCK.
const waiting = "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE STATE = 'User lock'"

// waitWaiting waits until one session of the server waits in GET_LOCK.
func waitWaiting(t *testing.T, dbURL string) {
	t.Helper()
	testenv.WaitFor(t, "one session waiting in GET_LOCK", func() bool { return query(t, dbURL, waiting) == "1" })
}

// TestReadOnlyAfterGrant: a waiter granted the lock after the server became
// read-only (its holder let go as the failover demoted the server) is
// refused, ErrRefused, before it can use the lock, and leaves it free.
func TestReadOnlyAfterGrant(t *testing.T) {
	m := testenv.RequireMariaDB(t)
	holder := locktest.Open(t, m.URL, lock.Options{})
	l, err := holder.TryAcquire(locktest.Context(t), "job")
	if err != nil {
		t.Fatal(err)
	}
	waiter := locktest.Open(t, m.UnprivilegedURL(), lock.Options{})
	done := make(chan error, 1)
	go func() {
		h, err := waiter.Acquire(locktest.Context(t), "job")
		if err == nil {
			h.Release(context.Background())
		}
		done <- err
	}()
	waitWaiting(t, m.URL)
	query(t, m.URL, "SET GLOBAL read_only = ON")
	if err := l.Release(locktest.Context(t)); err != nil {
		t.Fatal(err)
	}
	err = <-done
	if !errors.Is(err, lock.ErrRefused) || !strings.Contains(err.Error(), "is read-only") {
		t.Errorf("a waiter granted on a server that became read-only: %v; want ErrRefused saying read-only", err)
	}
	waitFree(t, m.URL, "job")
	if s := detect(t, m.UnprivilegedURL()); !s.ReadOnly || s.Galera || s.Replicating {
		t.Errorf("Detect on a read-only server: %+v; want ReadOnly only", s)
	}
}

// TestReplicaNotReadOnly: a server that replicates from another (a replica
// nobody made read-only) takes the lock, since master-master pairs
// replicate both ways, but the holder is warned, once, naming the server.
func TestReplicaNotReadOnly(t *testing.T) {
	primary, replica := testenv.RequireMariaDBReplica(t)
	if s := detect(t, replica.UnprivilegedURL()); !s.Replicating || s.ReadOnly || s.Galera {
		t.Errorf("Detect on a replica: %+v; want Replicating only", s)
	}
	var log logBuffer
	c := locktest.Open(t, replica.UnprivilegedURL(), lock.Options{Log: log.logger()})
	for range 2 {
		h, err := c.Acquire(locktest.Context(t), "job")
		if err != nil {
			t.Fatalf("Acquire on a replica that is not read-only: %v", err)
		}
		h.Release(locktest.Context(t))
	}
	want := fmt.Sprintf("mysql at 127.0.0.1:%d replicates from another server", replica.Port)
	if got := log.String(); strings.Count(got, want) != 1 || !strings.Contains(got, "level=WARN") {
		t.Errorf("the holder's log:\n%s\nwant one warning saying %q", got, want)
	}
	if s := detect(t, primary.UnprivilegedURL()); s.Refusal("primary") != nil || s.Warning("primary") != "" {
		t.Errorf("Detect on the primary: %+v; want nothing to refuse or warn of", s)
	}
}
