package locktest

import (
	"errors"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/withlock/withlock/internal/lock"
)

// RunOneDial checks that one TryAcquire against a server that accepts
// every connection and closes it after its first bytes dials once: the
// driver has no retries of its own, since Client.Acquire is the only retry
// loop (lock.Backend: a backend never retries). url makes the backend's URL
// for a host:port. Connections whose first bytes (read for up to 100ms)
// ignore says are not an attempt to connect are not counted.
func RunOneDial(t *testing.T, url func(hostport string) string, ignore func(first []byte) bool) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var dials atomic.Int64
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
			first := make([]byte, 64)
			n, _ := c.Read(first)
			if ignore == nil || !ignore(first[:n]) {
				dials.Add(1)
			}
			c.Close()
		}
	}()
	c := Open(t, url(l.Addr().String()), lock.Options{ConnectTimeout: 2 * time.Second})
	_, err = c.TryAcquire(Context(t), Name(t))
	if !errors.Is(err, lock.ErrUnavailable) {
		t.Errorf("TryAcquire: %v; want ErrUnavailable", err)
	}
	// A sleep that checks that nothing happens: a driver that retries in
	// the background would dial again meanwhile.
	time.Sleep(200 * time.Millisecond)
	if n := dials.Load(); n != 1 {
		t.Errorf("one TryAcquire dialed %d times, want once", n)
	}
}
