package s3

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsmiddleware "github.com/aws/aws-sdk-go-v2/aws/middleware"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"

	"github.com/withlock/withlock/internal/lock"
)

func init() {
	lock.Register("s3", open)
}

type backend struct {
	opts   lock.Options
	bucket string
	prefix string // "" or ending in "/"
	where  string // for messages: "s3 at HOST:PORT"

	region, endpoint, profile string
	pathStyle                 bool
	tls                       *tls.Config
	keys                      *url.Userinfo // access key and secret from the URL, if given

	mu     sync.Mutex
	client *s3.Client // made on first use (connect)

	// seen is, per key, the ETag last read and when (on this process's
	// monotonic clock) it was first read: expiry is judged from it where
	// the store gave no Date.
	seen map[string]observation
}

type observation struct {
	etag string
	at   time.Time
}

// urlOptions are the s3:// URL's query options.
var urlOptions = []string{"endpoint", "region", "path_style", "profile", "cacert", "cert", "key"}

func open(u *url.URL, opts lock.Options) (lock.Backend, error) {
	if opts.Mode == lock.Shared {
		return nil, lock.Errorf(lock.ErrUsage, "the s3:// backend has no shared locks: a lock object has one holder; use --max-holders N for N at once, or a backend with shared locks (postgres, redis, mongodb, etcd) for readers and writers")
	}
	if u.Opaque != "" || u.Host == "" {
		return nil, lock.Errorf(lock.ErrUsage, "an s3 URL names its bucket: s3://BUCKET[/PREFIX]")
	}
	q := u.Query()
	for k := range q {
		if !slices.Contains(urlOptions, k) {
			return nil, lock.Errorf(lock.ErrUsage, "s3 URL: unknown option %q; the options are %s", k, strings.Join(urlOptions, ", "))
		}
	}
	b := &backend{
		opts:     opts,
		bucket:   u.Host,
		region:   q.Get("region"),
		endpoint: q.Get("endpoint"),
		profile:  q.Get("profile"),
		keys:     u.User,
		seen:     map[string]observation{},
	}
	if p := strings.Trim(u.Path, "/"); p != "" {
		b.prefix = p + "/"
	}
	if s := q.Get("path_style"); s != "" {
		v, err := strconv.ParseBool(s)
		if err != nil {
			return nil, lock.Errorf(lock.ErrUsage, "s3 URL: path_style=%q is not true or false", s)
		}
		b.pathStyle = v
	}
	if b.endpoint != "" {
		e, err := url.Parse(b.endpoint)
		if err != nil || e.Scheme != "http" && e.Scheme != "https" || e.Host == "" {
			return nil, lock.Errorf(lock.ErrUsage, "s3 URL: endpoint=%q is not an http:// or https:// URL", b.endpoint)
		}
	}
	if b.keys != nil {
		if _, ok := b.keys.Password(); !ok || b.keys.Username() == "" {
			return nil, lock.Errorf(lock.ErrUsage, "s3 URL: give both the access key and the secret, s3://ACCESS_KEY:SECRET@BUCKET, or neither (the AWS credential chain)")
		}
	}
	var err error
	if b.tls, err = lock.TLSFiles("s3 URL", q); err != nil {
		return nil, err
	}
	b.where = whereOf(b.endpoint, b.region)
	return b, nil
}

// whereOf is the store at endpoint (or AWS S3 in region) for messages:
// "s3 at HOST:PORT".
func whereOf(endpoint, region string) string {
	if u, err := url.Parse(endpoint); err == nil && u.Host != "" {
		return "s3 at " + u.Host
	}
	if region != "" {
		return "s3 at s3." + region + ".amazonaws.com"
	}
	return "s3 at s3.amazonaws.com"
}

