package s3_test

import (
	"errors"
	"io"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/withlock/withlock/internal/lock"
	"github.com/withlock/withlock/internal/lock/locktest"
	_ "github.com/withlock/withlock/internal/lock/s3"
	"github.com/withlock/withlock/internal/testenv"
)

// client is an S3 client of the test's own on s's store, to read and
// write behind withlock's back as an operator would.
func client(s *testenv.S3) *s3.Client {
	return s3.New(s3.Options{
		Region:       s.Region,
		BaseEndpoint: aws.String(s.Endpoint),
		UsePathStyle: true,
		Credentials:  credentials.NewStaticCredentialsProvider(s.AccessKey, s.SecretKey, ""),
	})
}

// TestConformance runs the suite every backend passes on a bucket of its
// own, under a prefix, as users write it.
func TestConformance(t *testing.T) {
	s := testenv.RequireS3(t)
	bucket := s.Bucket(t)
	u := withPrefix(s.URL(bucket), "locks/ci")
	c := client(s)
	locktest.Run(t, locktest.Config{
		Open: func(t *testing.T, opts lock.Options) *lock.Client { return locktest.Open(t, u, opts) },
		Lease: &locktest.Lease{
			Break: func(t *testing.T, name string) {
				key := "locks/ci/" + lock.EscapeName(name)
				if _, err := c.DeleteObject(t.Context(), &s3.DeleteObjectInput{Bucket: &bucket, Key: &key}); err != nil {
					t.Fatalf("deleting the lock object: %v", err)
				}
			},
			// Last-Modified and Date are whole seconds: a lease is judged
			// to run until a second after its ttl. And versitygw's Date
			// lags by up to a second more (its HTTP server stamps the
			// time it last read once a second), which a contender takes
			// for a lease that runs that much longer.
			Margin: 2 * time.Second,
		},
		Modes: locktest.Modes{NoShared: true, RecordsN: true},
	})
}

// withPrefix is the s3:// URL u with the key prefix p.
func withPrefix(u, p string) string {
	pu, err := url.Parse(u)
	if err != nil {
		panic(err)
	}
	pu.Path = "/" + p
	return pu.String()
}

// TestURL: what the URL says, and what it may not.
func TestURL(t *testing.T) {
	for _, tc := range []struct {
		url, opts, want string
	}{
		{"s3:///prefix", "", "names its bucket"},
		{"s3://b?regoin=x", "", `unknown option "regoin"`},
		{"s3://b?path_style=yes", "", "not true or false"},
		{"s3://b?endpoint=minio:9000", "", "not an http:// or https:// URL"},
		{"s3://key@b", "", "both the access key and the secret"},
		{"s3://b", "shared", "no shared locks"},
		{"s3://b?cacert=/nonexistent", "", "cacert"},
	} {
		opts := lock.Options{}
		if tc.opts == "shared" {
			opts.Mode = lock.Shared
		}
		_, err := lock.Open(tc.url, opts)
		if !errors.Is(err, lock.ErrUsage) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Open(%q): %v; want a usage error saying %q", tc.url, err, tc.want)
		}
	}
	if _, err := lock.Open("s3://ak:sk@bucket/a/b?endpoint=https://s3.example:9000&region=eu-west-1&path_style=true", lock.Options{}); err != nil {
		t.Errorf("a full URL: %v", err)
	}
}

// TestObject: the object is PREFIX/NAME escaped, its body says who holds
// it, and a release writes a free body that keeps the count of
// acquisitions: the fencing token only grows.
func TestObject(t *testing.T) {
	s := testenv.RequireS3(t)
	bucket := s.Bucket(t)
	c := locktest.Open(t, withPrefix(s.URL(bucket), "p"), lock.Options{TTL: 3 * time.Second, Holder: lock.Holder{Host: "web-1", PID: 42, Command: []string{"migrate", "up"}}})
	name := "db migration/" + t.Name()
	key := "p/" + lock.EscapeName(name)
	for i := int64(1); i <= 2; i++ {
		l, err := c.TryAcquire(locktest.Context(t), name)
		if err != nil {
			t.Fatal(err)
		}
		if tok := l.(lock.Expiring).Token(); tok != i {
			t.Errorf("acquisition %d: token %d", i, tok)
		}
		body := read(t, s, bucket, key)
		for _, want := range []string{`"state":"held"`, `"host":"web-1"`, `"pid":42`, `"command":["migrate","up"]`, `"ttl_ms":3000`, `"name":"db migration/`} {
			if !strings.Contains(body, want) {
				t.Errorf("held body %s lacks %s", body, want)
			}
		}
		if err := l.Release(locktest.Context(t)); err != nil {
			t.Fatal(err)
		}
		body = read(t, s, bucket, key)
		if !strings.Contains(body, `"state":"free"`) || strings.Contains(body, "web-1") || !strings.Contains(body, `"token":`) {
			t.Errorf("released body %s: want free, no holder, the token kept", body)
		}
	}
	if strings.Contains(key, " ") || strings.Count(key, "/") != 1 {
		t.Errorf("key %q: the name is not escaped", key)
	}
}

func read(t *testing.T, s *testenv.S3, bucket, key string) string {
	t.Helper()
	out, err := client(s).GetObject(t.Context(), &s3.GetObjectInput{Bucket: &bucket, Key: &key})
	if err != nil {
		t.Fatalf("reading %s: %v", key, err)
	}
	defer out.Body.Close()
	var b strings.Builder
	if _, err := io.Copy(&b, out.Body); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// TestErrors: a missing bucket and wrong keys are refusals that say what
// to do; a store that does not answer is unavailable.
func TestErrors(t *testing.T) {
	s := testenv.RequireS3(t)
	ctx := locktest.Context(t)
	u, _ := url.Parse(s.URL("no-such-bucket-" + strings.ToLower(lock.NewToken()[:8])))
	wrong, _ := url.Parse(s.URL(s.Bucket(t)))
	wrong.User = url.UserPassword(s.AccessKey, "wrong")
	cases := []struct {
		url  string
		kind error
		want string
	}{
		{u.String(), lock.ErrRefused, "does not exist; create it"},
		{wrong.String(), lock.ErrRefused, "refused the credentials"},
		{"s3://ak:sk@b?endpoint=http://127.0.0.1:1&path_style=true", lock.ErrUnavailable, "cannot reach s3 at 127.0.0.1:1"},
	}
	for _, tc := range cases {
		c, err := lock.Open(tc.url, lock.Options{})
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.TryAcquire(ctx, "x")
		c.Close()
		if !errors.Is(err, tc.kind) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v; want %v saying %q", lock.Redact(tc.url), err, tc.kind, tc.want)
		}
	}
}
