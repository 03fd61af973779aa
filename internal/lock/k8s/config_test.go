package k8s

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"math/big"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/withlock/withlock/internal/lock"
)

func TestLeaseName(t *testing.T) {
	for _, tc := range []struct{ name, want string }{
		{"dbmigration", "dbmigration"},
		{"db-migration.v2", "db-migration.v2"},
		{"a", "a"},
		{strings.Repeat("a", 253), strings.Repeat("a", 253)},
		// Not DNS-1123 subdomains: hashed.
		{"DBMigration", "withlock-" + hashOf("DBMigration")},
		{"job/1", "withlock-" + hashOf("job/1")},
		{"-job", "withlock-" + hashOf("-job")},
		{"job-", "withlock-" + hashOf("job-")},
		{"a..b", "withlock-" + hashOf("a..b")},
		{"zü", "withlock-" + hashOf("zü")},
		{strings.Repeat("a", 254), "withlock-" + hashOf(strings.Repeat("a", 254))},
	} {
		if got := LeaseName(tc.name); got != tc.want {
			t.Errorf("LeaseName(%q) = %q, want %q", tc.name, got, tc.want)
		}
	}
	// The hash is the first 32 hex digits of SHA-256: "DBMigration".
	if got, want := LeaseName("DBMigration"), "withlock-11f4875ce571faba06d84971c7f3d06a"; got != want {
		t.Errorf("LeaseName(DBMigration) = %q, want %q (sha256sum's first 32 digits)", got, want)
	}
	if got := SlotName("job", 0); got != "job" {
		t.Errorf("SlotName(job, 0) = %q", got)
	}
	if got, want := SlotName("job", 2), "withlock-"+hashOf("job")+"-2"; got != want {
		t.Errorf("SlotName(job, 2) = %q, want %q", got, want)
	}
	// Every name makes a valid object name.
	for _, n := range []string{"x", "DBMigration", strings.Repeat("é", 127)} {
		for i := range 3 {
			if s := SlotName(n, i); len(s) > 253 || !isSubdomainPart(s) {
				t.Errorf("SlotName(%q, %d) = %q, not a DNS-1123 subdomain", n, i, s)
			}
		}
	}
}

// writeKubeconfig writes a kubeconfig file into dir.
func writeKubeconfig(t *testing.T, dir, name, text string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// testCA makes a self-signed certificate and key, PEM.
func testCA(t *testing.T) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
}

// authHeader is the Authorization header a request through c gets.
func authHeader(t *testing.T, c *config) string {
	t.Helper()
	req, _ := http.NewRequest("GET", c.server, nil)
	if err := c.auth.apply(context.Background(), req); err != nil {
		t.Fatalf("auth: %v", err)
	}
	return req.Header.Get("Authorization")
}

func mustLoad(t *testing.T, rawURL string) *config {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	c, err := loadConfig(u)
	if err != nil {
		t.Fatalf("loadConfig(%s): %v", rawURL, err)
	}
	return c
}

func notInPod(t *testing.T) {
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	t.Setenv("KUBERNETES_SERVICE_PORT", "")
}

