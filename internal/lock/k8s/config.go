package k8s

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	"go.yaml.in/yaml/v3"
	"golang.org/x/term"

	"github.com/withlock/withlock/internal/lock"
)

// ServiceAccountDir is where a pod's service account is mounted: token,
// ca.crt and namespace. A variable so that tests can point it at a
// directory of their own; nothing else changes it.
var ServiceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"

// config is how to reach the API server and as whom: what one URL and the
// environment resolve to. Making it reads files only; an exec credential
// plugin runs at the first request.
type config struct {
	server    string // https://host:port, no trailing slash
	hostport  string // for messages
	namespace string
	source    string // where it came from, for messages: "the pod's service account", "kubeconfig context X"
	tls       *tls.Config
	auth      *auth
	proxy     *url.URL // the kubeconfig's proxy-url; nil: $HTTPS_PROXY, $NO_PROXY
	// files are the CA and client certificate files, read again when
	// they change; nil when there are none.
	files              *credFiles
	disableCompression bool // the kubeconfig's disable-compression
}

// loadConfig resolves a k8s:// URL: in a pod (KUBERNETES_SERVICE_HOST set
// and a service account mounted) the service account, unless $KUBECONFIG
// or ?context= ask for a kubeconfig; elsewhere the kubeconfig ($KUBECONFIG,
// else ~/.kube/config). The URL's host, if any, is the namespace.
func loadConfig(u *url.URL) (*config, error) {
	q := u.Query()
	for k := range q {
		if k != "context" {
			return nil, lock.Errorf(lock.ErrUsage, "k8s URL: unknown option %q; k8s://[NAMESPACE] takes only ?context=NAME", k)
		}
	}
	if u.User != nil || u.Port() != "" || u.Path != "" && u.Path != "/" {
		return nil, lock.Errorf(lock.ErrUsage, "k8s URL: write k8s://[NAMESPACE][?context=NAME]; the API server and credentials come from the pod's service account or the kubeconfig")
	}
	ns := u.Hostname()
	if ns != "" && !isLabel(ns) {
		return nil, lock.Errorf(lock.ErrUsage, "k8s URL: %q is not a namespace name (lower-case letters, digits and '-', at most 63)", ns)
	}
	context := q.Get("context")
	var (
		c   *config
		err error
	)
	if context == "" && os.Getenv("KUBECONFIG") == "" && inCluster() {
		c, err = inClusterConfig()
	} else {
		c, err = kubeconfigConfig(context)
	}
	if err != nil {
		return nil, err
	}
	if ns != "" {
		c.namespace = ns
	}
	return c, nil
}

// inCluster says whether this process runs in a pod with a service account.
func inCluster() bool {
	if os.Getenv("KUBERNETES_SERVICE_HOST") == "" || os.Getenv("KUBERNETES_SERVICE_PORT") == "" {
		return false
	}
	_, err := os.Stat(filepath.Join(ServiceAccountDir, "token"))
	return err == nil
}

// inClusterConfig is the pod's own service account, as client-go's
// rest.InClusterConfig reads it. The token is read again at every request,
// and ca.crt whenever it changes: the kubelet rewrites both in place (a
// projected token is rotated; ca.crt follows the cluster's CA).
func inClusterConfig() (*config, error) {
	host, port := os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT")
	hp := net.JoinHostPort(host, port)
	ca := filepath.Join(ServiceAccountDir, "ca.crt")
	pem, err := os.ReadFile(ca)
	if err != nil {
		return nil, lock.Errorf(lock.ErrUsage, "k8s: the pod's service account has no CA certificate: %v", err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pem) {
		return nil, lock.Errorf(lock.ErrUsage, "k8s: no PEM certificate in %s", ca)
	}
	ns := "default"
	if b, err := os.ReadFile(filepath.Join(ServiceAccountDir, "namespace")); err == nil && strings.TrimSpace(string(b)) != "" {
		ns = strings.TrimSpace(string(b))
	}
	return &config{
		server:    "https://" + hp,
		hostport:  hp,
		namespace: ns,
		source:    "the pod's service account",
		tls:       &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: roots},
		auth:      &auth{tokenFile: filepath.Join(ServiceAccountDir, "token")},
		files:     &credFiles{ca: ca, caPEM: pem},
	}, nil
}

