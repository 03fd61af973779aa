package k8s_test

import (
	"bytes"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/withlock/withlock/internal/lock"
	"github.com/withlock/withlock/internal/lock/k8s"
	"github.com/withlock/withlock/internal/lock/locktest"
	"github.com/withlock/withlock/internal/testenv"
)

// replaceFile replaces path with data at once, as the kubelet updates a
// mounted Secret or ConfigMap: a new file renamed over the old.
func replaceFile(t *testing.T, path string, data []byte) {
	t.Helper()
	next := path + ".new"
	if err := os.WriteFile(next, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(next, path); err != nil {
		t.Fatal(err)
	}
}

// renewedAfter waits until the Lease ns/name is renewed after t0 (its
// renewTime, written by the holder, is later), for at most within.
func renewedAfter(t *testing.T, k *testenv.Kube, ns, name string, t0 time.Time, within time.Duration) {
	t.Helper()
	for deadline := time.Now().Add(within); ; time.Sleep(100 * time.Millisecond) {
		var l k8s.LeaseObject
		err := k.Do("GET", leasePath(ns, name), nil, &l)
		renewed, _ := time.Parse(time.RFC3339Nano, l.Spec.RenewTime)
		if err == nil && renewed.After(t0) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the Lease %s was not renewed within %s after %s (last renewal %s, %v)", name, within, t0.Format(time.StampMilli), l.Spec.RenewTime, err)
		}
	}
}

// notLost fails t if h loses its lock within d.
func notLost(t *testing.T, h *lock.Held, d time.Duration, what string) {
	t.Helper()
	select {
	case <-h.Lost():
		t.Fatalf("the holder lost its lock %s: %v", what, h.Err())
	case <-time.After(d):
	}
}

