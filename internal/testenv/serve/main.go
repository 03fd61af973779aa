// Command serve starts a throwaway test server (as the tests do), prints its
// URL on stdout, and removes it when stdin closes or on INT/TERM. For
// benchmarks and manual trials:
//
//	go run ./internal/testenv/serve postgres|redis|mongodb|etcd
package main

import (
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/withlock/withlock/internal/testenv"
)

type server interface{ Close() error }

func main() {
	var (
		srv server
		url string
		err error
	)
	switch kind := append(os.Args[1:], "")[0]; kind {
	case "postgres":
		var p *testenv.Postgres
		if p, err = testenv.StartPostgres(); err == nil {
			srv, url = p, p.URL
		}
	case "redis":
		var r *testenv.Redis
		if r, err = testenv.StartRedis(); err == nil {
			srv, url = r, r.URL
		}
	case "mongodb":
		var m *testenv.Mongo
		if m, err = testenv.StartMongo(); err == nil {
			srv, url = m, m.URL
		}
	case "etcd":
		var e *testenv.Etcd
		if e, err = testenv.StartEtcd(); err == nil {
			srv, url = e, e.URL
		}
	default:
		err = fmt.Errorf("usage: serve postgres|redis|mongodb|etcd")
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "serve:", err)
		os.Exit(1)
	}
	defer srv.Close()
	fmt.Println(url)
	done := make(chan struct{})
	go func() {
		io.Copy(io.Discard, os.Stdin)
		close(done)
	}()
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	select {
	case <-done:
	case <-sigs:
	}
}
