package testenv

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsmiddleware "github.com/aws/aws-sdk-go-v2/aws/middleware"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/aws/smithy-go/middleware"
	smithyhttp "github.com/aws/smithy-go/transport/http"
)

// TestS3: the server answers the SDK as it signs by default, a bucket
// Bucket makes is listed and usable, URL carries the keys, and the
// conditional writes a lease lock relies on give the statuses [S3] says,
// with exactly one winner of concurrent ones, also across two processes on
// one Root (which fails, two writers winning, with versitygw's lock files
// off: posix --disable-object-lock-file).
func TestS3(t *testing.T) {
	s := RequireS3(t)
	c := s3Client(s)
	bucket := s.Bucket(t)
	ctx := t.Context()
	list, err := c.ListBuckets(ctx, &s3.ListBucketsInput{})
	if err != nil || !slices.ContainsFunc(list.Buckets, func(b types.Bucket) bool { return aws.ToString(b.Name) == bucket }) {
		t.Fatalf("ListBuckets: %v, %v; want %s among them", list, err, bucket)
	}
	u, err := url.Parse(s.URL(bucket))
	if pw, _ := u.User.Password(); err != nil || u.Host != bucket || u.User.Username() != s.AccessKey || pw != s.SecretKey || u.Query().Get("endpoint") != s.Endpoint {
		t.Fatalf("URL: %s (%v) does not give back the bucket, keys and endpoint", s.URL(bucket), err)
	}

	star, stale := aws.String("*"), aws.String(`"0123456789abcdef0123456789abcdef"`)
	before := time.Now().Truncate(time.Second)
	e1, code, hdr := put(ctx, c, bucket, "k", "one", nil, star)
	if code != http.StatusOK {
		t.Fatalf("create with If-None-Match: *: %d", code)
	}
	t.Logf("PutObject answers Date: %s, Last-Modified: %q, ETag: %s", hdr.Get("Date"), hdr.Get("Last-Modified"), e1)
	head, err := c.HeadObject(ctx, &s3.HeadObjectInput{Bucket: &bucket, Key: aws.String("k")})
	if err != nil {
		t.Fatal(err)
	}
	hdr = rawHeader(head.ResultMetadata)
	t.Logf("HeadObject answers Date: %s, Last-Modified: %s", hdr.Get("Date"), hdr.Get("Last-Modified"))
	// versitygw's HTTP server reads its clock for Date once a second, so
	// Date may be a second behind the write's Last-Modified.
	for h, lag := range map[string]time.Duration{"Date": time.Second, "Last-Modified": 0} {
		if at, err := http.ParseTime(hdr.Get(h)); err != nil || at.Before(before.Add(-lag)) || at.After(time.Now()) {
			t.Errorf("HeadObject's %s: %q (%v); want an HTTP date, in seconds, between the PUT (less %s) and now", h, hdr.Get(h), err, lag)
		}
	}
	e2, code, _ := put(ctx, c, bucket, "k", "two", &e1, nil)
	if code != http.StatusOK || e2 == e1 {
		t.Fatalf("replace with If-Match: the ETag: %d, ETag %s (was %s)", code, e2, e1)
	}
	for _, c3 := range []struct {
		what                 string
		key                  string
		ifMatch, ifNoneMatch *string
		want                 int
	}{
		{"If-None-Match: * on an existing key", "k", nil, star, http.StatusPreconditionFailed},
		{"If-Match: a made-up ETag", "k", stale, nil, http.StatusPreconditionFailed},
		{"If-Match: the previous ETag", "k", &e1, nil, http.StatusPreconditionFailed},
		{"If-Match on a missing key", "missing", &e2, nil, http.StatusNotFound},
		{"If-Match: * on a missing key", "missing", star, nil, http.StatusNotFound},
		{"If-Match and If-None-Match: *", "k", &e2, star, http.StatusNotImplemented},
	} {
		if _, code, _ := put(ctx, c, bucket, c3.key, "three", c3.ifMatch, c3.ifNoneMatch); code != c3.want {
			t.Errorf("PutObject with %s: %d, want %d", c3.what, code, c3.want)
		}
	}
	if got := get(ctx, t, c, bucket, "k"); got != "two" {
		t.Errorf("after the failed writes the object holds %q, want %q", got, "two")
	}
	for _, d := range []struct {
		what    string
		key     string
		ifMatch *string
		want    int
	}{
		{"a made-up ETag", "k", stale, http.StatusPreconditionFailed},
		{"its ETag", "k", &e2, http.StatusNoContent},
		{"an ETag, on a missing key", "missing", &e2, http.StatusNoContent},
	} {
		out, err := c.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: &bucket, Key: &d.key, IfMatch: d.ifMatch})
		code := status(err)
		if err == nil {
			code = rawStatus(out.ResultMetadata)
		}
		if code != d.want {
			t.Errorf("DeleteObject with If-Match: %s: %d (%v), want %d", d.what, code, err, d.want)
		}
	}

	// Concurrent writes of one key: exactly one wins, the others get 412.
	race := func(t *testing.T, clients ...*s3.Client) {
		for round := range 5 {
			key := fmt.Sprintf("race-%d-%d", len(clients), round)
			var match *string
			if round%2 == 1 { // replace the object, as a renewal or a takeover does
				etag, code, _ := put(ctx, clients[0], bucket, key, "first", nil, star)
				if code != http.StatusOK {
					t.Fatalf("create %s: %d", key, code)
				}
				match = &etag
			}
			codes := make([]int, 20)
			var wg sync.WaitGroup
			for i := range codes {
				wg.Go(func() {
					ifNoneMatch := star
					if match != nil {
						ifNoneMatch = nil
					}
					_, codes[i], _ = put(ctx, clients[i%len(clients)], bucket, key, fmt.Sprint("writer ", i), match, ifNoneMatch)
				})
			}
			wg.Wait()
			wins, winner := 0, -1
			for i, code := range codes {
				if code == http.StatusOK {
					wins, winner = wins+1, i
				} else if code != http.StatusPreconditionFailed {
					wins = -1
					break
				}
			}
			if wins != 1 {
				t.Fatalf("%s, If-Match %v: 20 writers got %v; want one 200 and 412s", key, match != nil, codes)
			}
			for i, c := range clients {
				if got := get(ctx, t, c, bucket, key); got != fmt.Sprint("writer ", winner) {
					t.Errorf("%s through server %d: %q, want the winner's, %q", key, i, got, fmt.Sprint("writer ", winner))
				}
			}
		}
	}
	t.Run("one server", func(t *testing.T) { race(t, c) })
	s2, err := s.Second()
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if s2.Endpoint == s.Endpoint || s2.Root != s.Root {
		t.Fatalf("Second: at %s on %s; the first at %s on %s", s2.Endpoint, s2.Root, s.Endpoint, s.Root)
	}
	t.Run("two servers", func(t *testing.T) { race(t, c, s3Client(s2)) })

	ping := func(s *S3) func(context.Context) error {
		c := s3Client(s)
		return func(ctx context.Context) error {
			_, err := c.HeadBucket(ctx, &s3.HeadBucketInput{Bucket: &bucket})
			return err
		}
	}
	checkLifecycle(t, s2.proc, ping(s2))
	if _, err := os.Stat(filepath.Join(s.Root, bucket)); err != nil {
		t.Fatalf("after the second server's Close: %v", err)
	}
	checkLifecycle(t, s.proc, ping(s))
}