// TestCARotated: the cluster's CA rotates during a hold, the way operators
// rotate it: the pod's ca.crt (and a kubeconfig's certificate-authority
// file) first gets the new CA beside the old, the API server restarts with
// a certificate from the new CA, then the files keep the new CA alone.
// Both holders keep their locks and renew after the restart: a client that
// had read its CA once could not connect again.
func TestCARotated(t *testing.T) {
	k, ns, _ := space(t)
	token := migrator(t, k, ns)
	oldCA, err := os.ReadFile(k.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	// A ttl that outlasts the API server's restart on a busy machine.
	opts := lock.Options{TTL: 30 * time.Second, Grace: time.Second}
	sa := inPod(t, k, ns, token)
	inPodHolder, err := locktest.Open(t, "k8s://", opts).Acquire(locktest.Context(t), "in-pod")
	if err != nil {
		t.Fatal(err)
	}
	kcCA := filepath.Join(t.TempDir(), "ca.crt")
	if err := os.WriteFile(kcCA, oldCA, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	setKubeconfig(t, k, ns, "", fmt.Sprintf("    token: %q", k.UserToken("leaser")))
	kc, _ := os.ReadFile(os.Getenv("KUBECONFIG"))
	os.WriteFile(os.Getenv("KUBECONFIG"), bytes.ReplaceAll(kc, []byte(k.CAFile), []byte(kcCA)), 0o600)
	kcHolder, err := locktest.Open(t, "k8s://", opts).Acquire(locktest.Context(t), "kubeconfig")
	if err != nil {
		t.Fatal(err)
	}

	newCA, err := k.RotateServingCA()
	if err != nil {
		t.Fatal(err)
	}
	both := append(append([]byte{}, oldCA...), newCA...)
	replaceFile(t, filepath.Join(sa, "ca.crt"), both)
	replaceFile(t, kcCA, both)
	if err := k.Stop(); err != nil {
		t.Fatal(err)
	}
	restarted := time.Now()
	if err := k.Start(); err != nil {
		t.Fatal(err)
	}
	replaceFile(t, filepath.Join(sa, "ca.crt"), newCA)
	replaceFile(t, kcCA, newCA)
	// Renewals come every ttl/3: within one ttl each holder has renewed
	// through a connection that trusts the new CA alone.
	for _, name := range []string{"in-pod", "kubeconfig"} {
		renewedAfter(t, k, ns, name, restarted, opts.TTL)
	}
	for what, h := range map[string]*lock.Held{"in the pod": inPodHolder, "with a kubeconfig": kcHolder} {
		notLost(t, h, 0, what+" across the CA's rotation")
		if err := h.Release(locktest.Context(t)); err != nil {
			t.Errorf("release %s: %v", what, err)
		}
	}
}

// TestClientCertFilesRotated: a kubeconfig's client-certificate and
// client-key files are replaced during a hold by a new certificate from the
// same CA, the key first (for a moment the two do not match), and then the
// old certificate expires: the server no longer trusts it. The holder
// renews with the new one and keeps its lock; one that had read its files
// once would present the old certificate and lose the lock to 401s.
func TestClientCertFilesRotated(t *testing.T) {
	k, ns, _ := space(t)
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "leaser.crt"), filepath.Join(dir, "leaser.key")
	expires := time.Now().Add(6 * time.Second)
	cert, key, err := k.ClientCert("leaser", expires)
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(certFile, cert, 0o600)
	os.WriteFile(keyFile, key, 0o600)
	setKubeconfig(t, k, ns, "", fmt.Sprintf("    client-certificate: %q\n    client-key: %q", certFile, keyFile))
	const ttl = 3 * time.Second
	h, err := locktest.Open(t, "k8s://", lock.Options{TTL: ttl, Grace: 500 * time.Millisecond}).Acquire(locktest.Context(t), "job")
	if err != nil {
		t.Fatal(err)
	}
	cert2, key2, err := k.ClientCert("leaser", time.Now().Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	replaceFile(t, keyFile, key2)
	notLost(t, h, ttl/2, "while its key file did not match its certificate")
	replaceFile(t, certFile, cert2)
	// Past the old certificate's expiry by more than a ttl.
	notLost(t, h, time.Until(expires.Add(ttl+time.Second)), "after its certificate files were replaced")
	renewedAfter(t, k, ns, "job", expires, ttl)
	if code := certStatus(t, k, cert, key, "/apis/coordination.k8s.io/v1/namespaces/"+ns+"/leases"); code != http.StatusUnauthorized {
		t.Errorf("the old certificate after its expiry: HTTP %d, want 401 (else this test proves nothing)", code)
	}
	if err := h.Release(locktest.Context(t)); err != nil {
		t.Fatal(err)
	}
}

// certStatus is the HTTP status of a GET of path with the client
// certificate cert and key.
func certStatus(t *testing.T, k *testenv.Kube, cert, key []byte, path string) int {
	t.Helper()
	pair, err := tls.X509KeyPair(cert, key)
	if err != nil {
		t.Fatal(err)
	}
	hc := kubeClient(t, k)
	hc.Transport.(*http.Transport).TLSClientConfig.Certificates = []tls.Certificate{pair}
	resp, err := hc.Get(k.URL + path)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestTokenFileUnreadable: the pod's token file is gone for longer than
// the ttl, as in a rotation caught half-way: the holder renews with the
// last token it read and keeps its lock.
func TestTokenFileUnreadable(t *testing.T) {
	k, ns, _ := space(t)
	token := migrator(t, k, ns)
	sa := inPod(t, k, ns, token)
	const ttl = 3 * time.Second
	h, err := locktest.Open(t, "k8s://", lock.Options{TTL: ttl, Grace: 500 * time.Millisecond}).Acquire(locktest.Context(t), "dbmigration")
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(sa, "token")
	if err := os.Rename(file, file+".away"); err != nil {
		t.Fatal(err)
	}
	gone := time.Now()
	notLost(t, h, ttl+time.Second, "while its token file was gone")
	renewedAfter(t, k, ns, "dbmigration", gone, ttl)
	os.Rename(file+".away", file)
	if err := h.Release(locktest.Context(t)); err != nil {
		t.Fatal(err)
	}
}

// TestExecPluginClusterInfo: with provideClusterInfo, an exec plugin is
// told of the cluster what kubectl tells it: the server, its CA,
// tls-server-name, proxy-url, disable-compression and the cluster's
// client.authentication.k8s.io/exec extension as config; with
// interactiveMode Never, that it is not interactive. The lock is taken
// through that proxy, with that server name.
func TestExecPluginClusterInfo(t *testing.T) {
	k, ns, _ := space(t)
	proxy, tunnels := connectProxy(t)
	t.Setenv("HTTPS_PROXY", "")
	dir := t.TempDir()
	setKubeconfig(t, k, ns, fmt.Sprintf(`, tls-server-name: "127.0.0.1", proxy-url: %q, disable-compression: true,
    extensions: [{name: client.authentication.k8s.io/exec, extension: {audience: locks, scopes: [read, write], depth: {level: 2}}},
                 {name: other, extension: {ignored: true}}]`, proxy.URL),
		execUser(dir, `#!/bin/sh
printf '%s' "$KUBERNETES_EXEC_INFO" > "$DIR/info"
printf '{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{"token":"%s"}}\n' "$TOKEN"
`, "DIR", dir, "TOKEN", k.UserToken("leaser"))+"\n      provideClusterInfo: true\n      interactiveMode: Never")
	takeOnce(t, "with an exec plugin given the cluster's fields")
	if tunnels.Load() == 0 {
		t.Error("the proxy saw no CONNECT: proxy-url was not used")
	}
	info, err := os.ReadFile(filepath.Join(dir, "info"))
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Spec struct {
			Interactive *bool
			Cluster     map[string]json.RawMessage
		}
	}
	if err := json.Unmarshal(info, &got); err != nil {
		t.Fatalf("KUBERNETES_EXEC_INFO %s: %v", info, err)
	}
	if got.Spec.Interactive == nil || *got.Spec.Interactive {
		t.Errorf("spec.interactive in %s; want false", info)
	}
	ca, _ := os.ReadFile(k.CAFile)
	caJSON, _ := json.Marshal(ca)
	for field, want := range map[string]string{
		"server":                     fmt.Sprintf("%q", k.URL),
		"tls-server-name":            `"127.0.0.1"`,
		"proxy-url":                  fmt.Sprintf("%q", proxy.URL),
		"disable-compression":        "true",
		"certificate-authority-data": string(caJSON),
		"config":                     `{"audience":"locks","depth":{"level":2},"scopes":["read","write"]}`,
	} {
		if g := string(got.Spec.Cluster[field]); g != want {
			t.Errorf("spec.cluster.%s = %s; want %s", field, g, want)
		}
	}
}
