package lock

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"net/url"
	"os"
	"strings"
)

// TLSFiles reads the TLS options that withlock's URLs share, named as
// etcdctl's and redis-cli's flags are: cacert, a PEM file of the CAs to
// trust instead of the system's; cert and key, a client certificate and its
// key, for servers that ask for one. It returns nil if q has none of them,
// and an ErrUsage naming what (say "redis URL") if a file cannot be read.
// The caller removes the three from q itself if its driver refuses options
// it does not know.
func TLSFiles(what string, q url.Values) (*tls.Config, error) {
	cacert, cert, key := q.Get("cacert"), q.Get("cert"), q.Get("key")
	if cacert == "" && cert == "" && key == "" {
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if cacert != "" {
		pem, err := os.ReadFile(cacert)
		if err != nil {
			return nil, Errorf(ErrUsage, "%s: cacert: %v", what, err)
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, Errorf(ErrUsage, "%s: cacert: no PEM certificate in %s", what, cacert)
		}
	}
	if (cert == "") != (key == "") {
		return nil, Errorf(ErrUsage, "%s: give both cert and key for a client certificate", what)
	}
	if cert != "" {
		pair, err := tls.LoadX509KeyPair(cert, key)
		if err != nil {
			return nil, Errorf(ErrUsage, "%s: cert and key: %v", what, err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg, nil
}

// TLSRefusal reports whether err is the end of a TLS handshake that trying
// again will not change: the server's certificate is not trusted or not for
// this host, the server refused the client's (a TLS alert), or the other
// side does not speak TLS at all. Backends report it as ErrRefused, with
// what to fix (cacert, cert and key, or the URL's scheme).
func TLSRefusal(err error) bool {
	var (
		verify   *tls.CertificateVerificationError
		unknown  x509.UnknownAuthorityError
		hostname x509.HostnameError
		invalid  x509.CertificateInvalidError
		header   tls.RecordHeaderError
		op       *net.OpError
	)
	return errors.As(err, &verify) || errors.As(err, &unknown) || errors.As(err, &hostname) ||
		errors.As(err, &invalid) || errors.As(err, &header) ||
		errors.As(err, &op) && op.Op == "remote error" ||
		strings.Contains(err.Error(), "server gave HTTP response to HTTPS client")
}
