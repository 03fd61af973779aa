package testenv

import (
	"crypto/rand"
	"crypto/tls"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
)

// ErrNoS3 is returned by [StartS3] when the S3 test server cannot be built.
// Its message says what to do.
var ErrNoS3 = errors.New("testenv: cannot build the S3 test server (versitygw, module internal/testenv/versitygw): it needs the go command in PATH and, the first time, the Go module proxy; run scripts/test-deps to build it ahead")

// S3 is a running throwaway S3 server on 127.0.0.1, over plain HTTP: the
// Versity S3 Gateway (versitygw), built from the module
// internal/testenv/versitygw, with its POSIX backend. Its one account is
// root, with AccessKey and SecretKey, in Region; requests need AWS Signature
// Version 4 with an x-amz-content-sha256 header, as the SDKs sign them.
// Buckets are directories of Root, objects files below them, with their
// ETags and metadata in extended attributes; versioning is off. Date and
// Last-Modified are HTTP dates, in whole seconds, of this machine's clock.
//
// Conditional writes, what a lease lock needs: PutObject with
// If-None-Match: * on an existing key, or with an If-Match ETag other than
// the object's, fails with 412 PreconditionFailed; with If-Match on a
// missing key, with 404 NoSuchKey; with both headers, with 501
// NotImplemented. Each evaluates and publishes under a flock in
// Root/.vgwlocks, so that of concurrent conditional writes to a key, also
// through different processes on one Root ([S3.Second]), exactly one
// succeeds and the others wait and get 412 (never AWS's 409
// ConditionalRequestConflict). DeleteObject with If-Match answers 412 to
// another ETag and 204 on a missing key, but checks the ETag outside that
// flock: it may remove an object that a concurrent If-Match write has just
// replaced.
//
// A start takes a fraction of a second, so each test may have a server of
// its own; tests of one binary may also share one and give each test a
// bucket ([S3.Bucket]).
type S3 struct {
	*proc            // Dir: Root for a first server, only its output for a second; Close removes it
	Endpoint  string // http://127.0.0.1:PORT (https:// with TLS), the same across Stop and Start
	AccessKey string
	SecretKey string // random, with the characters of an AWS secret key: A-Z a-z 0-9 + /
	Region    string // us-east-1
	// Root is the POSIX backend's directory: Dir for the server StartS3
	// starts (its output, Dir/server.out, is a file, not a bucket), the
	// first server's Root for a second one.
	Root string
}

// S3Options say how [StartS3] starts a server.
type S3Options struct {
	// TLS serves https:// only, with a certificate for 127.0.0.1 signed by
	// the CA in CertFile.
	TLS bool
}

// StartS3 starts a new server on a free port, with new keys and an empty
// Root. The first call in a process finds the server binary in the user's
// cache (withlock-testenv/versitygw-KEY, KEY a hash of the module's
// go.mod and go.sum) or builds it there, which takes a minute or two.
func StartS3(opts ...S3Options) (*S3, error) {
	o := append(opts, S3Options{})[0]
	bin, err := versitygwBinary()
	if err != nil {
		return nil, err
	}
	p, err := newProc(os.TempDir(), "s3", nil, o.TLS)
	if err != nil {
		return nil, err
	}
	key := make([]byte, 30)
	rand.Read(key)
	s := &S3{proc: p, AccessKey: "AKIA" + rand.Text()[:16], SecretKey: base64.StdEncoding.EncodeToString(key), Region: "us-east-1", Root: p.Dir}
	return s.launch(bin)
}

// RequireS3 is [StartS3] for t; if the server cannot be built, t fails under
// CI and is skipped elsewhere.
func RequireS3(t testing.TB) *S3 {
	s, err := StartS3()
	return require(t, s, err, ErrNoS3)
}

// Second starts another server on a free port of its own serving the same
// Root with the same keys and region, as two gateways in front of one
// shared file system: what one writes the other reads at once. Its Dir
// holds only its output; Close stops it and leaves Root to the first
// server. The caller must Close it.
func (s *S3) Second() (*S3, error) {
	bin, err := versitygwBinary()
	if err != nil {
		return nil, err
	}
	p, err := newProc(os.TempDir(), "s3", nil, false)
	if err != nil {
		return nil, err
	}
	s2 := &S3{proc: p, AccessKey: s.AccessKey, SecretKey: s.SecretKey, Region: s.Region, Root: s.Root}
	return s2.launch(bin)
}

