// Command pgserve starts a throwaway PostgreSQL cluster (as the tests do),
// prints its URL on stdout, and removes it when stdin closes or on INT/TERM.
// For benchmarks and manual trials:
//
//	coproc PG { go run ./internal/testenv/pgserve; }; read -r DB <&"${PG[0]}"
package main

import (
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/withlock/withlock/internal/testenv"
)

func main() {
	pg, err := testenv.StartPostgres()
	if err != nil {
		fmt.Fprintln(os.Stderr, "pgserve:", err)
		os.Exit(1)
	}
	defer pg.Close()
	fmt.Println(pg.URL)
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