// TestKubeconfigMerge: $KUBECONFIG is a list of files merged as kubectl
// merges them (the first to name a thing wins, missing files skipped);
// ?context= picks a context; the URL's namespace beats the context's;
// relative file paths are relative to their kubeconfig.
func TestKubeconfigMerge(t *testing.T) {
	notInPod(t)
	dir := t.TempDir()
	ca, _ := testCA(t)
	os.WriteFile(filepath.Join(dir, "ca.pem"), ca, 0o600)
	os.WriteFile(filepath.Join(dir, "token.txt"), []byte("file-token\n"), 0o600)
	first := writeKubeconfig(t, dir, "first", `
apiVersion: v1
kind: Config
current-context: dev
clusters:
- name: c1
  cluster:
    server: https://first.example:6443
    certificate-authority: ca.pem
contexts:
- name: dev
  context: {cluster: c1, user: u1, namespace: team-a}
- name: files
  context: {cluster: c1, user: u3}
users:
- name: u1
  user:
    token: first-token
- name: u3
  user:
    tokenFile: token.txt
`)
	// JSON is YAML too; kubectl writes either.
	second := writeKubeconfig(t, dir, "second", `{
  "current-context": "prod",
  "clusters": [
    {"name": "c1", "cluster": {"server": "https://shadowed.example"}},
    {"name": "c2", "cluster": {"server": "https://second.example", "insecure-skip-tls-verify": true}}
  ],
  "contexts": [
    {"name": "dev", "context": {"cluster": "c2", "user": "u2"}},
    {"name": "prod", "context": {"cluster": "c2", "user": "u2"}}
  ],
  "users": [
    {"name": "u1", "user": {"token": "shadowed"}},
    {"name": "u2", "user": {"username": "admin", "password": "hunter22"}}
  ]
}`)
	t.Setenv("KUBECONFIG", strings.Join([]string{filepath.Join(dir, "missing"), first, second}, string(os.PathListSeparator)))

	c := mustLoad(t, "k8s://")
	if c.server != "https://first.example:6443" || c.namespace != "team-a" || c.hostport != "first.example:6443" {
		t.Errorf("current context: server %q, namespace %q, hostport %q; want the first file's dev context", c.server, c.namespace, c.hostport)
	}
	if c.tls.RootCAs == nil || c.tls.InsecureSkipVerify {
		t.Errorf("the CA file (relative to its kubeconfig) was not read")
	}
	if got := authHeader(t, c); got != "Bearer first-token" {
		t.Errorf("Authorization = %q, want the first file's user", got)
	}

	c = mustLoad(t, "k8s://elsewhere?context=prod")
	if c.server != "https://second.example" || c.hostport != "second.example:443" || c.namespace != "elsewhere" || !c.tls.InsecureSkipVerify {
		t.Errorf("?context=prod: server %q, hostport %q, namespace %q, insecure %v", c.server, c.hostport, c.namespace, c.tls.InsecureSkipVerify)
	}
	if got, want := authHeader(t, c), "Basic "+base64.StdEncoding.EncodeToString([]byte("admin:hunter22")); got != want {
		t.Errorf("basic auth: Authorization = %q, want %q", got, want)
	}

	c = mustLoad(t, "kubernetes://?context=files")
	if c.namespace != "default" {
		t.Errorf("a context without a namespace: %q, want default", c.namespace)
	}
	if got := authHeader(t, c); got != "Bearer file-token" {
		t.Errorf("tokenFile: Authorization = %q", got)
	}
	// The token file is read at each request: a rotated token is used.
	os.WriteFile(filepath.Join(dir, "token.txt"), []byte("rotated"), 0o600)
	if got := authHeader(t, c); got != "Bearer rotated" {
		t.Errorf("tokenFile after rotation: Authorization = %q", got)
	}

	for _, tc := range []struct{ url, want string }{
		{"k8s://?context=nope", `no context "nope"`},
		{"k8s://Bad_NS", "not a namespace name"},
		{"k8s://ns?timeout=3", "unknown option"},
		{"k8s://u:p@ns", "write k8s://[NAMESPACE]"},
		{"k8s://ns/path", "write k8s://[NAMESPACE]"},
	} {
		u, _ := url.Parse(tc.url)
		_, err := loadConfig(u)
		if !errors.Is(err, lock.ErrUsage) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("loadConfig(%s) = %v; want ErrUsage saying %q", tc.url, err, tc.want)
		}
	}
}