// kubeconfig is the part of a kubeconfig file that withlock reads. The
// names are kubectl's (k8s.io/client-go/tools/clientcmd/api/v1).
type kubeconfig struct {
	CurrentContext string `yaml:"current-context"`
	Clusters       []struct {
		Name    string        `yaml:"name"`
		Cluster clusterConfig `yaml:"cluster"`
	} `yaml:"clusters"`
	Users []struct {
		Name string     `yaml:"name"`
		User userConfig `yaml:"user"`
	} `yaml:"users"`
	Contexts []struct {
		Name    string `yaml:"name"`
		Context struct {
			Cluster   string `yaml:"cluster"`
			User      string `yaml:"user"`
			Namespace string `yaml:"namespace"`
		} `yaml:"context"`
	} `yaml:"contexts"`
}

type clusterConfig struct {
	Server                   string `yaml:"server"`
	CertificateAuthority     string `yaml:"certificate-authority"`
	CertificateAuthorityData string `yaml:"certificate-authority-data"`
	InsecureSkipTLSVerify    bool   `yaml:"insecure-skip-tls-verify"`
	TLSServerName            string `yaml:"tls-server-name"`
	ProxyURL                 string `yaml:"proxy-url"`
	DisableCompression       bool   `yaml:"disable-compression"`
	Extensions               []struct {
		Name      string `yaml:"name"`
		Extension any    `yaml:"extension"`
	} `yaml:"extensions"`
	dir string // of the file it came from, for relative paths
}

type userConfig struct {
	Token                 string         `yaml:"token"`
	TokenFile             string         `yaml:"tokenFile"`
	ClientCertificate     string         `yaml:"client-certificate"`
	ClientCertificateData string         `yaml:"client-certificate-data"`
	ClientKey             string         `yaml:"client-key"`
	ClientKeyData         string         `yaml:"client-key-data"`
	Username              string         `yaml:"username"`
	Password              string         `yaml:"password"`
	Exec                  *execConfig    `yaml:"exec"`
	AuthProvider          map[string]any `yaml:"auth-provider"`
	Impersonate           string         `yaml:"as"`
	ImpersonateUID        string         `yaml:"as-uid"`
	ImpersonateGroups     []string       `yaml:"as-groups"`
	dir                   string
}

// execConfig is a credential plugin (client.authentication.k8s.io).
type execConfig struct {
	APIVersion string   `yaml:"apiVersion"`
	Command    string   `yaml:"command"`
	Args       []string `yaml:"args"`
	Env        []struct {
		Name  string `yaml:"name"`
		Value string `yaml:"value"`
	} `yaml:"env"`
	InstallHint        string `yaml:"installHint"`
	ProvideClusterInfo bool   `yaml:"provideClusterInfo"`
	InteractiveMode    string `yaml:"interactiveMode"` // Never, IfAvailable (the default), Always
}

// execExtension names the cluster extension passed to an exec plugin as
// its ExecCredential's spec.cluster.config.
const execExtension = "client.authentication.k8s.io/exec"

// kubeconfigFiles are the kubeconfig files in kubectl's order: $KUBECONFIG
// (a list, merged), else ~/.kube/config.
func kubeconfigFiles() []string {
	if env := os.Getenv("KUBECONFIG"); env != "" {
		var files []string
		for _, f := range filepath.SplitList(env) {
			if f != "" {
				files = append(files, f)
			}
		}
		return files
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return nil
	}
	return []string{filepath.Join(home, ".kube", "config")}
}

