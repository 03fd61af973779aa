package k8s_test

import (
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/withlock/withlock/internal/lock"
	"github.com/withlock/withlock/internal/lock/k8s"
	"github.com/withlock/withlock/internal/lock/locktest"
	"github.com/withlock/withlock/internal/testenv"
)

// One API server for the whole test binary (it takes seconds to start), a
// namespace for each test.
var (
	kubeOnce sync.Once
	kube     *testenv.Kube
	kubeErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if kube != nil {
		kube.Close()
	}
	os.Exit(code)
}

// requireKube starts the shared API server on first use; without one, t
// fails under CI and is skipped elsewhere.
func requireKube(t *testing.T) *testenv.Kube {
	t.Helper()
	kubeOnce.Do(func() { kube, kubeErr = testenv.StartKube() })
	// As testenv's Require functions: skipped outside CI (CI unset or false).
	if ci, err := strconv.ParseBool(os.Getenv("CI")); errors.Is(kubeErr, testenv.ErrNoKube) && (os.Getenv("CI") == "" || err == nil && !ci) {
		t.Skip(kubeErr)
	}
	if kubeErr != nil {
		t.Fatal(kubeErr)
	}
	return kube
}

// space is a namespace of the test's own where the user "leaser" may use
// Leases, and a kubeconfig ($KUBECONFIG for the test) that reaches the
// server as leaser. It returns the k8s:// URL of the namespace.
func space(t *testing.T) (*testenv.Kube, string, string) {
	t.Helper()
	k := requireKube(t)
	b := make([]byte, 4)
	rand.Read(b)
	ns := "t-" + hex.EncodeToString(b)
	if err := k.Namespace(ns); err != nil {
		t.Fatal(err)
	}
	if err := k.Grant(ns, "leaser"); err != nil {
		t.Fatal(err)
	}
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	if err := k.Kubeconfig(kc, "default", k.UserToken("leaser")); err != nil {
		t.Fatal(err)
	}
	t.Setenv("KUBECONFIG", kc)
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	return k, ns, "k8s://" + ns
}

func leasePath(ns, name string) string {
	return "/apis/coordination.k8s.io/v1/namespaces/" + ns + "/leases/" + name
}

func TestConformance(t *testing.T) {
	k, ns, url := space(t)
	locktest.Run(t, locktest.Config{
		Open: func(t *testing.T, opts lock.Options) *lock.Client { return locktest.Open(t, url, opts) },
		Lease: &locktest.Lease{
			Break: func(t *testing.T, name string) {
				if err := k.Do("DELETE", leasePath(ns, k8s.LeaseName(name)), nil, nil); err != nil {
					t.Fatalf("deleting the Lease: %v", err)
				}
			},
			WholeSeconds: true,
			Margin:       time.Second,
		},
		Modes: locktest.Modes{NoShared: true, RecordsN: true},
	})
}

