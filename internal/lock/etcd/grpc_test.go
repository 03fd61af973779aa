package etcd

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/withlock/withlock/internal/testenv"
)

// closeWatcher is a connection that says, on its first Close, whether its
// reads had ended before (the server closed it) or not (the client did).
type closeWatcher struct {
	net.Conn
	readEnded atomic.Bool
	once      sync.Once
	byClient  chan bool
}

func (c *closeWatcher) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if err != nil {
		c.readEnded.Store(true)
	}
	return n, err
}

func (c *closeWatcher) Close() error {
	c.once.Do(func() { c.byClient <- !c.readEnded.Load() })
	return c.Conn.Close()
}

// TestGoAwayClosesConnection: when a member stops, the gRPC connection that
// a holder keeps open for its release is closed by the client as soon as
// the member says GOAWAY, not left for the member to close at the end of
// its graceful stop, a second later, which a holder with a short ttl might
// not survive in a rolling restart. (etcd 3.4 closes every connection
// itself at once: no release to test there.)
func TestGoAwayClosesConnection(t *testing.T) {
	for _, v := range testenv.EtcdVersions {
		t.Run("etcd"+v, func(t *testing.T) {
			t.Parallel()
			e := testenv.RequireEtcd(t, testenv.EtcdOptions{Version: v})
			c := newClient([]string{"http://" + e.Endpoint}, "", "", nil)
			defer c.close()
			byClient := make(chan bool, 1)
			c.h2, c.h2Conns = newH2(func(ctx context.Context, network, addr string) (net.Conn, error) {
				conn, err := (&net.Dialer{}).DialContext(ctx, network, addr)
				if err != nil {
					return nil, err
				}
				return &closeWatcher{Conn: conn, byClient: byClient}, nil
			})
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if _, err := c.txn(ctx, &txnRequest{Success: []requestOp{{Range: &rangeRequest{Key: []byte(t.Name())}}}}); err != nil {
				t.Fatal(err)
			}
			stopped := make(chan error, 1)
			go func() { stopped <- e.Stop() }()
			select {
			case closedByClient := <-byClient:
				if !closedByClient {
					t.Error("the member closed the idle gRPC connection; want the client to close it on the member's GOAWAY")
				}
			case <-ctx.Done():
				t.Fatal("the gRPC connection still open a minute after the member was told to stop")
			}
			if err := <-stopped; err != nil {
				t.Fatal(err)
			}
		})
	}
}
