package testenv

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// ErrNoKube is returned by [StartKube] when the test API server cannot be
// built or etcd is missing. Its message says what to do.
var ErrNoKube = errors.New("testenv: cannot build the test kube-apiserver (module internal/testenv/kubeapiserver): it needs the go command in PATH and, the first time, the Go module proxy; run scripts/test-deps to build it ahead")

// Kube is a running throwaway kube-apiserver on 127.0.0.1 over its own etcd,
// with token authentication (the users admin, in system:masters, leaser and
// nobody, who may do nothing until [Kube.Grant]), client certificates
// ([Kube.ClientCert]), RBAC, and service account tokens from the
// TokenRequest API. No controllers run: nothing deletes a
// namespace's contents or makes a service account's secret.
//
// A start takes seconds, so a test binary may share one server: start it
// once (sync.OnceValues(StartKube)), Close it in TestMain, and give each test
// a namespace of its own.
type Kube struct {
	*proc             // URL: https://127.0.0.1:PORT, the same across Stop and Start
	CAFile     string // the CA that signed the serving certificate (CertFile)
	AdminToken string
	Etcd       *Etcd

	tokens map[string]string
	client *http.Client
	// The CA the server trusts for client certificates.
	clientCA    *x509.Certificate
	clientCAKey *ecdsa.PrivateKey
}

// StartKube starts etcd and kube-apiserver on free ports, ready (/readyz
// answers ok). The caller must Close it. The first call on a machine builds
// the server into the user's cache (withlock-testenv/kube-apiserver-KEY),
// which takes minutes; later ones find it there.
func StartKube() (*Kube, error) {
	bin, err := kubeAPIServer()
	if err != nil {
		return nil, err
	}
	p, err := newProc(os.TempDir(), "kube", nil, true)
	if err != nil {
		return nil, err
	}
	k := &Kube{proc: p, tokens: map[string]string{"admin": rand.Text(), "leaser": rand.Text(), "nobody": rand.Text()}}
	k.AdminToken = k.tokens["admin"]
	fail := func(err error) (*Kube, error) { k.Close(); return nil, err }
	if k.Etcd, err = StartEtcd(); errors.Is(err, ErrNoEtcd) {
		return fail(errors.Join(ErrNoKube, err))
	} else if err != nil {
		return fail(err)
	}
	csv := fmt.Sprintf("%s,admin,admin,system:masters\n%s,leaser,leaser\n%s,nobody,nobody\n", k.AdminToken, k.tokens["leaser"], k.tokens["nobody"])
	if err := os.WriteFile(filepath.Join(p.Dir, "tokens.csv"), []byte(csv), 0o600); err != nil {
		return fail(err)
	}
	k.CAFile = p.CertFile
	// The service account tokens' own key, so that a new serving
	// certificate (RotateServingCA) leaves the tokens valid.
	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fail(err)
	}
	saDER, _ := x509.MarshalECPrivateKey(saKey)
	if err := os.WriteFile(filepath.Join(p.Dir, "sa.key"), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: saDER}), 0o600); err != nil {
		return fail(err)
	}
	caKey, caDER, err := newCert(nil, nil, "")
	if err != nil {
		return fail(err)
	}
	k.clientCA, _ = x509.ParseCertificate(caDER)
	k.clientCAKey = caKey
	if err := os.WriteFile(filepath.Join(p.Dir, "clientca.crt"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), 0o600); err != nil {
		return fail(err)
	}
	if err := k.trustCAFile(); err != nil {
		return fail(err)
	}
	p.command = func() *exec.Cmd {
		k.URL = "https://" + k.addr()
		// Priority and fairness off: it adds work at start and nothing here.
		// Coordinated leader election on, so that a Lease keeps
		// spec.strategy and spec.preferredHolder as clusters that use it do.
		return exec.Command(bin, "--etcd-servers=http://"+k.Etcd.Endpoint, "--bind-address=127.0.0.1",
			"--advertise-address=127.0.0.1", "--secure-port="+strconv.Itoa(k.Port), "--cert-dir=.",
			"--tls-cert-file=server.crt", "--tls-private-key-file=server.key", "--token-auth-file=tokens.csv", "--client-ca-file=clientca.crt",
			"--authorization-mode=RBAC", "--service-account-issuer=https://kubernetes.default.svc",
			"--service-account-key-file=sa.key", "--service-account-signing-key-file=sa.key",
			"--service-cluster-ip-range=10.96.0.0/24", "--endpoint-reconciler-type=none",
			"--enable-priority-and-fairness=false", "--profiling=false",
			"--feature-gates=CoordinatedLeaderElection=true", "--runtime-config=coordination.k8s.io/v1beta1=true")
	}
	p.ready = func() error { return k.do(context.Background(), k.AdminToken, "GET", "/readyz", nil, nil) }
	if err := p.launch(); err != nil {
		return fail(err)
	}
	return k, nil
}