// launch starts the server on a free port, ready (its /health answers);
// if it cannot, it closes s.
func (s *S3) launch(bin string) (*S3, error) {
	// Stop kills it: its graceful shutdown waits up to 10s for connections
	// a client opened and never used, as an SDK's pool has some after a
	// burst of requests. A kill loses nothing it acknowledged: each object
	// is written to an unnamed file, with its ETag and metadata, and then
	// linked in.
	s.stopSig = syscall.SIGKILL
	s.command = func() *exec.Cmd {
		// Written once, not at each Start: tests read them meanwhile.
		if e := s.scheme() + "://" + s.addr(); s.Endpoint != e {
			s.Endpoint, s.proc.URL = e, e
		}
		// Keep-alive on, as S3 keeps connections; --quiet: no line per
		// request in server.out. None of the environment's variables that
		// versitygw reads as flags: VGW_*, ROOT_*, LOGFILE and WEBHOOK.
		args := []string{"--port", s.addr(), "--access", s.AccessKey, "--secret", s.SecretKey,
			"--region", s.Region, "--health", "/health", "--keep-alive", "--quiet"}
		if s.CertFile != "" {
			args = append(args, "--cert", filepath.Join(s.Dir, "server.crt"), "--key", filepath.Join(s.Dir, "server.key"))
		}
		cmd := exec.Command(bin, append(args, "posix", s.Root)...)
		for _, kv := range os.Environ() {
			name, _, _ := strings.Cut(kv, "=")
			if !strings.HasPrefix(name, "VGW_") && !strings.HasPrefix(name, "ROOT_") && name != "LOGFILE" && name != "WEBHOOK" {
				cmd.Env = append(cmd.Env, kv)
			}
		}
		return cmd
	}
	// A client of its own, that leaves no connection open.
	client := &http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true,
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} // readiness only
	s.ready = func() error {
		resp, err := client.Get(s.scheme() + "://" + s.addr() + "/health")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("GET /health: %s", resp.Status)
		}
		return nil
	}
	if err := s.proc.launch(); err != nil {
		return nil, err
	}
	return s, nil
}

// IgnoringConditions starts an endpoint in front of s that drops
// If-None-Match and If-Match from every request and signs it again with
// s's keys: a store that takes the conditions and ignores them, as many
// S3-compatible stores do. stop closes it.
func (s *S3) IgnoringConditions() (endpoint string, stop func(), err error) {
	target, err := url.Parse(s.Endpoint)
	if err != nil {
		return "", nil, err
	}
	signer := v4.NewSigner()
	creds := aws.Credentials{AccessKeyID: s.AccessKey, SecretAccessKey: s.SecretKey}
	p := &httputil.ReverseProxy{Rewrite: func(r *httputil.ProxyRequest) {
		r.SetURL(target)
		out := r.Out
		out.Host = target.Host
		out.Header.Del("If-None-Match")
		out.Header.Del("If-Match")
		out.Header.Del("Authorization")
		// A request it cannot sign goes unsigned, and the server refuses it.
		signer.SignHTTP(out.Context(), creds, out, out.Header.Get("X-Amz-Content-Sha256"), "s3", s.Region, time.Now())
	}}
	srv := httptest.NewServer(p)
	return srv.URL, srv.Close, nil
}

// scheme is https for a server with TLS, else http.
func (s *S3) scheme() string {
	if s.CertFile != "" {
		return "https"
	}
	return "http"
}

// Bucket creates a new, empty bucket with a name of its own (withlock-
// and 16 lower-case letters and digits) and returns its name. It makes the
// bucket's directory in Root, which the server takes for a bucket owned by
// its root account.
func (s *S3) Bucket(t testing.TB) string {
	t.Helper()
	name := "withlock-" + strings.ToLower(rand.Text()[:16])
	if err := os.Mkdir(filepath.Join(s.Root, name), 0o755); err != nil {
		t.Fatalf("testenv: bucket: %v", err)
	}
	return name
}

// URL returns withlock's URL of bucket on this server, with its keys:
// s3://ACCESS:SECRET@BUCKET?endpoint=http://127.0.0.1:PORT&region=us-east-1&path_style=true
// (the secret key percent-encoded: it may hold a /).
func (s *S3) URL(bucket string) string {
	return fmt.Sprintf("s3://%s@%s?endpoint=%s&region=%s&path_style=true",
		url.UserPassword(s.AccessKey, s.SecretKey), bucket, s.Endpoint, s.Region)
}

var versitygwBinary = sync.OnceValues(func() (string, error) {
	return cachedBuild("versitygw", "github.com/versity/versitygw/cmd/versitygw", ErrNoS3)
})
