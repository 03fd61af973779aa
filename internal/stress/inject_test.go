package stress

import (
	"context"
	"io"
	"math/rand/v2"
	"net"
	"testing"
	"time"

	"github.com/withlock/withlock/internal/stress/faultproxy"
)

func TestInjectorCountsAndEndsFaults(t *testing.T) {
	// A server that answers each connection with one byte: a dial through
	// the proxy that reads it has passed the proxy.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Write([]byte{1})
			c.Close()
		}
	}()
	p, err := faultproxy.Start(ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()

	in := Injector{
		MinPause: time.Millisecond, MaxPause: 5 * time.Millisecond,
		// Long black-holes: Run must heal the one in force when it returns.
		Faults: []Fault{Cut(p), BlackHole(p, time.Hour, time.Hour)},
	}
	ctx, cancel := context.WithCancel(context.Background())
	counts := make(chan map[string]int)
	go func() { counts <- in.Run(ctx, rand.New(rand.NewPCG(1, 2))) }()
	// Wait until a black-hole is in force: a connection gets no answer.
	// (Cuts may reset the probes meanwhile.)
	for {
		c, err := net.Dial("tcp", p.Addr())
		if err != nil {
			continue
		}
		// Long enough that a busy machine's late answer is not taken for
		// a black-hole (which lasts an hour).
		c.SetReadDeadline(time.Now().Add(time.Second))
		_, err = io.ReadFull(c, make([]byte, 1))
		c.Close()
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			break
		}
	}
	cancel()
	got := <-counts
	if got["black-holes"] != 1 || len(got) != 1 && (len(got) != 2 || got["cuts"] == 0) {
		t.Errorf("counts = %v, want one black-hole and any number of cuts", got)
	}
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(c, make([]byte, 1)); err != nil {
		t.Errorf("after Run returned, the proxy is still black-holed: %v", err)
	}
}