// RequireKube is [StartKube] for t, closed when t ends; if the server cannot
// be built or etcd is missing, t fails under CI and is skipped elsewhere.
func RequireKube(t testing.TB) *Kube {
	k, err := StartKube()
	return require(t, k, err, ErrNoKube)
}

// trustCAFile makes the tests' own client trust the CAs in CAFile.
func (k *Kube) trustCAFile() error {
	roots := x509.NewCertPool()
	if pem, err := os.ReadFile(k.CAFile); err != nil || !roots.AppendCertsFromPEM(pem) {
		return fmt.Errorf("testenv: no CA in %s: %v", k.CAFile, err)
	}
	if k.client != nil {
		k.client.CloseIdleConnections()
	}
	k.client = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}}
	return nil
}

// RotateServingCA gives the API server a serving certificate signed by a
// new CA, as a cluster's CA rotation does, and returns the new CA (PEM).
// The server presents it from its next start (Stop, then Start). CAFile
// then holds both CAs, the old and the new, so that the tests' other
// clients trust the server before and after. Not safe to call while the
// tests' client is in use ([Kube.Do]).
func (k *Kube) RotateServingCA() (caPEM []byte, err error) {
	caKey, caDER, err := newCert(nil, nil, "")
	if err != nil {
		return nil, err
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, der, err := newCert(ca, caKey, certCN)
	if err != nil {
		return nil, err
	}
	keyDER, _ := x509.MarshalECPrivateKey(key)
	caPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
	old, err := os.ReadFile(k.CAFile)
	if err != nil {
		return nil, err
	}
	for name, data := range map[string][]byte{
		"server.crt": pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		"server.key": pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}),
		"ca.crt":     append(old, caPEM...),
	} {
		if err := os.WriteFile(filepath.Join(k.Dir, name), data, 0o600); err != nil {
			return nil, err
		}
	}
	return caPEM, k.trustCAFile()
}

// Close stops the API server, then its etcd, and removes their directories.
func (k *Kube) Close() error {
	err := k.proc.Close()
	if k.client != nil {
		k.client.CloseIdleConnections()
	}
	if k.Etcd != nil {
		err = errors.Join(err, k.Etcd.Close())
	}
	return err
}

// UserToken is the bearer token of a static user: admin, leaser or nobody.
func (k *Kube) UserToken(user string) string { return k.tokens[user] }

// Namespace creates the namespace name, unless it exists.
func (k *Kube) Namespace(name string) error {
	return k.create("/api/v1/namespaces", map[string]any{"metadata": map[string]any{"name": name}})
}

