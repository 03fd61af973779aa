package s3

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsmiddleware "github.com/aws/aws-sdk-go-v2/aws/middleware"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	smithyhttp "github.com/aws/smithy-go/transport/http"

	"github.com/withlock/withlock/internal/lock"
)

// burst is how many creates of one object the check sends at once.
const burst = 20

// Findings asks whether the store honours the conditions every write
// depends on (many S3-compatible stores ignore them, and a lock there
// excludes nobody), what its clock says beside this host's, and whether
// the bucket keeps versions; then removes its probe objects and the probe
// lock's, which a release keeps (free) for the lock's next holder.
func (b *backend) Findings(ctx context.Context, probe string) ([]lock.Finding, error) {
	base := b.keyOf(probe, 0)
	keys := []string{base, base + ".if-none-match", base + ".if-match", base + ".missing", base + ".burst"}
	out := b.conditions(ctx, keys[1], keys[2], keys[3], keys[4])
	out = append(out, b.versioning(ctx))
	if f, ok := b.remove(ctx, keys); !ok {
		out = append(out, f)
	}
	return out, nil
}

// conditions probes the conditional writes: a second If-None-Match: *
// create, a matching and then a stale If-Match, If-Match on a missing
// object, and a burst of creates of one object at once.
func (b *backend) conditions(ctx context.Context, kNone, kMatch, kMissing, kBurst string) []lock.Finding {
	probeRec := func(i int) record {
		return record{Name: kNone, State: free, Owner: lock.NewToken(), Renewals: int64(i)}
	}
	fail := func(name, detail string) lock.Finding {
		return lock.Finding{Name: name, Status: lock.Fail, Detail: detail,
			Fix: "use a store that honours conditional writes (AWS S3, versitygw, or a release of yours that documents If-None-Match and If-Match on PutObject); a lock here would exclude nobody"}
	}
	var out []lock.Finding
	// If-None-Match: the first create wins, the second must not.
	if _, err := b.put(ctx, kNone, probeRec(0), create); err != nil {
		return []lock.Finding{b.unasked("If-None-Match", err)}
	}
	_, err := b.put(ctx, kNone, probeRec(1), create)
	switch {
	case err == nil:
		out = append(out, fail("If-None-Match", "a second PUT with If-None-Match: * of an existing object succeeded: the store ignores the condition"))
	case failed(err):
		out = append(out, lock.Finding{Name: "If-None-Match", Status: lock.Ok, Detail: fmt.Sprintf("a second create of an existing object was refused (%d)", statusOf(err))})
	default:
		out = append(out, b.unasked("If-None-Match", err))
	}
	// If-Match: the ETag just written matches; the one before it must not.
	first, err := b.put(ctx, kMatch, probeRec(0), create)
	if err != nil {
		return append(out, b.unasked("If-Match", err))
	}
	_, err = b.put(ctx, kMatch, probeRec(1), condition{ifMatch: first})
	switch {
	case failed(err):
		out = append(out, fail("If-Match", fmt.Sprintf("a PUT with the object's own ETag in If-Match was refused (%d): the store compares ETags wrongly", statusOf(err))))
	case err != nil:
		out = append(out, b.unasked("If-Match", err))
	default:
		_, err = b.put(ctx, kMatch, probeRec(2), condition{ifMatch: first})
		switch {
		case err == nil:
			out = append(out, fail("If-Match", "a PUT with a stale ETag in If-Match succeeded: the store ignores the condition"))
		case failed(err):
			out = append(out, lock.Finding{Name: "If-Match", Status: lock.Ok, Detail: fmt.Sprintf("a write with the current ETag went through, one with a stale ETag was refused (%d)", statusOf(err))})
		default:
			out = append(out, b.unasked("If-Match", err))
		}
	}
	// If-Match on an object that does not exist must not create it.
	_, err = b.put(ctx, kMissing, probeRec(0), condition{ifMatch: `"0123456789abcdef0123456789abcdef"`})
	switch {
	case err == nil:
		out = append(out, fail("If-Match, missing", "a PUT with If-Match of an object that does not exist created it: the store ignores the condition"))
	case failed(err):
		out = append(out, lock.Finding{Name: "If-Match, missing", Status: lock.Ok, Detail: fmt.Sprintf("a write with If-Match of a missing object was refused (%d)", statusOf(err))})
	default:
		out = append(out, b.unasked("If-Match, missing", err))
	}
	// A burst of creates of one object: exactly one winner.
	var (
		wg        sync.WaitGroup
		mu        sync.Mutex
		won, lost int
		otherErr  error
	)
	for i := range burst {
		wg.Go(func() {
			_, err := b.put(ctx, kBurst, probeRec(i), create)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				won++
			case failed(err):
				lost++
			default:
				otherErr = err
			}
		})
	}
	wg.Wait()
	switch {
	case won > 1:
		out = append(out, fail("concurrent creates", fmt.Sprintf("%d creates of one object at once, each with If-None-Match: *: %d succeeded; exactly one may", burst, won)))
	case won == 1 && otherErr == nil:
		out = append(out, lock.Finding{Name: "concurrent creates", Status: lock.Ok, Detail: fmt.Sprintf("%d creates of one object at once: exactly one succeeded", burst)})
	case otherErr != nil:
		out = append(out, lock.Finding{Name: "concurrent creates", Status: lock.Warn,
			Detail: fmt.Sprintf("%d creates of one object at once: %d succeeded, %d were refused, and some failed (%v)", burst, won, lost, b.classify(otherErr, "s3:PutObject"))})
	default:
		out = append(out, fail("concurrent creates", fmt.Sprintf("%d creates of one object at once: none succeeded", burst)))
	}
	out = append(out, b.clock(ctx, kBurst))
	return out
}