// TestLeaseFields: the Lease says who holds it as the issue asks: NAME
// hashed when it is no DNS-1123 name (kept in an annotation),
// holderIdentity host/pid, the ttl rounded up to whole seconds, both
// times, and leaseTransitions that grows with each acquisition (the
// token); a release clears the holder and keeps the count.
func TestLeaseFields(t *testing.T) {
	k, ns, url := space(t)
	c := locktest.Open(t, url, lock.Options{TTL: 2500 * time.Millisecond, Holder: lock.Holder{Host: "web-1", PID: 42, Command: []string{"migrate", "up"}}})
	name := "DB Migration/" + t.Name()
	for i := 1; i <= 2; i++ {
		l, err := c.TryAcquire(locktest.Context(t), name)
		if err != nil {
			t.Fatal(err)
		}
		var got k8s.LeaseObject
		if err := k.Do("GET", leasePath(ns, k8s.LeaseName(name)), nil, &got); err != nil {
			t.Fatal(err)
		}
		s, a := got.Spec, got.Metadata.Annotations
		if !strings.HasPrefix(got.Metadata.Name, "withlock-") || a[k8s.AnnotationName] != name {
			t.Errorf("Lease %q, annotation name %q", got.Metadata.Name, a[k8s.AnnotationName])
		}
		if s.HolderIdentity != "web-1/42" || s.LeaseDurationSeconds != 3 || s.AcquireTime == "" || s.RenewTime == "" || s.LeaseTransitions != int32(i) {
			t.Errorf("acquisition %d: spec %+v; want holder web-1/42, 3s, times set, transitions %d", i, s, i)
		}
		if a[k8s.AnnotationHost] != "web-1" || a[k8s.AnnotationPID] != "42" || a[k8s.AnnotationCommand] != `["migrate","up"]` {
			t.Errorf("holder record: %v", a)
		}
		if tok := l.(lock.Expiring).Token(); tok != int64(i) {
			t.Errorf("token %d, want leaseTransitions %d", tok, i)
		}
		if err := l.Release(locktest.Context(t)); err != nil {
			t.Fatal(err)
		}
		got = k8s.LeaseObject{}
		if err := k.Do("GET", leasePath(ns, k8s.LeaseName(name)), nil, &got); err != nil {
			t.Fatal(err)
		}
		if got.Spec.HolderIdentity != "" || got.Spec.LeaseTransitions != int32(i) || got.Metadata.Annotations[k8s.AnnotationHost] != "" {
			t.Errorf("after release: spec %+v, annotations %v; want no holder, transitions kept", got.Spec, got.Metadata.Annotations)
		}
	}
}

// TestErrors: what the API server refuses (docs/kubernetes.md, Errors):
// 403 says the verb, the resource, the namespace and the Role to grant; a
// missing namespace, a bad token, an unreachable server. None is ErrHeld.
func TestErrors(t *testing.T) {
	k, ns, _ := space(t)
	dir := t.TempDir()
	try := func(t *testing.T, url, token string) error {
		t.Helper()
		kc := filepath.Join(dir, "kc-"+hex.EncodeToString([]byte(token))[:8])
		if err := k.Kubeconfig(kc, "default", token); err != nil {
			t.Fatal(err)
		}
		t.Setenv("KUBECONFIG", kc)
		_, err := locktest.Open(t, url, lock.Options{}).TryAcquire(locktest.Context(t), "job")
		return err
	}
	for _, tc := range []struct {
		desc, url, token string
		kind             error
		want             string
	}{
		{"forbidden", "k8s://" + ns, k.UserToken("nobody"), lock.ErrRefused,
			regexp.QuoteMeta(`may not get leases (coordination.k8s.io) in namespace "`+ns+`" (403 Forbidden: `) + `.*` +
				regexp.QuoteMeta(`); grant it a Role with verbs get, list, watch, create, update on leases in "`+ns+`" and bind it (docs/kubernetes.md)`)},
		{"no namespace", "k8s://no-such-ns", k.AdminToken, lock.ErrRefused, `namespace "no-such-ns" does not exist`},
		{"bad token", "k8s://" + ns, "not-a-token", lock.ErrRefused, `401 Unauthorized`},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			err := try(t, tc.url, tc.token)
			if !errors.Is(err, tc.kind) || errors.Is(err, lock.ErrHeld) || !matches(err.Error(), tc.want) {
				t.Errorf("%v; want %v saying %q", err, tc.kind, tc.want)
			}
		})
	}
	t.Run("unreachable", func(t *testing.T) {
		kc := filepath.Join(dir, "closed")
		os.WriteFile(kc, []byte(`
current-context: x
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1", insecure-skip-tls-verify: true}}]
users: [{name: u, user: {username: u, password: hunter22}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
`), 0o600)
		t.Setenv("KUBECONFIG", kc)
		_, err := locktest.Open(t, "k8s://"+ns, lock.Options{}).TryAcquire(locktest.Context(t), "job")
		if !errors.Is(err, lock.ErrUnavailable) || !strings.Contains(err.Error(), "cannot reach kubernetes at 127.0.0.1:1 (connection refused)") || strings.Contains(err.Error(), "hunter22") {
			t.Errorf("%v; want ErrUnavailable: cannot reach kubernetes at 127.0.0.1:1 (connection refused)", err)
		}
	})
}

