package etcd

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/withlock/withlock/internal/stress/faultproxy"
	"github.com/withlock/withlock/internal/testenv"
)

// splitHTTP reads one HTTP/1.1 request, named by its path.
func splitHTTP(r *bufio.Reader) (string, []byte, error) {
	var head strings.Builder
	for {
		line, err := r.ReadString('\n')
		head.WriteString(line)
		if err != nil {
			return "", nil, err
		}
		if line == "\r\n" {
			break
		}
	}
	req, err := http.ReadRequest(bufio.NewReader(strings.NewReader(head.String())))
	if err != nil {
		return "", nil, err
	}
	body := make([]byte, max(req.ContentLength, 0))
	if _, err := io.ReadFull(r, body); err != nil {
		return "", nil, err
	}
	return req.URL.Path, append([]byte(head.String()), body...), nil
}

// A kept-alive connection reset as the next request goes out on it (a
// server, proxy or load balancer dropping it as idle at that moment) costs
// a read, a renewal or a revocation nothing: it goes out again on a new
// connection. A grant is not sent again, since it may have run: the caller
// hears of the reset. (Transactions go over gRPC: TestTxnNotSentTwice.)
func TestResetKeptAliveConnection(t *testing.T) {
	e := testenv.RequireEtcd(t)
	p, err := faultproxy.Start(e.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	p.SetSplit(func() faultproxy.Split { return splitHTTP })
	// Every request but the first on a connection is reset unsent.
	p.SetRule(func(m faultproxy.Message) faultproxy.Action {
		if m.Index > 1 {
			return faultproxy.Action{Cut: faultproxy.ResetBefore}
		}
		return faultproxy.Action{}
	})
	c := newClient([]string{"http://" + p.Addr()}, "", "", nil)
	defer c.close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	key := []byte(strings.ReplaceAll(t.Name(), "/", "-") + "/")
	if _, err := c.get(ctx, &rangeRequest{Key: key}); err != nil {
		t.Fatalf("first range: %v", err)
	}
	id, err := c.grant(ctx, 60) // a new connection: the first was reset
	if err == nil {
		t.Fatalf("grant on a connection the proxy resets: lease %x, no error; want the reset", id)
	}
	id, err = c.grant(ctx, 60)
	if err != nil {
		t.Fatalf("grant: %v", err)
	}
	for _, step := range []struct {
		name string
		do   func() error
	}{
		{"range", func() error { _, err := c.get(ctx, &rangeRequest{Key: key}); return err }},
		{"keepalive", func() error { return c.keepAliveOnce(ctx, id) }},
		{"timetolive", func() error { _, err := c.timeToLive(ctx, id); return err }},
		{"revoke", func() error { return c.revoke(ctx, id) }},
	} {
		cuts := p.RuleCuts()
		if err := step.do(); err != nil {
			t.Errorf("%s on a kept-alive connection reset: %v; want it sent again", step.name, err)
		}
		if p.RuleCuts() != cuts+1 {
			t.Errorf("%s: the proxy reset %d connections; want 1", step.name, p.RuleCuts()-cuts)
		}
	}
}

// splitH2 reads the client's side of an HTTP/2 connection: its preface,
// then one frame at a time, named by its type.
func splitH2(r *bufio.Reader) (string, []byte, error) {
	const preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
	if b, err := r.Peek(len(preface)); err == nil && string(b) == preface {
		r.Discard(len(preface))
		return "preface", []byte(preface), nil
	}
	head := make([]byte, 9)
	if _, err := io.ReadFull(r, head); err != nil {
		return "", nil, err
	}
	frame := make([]byte, 9+(int(head[0])<<16|int(head[1])<<8|int(head[2])))
	copy(frame, head)
	if _, err := io.ReadFull(r, frame[9:]); err != nil {
		return "", nil, err
	}
	kinds := map[byte]string{0: "DATA", 1: "HEADERS", 3: "RST_STREAM", 4: "SETTINGS", 6: "PING", 7: "GOAWAY", 8: "WINDOW_UPDATE"}
	return kinds[head[3]], frame, nil
}

// A transaction, sent over gRPC, whose connection is reset once the
// request is out and before its answer came back, is not sent again: the
// caller hears of the reset. Whether the server ran it depends on when the
// reset reached it, which neither side can tell; so the proxy counts the
// request's messages, and the server must show the put at most once.
func TestTxnNotSentTwice(t *testing.T) {
	e := testenv.RequireEtcd(t)
	p, err := faultproxy.Start(e.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	p.SetSplit(func() faultproxy.Split { return splitH2 })
	value := []byte(t.Name() + "-value")
	var sent atomic.Int32 // the put's messages (DATA frames) that left the client
	p.SetRule(func(m faultproxy.Message) faultproxy.Action {
		if m.Kind == "DATA" && bytes.Contains(m.Data, value) && sent.Add(1) == 1 {
			return faultproxy.Action{Cut: faultproxy.ResetAfter}
		}
		return faultproxy.Action{}
	})
	c := newClient([]string{"http://" + p.Addr()}, "", "", nil)
	defer c.close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	key := []byte(t.Name() + "/k")
	if _, err := c.txn(ctx, &txnRequest{Success: []requestOp{{Range: &rangeRequest{Key: key}}}}); err != nil {
		t.Fatalf("first txn: %v", err)
	}
	put := &txnRequest{Success: []requestOp{{Put: &putRequest{Key: key, Value: value}}}}
	if _, err := c.txn(ctx, put); err == nil || p.RuleCuts() != 1 {
		t.Fatalf("txn whose answer the proxy cut: err %v, %d cuts; want the reset", err, p.RuleCuts())
	}
	if n := sent.Load(); n != 1 {
		t.Fatalf("the put left the client %d times; want once, not again after the reset", n)
	}
	direct := newClient([]string{"http://" + e.Endpoint}, "", "", nil)
	defer direct.close()
	resp, err := direct.get(ctx, &rangeRequest{Key: key})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) > 1 || len(resp.Kvs) == 1 && resp.Kvs[0].ModRevision != resp.Kvs[0].CreateRevision {
		t.Fatalf("the key after one cut txn: %+v; want it put once at most", resp.Kvs)
	}
	if _, err := c.txn(ctx, put); err != nil {
		t.Fatalf("txn on a new connection: %v", err)
	}
}

// A change of a user or role that lands between a new token's issue and
// its use makes the server refuse that token too ("revision of auth store
// is old"); the request is sent again with a newer one rather than fail.
// The proxy holds the request that carries the new token while the
// password is changed again. On the system's etcd with simple tokens (the
// change invalidates the user's tokens) and on the newest release with
// JWTs (the token is older than the auth store).
func TestAuthChangeMeetsNewToken(t *testing.T) {
	newest := testenv.EtcdVersions[len(testenv.EtcdVersions)-1]
	for _, o := range []testenv.EtcdOptions{{}, {Version: newest, JWTTTL: time.Minute}} {
		t.Run("etcd"+o.Version, func(t *testing.T) {
			t.Parallel()
			testAuthChangeMeetsNewToken(t, testenv.RequireEtcd(t, o))
		})
	}
}

func testAuthChangeMeetsNewToken(t *testing.T, e *testenv.Etcd) {
	if err := e.AddUser("wl", "wlpw", testenv.EtcdEveryKey); err != nil {
		t.Fatal(err)
	}
	if err := e.EnableAuth("rootpw"); err != nil {
		t.Fatal(err)
	}
	root, err := e.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	p, err := faultproxy.Start(e.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	p.SetSplit(func() faultproxy.Split { return splitHTTP })
	c := newClient([]string{"http://" + p.Addr()}, "wl", "wlpw", nil)
	defer c.close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	key := []byte("jobs/x")
	if _, err := c.get(ctx, &rangeRequest{Key: key}); err != nil {
		t.Fatalf("range: %v", err)
	}
	changePassword := func() {
		t.Helper()
		if _, err := root.UserChangePassword(ctx, "wl", "wlpw"); err != nil {
			t.Fatal(err)
		}
	}
	changePassword()

	// The first range after the next authentication waits for the second
	// change.
	held, release := make(chan struct{}), make(chan struct{})
	var mu sync.Mutex
	authenticated, holding := false, false
	p.SetRule(func(m faultproxy.Message) faultproxy.Action {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case m.Kind == "/v3/auth/authenticate":
			authenticated = true
		case m.Kind == "/v3/kv/range" && authenticated && !holding:
			holding = true
			close(held)
			return faultproxy.Action{Wait: release}
		}
		return faultproxy.Action{}
	})
	done := make(chan error, 1)
	go func() {
		_, err := c.get(ctx, &rangeRequest{Key: key})
		done <- err
	}()
	select {
	case <-held:
	case err := <-done:
		t.Fatalf("the range ended before it was sent with a new token: %v", err)
	}
	changePassword()
	close(release)
	if err := <-done; err != nil {
		t.Errorf("range whose new token an auth change made old: %v; want it sent again with a newer one", err)
	}
}
