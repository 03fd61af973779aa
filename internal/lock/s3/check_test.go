package s3_test

import (
	"net/url"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/withlock/withlock/internal/lock"
	"github.com/withlock/withlock/internal/lock/locktest"
	"github.com/withlock/withlock/internal/testenv"
)

// findings runs withlock check's probe on u and returns its findings by
// name.
func findings(t *testing.T, u string) map[string]lock.Finding {
	t.Helper()
	c := locktest.Open(t, u, lock.Options{})
	fs, err := c.Check(locktest.Context(t))
	if err != nil {
		t.Fatalf("check: %v", err)
	}
	byName := map[string]lock.Finding{}
	for _, f := range fs {
		t.Logf("%s: %s: %s %s", f.Status, f.Name, f.Detail, f.Fix)
		byName[f.Name] = f
	}
	return byName
}

// TestCheck: on a store that honours the conditions every probe passes,
// the clock is read, and nothing is left behind.
func TestCheck(t *testing.T) {
	s := testenv.RequireS3(t)
	bucket := s.Bucket(t)
	fs := findings(t, withPrefix(s.URL(bucket), "locks"))
	for _, name := range []string{"probe lock", "If-None-Match", "If-Match", "If-Match, missing", "concurrent creates", "clock", "versioning"} {
		if f, ok := fs[name]; !ok || f.Status != lock.Ok {
			t.Errorf("%s: %+v; want ok", name, f)
		}
	}
	if _, ok := fs["probe objects"]; ok {
		t.Errorf("the probe objects stayed: %+v", fs["probe objects"])
	}
	if keys := list(t, s, bucket); len(keys) != 0 {
		t.Errorf("check left %v behind", keys)
	}
}

// TestCheckIgnoringStore: a store that ignores If-None-Match and If-Match
// (here the same server behind a proxy that drops them and signs the
// request again, as a store that does not know them would see it) fails
// the check on every probe of a condition.
func TestCheckIgnoringStore(t *testing.T) {
	s := testenv.RequireS3(t)
	bucket := s.Bucket(t)
	u, _ := url.Parse(withPrefix(s.URL(bucket), "locks"))
	q := u.Query()
	endpoint, stop, err := s.IgnoringConditions()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	q.Set("endpoint", endpoint)
	u.RawQuery = q.Encode()
	fs := findings(t, u.String())
	for _, name := range []string{"If-None-Match", "If-Match", "If-Match, missing", "concurrent creates"} {
		if f := fs[name]; f.Status != lock.Fail || f.Fix == "" {
			t.Errorf("%s: %+v; want fail, with the fix", name, f)
		}
	}
}

// list is the keys in bucket.
func list(t *testing.T, s *testenv.S3, bucket string) []string {
	t.Helper()
	out, err := client(s).ListObjectsV2(t.Context(), &s3.ListObjectsV2Input{Bucket: &bucket})
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, o := range out.Contents {
		keys = append(keys, aws.ToString(o.Key))
	}
	return keys
}