func matches(s, pattern string) bool {
	ok, _ := regexp.MatchString(pattern, s)
	return ok
}

// TestInClusterServiceAccount: in a pod, withlock uses the mounted
// service account: a real token from the TokenRequest API, the CA, and
// the pod's namespace. The account may use leases in its own namespace
// only: elsewhere it gets a refusal naming what to grant.
func TestInClusterServiceAccount(t *testing.T) {
	k, ns, _ := space(t)
	token := migrator(t, k, ns)
	other := ns + "-other"
	if err := k.Namespace(other); err != nil {
		t.Fatal(err)
	}
	inPod(t, k, ns, token)

	c := locktest.Open(t, "k8s://", lock.Options{})
	l, err := c.TryAcquire(locktest.Context(t), "dbmigration")
	if err != nil {
		t.Fatalf("in-cluster TryAcquire in the pod's namespace: %v", err)
	}
	var got k8s.LeaseObject
	if err := k.Do("GET", leasePath(ns, "dbmigration"), nil, &got); err != nil {
		t.Fatalf("the Lease is not in the pod's namespace %s: %v", ns, err)
	}
	if err := l.Release(locktest.Context(t)); err != nil {
		t.Fatal(err)
	}
	_, err = locktest.Open(t, "k8s://"+other, lock.Options{}).TryAcquire(locktest.Context(t), "dbmigration")
	want := fmt.Sprintf(`the pod's service account may not get leases (coordination.k8s.io) in namespace %q (403 Forbidden`, other)
	if !errors.Is(err, lock.ErrRefused) || !strings.Contains(err.Error(), want) {
		t.Errorf("in another namespace: %v; want ErrRefused saying %q", err, want)
	}
}

// migrator makes the service account migrator in ns, allowed to use
// Leases there, and returns a token for it.
func migrator(t *testing.T, k *testenv.Kube, ns string) string {
	t.Helper()
	token, err := k.ServiceAccountToken(ns, "migrator")
	if err != nil {
		t.Fatal(err)
	}
	if err := k.Grant(ns, "system:serviceaccount:"+ns+":migrator"); err != nil {
		t.Fatal(err)
	}
	return token
}

// inPod makes t run as in a pod of namespace ns whose service account's
// token is token: the account's directory (CA, token, namespace) mounted,
// the service's host and port in the environment, no kubeconfig. It
// returns the directory.
func inPod(t *testing.T, k *testenv.Kube, ns, token string) string {
	t.Helper()
	sa := t.TempDir()
	ca, err := os.ReadFile(k.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(sa, "ca.crt"), ca, 0o600)
	os.WriteFile(filepath.Join(sa, "token"), []byte(token), 0o600)
	os.WriteFile(filepath.Join(sa, "namespace"), []byte(ns), 0o600)
	old := k8s.ServiceAccountDir
	k8s.ServiceAccountDir = sa
	t.Cleanup(func() { k8s.ServiceAccountDir = old })
	host, port, _ := strings.Cut(strings.TrimPrefix(k.URL, "https://"), ":")
	t.Setenv("KUBECONFIG", "")
	t.Setenv("KUBERNETES_SERVICE_HOST", host)
	t.Setenv("KUBERNETES_SERVICE_PORT", port)
	return sa
}

