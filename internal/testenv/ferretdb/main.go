// Command ferretdb runs FerretDB v1 (embedded, SQLite handler) on 127.0.0.1: a
// MongoDB wire-protocol server for withlock's tests, built and started by
// testenv.StartMongo. It is a separate module so that FerretDB's dependencies stay
// out of withlock's go.mod.
//
// It keeps its databases in -dir (created if missing), listens on -port (0: any
// free port), and once it listens writes the port and a newline to -ready-file
// (atomically, by rename) and prints "ready mongodb://127.0.0.1:PORT/" on stdout.
// With -tls-cert and -tls-key the port speaks TLS only (client certificates
// are not asked for).
// It exits on INT or TERM and when its stdin reaches EOF, so it never outlives the
// process holding the write end of its stdin pipe; from a shell, give it a stdin
// that stays open:
//
//	go run . -dir /tmp/fdb -port 27017 </dev/tty
//
// It exits 3 if the port is in use, 1 on other errors, 2 on bad usage.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/FerretDB/FerretDB/ferretdb"
)

func main() {
	port := flag.Int("port", 0, "TCP port on 127.0.0.1 (0: any free port)")
	dir := flag.String("dir", "", "SQLite state directory (required; created if missing)")
	readyFile := flag.String("ready-file", "", "file to write the port to once listening")
	logLevel := flag.String("log-level", "warn", "log level: debug, info, warn or error")
	grace := flag.Duration("grace", 500*time.Millisecond, "how long to wait for a clean shutdown before exiting anyway")
	tlsCert := flag.String("tls-cert", "", "serve TLS only, with this certificate (PEM)")
	tlsKey := flag.String("tls-key", "", "the key of -tls-cert (PEM)")
	flag.Parse()
	if *dir == "" || flag.NArg() > 0 || (*tlsCert == "") != (*tlsKey == "") {
		fmt.Fprintln(os.Stderr, "usage: ferretdb -dir DIR [-port PORT] [-ready-file FILE] [-log-level LEVEL] [-grace DURATION] [-tls-cert FILE -tls-key FILE]")
		os.Exit(2)
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		fmt.Fprintln(os.Stderr, "ferretdb: -log-level:", err)
		os.Exit(2)
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		io.Copy(io.Discard, os.Stdin)
		cancel()
	}()
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		<-sigs
		cancel()
	}()

	err := serve(ctx, config{
		port:    *port,
		dir:     *dir,
		logger:  slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})),
		grace:   *grace,
		tlsCert: *tlsCert,
		tlsKey:  *tlsKey,
		ready: func(uri string, port int) error {
			if *readyFile != "" {
				tmp := *readyFile + ".tmp"
				if err := os.WriteFile(tmp, []byte(strconv.Itoa(port)+"\n"), 0o644); err != nil {
					return err
				}
				if err := os.Rename(tmp, *readyFile); err != nil {
					return err
				}
			}
			fmt.Println("ready", uri)
			return nil
		},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "ferretdb:", err)
		if errors.Is(err, errAddrInUse) {
			os.Exit(3)
		}
		os.Exit(1)
	}
}

type config struct {
	port   int
	dir    string
	logger *slog.Logger
	grace  time.Duration
	// tlsCert and tlsKey, if set, make the port speak TLS only.
	tlsCert, tlsKey string
	// ready is called once the server listens, with its URI and port.
	ready func(uri string, port int) error
}

var errAddrInUse = errors.New("address already in use")

// serve runs FerretDB until ctx is done.
func serve(ctx context.Context, c config) error {
	dir, err := filepath.Abs(c.dir)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	// FerretDB wants a file: URI naming a directory, ending with a slash. The
	// servers are disposable: no fsync (what a process wrote survives its exit,
	// which is all a restart on the same directory needs).
	sqliteURL := &url.URL{
		Scheme:   "file",
		Path:     dir + "/",
		OmitHost: true,
		RawQuery: url.Values{"_pragma": {"synchronous(off)"}}.Encode(),
	}

	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(c.port))
	if c.port != 0 {
		// Check the port first: when New fails to listen, it leaves its backend
		// open, and FerretDB's leak detector panics in a finalizer later.
		l, err := net.Listen("tcp", addr)
		if err != nil {
			if errors.Is(err, syscall.EADDRINUSE) {
				return fmt.Errorf("%w: %v", errAddrInUse, err)
			}
			return err
		}
		l.Close()
	}

	// The listener binds in New, so the port is taken (and connections queue)
	// once New returns.
	listener := ferretdb.ListenerConfig{TCP: addr}
	if c.tlsCert != "" {
		listener = ferretdb.ListenerConfig{TLS: addr, TLSCertFile: c.tlsCert, TLSKeyFile: c.tlsKey}
	}
	f, err := ferretdb.New(&ferretdb.Config{
		Listener:  listener,
		Logger:    c.logger,
		Handler:   "sqlite",
		SQLiteURL: sqliteURL.String(),
	})
	if err != nil {
		// FerretDB formats the listener's error with %s, which loses the errno.
		if strings.Contains(err.Error(), "address already in use") {
			return fmt.Errorf("%w: %v", errAddrInUse, err)
		}
		return err
	}

	runCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
	defer stop()
	done := make(chan error, 1)
	go func() { done <- f.Run(runCtx) }()

	uri := f.MongoDBURI()
	u, err := url.Parse(uri)
	if err != nil {
		return err
	}
	port, err := strconv.Atoi(u.Port())
	if err != nil {
		return fmt.Errorf("FerretDB URI %q: %v", uri, err)
	}
	if err := c.ready(uri, port); err != nil {
		return err
	}

	select {
	case <-ctx.Done():
	case err := <-done:
		return fmt.Errorf("FerretDB stopped by itself: %v", err)
	}
	// FerretDB gives connected clients 3s to go away; committed writes are in the
	// SQLite WAL already, so we do not wait that long.
	stop()
	select {
	case err := <-done:
		return err
	case <-time.After(c.grace):
		return nil
	}
}