// kubeconfigConfig reads the kubeconfig files and resolves context (the
// current context if empty). The files are merged as kubectl merges them:
// the first file to set a value, or to name a cluster, user or context,
// wins; a file in $KUBECONFIG that does not exist is skipped.
func kubeconfigConfig(context string) (*config, error) {
	files := kubeconfigFiles()
	var (
		current  string
		clusters = map[string]clusterConfig{}
		users    = map[string]userConfig{}
		contexts = map[string]struct{ cluster, user, namespace string }{}
		read     []string
	)
	for _, f := range files {
		data, err := os.ReadFile(f)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, lock.Errorf(lock.ErrUsage, "k8s: kubeconfig: %v", err)
		}
		var kc kubeconfig
		if err := yaml.Unmarshal(data, &kc); err != nil {
			return nil, lock.Errorf(lock.ErrUsage, "k8s: kubeconfig %s: %v", f, err)
		}
		read = append(read, f)
		dir := filepath.Dir(f)
		if current == "" {
			current = kc.CurrentContext
		}
		for _, c := range kc.Clusters {
			if _, dup := clusters[c.Name]; !dup {
				c.Cluster.dir = dir
				clusters[c.Name] = c.Cluster
			}
		}
		for _, u := range kc.Users {
			if _, dup := users[u.Name]; !dup {
				u.User.dir = dir
				users[u.Name] = u.User
			}
		}
		for _, c := range kc.Contexts {
			if _, dup := contexts[c.Name]; !dup {
				contexts[c.Name] = struct{ cluster, user, namespace string }{c.Context.Cluster, c.Context.User, c.Context.Namespace}
			}
		}
	}
	if len(read) == 0 {
		return nil, lock.Errorf(lock.ErrUsage, "k8s: not in a pod (no KUBERNETES_SERVICE_HOST and service account) and no kubeconfig (%s); set KUBECONFIG or run in a pod", strings.Join(files, ", "))
	}
	if context == "" {
		context = current
	}
	if context == "" {
		return nil, lock.Errorf(lock.ErrUsage, "k8s: the kubeconfig (%s) has no current-context; add ?context=NAME to the URL", strings.Join(read, ", "))
	}
	ctx, ok := contexts[context]
	if !ok {
		return nil, lock.Errorf(lock.ErrUsage, "k8s: no context %q in the kubeconfig (%s)", context, strings.Join(read, ", "))
	}
	cluster, ok := clusters[ctx.cluster]
	if !ok {
		return nil, lock.Errorf(lock.ErrUsage, "k8s: kubeconfig context %q names cluster %q, which is not in the kubeconfig", context, ctx.cluster)
	}
	user, ok := users[ctx.user]
	if !ok && ctx.user != "" {
		return nil, lock.Errorf(lock.ErrUsage, "k8s: kubeconfig context %q names user %q, which is not in the kubeconfig", context, ctx.user)
	}
	c, err := fromKubeconfig(cluster, user)
	if err != nil {
		return nil, lock.Errorf(lock.ErrUsage, "k8s: kubeconfig context %q: %v", context, err)
	}
	c.source = fmt.Sprintf("kubeconfig context %q", context)
	c.namespace = ctx.namespace
	if c.namespace == "" {
		c.namespace = "default"
	}
	return c, nil
}