func s3Client(s *S3) *s3.Client {
	return s3.New(s3.Options{
		Region:       s.Region,
		BaseEndpoint: aws.String(s.Endpoint),
		UsePathStyle: true,
		Credentials:  credentials.NewStaticCredentialsProvider(s.AccessKey, s.SecretKey, ""),
		Retryer:      aws.NopRetryer{}, // every status as the server gave it
	})
}

// put writes body to bucket/key with the conditions given and returns the
// new ETag, the HTTP status and the response's header.
func put(ctx context.Context, c *s3.Client, bucket, key, body string, ifMatch, ifNoneMatch *string) (etag string, code int, hdr http.Header) {
	out, err := c.PutObject(ctx, &s3.PutObjectInput{Bucket: &bucket, Key: &key, Body: strings.NewReader(body), IfMatch: ifMatch, IfNoneMatch: ifNoneMatch})
	if err != nil {
		return "", status(err), nil
	}
	return aws.ToString(out.ETag), rawStatus(out.ResultMetadata), rawHeader(out.ResultMetadata)
}

func get(ctx context.Context, t *testing.T, c *s3.Client, bucket, key string) string {
	t.Helper()
	out, err := c.GetObject(ctx, &s3.GetObjectInput{Bucket: &bucket, Key: &key})
	if err != nil {
		t.Fatalf("GetObject %s: %v", key, err)
	}
	defer out.Body.Close()
	b, err := io.ReadAll(out.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// status is the HTTP status of a failed request, 0 if it got no answer.
func status(err error) int {
	var re interface{ HTTPStatusCode() int }
	if errors.As(err, &re) {
		return re.HTTPStatusCode()
	}
	return 0
}

func rawResponse(md middleware.Metadata) *smithyhttp.Response {
	r, _ := awsmiddleware.GetRawResponse(md).(*smithyhttp.Response)
	return r
}

func rawStatus(md middleware.Metadata) int         { return rawResponse(md).StatusCode }
func rawHeader(md middleware.Metadata) http.Header { return rawResponse(md).Header }