// TestKubeconfigData: inline -data fields and a client certificate.
func TestKubeconfigData(t *testing.T) {
	notInPod(t)
	dir := t.TempDir()
	cert, key := testCA(t)
	b64 := base64.StdEncoding.EncodeToString
	t.Setenv("KUBECONFIG", writeKubeconfig(t, dir, "config", `
current-context: x
clusters:
- name: c
  cluster:
    server: https://127.0.0.1:6443
    certificate-authority-data: `+b64(cert)+`
    tls-server-name: kubernetes
contexts:
- name: x
  context: {cluster: c, user: u}
users:
- name: u
  user:
    client-certificate-data: `+b64(cert)+`
    client-key-data: `+b64(key)+`
`))
	c := mustLoad(t, "k8s://")
	if c.tls.RootCAs == nil || len(c.tls.Certificates) != 1 || c.tls.ServerName != "kubernetes" {
		t.Errorf("TLS: roots %v, %d client certificates, server name %q", c.tls.RootCAs != nil, len(c.tls.Certificates), c.tls.ServerName)
	}
	if got := authHeader(t, c); got != "" {
		t.Errorf("a client certificate user sends Authorization %q", got)
	}
}

// TestKubeconfigUnsupported: what withlock cannot do is said, at open.
func TestKubeconfigUnsupported(t *testing.T) {
	notInPod(t)
	for _, tc := range []struct{ user, cluster, want string }{
		{"auth-provider: {name: oidc, config: {}}", "", "auth-provider (oidc) is not supported; use its exec credential plugin instead (kubelogin: kubectl oidc-login setup"},
		{"auth-provider: {name: openstack}", "", "auth-provider (openstack) is not supported; use its exec credential plugin instead (kubelogin for OIDC"},
		{"{token: t, as: deployer}", "", "impersonation (the user's as, as-groups or as-uid) is not supported; give withlock that identity's own credentials"},
		{"{token: t, as-groups: [admins]}", "", "impersonation (the user's as, as-groups or as-uid) is not supported"},
		{"exec: {apiVersion: client.authentication.k8s.io/v1alpha1, command: x}", "", "v1alpha1\" is not supported"},
		{"{token: t, username: u, password: p}", "", "a username and password and a token; give one of them"},
		{"token: t", "proxy-url: ftp://proxy:21", `proxy-url "ftp://proxy:21" is not an http://, https:// or socks5:// URL`},
	} {
		dir := t.TempDir()
		t.Setenv("KUBECONFIG", writeKubeconfig(t, dir, "config", `
current-context: x
clusters:
- name: c
  cluster:
    server: https://127.0.0.1:6443
    `+tc.cluster+`
contexts:
- name: x
  context: {cluster: c, user: u}
users:
- name: u
  user:
    `+tc.user+`
`))
		_, err := loadConfig(&url.URL{Scheme: "k8s"})
		if !errors.Is(err, lock.ErrUsage) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v; want ErrUsage saying %q", tc.user, err, tc.want)
		}
	}
	// No kubeconfig at all, and not in a pod.
	t.Setenv("KUBECONFIG", filepath.Join(t.TempDir(), "none"))
	_, err := loadConfig(&url.URL{Scheme: "k8s"})
	if !errors.Is(err, lock.ErrUsage) || !strings.Contains(err.Error(), "not in a pod") {
		t.Errorf("no kubeconfig: %v", err)
	}
}

