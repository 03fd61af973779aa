package k8s

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"
)

// The ExecCredential versions a credential plugin may speak.
const (
	execV1      = "client.authentication.k8s.io/v1"
	execV1beta1 = "client.authentication.k8s.io/v1beta1"
)

// auth is how a request says who it is: a bearer token (given, read from a
// file at each request, or from an exec plugin), or a user and password.
// A client certificate is in the TLS config instead.
type auth struct {
	token              string
	tokenFile          string
	username, password string
	exec               *execPlugin

	mu       sync.Mutex
	lastGood string // the token file's last token read
}

// apply sets the request's Authorization header.
func (a *auth) apply(ctx context.Context, req *http.Request) error {
	token := a.token
	switch {
	case a.exec != nil:
		cred, err := a.exec.get(ctx)
		if err != nil {
			return err
		}
		token = cred.token
	case a.tokenFile != "":
		var err error
		if token, err = a.readTokenFile(); err != nil {
			return err
		}
	case a.username != "":
		req.SetBasicAuth(a.username, a.password)
		return nil
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	return nil
}

// readTokenFile reads the token file. It is read at every request: the
// kubelet rotates projected service account tokens in place, and a file
// read costs microseconds. A read that fails, or finds the file empty (a
// rotation caught half-way), gives the last token read, as client-go
// does: a token file gone for a moment is not a lost lock. The server
// still refuses the last token once it has expired.
func (a *auth) readTokenFile() (string, error) {
	b, err := os.ReadFile(a.tokenFile)
	token := strings.TrimSpace(string(b))
	a.mu.Lock()
	defer a.mu.Unlock()
	switch {
	case err == nil && token != "":
		a.lastGood = token
	case a.lastGood != "":
		return a.lastGood, nil
	case err != nil:
		return "", fmt.Errorf("reading the token: %v", err)
	default:
		return "", fmt.Errorf("the token file %s is empty", a.tokenFile)
	}
	return token, nil
}

// unauthorized is told of a 401. A cached plugin credential is dropped so
// that the next request runs the plugin again (the server may have revoked
// it before its expiry). It reports whether the next request may carry
// other credentials: a plugin's, or a token file's, read again.
func (a *auth) unauthorized() bool {
	if a.exec != nil {
		a.exec.forget()
		return true
	}
	return a.tokenFile != ""
}

// execPlugin runs a kubeconfig's exec credential plugin and caches its
// answer until the expiry the answer gives (for ever without one), as
// client-go does.
type execPlugin struct {
	cfg     execConfig
	cluster execCluster // what the plugin is told of the cluster, with provideClusterInfo
	// interactive says that the plugin may talk to the user: standard
	// input is a terminal and interactiveMode is not Never. It then gets
	// withlock's standard input, and its standard error is shown too.
	interactive bool

	// rotated is called when the plugin answers with a client
	// certificate other than the one before: connections made with the
	// old one must go (wire.go).
	rotated func()

	mu     sync.Mutex
	cred   *execCred
	expiry time.Time        // zero: no expiry
	cert   *tls.Certificate // the last client certificate it gave, kept by forget
}

type execCred struct {
	token string
	cert  *tls.Certificate
}

// execMaxRun bounds one run of a plugin whose caller has no deadline (a
// TLS handshake's certificate request).
const execMaxRun = 30 * time.Second

// get returns the cached credential, or runs the plugin for a new one.
func (p *execPlugin) get(ctx context.Context) (*execCred, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cred != nil && (p.expiry.IsZero() || time.Now().Before(p.expiry)) {
		return p.cred, nil
	}
	cred, expiry, err := p.run(ctx)
	if err != nil {
		return nil, err
	}
	p.cred, p.expiry = cred, expiry
	if cred.cert != nil {
		if p.cert != nil && !sameCert(p.cert, cred.cert) && p.rotated != nil {
			p.rotated()
		}
		p.cert = cred.cert
	}
	return cred, nil
}

// certificate returns the last client certificate the plugin gave, without
// running it; nil if none.
func (p *execPlugin) certificate() *tls.Certificate {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cert
}

// sameCert reports whether a and b are the same leaf certificate.
func sameCert(a, b *tls.Certificate) bool {
	return len(a.Certificate) > 0 && len(b.Certificate) > 0 && bytes.Equal(a.Certificate[0], b.Certificate[0])
}

func (p *execPlugin) forget() {
	p.mu.Lock()
	p.cred = nil
	p.mu.Unlock()
}

// execCredential is client.authentication.k8s.io's ExecCredential, the
// plugin's input (spec) and output (status).
type execCredential struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Spec       struct {
		Interactive bool         `json:"interactive"`
		Cluster     *execCluster `json:"cluster,omitempty"`
	} `json:"spec"`
	Status *struct {
		Token                 string    `json:"token"`
		ClientCertificateData string    `json:"clientCertificateData"`
		ClientKeyData         string    `json:"clientKeyData"`
		ExpirationTimestamp   time.Time `json:"expirationTimestamp"`
	} `json:"status,omitempty"`
}