// connect makes the client on first use: the credential chain is read
// then, not when the backend is opened (lock.Opener: no network, and a
// command that fails on its flags does not pay for it).
func (b *backend) connect(ctx context.Context) (*s3.Client, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.client != nil {
		return b.client, nil
	}
	load := []func(*config.LoadOptions) error{
		// The wait loop and the keep loop retry; a conditional write the
		// SDK sent again after a lost answer would fail on its own success.
		config.WithRetryer(func() aws.Retryer { return aws.NopRetryer{} }),
		// No x-amz-checksum-* headers: some stores refuse them. The body
		// is signed with its SHA-256 all the same.
		config.WithRequestChecksumCalculation(aws.RequestChecksumCalculationWhenRequired),
		config.WithResponseChecksumValidation(aws.ResponseChecksumValidationWhenRequired),
	}
	if b.region != "" {
		load = append(load, config.WithRegion(b.region))
	}
	if b.profile != "" {
		load = append(load, config.WithSharedConfigProfile(b.profile))
	}
	if b.keys != nil {
		secret, _ := b.keys.Password()
		load = append(load, config.WithCredentialsProvider(credentials.NewStaticCredentialsProvider(b.keys.Username(), secret, "")))
	}
	if b.tls != nil {
		load = append(load, config.WithHTTPClient(awshttp.NewBuildableClient().WithTransportOptions(func(t *http.Transport) {
			t.TLSClientConfig = b.tls
		})))
	}
	cfg, err := config.LoadDefaultConfig(ctx, load...)
	if err != nil {
		return nil, lock.Errorf(lock.ErrRefused, "%s: the AWS configuration cannot be read: %v", b.where, err)
	}
	if cfg.Region == "" {
		if b.endpoint == "" {
			return nil, lock.Errorf(lock.ErrUsage, "%s: no region: give ?region=R in the URL, or set AWS_REGION", b.where)
		}
		cfg.Region = "us-east-1" // what most S3-compatible stores expect
	}
	b.client = s3.NewFromConfig(cfg, func(o *s3.Options) {
		if b.endpoint != "" {
			o.BaseEndpoint = aws.String(b.endpoint)
		}
		o.UsePathStyle = b.pathStyle
	})
	// The store the SDK settled on: an endpoint from the environment
	// (AWS_ENDPOINT_URL_S3) or the profile, the region's.
	b.where = whereOf(aws.ToString(b.client.Options().BaseEndpoint), cfg.Region)
	return b.client, nil
}

// Close has nothing to do: the SDK's connections close with the process.
// A lock held through the backend stays held until its lease runs out.
func (b *backend) Close() error { return nil }

// keyOf is the key of slot i of name's lock: slot 0 is NAME's object.
func (b *backend) keyOf(name string, slot int) string {
	k := b.prefix + lock.EscapeName(name)
	if slot > 0 {
		k += ".slot-" + strconv.Itoa(slot)
	}
	return k
}

// get reads the object key. A missing one is an object that does not
// exist, not an error.
func (b *backend) get(ctx context.Context, key string) (*object, error) {
	c, err := b.connect(ctx)
	if err != nil {
		return nil, err
	}
	out, err := c.GetObject(ctx, &s3.GetObjectInput{Bucket: &b.bucket, Key: &key})
	if err != nil {
		if statusOf(err) == http.StatusNotFound && codeOf(err) != "NoSuchBucket" {
			return &object{key: key, served: dateOf(err)}, nil
		}
		return nil, b.classify(err, "s3:GetObject")
	}
	defer out.Body.Close()
	body, err := io.ReadAll(io.LimitReader(out.Body, 1<<16))
	if err != nil {
		return nil, lock.Unreachable(b.where, lock.Reason(err))
	}
	o := &object{key: key, exists: true, etag: aws.ToString(out.ETag), modified: aws.ToTime(out.LastModified)}
	if raw, ok := awsmiddleware.GetRawResponse(out.ResultMetadata).(*smithyhttp.Response); ok {
		o.served, _ = http.ParseTime(raw.Header.Get("Date"))
	}
	if err := json.Unmarshal(body, &o.rec); err != nil || o.rec.State != held && o.rec.State != free {
		return nil, lock.Errorf(lock.ErrRefused, "%s: the object %s is not a withlock lock; give withlock a prefix of its own (s3://%s/PREFIX)", b.where, key, b.bucket)
	}
	return o, nil
}

// condition is what a put is conditional on: the object not existing
// (ifMatch empty), or its ETag being ifMatch. One condition per request:
// some stores refuse two.
type condition struct{ ifMatch string }

var create = condition{}

// put writes rec to key if cond holds, and returns the new ETag. A write
// whose condition failed is an error for which failed reports true.
func (b *backend) put(ctx context.Context, key string, rec record, cond condition) (string, error) {
	c, err := b.connect(ctx)
	if err != nil {
		return "", err
	}
	body := rec.marshal()
	in := &s3.PutObjectInput{
		Bucket:        &b.bucket,
		Key:           &key,
		Body:          bytes.NewReader(body),
		ContentLength: aws.Int64(int64(len(body))),
		ContentType:   aws.String("application/json"),
	}
	if cond.ifMatch == "" {
		in.IfNoneMatch = aws.String("*")
	} else {
		in.IfMatch = aws.String(cond.ifMatch)
	}
	out, err := c.PutObject(ctx, in)
	if err != nil {
		return "", err
	}
	return aws.ToString(out.ETag), nil
}