// TestExecPluginServer: a kubeconfig whose user is an exec credential
// plugin (a shell script printing an ExecCredential with leaser's token)
// reaches the real server.
func TestExecPluginServer(t *testing.T) {
	k, ns, _ := space(t)
	setKubeconfig(t, k, ns, "", execUser(t.TempDir(), `#!/bin/sh
printf '{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{"token":"%s"}}\n' "$TOKEN"
`, "TOKEN", k.UserToken("leaser")))
	takeOnce(t, "with an exec plugin's token")
}

// setKubeconfig writes a kubeconfig that reaches k, in namespace ns, with
// the cluster's fields besides its server and CA (", proxy-url: ..."), and
// the user's (YAML, under "user:"), and makes it $KUBECONFIG for t.
func setKubeconfig(t *testing.T, k *testenv.Kube, ns, cluster, user string) {
	t.Helper()
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	err := os.WriteFile(kc, []byte(fmt.Sprintf(`
current-context: x
clusters: [{name: c, cluster: {server: %q, certificate-authority: %q%s}}]
users:
- name: u
  user:
%s
contexts: [{name: x, context: {cluster: c, user: u, namespace: %s}}]
`, k.URL, k.CAFile, cluster, user, ns)), 0o600)
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("KUBECONFIG", kc)
}

// execUser writes script to dir/plugin.sh and returns the fields of a
// user whose exec credential plugin it is, run with env (names and
// values, in turn).
func execUser(dir, script string, env ...string) string {
	plugin := filepath.Join(dir, "plugin.sh")
	os.WriteFile(plugin, []byte(script), 0o755)
	var vars []string
	for i := 0; i+1 < len(env); i += 2 {
		vars = append(vars, fmt.Sprintf("{name: %s, value: %q}", env[i], env[i+1]))
	}
	return fmt.Sprintf(`    exec:
      apiVersion: client.authentication.k8s.io/v1
      command: %s
      env: [%s]`, plugin, strings.Join(vars, ", "))
}

// takeOnce takes "job" through a new client of the kubeconfig's namespace,
// what saying how, and releases it.
func takeOnce(t *testing.T, what string) {
	t.Helper()
	l, err := locktest.Open(t, "k8s://", lock.Options{}).TryAcquire(locktest.Context(t), "job")
	if err != nil {
		t.Fatalf("TryAcquire %s: %v", what, err)
	}
	if err := l.Release(locktest.Context(t)); err != nil {
		t.Fatal(err)
	}
}

// TestWatchWakes: a waiter's Notify channel fires when the holder releases,
// and not before (nobody writes meanwhile: a raw Lease is not renewed).
func TestWatchWakes(t *testing.T) {
	_, _, url := space(t)
	a, b := locktest.Open(t, url, lock.Options{}), locktest.Open(t, url, lock.Options{})
	name := locktest.Name(t)
	l, err := a.TryAcquire(locktest.Context(t), name)
	if err != nil {
		t.Fatal(err)
	}
	n := b.Backend.(lock.Notifier)
	ch, stop, err := n.Notify(locktest.Context(t), name)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	select {
	case <-ch:
		t.Fatal("Notify fired while nothing changed")
	case <-time.After(300 * time.Millisecond): // it must not fire: a wait is the check
	}
	if err := l.Release(locktest.Context(t)); err != nil {
		t.Fatal(err)
	}
	released := time.Now()
	select {
	case <-ch:
		t.Logf("woken %v after the release", time.Since(released))
	case <-time.After(10 * time.Second):
		t.Fatal("Notify did not fire within 10s of the release")
	}
}