// execCluster is the cluster as an ExecCredential gives it: the
// kubeconfig cluster's fields, and its client.authentication.k8s.io/exec
// extension as config.
type execCluster struct {
	Server                   string          `json:"server"`
	TLSServerName            string          `json:"tls-server-name,omitempty"`
	InsecureSkipTLSVerify    bool            `json:"insecure-skip-tls-verify,omitempty"`
	CertificateAuthorityData []byte          `json:"certificate-authority-data,omitempty"`
	ProxyURL                 string          `json:"proxy-url,omitempty"`
	DisableCompression       bool            `json:"disable-compression,omitempty"`
	Config                   json.RawMessage `json:"config,omitempty"`
}

// run runs the plugin once: its args and env as the kubeconfig says, the
// ExecCredential in $KUBERNETES_EXEC_INFO, its answer on stdout. As
// kubectl runs it: with withlock's standard input when interactive, else
// none.
func (p *execPlugin) run(ctx context.Context) (*execCred, time.Time, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, execMaxRun)
		defer cancel()
	}
	in := execCredential{APIVersion: p.cfg.APIVersion, Kind: "ExecCredential"}
	in.Spec.Interactive = p.interactive
	if p.cfg.ProvideClusterInfo {
		in.Spec.Cluster = &p.cluster
	}
	info, err := json.Marshal(in)
	if err != nil {
		return nil, time.Time{}, err
	}
	cmd := exec.CommandContext(ctx, p.cfg.Command, p.cfg.Args...)
	cmd.Env = append(os.Environ(), "KUBERNETES_EXEC_INFO="+string(info))
	for _, e := range p.cfg.Env {
		cmd.Env = append(cmd.Env, e.Name+"="+e.Value)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if p.interactive {
		cmd.Stdin, cmd.Stderr = os.Stdin, io.MultiWriter(os.Stderr, &stderr)
	}
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(stderr.String())
		if i := strings.IndexByte(msg, '\n'); i >= 0 {
			msg = msg[:i]
		}
		if errors.Is(err, exec.ErrNotFound) && p.cfg.InstallHint != "" {
			msg = strings.Join(strings.Fields(p.cfg.InstallHint), " ")
		}
		if msg != "" {
			msg = ": " + msg
		}
		return nil, time.Time{}, &pluginError{fmt.Sprintf("the kubeconfig's exec credential plugin %s failed (%v)%s", p.cfg.Command, err, msg)}
	}
	var out execCredential
	if err := json.Unmarshal(stdout.Bytes(), &out); err != nil {
		return nil, time.Time{}, &pluginError{fmt.Sprintf("the exec credential plugin %s printed no ExecCredential: %v", p.cfg.Command, err)}
	}
	switch {
	case out.Kind != "ExecCredential" || out.APIVersion != p.cfg.APIVersion:
		return nil, time.Time{}, &pluginError{fmt.Sprintf("the exec credential plugin %s answered %s %s; the kubeconfig asks for ExecCredential %s", p.cfg.Command, out.APIVersion, out.Kind, p.cfg.APIVersion)}
	case out.Status == nil || out.Status.Token == "" && out.Status.ClientCertificateData == "":
		return nil, time.Time{}, &pluginError{fmt.Sprintf("the exec credential plugin %s gave neither a token nor a client certificate", p.cfg.Command)}
	}
	cred := &execCred{token: out.Status.Token}
	if out.Status.ClientCertificateData != "" {
		pair, err := tls.X509KeyPair([]byte(out.Status.ClientCertificateData), []byte(out.Status.ClientKeyData))
		if err != nil {
			return nil, time.Time{}, &pluginError{fmt.Sprintf("the exec credential plugin %s: client certificate: %v", p.cfg.Command, err)}
		}
		cred.cert = &pair
	}
	return cred, out.Status.ExpirationTimestamp, nil
}

// pluginError is credentials that could not be had: a credential plugin
// that failed, a token file that cannot be read. A refusal, since trying
// again soon will most likely fail the same way.
type pluginError struct{ msg string }

func (e *pluginError) Error() string { return e.msg }

// decodeB64 is base64 that tolerates line breaks, as kubeconfig data
// fields sometimes carry.
func decodeB64(s string) ([]byte, error) {
	return base64.StdEncoding.DecodeString(strings.Join(strings.Fields(s), ""))
}
