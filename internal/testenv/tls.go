package testenv

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// EnableTLS gives the server a new self-signed certificate for 127.0.0.1 and
// localhost, turns ssl on and restarts it (Configure, with settings too, if
// any). Clients may still connect without TLS: pg_hba's host lines match both.
// It returns the certificate's file, for clients' sslrootcert.
func (p *Postgres) EnableTLS(settings ...string) (rootCert string, err error) {
	certPEM, keyPEM, err := selfSigned()
	if err != nil {
		return "", fmt.Errorf("testenv: %w", err)
	}
	for name, data := range map[string][]byte{"server.crt": certPEM, "server.key": keyPEM} {
		file := filepath.Join(p.dataDir(), name)
		if err := os.WriteFile(file, data, 0o600); err != nil { // the server refuses a key others can read
			return "", fmt.Errorf("testenv: %w", err)
		}
		if err := p.inst.chown(file); err != nil {
			return "", err
		}
	}
	rootCert = filepath.Join(p.Dir, "root.crt")
	if err := os.WriteFile(rootCert, certPEM, 0o644); err != nil {
		return "", fmt.Errorf("testenv: %w", err)
	}
	return rootCert, p.Configure(strings.Join(append([]string{"ssl = on"}, settings...), "\n"))
}

func selfSigned() (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "withlock test server"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1)},
		DNSNames:              []string{"localhost"},
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
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