// TestExecPlugin: a credential plugin (a shell script) is run with its
// args, env and $KUBERNETES_EXEC_INFO; its token is cached until its
// expirationTimestamp, then the plugin runs again; a 401 drops the cache.
func TestExecPlugin(t *testing.T) {
	notInPod(t)
	for _, version := range []string{execV1, execV1beta1} {
		t.Run(version, func(t *testing.T) {
			dir := t.TempDir()
			// Each run appends a line to runs and answers token-N; the
			// expiry is $EXPIRES (the first run's) or none.
			os.WriteFile(filepath.Join(dir, "plugin.sh"), []byte(`#!/bin/sh
echo "$1 $GREETING $KUBERNETES_EXEC_INFO" >> "$RUNS"
n=$(wc -l < "$RUNS" | tr -d ' ')
exp=""
[ -n "$EXPIRES" ] && [ "$n" = 1 ] && exp=",\"expirationTimestamp\":\"$EXPIRES\""
printf '{"apiVersion":"%s","kind":"ExecCredential","status":{"token":"token-%s"%s}}\n' "`+version+`" "$n" "$exp"
`), 0o755)
			runs := filepath.Join(dir, "runs")
			t.Setenv("RUNS", runs)
			t.Setenv("EXPIRES", time.Now().Add(2*time.Second).UTC().Format(time.RFC3339))
			t.Setenv("KUBECONFIG", writeKubeconfig(t, dir, "config", `
current-context: x
clusters:
- name: c
  cluster: {server: "https://127.0.0.1:6443"}
contexts:
- name: x
  context: {cluster: c, user: u}
users:
- name: u
  user:
    exec:
      apiVersion: `+version+`
      command: ./plugin.sh
      args: [hello]
      env: [{name: GREETING, value: world}]
      provideClusterInfo: true
`))
			c := mustLoad(t, "k8s://")
			if got := authHeader(t, c); got != "Bearer token-1" {
				t.Fatalf("Authorization = %q, want the plugin's token-1", got)
			}
			if got := authHeader(t, c); got != "Bearer token-1" {
				t.Errorf("before its expiry: Authorization = %q, want the cached token-1", got)
			}
			data, _ := os.ReadFile(runs)
			line := strings.Split(string(data), "\n")[0]
			for _, want := range []string{"hello world ", `"kind":"ExecCredential"`, `"apiVersion":"` + version + `"`, `"server":"https://127.0.0.1:6443"`, `"interactive":false`} {
				if !strings.Contains(line, want) {
					t.Errorf("the plugin's args, env and KUBERNETES_EXEC_INFO: %q lacks %q", line, want)
				}
			}
			// RFC 3339 has whole seconds: wait until the expiry has surely
			// passed. (What is checked is that the plugin runs again.)
			time.Sleep(time.Until(c.auth.exec.expiry) + 10*time.Millisecond)
			if got := authHeader(t, c); got != "Bearer token-2" {
				t.Errorf("after its expiry: Authorization = %q, want a new token-2", got)
			}
			c.auth.unauthorized()
			if got := authHeader(t, c); got != "Bearer token-3" {
				t.Errorf("after a 401: Authorization = %q, want a new token-3", got)
			}
		})
	}
}

// TestExecPluginFails: a plugin that fails is a refusal naming it and its
// stderr; the installHint is shown when the command is missing.
func TestExecPluginFails(t *testing.T) {
	notInPod(t)
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "fail.sh"), []byte("#!/bin/sh\necho 'login expired; run sso login' >&2\nexit 3\n"), 0o755)
	t.Setenv("KUBECONFIG", writeKubeconfig(t, dir, "config", `
current-context: x
clusters:
- name: c
  cluster: {server: "https://127.0.0.1:6443"}
contexts:
- {name: x, context: {cluster: c, user: u}}
- {name: missing, context: {cluster: c, user: m}}
users:
- name: u
  user:
    exec: {apiVersion: client.authentication.k8s.io/v1, command: ./fail.sh}
- name: m
  user:
    exec: {apiVersion: client.authentication.k8s.io/v1, command: no-such-plugin-xyz, installHint: "install it with\n  apt-get install xyz"}
`))
	for ctx, want := range map[string]string{
		"x":       "login expired; run sso login",
		"missing": "install it with apt-get install xyz",
	} {
		c := mustLoad(t, "k8s://?context="+ctx)
		b := &backend{cfg: c}
		req, _ := http.NewRequest("GET", c.server, nil)
		err := b.classify(c.auth.apply(context.Background(), req), "get")
		if !errors.Is(err, lock.ErrRefused) || !strings.Contains(err.Error(), want) {
			t.Errorf("context %s: %v; want ErrRefused saying %q", ctx, err, want)
		}
	}
}