// TestContenders: 16 clients take one NAME 5 times each through Acquire;
// never two inside at once, and the tokens grow in the order they entered.
func TestContenders(t *testing.T) {
	_, _, url := space(t)
	name := locktest.Name(t)
	var inside atomic.Int32
	var mu sync.Mutex
	var last int64
	var wg sync.WaitGroup
	for i := range 16 {
		c := locktest.Open(t, url, lock.Options{TTL: 6 * time.Second, Holder: lock.Holder{Host: "c", PID: i + 1}})
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 5 {
				h, err := c.Acquire(locktest.Context(t), name)
				if err != nil {
					t.Error(err)
					return
				}
				if n := inside.Add(1); n != 1 {
					t.Errorf("%d holders inside at once", n)
				}
				tok, _ := h.Token()
				mu.Lock()
				if tok <= last {
					t.Errorf("token %d after %d", tok, last)
				}
				last = tok
				mu.Unlock()
				time.Sleep(time.Millisecond) // some work inside
				inside.Add(-1)
				if err := h.Release(locktest.Context(t)); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	if last != 80 {
		t.Errorf("last token %d; want 80 acquisitions counted", last)
	}
}

// TestRenewalRecord checks, on the real API server, the record that expiry
// is judged by: withlock's entry in managedFields (field manager
// "withlock") owns spec.renewTime, and its time, the server's clock in
// whole seconds, moves with every renewal; the write of --hold-at-least
// (field manager "withlock-hold") changes only leaseDurationSeconds and
// leaves that time where it was.
func TestRenewalRecord(t *testing.T) {
	k, ns, url := space(t)
	c := locktest.Open(t, url, lock.Options{TTL: 30 * time.Second})
	name := locktest.Name(t)
	ctx := locktest.Context(t)
	l, err := c.TryAcquire(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	read := func() (k8s.LeaseObject, time.Time) {
		t.Helper()
		var got k8s.LeaseObject
		if err := k.Do("GET", leasePath(ns, k8s.LeaseName(name)), nil, &got); err != nil {
			t.Fatal(err)
		}
		for _, m := range got.Metadata.ManagedFields {
			if m.Manager == "withlock" && strings.Contains(string(m.FieldsV1), `"f:renewTime"`) {
				at, err := time.Parse(time.RFC3339, m.Time)
				if err != nil {
					t.Fatal(err)
				}
				return got, at
			}
		}
		t.Fatalf("no managedFields entry of withlock owns spec.renewTime: %+v", got.Metadata.ManagedFields)
		return got, time.Time{}
	}
	_, prev := read()
	for i := range 3 {
		serverPast(t, k, prev)
		if err := l.Keep(ctx); err != nil {
			t.Fatal(err)
		}
		_, at := read()
		if !at.After(prev) {
			t.Fatalf("renewal %d: the record stayed at %s", i+1, prev.Format(time.RFC3339))
		}
		prev = at
	}
	serverPast(t, k, prev)
	if err := l.(lock.Expiring).ReleaseAt(ctx, time.Now().Add(5*time.Second)); err != nil {
		t.Fatal(err)
	}
	got, at := read()
	if !at.Equal(prev) {
		t.Errorf("the write of --hold-at-least moved the record from %s to %s", prev.Format(time.RFC3339), at.Format(time.RFC3339))
	}
	if d := got.Spec.LeaseDurationSeconds; d >= 30 || d < 1 {
		t.Errorf("leaseDurationSeconds %d after the hold's write; want the hold's end, not the ttl", d)
	}
}

// kubeStatus is the HTTP status of a GET of path as the bearer of token.
func kubeStatus(t *testing.T, k *testenv.Kube, token, path string) int {
	t.Helper()
	resp, err := kubeClient(t, k).Do(kubeRequest(t, k, token, path))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

func kubeRequest(t *testing.T, k *testenv.Kube, token, path string) *http.Request {
	t.Helper()
	req, err := http.NewRequest("GET", k.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	return req
}

// kubeClient is an HTTP client that trusts the API server, closed when t
// ends.
func kubeClient(t *testing.T, k *testenv.Kube) *http.Client {
	t.Helper()
	pem, err := os.ReadFile(k.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pem)
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}}
	t.Cleanup(hc.CloseIdleConnections)
	return hc
}

// serverPast waits until the API server's clock (the Date of its answers)
// is past t, so that its next record of a write is a later second.
func serverPast(t *testing.T, k *testenv.Kube, t0 time.Time) {
	t.Helper()
	hc := kubeClient(t, k)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		resp, err := hc.Do(kubeRequest(t, k, k.AdminToken, "/version"))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if now, err := http.ParseTime(resp.Header.Get("Date")); err == nil && now.After(t0) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the API server's Date did not pass %s within 10s", t0.Format(time.RFC3339))
		}
	}
}

// TestForeignFields: a Lease shared with other tools keeps what withlock
// does not own through an acquisition, a renewal, a release and a release
// --force: labels, annotations, ownerReferences, finalizers,
// spec.strategy and spec.preferredHolder.
func TestForeignFields(t *testing.T) {
	k, ns, url := space(t)
	name := "shared-lease" // the namespace is the test's own
	owner := map[string]any{"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": "6f1c1d6e-2c57-4d1e-9a59-3a8c0d9f1a11"}
	lease := map[string]any{
		"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
		"metadata": map[string]any{
			"name":            name,
			"labels":          map[string]string{"team": "db"},
			"annotations":     map[string]string{"example.com/note": "kept"},
			"ownerReferences": []any{owner},
			"finalizers":      []string{"example.com/keep"},
		},
		"spec": map[string]any{"strategy": "OldestEmulationVersion", "preferredHolder": "other-tool"},
	}
	if err := k.Do("POST", "/apis/coordination.k8s.io/v1/namespaces/"+ns+"/leases", lease, nil); err != nil {
		t.Fatal(err)
	}
	check := func(when string) {
		t.Helper()
		var got struct {
			Metadata struct {
				Labels          map[string]string `json:"labels"`
				Annotations     map[string]string `json:"annotations"`
				OwnerReferences []map[string]any  `json:"ownerReferences"`
				Finalizers      []string          `json:"finalizers"`
			} `json:"metadata"`
			Spec struct {
				Strategy        string `json:"strategy"`
				PreferredHolder string `json:"preferredHolder"`
			} `json:"spec"`
		}
		if err := k.Do("GET", leasePath(ns, name), nil, &got); err != nil {
			t.Fatal(err)
		}
		m, s := got.Metadata, got.Spec
		if m.Labels["team"] != "db" || m.Annotations["example.com/note"] != "kept" ||
			len(m.OwnerReferences) != 1 || m.OwnerReferences[0]["uid"] != owner["uid"] ||
			len(m.Finalizers) != 1 || m.Finalizers[0] != "example.com/keep" ||
			s.Strategy != "OldestEmulationVersion" || s.PreferredHolder != "other-tool" {
			t.Errorf("after %s: %+v, spec %+v; want the other tool's fields kept", when, m, s)
		}
	}
	check("the other tool's create")
	c := locktest.Open(t, url, lock.Options{TTL: 30 * time.Second})
	ctx := locktest.Context(t)
	l, err := c.TryAcquire(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	check("an acquisition")
	if err := l.Keep(ctx); err != nil {
		t.Fatal(err)
	}
	check("a renewal")
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	check("a release")
	if _, err := c.TryAcquire(ctx, name); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Backend.Break(ctx, name); err != nil {
		t.Fatal(err)
	}
	check("release --force")
}

// TestStaleToken401: an exec plugin whose cached token the server refuses
// (401) is run again, and the request retried once with its fresh token:
// the first attempt takes the lock.
func TestStaleToken401(t *testing.T) {
	k, ns, _ := space(t)
	dir := t.TempDir()
	// The first run prints a token the server does not know, the next ones
	// leaser's; each run adds a line to runs.
	setKubeconfig(t, k, ns, "", execUser(dir, `#!/bin/sh
token=$TOKEN
[ -f "$DIR/runs" ] || token=stale
echo run >> "$DIR/runs"
printf '{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{"token":"%s"}}\n' "$token"
`, "TOKEN", k.UserToken("leaser"), "DIR", dir))
	takeOnce(t, "with a stale cached token (want a retry with a fresh one)")
	if runs, _ := os.ReadFile(filepath.Join(dir, "runs")); strings.Count(string(runs), "\n") != 2 {
		t.Errorf("the plugin ran %d times; want 2 (the stale token, then a fresh one)", strings.Count(string(runs), "\n"))
	}
}

// TestRotatingClientCert: an exec plugin hands out short client
// certificates, each for 4s and cached until 1.5s before it expires. A
// holder renewing every second over one pooled connection would go on
// presenting the first one after it expired, and lose the lock to 401s;
// each new certificate closes the connections made with the old one, so
// the holder keeps its lock across two rotations.
func TestRotatingClientCert(t *testing.T) {
	k, ns, _ := space(t)
	dir := t.TempDir()
	const life, early = 4 * time.Second, 1500 * time.Millisecond
	start := time.Now()
	for i := range 6 {
		notAfter := start.Add(time.Duration(i+1) * life)
		cert, key, err := k.ClientCert("leaser", notAfter)
		if err != nil {
			t.Fatal(err)
		}
		cred, _ := json.Marshal(map[string]any{
			"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential",
			"status": map[string]any{
				"clientCertificateData": string(cert), "clientKeyData": string(key),
				"expirationTimestamp": notAfter.Add(-early).UTC().Format(time.RFC3339Nano),
			},
		})
		os.WriteFile(filepath.Join(dir, fmt.Sprintf("cred%d", i)), cred, 0o600)
	}
	// Each run prints the certificate of the moment: the next in line,
	// skipping those that expire within the plugin's own margin.
	setKubeconfig(t, k, ns, "", execUser(dir, `#!/bin/sh
n=$(( ( $(date +%s%3N) - START ) / LIFE ))
cat "$DIR/cred$n"
echo "$n" >> "$DIR/runs"
`, "DIR", dir, "START", fmt.Sprint(start.UnixMilli()), "LIFE", fmt.Sprint((life-early).Milliseconds())))
	c := locktest.Open(t, "k8s://", lock.Options{TTL: 3 * time.Second, Grace: 500 * time.Millisecond})
	h, err := c.Acquire(locktest.Context(t), "job")
	if err != nil {
		t.Fatal(err)
	}
	// Past the second certificate's expiry: two rotations.
	select {
	case <-h.Lost():
		t.Fatalf("the holder lost its lock: %v", h.Err())
	case <-time.After(time.Until(start.Add(2*life + time.Second))):
	}
	if err := h.Release(locktest.Context(t)); err != nil {
		t.Fatal(err)
	}
	runs, _ := os.ReadFile(filepath.Join(dir, "runs"))
	if strings.Count(string(runs), "\n") < 3 {
		t.Errorf("the plugin ran for certificates %q; want at least 3 (two rotations)", strings.Fields(string(runs)))
	}
}

// TestProxyURL: a kubeconfig's proxy-url (an HTTP proxy, as on a bastion)
// carries every request: the lock is taken and released through it.
func TestProxyURL(t *testing.T) {
	k, ns, _ := space(t)
	proxy, tunnels := connectProxy(t)
	setKubeconfig(t, k, ns, fmt.Sprintf(", proxy-url: %q", proxy.URL), fmt.Sprintf("    token: %q", k.UserToken("leaser")))
	t.Setenv("HTTPS_PROXY", "")
	takeOnce(t, "through proxy-url")
	if tunnels.Load() == 0 {
		t.Error("the proxy saw no CONNECT: proxy-url was not used")
	}
}

// connectProxy is an HTTP proxy that tunnels CONNECT requests, closed when
// t ends, and the count of tunnels it opened.
func connectProxy(t *testing.T) (*httptest.Server, *atomic.Int32) {
	var tunnels atomic.Int32
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodConnect {
			http.Error(w, "CONNECT only", http.StatusMethodNotAllowed)
			return
		}
		upstream, err := net.Dial("tcp", r.Host)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		tunnels.Add(1)
		w.WriteHeader(http.StatusOK)
		conn, buf, err := http.NewResponseController(w).Hijack()
		if err != nil {
			upstream.Close()
			return
		}
		go func() {
			io.Copy(upstream, buf)
			upstream.Close()
		}()
		io.Copy(conn, upstream)
		conn.Close()
	}))
	t.Cleanup(proxy.Close)
	return proxy, &tunnels
}