// failed reports whether err is a conditional write's failed condition:
// 412 (the ETag did not match, or the object exists), 404 (If-Match on an
// object that no longer exists) or 409 (AWS: a concurrent conditional
// write; the other may have won).
func failed(err error) bool {
	switch statusOf(err) {
	case http.StatusPreconditionFailed, http.StatusConflict:
		return true
	case http.StatusNotFound:
		return codeOf(err) != "NoSuchBucket"
	}
	return false
}

// statusOf is the HTTP status of the store's answer in err, 0 if none.
func statusOf(err error) int {
	var re interface{ HTTPStatusCode() int }
	if errors.As(err, &re) {
		return re.HTTPStatusCode()
	}
	return 0
}

// codeOf is the S3 error code in err ("NoSuchBucket"), "" if none.
func codeOf(err error) string {
	var ae smithy.APIError
	if errors.As(err, &ae) {
		return ae.ErrorCode()
	}
	return ""
}

// dateOf is the Date of the store's answer in err, zero if none.
func dateOf(err error) time.Time {
	var re *smithyhttp.ResponseError
	if errors.As(err, &re) && re.Response != nil {
		t, _ := http.ParseTime(re.Response.Header.Get("Date"))
		return t
	}
	return time.Time{}
}

// classify sorts an error of a request into lock's sentinels. A failed
// condition is never classified here: the callers decide what a lost race
// means.
func (b *backend) classify(err error, action string) error {
	code, status := codeOf(err), statusOf(err)
	msg := code
	var ae smithy.APIError
	if errors.As(err, &ae) && ae.ErrorMessage() != "" {
		msg += ": " + ae.ErrorMessage()
	}
	switch {
	case code == "NoSuchBucket":
		return lock.Errorf(lock.ErrRefused, "%s: the bucket %s does not exist; create it, or name another in s3://BUCKET", b.where, b.bucket)
	case code == "InvalidAccessKeyId" || code == "SignatureDoesNotMatch" || code == "ExpiredToken" || code == "InvalidToken" || status == http.StatusUnauthorized:
		return lock.Errorf(lock.ErrRefused, "%s refused the credentials (%d %s); check the access key and secret, or the AWS credential chain's (AWS_PROFILE, AWS_ACCESS_KEY_ID)", b.where, status, msg)
	case status == http.StatusForbidden || code == "AccessDenied":
		return lock.Errorf(lock.ErrRefused, "%s refused %s on %s (403 %s); the credentials need s3:GetObject, s3:PutObject and s3:ListBucket on it (docs/s3.md)", b.where, action, b.prefixOrBucket(), msg)
	case status == http.StatusNotImplemented:
		return lock.Errorf(lock.ErrRefused, "%s does not implement %s as withlock sends it (501 %s); the store must honour conditional writes (If-None-Match, If-Match): withlock check tells", b.where, action, msg)
	case status == http.StatusTooManyRequests || status >= 500 || code == "SlowDown":
		return lock.Errorf(lock.ErrUnavailable, "%s is not answering (%d %s)", b.where, status, msg)
	case status != 0:
		return lock.Errorf(lock.ErrRefused, "%s refused %s (%d %s)", b.where, action, status, msg)
	case isCredentials(err):
		return lock.Errorf(lock.ErrRefused, "%s: no AWS credentials found (%v); give them in the environment (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE), a web identity, or the URL (s3://ACCESS_KEY:SECRET@BUCKET)", b.where, err)
	case lock.TLSRefusal(err):
		return lock.Errorf(lock.ErrRefused, "%s: %s", b.where, tlsReason(err))
	}
	return lock.Unreachable(b.where, lock.Reason(err))
}

// tlsReason is the TLS error in err without the SDK's wrapping of it
// ("operation error S3: GetObject, https response error ..."): the first
// error in its chain that is TLS's or x509's own.
func tlsReason(err error) string {
	for e := err; e != nil; e = errors.Unwrap(e) {
		if m := e.Error(); strings.HasPrefix(m, "tls: ") || strings.HasPrefix(m, "x509: ") || strings.HasPrefix(m, "remote error: ") {
			return m
		}
	}
	return err.Error()
}

func (b *backend) prefixOrBucket() string {
	if b.prefix == "" {
		return "the bucket " + b.bucket
	}
	return fmt.Sprintf("%s/%s*", b.bucket, b.prefix)
}

// isCredentials reports whether err is the credential chain's failure to
// find any credentials.
func isCredentials(err error) bool {
	s := err.Error()
	return strings.Contains(s, "failed to retrieve credentials") || strings.Contains(s, "failed to refresh cached credentials") || strings.Contains(s, "no EC2 IMDS role found")
}