// TestInCluster: in a pod, the service account's files and
// KUBERNETES_SERVICE_HOST/PORT; the namespace is the pod's unless the URL
// names one; $KUBECONFIG or ?context= choose the kubeconfig instead.
func TestInCluster(t *testing.T) {
	sa := t.TempDir()
	ca, _ := testCA(t)
	os.WriteFile(filepath.Join(sa, "ca.crt"), ca, 0o600)
	os.WriteFile(filepath.Join(sa, "token"), []byte("sa-token-1"), 0o600)
	os.WriteFile(filepath.Join(sa, "namespace"), []byte("pods-ns"), 0o600)
	old := ServiceAccountDir
	ServiceAccountDir = sa
	t.Cleanup(func() { ServiceAccountDir = old })
	t.Setenv("KUBECONFIG", "")
	t.Setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
	t.Setenv("KUBERNETES_SERVICE_PORT", "443")

	c := mustLoad(t, "k8s://")
	if c.server != "https://10.0.0.1:443" || c.namespace != "pods-ns" || c.tls.RootCAs == nil {
		t.Errorf("in cluster: server %q, namespace %q", c.server, c.namespace)
	}
	if got := authHeader(t, c); got != "Bearer sa-token-1" {
		t.Errorf("Authorization = %q", got)
	}
	// The kubelet rotates the projected token by replacing the file.
	os.WriteFile(filepath.Join(sa, "token.new"), []byte("sa-token-2"), 0o600)
	os.Rename(filepath.Join(sa, "token.new"), filepath.Join(sa, "token"))
	if got := authHeader(t, c); got != "Bearer sa-token-2" {
		t.Errorf("after rotation: Authorization = %q", got)
	}
	if c := mustLoad(t, "k8s://other"); c.namespace != "other" {
		t.Errorf("k8s://other in a pod: namespace %q", c.namespace)
	}
	// IPv6 service host.
	t.Setenv("KUBERNETES_SERVICE_HOST", "fd00::1")
	if c := mustLoad(t, "k8s://"); c.server != "https://[fd00::1]:443" {
		t.Errorf("IPv6: server %q", c.server)
	}
	// ?context= asks for the kubeconfig even in a pod.
	t.Setenv("HOME", t.TempDir())
	u, _ := url.Parse("k8s://?context=x")
	if _, err := loadConfig(u); err == nil || !strings.Contains(err.Error(), "kubeconfig") {
		t.Errorf("?context= in a pod without a kubeconfig: %v; want the kubeconfig's error", err)
	}
}

// TestSharedRefused: --shared is refused at open, before any connection.
func TestSharedRefused(t *testing.T) {
	_, err := lock.Open("k8s://ns", lock.Options{Mode: lock.Shared})
	if !errors.Is(err, lock.ErrUsage) || !strings.Contains(err.Error(), "no shared locks") {
		t.Errorf("k8s:// --shared: %v; want ErrUsage", err)
	}
}

// TestExecInteractive: as kubectl runs a plugin: interactive when standard
// input is a terminal and interactiveMode allows it (IfAvailable without
// one); Always without a terminal is refused before anything runs.
func TestExecInteractive(t *testing.T) {
	notInPod(t)
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "plugin.sh"), []byte(`#!/bin/sh
printf '%s' "$KUBERNETES_EXEC_INFO" > "$INFO"
echo '{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{"token":"t"}}'
`), 0o755)
	info := filepath.Join(dir, "info")
	t.Setenv("INFO", info)
	kubeconfig := func(mode string) {
		t.Setenv("KUBECONFIG", writeKubeconfig(t, dir, "config", `
current-context: x
clusters: [{name: c, cluster: {server: "https://127.0.0.1:6443"}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
users:
- name: u
  user:
    exec: {apiVersion: client.authentication.k8s.io/v1, command: ./plugin.sh, interactiveMode: "`+mode+`"}
`))
	}
	old := stdinIsTerminal
	t.Cleanup(func() { stdinIsTerminal = old })
	for _, tc := range []struct {
		mode     string
		terminal bool
		want     string // "true", "false", or the start of the error
	}{
		{"", false, "false"},
		{"", true, "true"},
		{"IfAvailable", true, "true"},
		{"Never", true, "false"},
		{"Always", true, "true"},
		{"Always", false, `k8s: kubeconfig context "x": the exec plugin ` + filepath.Join(dir, "plugin.sh") + ` needs a terminal (interactiveMode: Always) and standard input is not one`},
		{"Sometimes", true, `k8s: kubeconfig context "x": the exec plugin's interactiveMode "Sometimes" is not one of Never, IfAvailable, Always`},
	} {
		stdinIsTerminal = func() bool { return tc.terminal }
		kubeconfig(tc.mode)
		u, _ := url.Parse("k8s://")
		c, err := loadConfig(u)
		if err != nil {
			if !errors.Is(err, lock.ErrUsage) || !strings.HasPrefix(err.Error(), tc.want) {
				t.Errorf("mode %q, terminal %v: %v; want a usage error %q", tc.mode, tc.terminal, err, tc.want)
			}
			continue
		}
		os.Remove(info)
		authHeader(t, c)
		got, _ := os.ReadFile(info)
		if want := `"interactive":` + tc.want; !strings.Contains(string(got), want) {
			t.Errorf("mode %q, terminal %v: the plugin was given %s; want %s", tc.mode, tc.terminal, got, want)
		}
	}
}

