package k8s

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/withlock/withlock/internal/lock"
)

func init() {
	lock.Register("k8s", open)
	lock.Register("kubernetes", open)
}

// Annotations and labels withlock puts on its Leases.
const (
	AnnotationName    = "withlock.io/name"
	AnnotationHost    = "withlock.io/host"
	AnnotationPID     = "withlock.io/pid"
	AnnotationCommand = "withlock.io/command" // JSON array
	AnnotationMax     = "withlock.io/max-holders"
	LabelLock         = "withlock.io/lock" // hashOf(NAME)
	LabelManagedBy    = "app.kubernetes.io/managed-by"
)

type backend struct {
	opts     lock.Options
	cfg      *config
	c        *client
	identity string
	duration int32 // leaseDurationSeconds: the ttl rounded up
	// seen is, per Lease, the version last read and when (on this
	// process's monotonic clock) it was first read: expiry is judged
	// from it.
	seen map[string]observation
}

type observation struct {
	rv string
	at time.Time
}

func open(u *url.URL, opts lock.Options) (lock.Backend, error) {
	if opts.Mode == lock.Shared {
		return nil, lock.Errorf(lock.ErrUsage, "the k8s:// backend has no shared locks: a Lease has one holder; use --max-holders N for N at once, or a backend with shared locks (postgres, redis, mongodb, etcd) for readers and writers")
	}
	cfg, err := loadConfig(u)
	if err != nil {
		return nil, err
	}
	d := math.Ceil(opts.TTL.Seconds())
	return &backend{
		opts:     opts,
		cfg:      cfg,
		c:        newClient(cfg),
		identity: fmt.Sprintf("%s/%d", opts.Holder.Host, opts.Holder.PID),
		duration: int32(max(d, 1)),
		seen:     map[string]observation{},
	}, nil
}

// Close drops idle connections. A Lease held through the backend stays
// held until it runs out.
func (b *backend) Close() error {
	b.c.http.Load().CloseIdleConnections()
	return nil
}

// hashOf is the first 32 hex digits of SHA-256(name).
func hashOf(name string) string {
	sum := sha256.Sum256([]byte(name))
	return hex.EncodeToString(sum[:16])
}

// LeaseName is the name of the Lease of the lock name: name itself if it is
// a DNS-1123 subdomain (as Kubernetes object names must be), else
// "withlock-" and the first 32 hex digits of SHA-256(name).
func LeaseName(name string) string {
	if len(name) <= 253 && isSubdomainPart(name) {
		return name
	}
	return "withlock-" + hashOf(name)
}

// SlotName is the name of slot i of a semaphore on name: slot 0 is the
// lock's own Lease, the others "withlock-<hash>-i".
func SlotName(name string, i int) string {
	if i == 0 {
		return LeaseName(name)
	}
	return "withlock-" + hashOf(name) + "-" + strconv.Itoa(i)
}

// isSubdomainPart reports whether s is dot-separated DNS-1123 labels:
// lower-case letters, digits and '-', each label starting and ending with
// a letter or digit.
func isSubdomainPart(s string) bool {
	if s == "" {
		return false
	}
	for _, label := range strings.Split(s, ".") {
		if label == "" || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for _, r := range label {
			if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-') {
				return false
			}
		}
	}
	return true
}

// want is how many holders this client's mode allows: 1 for an exclusive
// lock, N for a semaphore.
func (b *backend) want() int {
	if b.opts.Mode == lock.Semaphore {
		return b.opts.MaxHolders
	}
	return 1
}

// recordedN is the N a Lease's holder took it with (1: exclusive).
func recordedN(l *LeaseObject) int {
	n, err := strconv.Atoi(l.Metadata.Annotations[AnnotationMax])
	if err != nil || n < 1 {
		return 1
	}
	return n
}

// classify sorts an error of a call into lock's sentinels. A 409 is never
// classified here: the callers decide what a lost race means.
func (b *backend) classify(err error, verb string) error {
	where := "kubernetes at " + b.cfg.hostport
	var ae *apiError
	var pe *pluginError
	switch {
	case errors.As(err, &pe):
		// The credentials could not be had: a plugin that failed, a
		// token file that cannot be read. Trying again will not help.
		return lock.Errorf(lock.ErrRefused, "%s: %s", where, pe.msg)
	case errors.As(err, &ae):
		switch {
		case ae.code == http.StatusUnauthorized:
			return lock.Errorf(lock.ErrRefused, "%s refused the credentials of %s (401 Unauthorized: %s); check the token or certificate", where, b.cfg.source, ae.Error())
		case ae.code == http.StatusForbidden:
			return lock.Errorf(lock.ErrRefused, "%s: %s may not %s leases (coordination.k8s.io) in namespace %q (403 Forbidden: %s); grant it a Role with verbs get, list, watch, create, update on leases in %q and bind it (docs/kubernetes.md)",
				where, b.cfg.source, verb, b.cfg.namespace, ae.Error(), b.cfg.namespace)
		case ae.code == http.StatusNotFound && ae.status.Details.Kind == "namespaces":
			return lock.Errorf(lock.ErrRefused, "%s: namespace %q does not exist (%s); create it or name another in k8s://NAMESPACE", where, b.cfg.namespace, ae.Error())
		case ae.code == http.StatusNotFound:
			return lock.Errorf(lock.ErrRefused, "%s has no coordination.k8s.io/v1 Lease API (%s); Kubernetes 1.14 or later is needed", where, ae.Error())
		case ae.code == http.StatusTooManyRequests || ae.code >= 500:
			return lock.Errorf(lock.ErrUnavailable, "%s is not ready (%d: %s)", where, ae.code, ae.Error())
		}
		return lock.Errorf(lock.ErrRefused, "%s refused: %d %s", where, ae.code, ae.Error())
	case lock.TLSRefusal(err):
		return lock.Errorf(lock.ErrRefused, "%s: %v", where, err)
	}
	return lock.Unreachable(where, lock.Reason(err))
}

// isCode reports whether err is the API server's answer code.
func isCode(err error, code int) bool {
	var ae *apiError
	return errors.As(err, &ae) && ae.code == code
}