// TestInClusterTokenRotated: the kubelet replaces a pod's projected token
// file during a hold; the holder reads the new token and keeps its lock
// after the old one stops working (it was bound to a Secret, deleted).
func TestInClusterTokenRotated(t *testing.T) {
	k, ns, _ := space(t)
	migrator(t, k, ns)
	// token returns a token of migrator bound to the Secret name, made here.
	token := func(name string) string {
		t.Helper()
		var secret struct{ Metadata struct{ UID string } }
		if err := k.Do("POST", "/api/v1/namespaces/"+ns+"/secrets", map[string]any{"metadata": map[string]any{"name": name}}, &secret); err != nil {
			t.Fatal(err)
		}
		var tr struct{ Status struct{ Token string } }
		req := map[string]any{"spec": map[string]any{"boundObjectRef": map[string]any{"kind": "Secret", "apiVersion": "v1", "name": name, "uid": secret.Metadata.UID}}}
		if err := k.Do("POST", "/api/v1/namespaces/"+ns+"/serviceaccounts/migrator/token", req, &tr); err != nil {
			t.Fatal(err)
		}
		return tr.Status.Token
	}
	first := token("first")
	sa := inPod(t, k, ns, first)

	const ttl = 3 * time.Second
	h, err := locktest.Open(t, "k8s://", lock.Options{TTL: ttl, Grace: 500 * time.Millisecond}).Acquire(locktest.Context(t), "dbmigration")
	if err != nil {
		t.Fatal(err)
	}
	// As the kubelet does: the new token appears in place at once (a
	// rename), then the old one stops working.
	next := filepath.Join(sa, ".token.new")
	os.WriteFile(next, []byte(token("second")), 0o600)
	if err := os.Rename(next, filepath.Join(sa, "token")); err != nil {
		t.Fatal(err)
	}
	if err := k.Do("DELETE", "/api/v1/namespaces/"+ns+"/secrets/first", nil, nil); err != nil {
		t.Fatal(err)
	}
	// The server caches a token it accepted for a few seconds: wait until
	// it refuses the old one.
	for deadline := time.Now().Add(30 * time.Second); kubeStatus(t, k, first, "/apis/coordination.k8s.io/v1/namespaces/"+ns+"/leases") != http.StatusUnauthorized; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the old token still works 30s after its Secret was deleted")
		}
	}
	// Longer than the ttl: renewals with the old token would have lost it.
	select {
	case <-h.Lost():
		t.Fatalf("the holder lost its lock after the token was replaced: %v", h.Err())
	case <-time.After(ttl + time.Second):
	}
	if err := h.Release(locktest.Context(t)); err != nil {
		t.Fatal(err)
	}
}

// TestStaticCredentialsWin: as with client-go, a token written in the
// kubeconfig wins over the user's exec plugin, which is then never run
// (here it would fail).
func TestStaticCredentialsWin(t *testing.T) {
	k, ns, _ := space(t)
	dir := t.TempDir()
	setKubeconfig(t, k, ns, "", fmt.Sprintf("    token: %q\n", k.UserToken("leaser"))+
		execUser(dir, "#!/bin/sh\necho ran > \"$(dirname \"$0\")/ran\"\necho 'plugin must not run' >&2\nexit 1\n"))
	takeOnce(t, "with a token and an exec plugin (want the token used)")
	if _, err := os.Stat(filepath.Join(dir, "ran")); err == nil {
		t.Error("the exec plugin ran though the kubeconfig gives a token")
	}
}