// fromKubeconfig makes the config of one cluster and user.
func fromKubeconfig(cl clusterConfig, us userConfig) (*config, error) {
	switch {
	case us.AuthProvider != nil:
		name, _ := us.AuthProvider["name"].(string)
		way, ok := authProviderWayOut[name]
		if !ok {
			way = authProviderWayOut[""]
		}
		return nil, fmt.Errorf("the user's auth-provider (%s) is not supported; use its exec credential plugin instead (%s), as kubectl itself now does", name, way)
	case us.Impersonate != "" || us.ImpersonateUID != "" || len(us.ImpersonateGroups) > 0:
		return nil, errors.New("impersonation (the user's as, as-groups or as-uid) is not supported; give withlock that identity's own credentials (for a service account, a token from kubectl create token NAME --duration, or its pod)")
	case cl.Server == "":
		return nil, errors.New("the cluster has no server")
	}
	su, err := url.Parse(cl.Server)
	if err != nil || su.Host == "" || su.Scheme != "https" && su.Scheme != "http" {
		return nil, fmt.Errorf("the cluster's server %q is not an http(s):// URL", cl.Server)
	}
	var proxy *url.URL
	if cl.ProxyURL != "" {
		// As client-go: http, https (TLS to the proxy) and socks5.
		proxy, err = url.Parse(cl.ProxyURL)
		if err != nil || proxy.Host == "" || proxy.Scheme != "http" && proxy.Scheme != "https" && proxy.Scheme != "socks5" {
			return nil, fmt.Errorf("the cluster's proxy-url %q is not an http://, https:// or socks5:// URL", lock.Redact(cl.ProxyURL))
		}
	}
	hp := su.Host
	if su.Port() == "" {
		port := "443"
		if su.Scheme == "http" {
			port = "80"
		}
		hp = net.JoinHostPort(su.Hostname(), port)
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: cl.TLSServerName, InsecureSkipVerify: cl.InsecureSkipTLSVerify}
	files := &credFiles{}
	caPEM, err := fileOrData(cl.CertificateAuthority, cl.CertificateAuthorityData, cl.dir)
	if err != nil {
		return nil, fmt.Errorf("certificate-authority: %v", err)
	}
	if caPEM != nil {
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(caPEM) {
			return nil, errors.New("certificate-authority: no PEM certificate")
		}
		if cl.CertificateAuthorityData == "" {
			files.ca, files.caPEM = resolve(cl.CertificateAuthority, cl.dir), caPEM
		}
	}
	a := &auth{token: us.Token, username: us.Username, password: us.Password}
	if us.TokenFile != "" {
		a.tokenFile = resolve(us.TokenFile, us.dir)
	}
	certPEM, err := fileOrData(us.ClientCertificate, us.ClientCertificateData, us.dir)
	if err != nil {
		return nil, fmt.Errorf("client-certificate: %v", err)
	}
	keyPEM, err := fileOrData(us.ClientKey, us.ClientKeyData, us.dir)
	if err != nil {
		return nil, fmt.Errorf("client-key: %v", err)
	}
	if (certPEM == nil) != (keyPEM == nil) {
		return nil, errors.New("give both a client certificate and its key")
	}
	if certPEM != nil {
		pair, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			return nil, fmt.Errorf("client certificate: %v", err)
		}
		if us.ClientCertificateData != "" && us.ClientKeyData != "" {
			cfg.Certificates = []tls.Certificate{pair}
		} else {
			// A file is read again when it changes, and the handshake
			// takes the certificate of the moment.
			files.pair = &pair
			if us.ClientCertificateData == "" {
				files.cert = resolve(us.ClientCertificate, us.dir)
			} else {
				files.certPEM = certPEM
			}
			if us.ClientKeyData == "" {
				files.key = resolve(us.ClientKey, us.dir)
			} else {
				files.keyPEM = keyPEM
			}
			cfg.GetClientCertificate = files.certificate
		}
	}
	if us.Username != "" && (us.Token != "" || us.TokenFile != "") {
		return nil, errors.New("the user has a username and password and a token; give one of them")
	}
	// As client-go: credentials written in the kubeconfig (a token, a
	// password, a client certificate) win, and the exec plugin is then not
	// run at all: "kubectl --token" works with any kubeconfig.
	if us.Exec != nil && us.Token == "" && us.TokenFile == "" && us.Username == "" && certPEM == nil {
		e := *us.Exec
		switch e.APIVersion {
		case execV1, execV1beta1:
		default:
			return nil, fmt.Errorf("exec plugin apiVersion %q is not supported; use %s or %s", e.APIVersion, execV1, execV1beta1)
		}
		if e.Command == "" {
			return nil, errors.New("the exec plugin has no command")
		}
		// As kubectl: a command with a slash is relative to the
		// kubeconfig's directory; one without is looked up in PATH.
		if strings.ContainsRune(e.Command, filepath.Separator) {
			e.Command = resolve(e.Command, us.dir)
		}
		a.exec, err = newExecPlugin(e, cl, caPEM)
		if err != nil {
			return nil, err
		}
		// A plugin may answer with a client certificate instead of a
		// token: asked for at each handshake, from the cache.
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			// The request ran the plugin before it dialled.
			if cert := a.exec.certificate(); cert != nil {
				return cert, nil
			}
			return &tls.Certificate{}, nil
		}
	}
	if files.ca == "" && files.pair == nil {
		files = nil
	}
	return &config{server: strings.TrimSuffix(su.String(), "/"), hostport: hp, tls: cfg, auth: a, proxy: proxy,
		files: files, disableCompression: cl.DisableCompression}, nil
}

