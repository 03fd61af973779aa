package k8s

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"github.com/withlock/withlock/internal/lock"
)

// leaseVerbs are the verbs withlock uses on Leases, and what each is for.
var leaseVerbs = []struct{ verb, for_ string }{
	{"get", "reading a lock"},
	{"create", "taking a lock for the first time"},
	{"update", "taking, renewing and releasing"},
	{"list", "status without NAME, and a semaphore's slots"},
	{"watch", "waking waiters when a lock is released (without it they poll)"},
	{"delete", "withlock check's removing its probe Lease"},
}

// accessReview is a SelfSubjectAccessReview: may this account do verb on
// Leases in the namespace?
type accessReview struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Spec       struct {
		ResourceAttributes struct {
			Namespace string `json:"namespace"`
			Verb      string `json:"verb"`
			Group     string `json:"group"`
			Resource  string `json:"resource"`
		} `json:"resourceAttributes"`
	} `json:"spec"`
	Status struct {
		Allowed bool   `json:"allowed"`
		Reason  string `json:"reason"`
	} `json:"status"`
}

// Findings asks the API server (SelfSubjectAccessReview, which every
// authenticated account may) what this account may do with Leases in the
// namespace, and removes the probe lock's Lease, which a release keeps
// (free) for the lock's next holder (withlock check).
func (b *backend) Findings(ctx context.Context, probe string) ([]lock.Finding, error) {
	ns := b.cfg.namespace
	var denied []string
	canDelete := false
	for _, v := range leaseVerbs {
		r := accessReview{APIVersion: "authorization.k8s.io/v1", Kind: "SelfSubjectAccessReview"}
		a := &r.Spec.ResourceAttributes
		a.Namespace, a.Verb, a.Group, a.Resource = ns, v.verb, "coordination.k8s.io", "leases"
		if _, _, err := b.c.call(ctx, http.MethodPost, "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", nil, &r, &r); err != nil {
			return []lock.Finding{{Name: "rights", Status: lock.Warn,
				Detail: fmt.Sprintf("the API server would not say what this account may do with leases in %q (%v)", ns, b.classify(err, "create selfsubjectaccessreviews"))}}, nil
		}
		switch {
		case !r.Status.Allowed:
			denied = append(denied, fmt.Sprintf("%s (%s)", v.verb, v.for_))
		case v.verb == "delete":
			canDelete = true
		}
	}
	var out []lock.Finding
	if len(denied) == 0 {
		out = append(out, lock.Finding{Name: "rights", Status: lock.Ok,
			Detail: fmt.Sprintf("this account may get, create, update, list, watch and delete leases in %q", ns)})
	} else {
		out = append(out, lock.Finding{Name: "rights", Status: lock.Warn,
			Detail: fmt.Sprintf("this account may not %s on leases in %q", strings.Join(denied, ", "), ns),
			Fix:    fmt.Sprintf("grant a Role with verbs get, list, watch, create, update and delete on leases in %q", ns)})
	}
	lease := LeaseName(probe)
	if canDelete {
		_, _, err := b.c.call(ctx, http.MethodDelete, b.c.leasesPath(ns)+"/"+url.PathEscape(lease), nil, nil, nil)
		if err != nil && !isNotFound(err) {
			return nil, b.classify(err, "delete")
		}
	} else {
		out = append(out, lock.Finding{Name: "probe lease", Status: lock.Warn,
			Detail: fmt.Sprintf("the probe's Lease %s/%s stays, free: this account may not delete leases", ns, lease),
			Fix:    fmt.Sprintf("kubectl delete lease -n %s %s", ns, lease)})
	}
	return out, nil
}

// isNotFound reports whether err is the API server's 404.
func isNotFound(err error) bool {
	var e *apiError
	return errors.As(err, &e) && e.code == http.StatusNotFound
}