// TestCredFilesKeepLastGood: a CA or client certificate file caught
// half-written, or missing, keeps the last good value; once complete it is
// taken, and only a change of content counts as one.
func TestCredFilesKeepLastGood(t *testing.T) {
	dir := t.TempDir()
	ca1, _ := testCA(t)
	ca2, _ := testCA(t)
	cert1, key1 := testCA(t)
	cert2, key2 := testCA(t)
	caFile, certFile, keyFile := filepath.Join(dir, "ca.crt"), filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	os.WriteFile(caFile, ca1, 0o600)
	os.WriteFile(certFile, cert1, 0o600)
	os.WriteFile(keyFile, key1, 0o600)
	pair1, _ := tls.X509KeyPair(cert1, key1)
	f := &credFiles{ca: caFile, caPEM: ca1, cert: certFile, key: keyFile, pair: &pair1}
	current := func() []byte {
		c, _ := f.certificate(nil)
		return c.Certificate[0]
	}
	step := func(what string, wantCA, wantCert bool) {
		t.Helper()
		roots, certChanged := f.refresh()
		if (roots != nil) != wantCA || certChanged != wantCert {
			t.Errorf("%s: new CA %v, new certificate %v; want %v, %v", what, roots != nil, certChanged, wantCA, wantCert)
		}
	}
	step("unchanged files", false, false)
	os.WriteFile(caFile, ca1[:len(ca1)/2], 0o600)
	os.WriteFile(keyFile, key2, 0o600)
	step("a half-written CA, a key without its certificate", false, false)
	if !bytes.Equal(current(), pair1.Certificate[0]) {
		t.Error("the certificate changed while its key did not match it")
	}
	os.Remove(caFile)
	os.WriteFile(certFile, cert2, 0o600)
	step("no CA file, a complete new pair", false, true)
	if bytes.Equal(current(), pair1.Certificate[0]) {
		t.Error("the new certificate is not the one presented")
	}
	os.WriteFile(caFile, ca1, 0o600)
	step("the CA file back as it was", false, false)
	os.WriteFile(caFile, ca2, 0o600)
	step("a new CA", true, false)
}

// TestTokenFileKeepsLastGood: a token file that cannot be read, or is
// empty, gives the last token read; one never read is an error.
func TestTokenFileKeepsLastGood(t *testing.T) {
	file := filepath.Join(t.TempDir(), "token")
	a := &auth{tokenFile: file}
	if _, err := a.readTokenFile(); err == nil {
		t.Error("a token file never read: no error")
	}
	os.WriteFile(file, []byte("one\n"), 0o600)
	for _, tc := range []struct {
		what string
		do   func()
		want string
	}{
		{"read", func() {}, "one"},
		{"removed", func() { os.Remove(file) }, "one"},
		{"empty", func() { os.WriteFile(file, nil, 0o600) }, "one"},
		{"rotated", func() { os.WriteFile(file, []byte("two"), 0o600) }, "two"},
	} {
		tc.do()
		if got, err := a.readTokenFile(); got != tc.want || err != nil {
			t.Errorf("%s: %q, %v; want %q", tc.what, got, err, tc.want)
		}
	}
}