// stdinIsTerminal says whether withlock's standard input is a terminal:
// only then may an exec plugin talk to the user. A variable for tests.
var stdinIsTerminal = func() bool { return term.IsTerminal(int(os.Stdin.Fd())) }

// newExecPlugin is the exec plugin e of cluster cl (whose CA is caPEM),
// told what kubectl tells it.
func newExecPlugin(e execConfig, cl clusterConfig, caPEM []byte) (*execPlugin, error) {
	p := &execPlugin{cfg: e, cluster: execCluster{
		Server:                   cl.Server,
		TLSServerName:            cl.TLSServerName,
		InsecureSkipTLSVerify:    cl.InsecureSkipTLSVerify,
		CertificateAuthorityData: caPEM,
		ProxyURL:                 cl.ProxyURL,
		DisableCompression:       cl.DisableCompression,
	}}
	for _, ext := range cl.Extensions {
		if ext.Name != execExtension {
			continue
		}
		config, err := json.Marshal(ext.Extension)
		if err != nil {
			return nil, fmt.Errorf("the cluster's %s extension cannot be passed to the exec plugin as JSON: %v", execExtension, err)
		}
		p.cluster.Config = config
	}
	// As kubectl: IfAvailable without a mode (the v1beta1 default; v1
	// asks for one, and IfAvailable is what most plugins are written for).
	switch e.InteractiveMode {
	case "", "IfAvailable":
		p.interactive = stdinIsTerminal()
	case "Always":
		if !stdinIsTerminal() {
			return nil, fmt.Errorf("the exec plugin %s needs a terminal (interactiveMode: Always) and standard input is not one; run withlock from a terminal, or set interactiveMode: IfAvailable in the kubeconfig if the plugin can do without one", e.Command)
		}
		p.interactive = true
	case "Never":
	default:
		return nil, fmt.Errorf("the exec plugin's interactiveMode %q is not one of Never, IfAvailable, Always", e.InteractiveMode)
	}
	return p, nil
}

// authProviderWayOut says, per legacy auth-provider, the exec plugin that
// replaces it.
var authProviderWayOut = map[string]string{
	"oidc":  "kubelogin: kubectl oidc-login setup prints the exec user to write",
	"gcp":   "gke-gcloud-auth-plugin; gcloud container clusters get-credentials writes it",
	"azure": "kubelogin: kubelogin convert-kubeconfig rewrites the kubeconfig",
	"":      "kubelogin for OIDC, gke-gcloud-auth-plugin, aws eks get-token",
}

// fileOrData reads a kubeconfig value given as a file (relative to the
// kubeconfig's directory) or inline as base64 (-data); nil if neither.
func fileOrData(file, data, dir string) ([]byte, error) {
	if data != "" {
		b, err := decodeB64(data)
		if err != nil {
			return nil, fmt.Errorf("not base64: %v", err)
		}
		return b, nil
	}
	if file == "" {
		return nil, nil
	}
	return os.ReadFile(resolve(file, dir))
}

func resolve(path, dir string) string {
	if filepath.IsAbs(path) || dir == "" {
		return path
	}
	return filepath.Join(dir, path)
}

// isLabel reports whether s is a DNS-1123 label, as namespace names are.
func isLabel(s string) bool {
	return len(s) <= 63 && isSubdomainPart(s)
}
