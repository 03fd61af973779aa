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
	"syscall"
	"time"
)

// writeCerts writes into dir a new CA (ca.crt) and a certificate it signed
// (server.crt, server.key, owned by asUser if not nil: servers refuse a key
// others can read), and returns ca.crt's path. The certificate names
// 127.0.0.1 alone, so that a client that connects to "localhost" meets a
// certificate for another host name. It is good for client authentication
// too: a test that makes a server ask for client certificates gives clients
// the server's own pair, whose Common Name is certCN, or client.crt and
// client.key, a pair for client authentication alone without a Common Name.
func writeCerts(dir string, asUser *syscall.Credential) (caFile string, err error) {
	caKey, caDER, err := newCert(nil, nil, "")
	if err != nil {
		return "", err
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, der, err := newCert(ca, caKey, certCN)
	if err != nil {
		return "", err
	}
	clientKey, clientDER, err := newCert(ca, caKey, "")
	if err != nil {
		return "", err
	}
	keyDER, _ := x509.MarshalECPrivateKey(key)
	clientKeyDER, _ := x509.MarshalECPrivateKey(clientKey)
	files := map[string][]byte{
		"ca.crt":     pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		"server.crt": pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		"server.key": pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}),
		"client.crt": pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: clientDER}),
		"client.key": pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: clientKeyDER}),
	}
	for name, data := range files {
		file := filepath.Join(dir, name)
		if err := os.WriteFile(file, data, 0o600); err != nil {
			return "", fmt.Errorf("testenv: %w", err)
		}
		if asUser != nil {
			os.Chown(file, int(asUser.Uid), int(asUser.Gid))
		}
	}
	return filepath.Join(dir, "ca.crt"), os.Chmod(filepath.Join(dir, "ca.crt"), 0o644)
}

// certCN is the Common Name of the certificates writeCerts writes.
const certCN = "withlock test server"

// newCert makes a key and a certificate for 127.0.0.1 named cn signed by
// parent, or a CA's self-signed one when parent is nil.
func newCert(parent *x509.Certificate, parentKey *ecdsa.PrivateKey, cn string) (*ecdsa.PrivateKey, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("testenv: %w", err)
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	if parent == nil {
		tmpl.Subject.CommonName, tmpl.IPAddresses = "withlock test CA", nil
		tmpl.IsCA, tmpl.BasicConstraintsValid, tmpl.KeyUsage = true, true, x509.KeyUsageCertSign
		parent, parentKey = tmpl, key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	if err != nil {
		return nil, nil, fmt.Errorf("testenv: %w", err)
	}
	return key, der, nil
}
