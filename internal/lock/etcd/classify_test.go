package etcd

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/withlock/withlock/internal/lock"
)

// answer is an error as etcd's gateway answers it: HTTP status and body.
func answer(t *testing.T, status int, body string) error {
	t.Helper()
	resp := &http.Response{StatusCode: status, Status: http.StatusText(status), Body: http.NoBody,
		Request: &http.Request{URL: &url.URL{Path: "/v3/kv/txn"}}}
	resp.Body = readCloser{strings.NewReader(body)}
	return httpError(resp)
}

type readCloser struct{ *strings.Reader }

func (readCloser) Close() error { return nil }

// A lease that ran out between an attempt's grant and its put (seen under
// make stress's black-holes) is an outage to retry, not a refusal (69).
// The two shapes are those of etcd 3.4's gateway (grpc-gateway v1, which
// also says "error") and of later ones.
func TestLeaseNotFoundIsRetried(t *testing.T) {
	b := &backend{addr: "127.0.0.1:2379"}
	for _, err := range []error{
		answer(t, 404, `{"error":"etcdserver: requested lease not found","message":"etcdserver: requested lease not found","code":5}`),
		answer(t, 404, `{"code":5,"message":"etcdserver: requested lease not found","details":[]}`),
	} {
		if got := b.classify(err); !errors.Is(got, lock.ErrUnavailable) || errors.Is(got, lock.ErrRefused) {
			t.Errorf("classify(%v) = %v; want ErrUnavailable", err, got)
		}
	}
}

// The gateway's answers are sorted as the official client's errors were.
func TestClassify(t *testing.T) {
	b := &backend{addr: "127.0.0.1:2379"}
	for _, tc := range []struct {
		status int
		body   string
		want   error
		says   string
	}{
		{401, `{"error":"etcdserver: authentication failed, invalid user ID or password","code":3}`, lock.ErrRefused, "refused the user and password"},
		{403, `{"message":"etcdserver: permission denied","code":7}`, lock.ErrRefused, "permission denied"},
		{401, `{"message":"etcdserver: invalid auth token","code":3}`, lock.ErrUnavailable, "invalid auth token"},
		{503, `{"message":"etcdserver: no leader","code":14}`, lock.ErrUnavailable, "no leader"},
		{503, `{"message":"etcdserver: request timed out","code":14}`, lock.ErrUnavailable, "request timed out"},
		// A member that is stopping: its gateway's connection to its own
		// gRPC server closes (the script etcd/restart saw withlock give up
		// with "context canceled" when this was taken for the caller's).
		{503, `{"error":"transport is closing","message":"transport is closing","code":14}`, lock.ErrUnavailable, "transport is closing"},
		{499, `{"error":"grpc: the client connection is closing","message":"grpc: the client connection is closing","code":1}`, lock.ErrUnavailable, "closing"},
		{429, `{"message":"etcdserver: too many requests","code":8}`, lock.ErrUnavailable, "busy"},
		{429, `{"message":"etcdserver: mvcc: database space exceeded","code":8}`, lock.ErrRefused, "out of space"},
		{400, `{"message":"etcdserver: user name is empty","code":3}`, lock.ErrRefused, "user name is empty"},
		{500, `{"error":"some failure of the gateway","code":2}`, lock.ErrUnavailable, "some failure"},
		{400, `{"error":"etcdserver: key is not provided","code":3}`, lock.ErrRefused, "key is not provided"},
		// A streaming request's error (watch, lease keep-alive) nests in
		// "error": etcd 3.6 and later, then 3.5.
		{401, `{"error":{"code":16,"message":"etcdserver: invalid auth token"}}`, lock.ErrUnavailable, "invalid auth token"},
		{401, `{"error":{"grpc_code":16,"http_code":401,"message":"etcdserver: invalid auth token","http_status":"Unauthorized"}}`, lock.ErrUnavailable, "invalid auth token"},
		{400, `{"error":{"code":3,"message":"etcdserver: revision of auth store is old"}}`, lock.ErrUnavailable, "revision of auth store is old"},
		{403, `{"error":{"grpc_code":7,"http_code":403,"message":"etcdserver: permission denied","http_status":"Forbidden"}}`, lock.ErrRefused, "permission denied"},
		{502, `<html>Bad Gateway</html>`, lock.ErrUnavailable, "HTTP"},
		{404, `404 page not found`, lock.ErrRefused, "not an answer of etcd's v3 API"},
	} {
		got := b.classify(answer(t, tc.status, tc.body))
		if !errors.Is(got, tc.want) || !strings.Contains(got.Error(), tc.says) {
			t.Errorf("%d %s: %v; want %v saying %q", tc.status, tc.body, got, tc.want, tc.says)
		}
	}
}

// The answers that refuse a request's auth token, not its user, in every
// shape: the request is sent again with a new token. A watch's
// "permission denied" is one too (etcd 3.4 cancels a watch so for a token
// it does not know); other requests' is a real refusal.
func TestTokenRefused(t *testing.T) {
	for _, tc := range []struct {
		status int
		body   string
		path   string
		want   bool
	}{
		{401, `{"code":16, "message":"etcdserver: invalid auth token"}`, "/v3/kv/range", true},
		{401, `{"error":"etcdserver: invalid auth token","code":16,"message":"etcdserver: invalid auth token"}`, "/v3/kv/txn", true},
		{401, `{"error":{"code":16,"message":"etcdserver: invalid auth token"}}`, "/v3/lease/keepalive", true},
		{401, `{"error":{"grpc_code":16,"http_code":401,"message":"etcdserver: invalid auth token","http_status":"Unauthorized"}}`, "/v3/lease/keepalive", true},
		{400, `{"code":3,"message":"etcdserver: revision of auth store is old"}`, "/v3/kv/txn", true},
		{400, `{"error":{"grpc_code":3,"http_code":400,"message":"etcdserver: revision of auth store is old","http_status":"Bad Request"}}`, "/v3/watch", true},
		{403, `{"code":7,"message":"etcdserver: permission denied"}`, "/v3/kv/txn", false},
		{403, `{"code":7,"message":"etcdserver: permission denied"}`, "/v3/watch", true},
		{400, `{"code":3,"message":"etcdserver: authentication failed, invalid user ID or password"}`, "/v3/kv/txn", false},
		{401, `401 Unauthorized`, "/v3/lease/keepalive", false},
	} {
		if got := tokenRefused(answer(t, tc.status, tc.body), tc.path); got != tc.want {
			t.Errorf("%s: %d %s: tokenRefused = %v; want %v", tc.path, tc.status, tc.body, got, tc.want)
		}
	}
}

// A stream's message that is an error, in either shape, is the server's
// error.
func TestStreamError(t *testing.T) {
	for _, body := range []string{
		`{"error":{"code":16,"message":"etcdserver: invalid auth token"}}`,
		`{"error":{"grpc_code":16,"http_code":401,"message":"etcdserver: invalid auth token","http_status":"Unauthorized"}}`,
	} {
		s := &stream{body: readCloser{strings.NewReader(body)}, dec: json.NewDecoder(strings.NewReader(body))}
		var out leaseResponse
		err := s.next(&out)
		var se *serverError
		if !errors.As(err, &se) || se.msg != msgInvalidToken || se.code != 16 {
			t.Errorf("%s: %#v; want the server's invalid auth token, code 16", body, err)
		}
	}
}
