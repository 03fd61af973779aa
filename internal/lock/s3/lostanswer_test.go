package s3_test

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync/atomic"
	"testing"

	"github.com/withlock/withlock/internal/lock"
	"github.com/withlock/withlock/internal/lock/locktest"
	"github.com/withlock/withlock/internal/testenv"
)

// TestLostAnswer: a write that reached the store but whose answer never
// came back (a connection cut after the store wrote) leaves the holder's
// ETag stale. Its next write fails its condition, finds the object still
// its own, and goes on from there: the lock is not taken for lost, and a
// release after such a write frees it.
func TestLostAnswer(t *testing.T) {
	s := testenv.RequireS3(t)
	bucket := s.Bucket(t)
	var drop atomic.Bool // the next PUT's answer is lost
	target, _ := url.Parse(s.Endpoint)
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		out := r.Clone(r.Context())
		out.URL.Scheme, out.URL.Host, out.RequestURI = target.Scheme, target.Host, ""
		resp, err := http.DefaultTransport.RoundTrip(out)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		if r.Method == http.MethodPut && drop.CompareAndSwap(true, false) {
			// Written; the answer is lost with the connection.
			conn, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				conn.Close()
			}
			return
		}
		for k, v := range resp.Header {
			w.Header()[k] = v
		}
		w.WriteHeader(resp.StatusCode)
		io.Copy(w, resp.Body)
	}))
	t.Cleanup(proxy.Close)
	u, _ := url.Parse(s.URL(bucket))
	q := u.Query()
	q.Set("endpoint", proxy.URL)
	u.RawQuery = q.Encode()

	c := locktest.Open(t, u.String(), lock.Options{})
	other := locktest.Open(t, s.URL(bucket), lock.Options{})
	ctx, name := locktest.Context(t), locktest.Name(t)
	l, err := c.TryAcquire(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	drop.Store(true)
	if err := l.Keep(ctx); err == nil || errors.Is(err, lock.ErrLost) {
		t.Fatalf("Keep whose answer was lost: %v; want an error that is not a loss", err)
	}
	if err := l.Keep(ctx); !errors.Is(err, lock.ErrUnavailable) || errors.Is(err, lock.ErrLost) {
		t.Fatalf("the Keep after it: %v; want ErrUnavailable (its own write found), not a loss", err)
	}
	if err := l.Keep(ctx); err != nil {
		t.Fatalf("the Keep after that: %v", err)
	}
	if _, err := other.TryAcquire(ctx, name); !errors.Is(err, lock.ErrHeld) {
		t.Fatalf("another holder while it is held: %v; want ErrHeld", err)
	}
	drop.Store(true)
	if err := l.Keep(ctx); err == nil || errors.Is(err, lock.ErrLost) {
		t.Fatalf("Keep whose answer was lost: %v; want an error that is not a loss", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatalf("Release after a write whose answer was lost: %v", err)
	}
	if l2, err := other.TryAcquire(ctx, name); err != nil {
		t.Fatalf("after the release: %v", err)
	} else if err := l2.Release(ctx); err != nil {
		t.Fatal(err)
	}
}