// Grant lets user (a static user, or system:serviceaccount:NS:NAME) get,
// list, watch, create, update, patch and delete Leases in namespace, and
// nothing else: a Role withlock-leases and a RoleBinding to user. It
// returns once the server's authorizer lets user in.
func (k *Kube) Grant(namespace, user string) error {
	rbac := "/apis/rbac.authorization.k8s.io/v1/namespaces/" + namespace
	role := map[string]any{"metadata": map[string]any{"name": "withlock-leases"}, "rules": []any{map[string]any{
		"apiGroups": []string{"coordination.k8s.io"}, "resources": []string{"leases"},
		"verbs": []string{"get", "list", "watch", "create", "update", "patch", "delete"}}}}
	binding := map[string]any{"metadata": map[string]any{"name": "withlock-leases-" + strings.ReplaceAll(user, ":", ".")},
		"roleRef":  map[string]any{"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "withlock-leases"},
		"subjects": []any{map[string]any{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}}}
	if err := errors.Join(k.create(rbac+"/roles", role), k.create(rbac+"/rolebindings", binding)); err != nil {
		return err
	}
	// RBAC's authorizer sees the binding through a cache, a moment later:
	// return once the server says user may update leases there.
	review := map[string]any{"spec": map[string]any{"user": user, "resourceAttributes": map[string]any{
		"namespace": namespace, "verb": "update", "group": "coordination.k8s.io", "resource": "leases"}}}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		var answer struct{ Status struct{ Allowed bool } }
		err := k.Do("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", review, &answer)
		if err == nil && answer.Status.Allowed {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("testenv: the grant to %s in %s not in effect after 30s (%v)", user, namespace, err)
		}
	}
}

// ServiceAccountToken creates the service account namespace/name unless it
// exists and returns a token for it from the TokenRequest API (good for an
// hour, for the server's audience), as the kubelet mounts in a pod.
func (k *Kube) ServiceAccountToken(namespace, name string) (string, error) {
	sa := "/api/v1/namespaces/" + namespace + "/serviceaccounts"
	if err := k.create(sa, map[string]any{"metadata": map[string]any{"name": name}}); err != nil {
		return "", err
	}
	var tr struct{ Status struct{ Token string } }
	err := k.Do("POST", sa+"/"+name+"/token", map[string]any{"spec": map[string]any{}}, &tr)
	return tr.Status.Token, err
}

// Kubeconfig writes to path a kubeconfig whose one context, test, is current
// and reaches the server as token, in namespace.
func (k *Kube) Kubeconfig(path, namespace, token string) error {
	config := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: test
  cluster: {server: %q, certificate-authority: %q}
users:
- name: test
  user: {token: %q}
contexts:
- name: test
  context: {cluster: test, user: test, namespace: %q}
current-context: test
`, k.URL, k.CAFile, token, namespace)
	return os.WriteFile(path, []byte(config), 0o600)
}

// ClientCert returns a client certificate and its key (PEM) by which the
// server knows user (its common name), valid from an hour ago until
// notAfter.
func (k *Kube) ClientCert(user string, notAfter time.Time) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: user},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, k.clientCA, &key.PublicKey, k.clientCAKey)
	if err != nil {
		return nil, nil, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), nil
}

// KubeError is a response of the API server other than 2xx.
type KubeError struct {
	Code int    // the HTTP status: 401, 403, 404, 409...
	Body string // the response, a Status object as JSON
}

func (e *KubeError) Error() string {
	return fmt.Sprintf("testenv: kube-apiserver: %d %s", e.Code, e.Body)
}

// Do sends body (if not nil) as JSON to the API server's path as admin and
// decodes the response into out (if not nil). A status other than 2xx is a
// *[KubeError].
func (k *Kube) Do(method, path string, body, out any) error {
	return k.do(context.Background(), k.AdminToken, method, path, body, out)
}

func (k *Kube) do(ctx context.Context, token, method, path string, body, out any) error {
	var in io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		in = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, k.URL+path, in)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := k.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode/100 != 2 {
		err = &KubeError{resp.StatusCode, strings.TrimSpace(string(b))}
	}
	if err == nil && out != nil {
		err = json.Unmarshal(b, out)
	}
	return err
}

// create POSTs obj to the collection path; one that exists is no error.
func (k *Kube) create(path string, obj any) error {
	var e *KubeError
	if err := k.Do("POST", path, obj, nil); err != nil && (!errors.As(err, &e) || e.Code != http.StatusConflict) {
		return err
	}
	return nil
}

var kubeAPIServer = sync.OnceValues(func() (string, error) {
	return cachedBuild("kubeapiserver", "k8s.io/kubernetes/cmd/kube-apiserver", ErrNoKube)
})
