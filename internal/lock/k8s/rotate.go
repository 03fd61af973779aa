package k8s

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"os"
	"sync"
	"syscall"
	"time"
)

// credFiles are the CA and client certificate files of a config, read
// again when they change during a run. A hold lasts as long as its
// command, and meanwhile the kubelet rewrites a pod's ca.crt when the
// cluster's CA rotates, and cert-manager or kubelet-style rotation replaces
// a client certificate before it expires: what was read at start may stop
// working mid-hold.
//
// Each request checks the files' identity (inode, size, modification
// time), a stat each, as client-go checks its CA and certificate files. A
// file that cannot be read, or does not parse (caught half-written, or a
// certificate whose key is not written yet), keeps the last good value and
// is tried again at the next request: a file replaced non-atomically is
// not a lost lock.
type credFiles struct {
	ca        string // the CA file; "" if the CA is inline or the system's
	cert, key string // the client certificate and key; "" if inline or none
	// certPEM, keyPEM are the client certificate's and key's inline
	// data, when only one of the two is a file.
	certPEM, keyPEM []byte

	mu        sync.Mutex
	caStamp   fileStamp
	caPEM     []byte // the last good CA file
	certStamp [2]fileStamp
	pair      *tls.Certificate // the last good client certificate
}

// fileStamp says which version of a file was last read.
type fileStamp struct {
	ino, size uint64
	mtime     time.Time
}

func stampOf(path string) (fileStamp, bool) {
	fi, err := os.Stat(path) // follows the symlinks of a projected volume
	if err != nil {
		return fileStamp{}, false
	}
	s := fileStamp{size: uint64(fi.Size()), mtime: fi.ModTime()}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		s.ino = uint64(st.Ino)
	}
	return s, true
}

// certificate is the client certificate to present, for
// tls.Config.GetClientCertificate: the last good one.
func (f *credFiles) certificate(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.pair, nil
}

// refresh reads again the files that changed since they were last read. It
// returns the new CA pool if the CA changed, and whether the client
// certificate did.
func (f *credFiles) refresh() (roots *x509.CertPool, certChanged bool) {
	if f == nil {
		return nil, false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.ca != "" {
		if s, ok := stampOf(f.ca); ok && s != f.caStamp {
			if pem, err := os.ReadFile(f.ca); err == nil {
				pool := x509.NewCertPool()
				if pool.AppendCertsFromPEM(pem) {
					f.caStamp = s
					if !bytes.Equal(pem, f.caPEM) {
						f.caPEM, roots = pem, pool
					}
				}
			}
		}
	}
	if f.cert != "" || f.key != "" {
		var stamps [2]fileStamp
		ok := true
		for i, path := range []string{f.cert, f.key} {
			if path != "" {
				var found bool
				stamps[i], found = stampOf(path)
				ok = ok && found
			}
		}
		if ok && stamps != f.certStamp {
			if pair, err := f.loadPair(); err == nil {
				f.certStamp = stamps
				if f.pair == nil || !sameCert(f.pair, pair) {
					certChanged = f.pair != nil
					f.pair = pair
				}
			}
		}
	}
	return roots, certChanged
}

// loadPair reads the client certificate and key.
func (f *credFiles) loadPair() (*tls.Certificate, error) {
	certPEM, keyPEM := f.certPEM, f.keyPEM
	var err error
	if f.cert != "" {
		if certPEM, err = os.ReadFile(f.cert); err != nil {
			return nil, err
		}
	}
	if f.key != "" {
		if keyPEM, err = os.ReadFile(f.key); err != nil {
			return nil, err
		}
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, err
	}
	return &pair, nil
}