// unasked is the finding of a probe the store would not answer.
func (b *backend) unasked(name string, err error) lock.Finding {
	return lock.Finding{Name: name, Status: lock.Warn, Detail: fmt.Sprintf("could not be probed: %v", b.classify(err, "s3:PutObject"))}
}

// clock reads the store's clock (an answer's Date) beside this host's.
// Expiry is judged by the store's clock alone, so a difference does no
// harm; a store that gives no Date leaves contenders to judge by their
// own.
func (b *backend) clock(ctx context.Context, key string) lock.Finding {
	c, err := b.connect(ctx)
	if err != nil {
		return lock.Finding{Name: "clock", Status: lock.Warn, Detail: err.Error()}
	}
	sent := time.Now()
	out, err := c.HeadObject(ctx, &s3.HeadObjectInput{Bucket: &b.bucket, Key: &key})
	got := time.Now()
	if err != nil {
		return lock.Finding{Name: "clock", Status: lock.Warn, Detail: fmt.Sprintf("could not be read: %v", b.classify(err, "s3:GetObject"))}
	}
	raw, _ := awsmiddleware.GetRawResponse(out.ResultMetadata).(*smithyhttp.Response)
	var date time.Time
	if raw != nil {
		date, _ = http.ParseTime(raw.Header.Get("Date"))
	}
	if date.IsZero() {
		return lock.Finding{Name: "clock", Status: lock.Warn, Detail: "the store gives no Date: contenders judge a lease's end by their own clocks, from when they first read it",
			Fix: "nothing to fix for safety; a run-out lease is taken over later than on a store that gives its time"}
	}
	// The store's second began somewhere in the request's round trip.
	mid := sent.Add(got.Sub(sent) / 2)
	off := date.Add(500 * time.Millisecond).Sub(mid).Round(100 * time.Millisecond)
	side := "ahead of"
	if off < 0 {
		off, side = -off, "behind"
	}
	return lock.Finding{Name: "clock", Status: lock.Ok,
		Detail: fmt.Sprintf("the store's clock is %v %s this host's (±%v); a lease's end is judged by the store's clock alone", off, side, (got.Sub(sent)/2 + 500*time.Millisecond).Round(100*time.Millisecond))}
}

// versioning warns of a bucket that keeps every version of an object:
// every renewal leaves one.
func (b *backend) versioning(ctx context.Context) lock.Finding {
	c, err := b.connect(ctx)
	if err != nil {
		return lock.Finding{Name: "versioning", Status: lock.Warn, Detail: err.Error()}
	}
	out, err := c.GetBucketVersioning(ctx, &s3.GetBucketVersioningInput{Bucket: &b.bucket})
	switch {
	case err != nil:
		return lock.Finding{Name: "versioning", Status: lock.Warn, Detail: fmt.Sprintf("could not be read: %v", b.classify(err, "s3:GetBucketVersioning")),
			Fix: "allow s3:GetBucketVersioning to know; a versioned bucket keeps a version of the lock object for every renewal"}
	case out.Status == types.BucketVersioningStatusEnabled:
		return lock.Finding{Name: "versioning", Status: lock.Warn, Detail: fmt.Sprintf("the bucket %s keeps versions: every renewal of a lock leaves one (a lock held for a day with --ttl 15s leaves about 17,000)", b.bucket),
			Fix: "give withlock a bucket without versioning, or a lifecycle rule that expires noncurrent versions under the prefix after a day (docs/s3.md)"}
	}
	return lock.Finding{Name: "versioning", Status: lock.Ok, Detail: fmt.Sprintf("the bucket %s keeps no versions", b.bucket)}
}

// remove deletes the probe objects. Without the right to delete, they
// stay, and the finding says how to remove them.
func (b *backend) remove(ctx context.Context, keys []string) (lock.Finding, bool) {
	c, err := b.connect(ctx)
	if err != nil {
		return lock.Finding{Name: "probe objects", Status: lock.Warn, Detail: err.Error()}, false
	}
	for _, k := range keys {
		_, err := c.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: &b.bucket, Key: aws.String(k)})
		if err != nil && statusOf(err) != http.StatusNotFound {
			return lock.Finding{Name: "probe objects", Status: lock.Warn,
				Detail: fmt.Sprintf("the probe objects %s* stay: %v", keys[0], b.classify(err, "s3:DeleteObject")),
				Fix:    fmt.Sprintf("aws s3 rm --recursive s3://%s/%s (only they begin so), or allow s3:DeleteObject on the prefix to withlock check's credentials", b.bucket, keys[0])}, false
		}
	}
	return lock.Finding{}, true
}
