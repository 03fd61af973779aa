package etcd_test

import (
	"errors"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/withlock/withlock/internal/lock"
	"github.com/withlock/withlock/internal/lock/locktest"
	"github.com/withlock/withlock/internal/testenv"
)

// TestClientCertUser: a server that asks for client certificates
// (--client-cert-auth) takes any the test CA signed while authentication is
// off. With authentication on and a user named as a certificate's Common
// Name, allowed the lock's keys, etcd's JSON gateway, which withlock
// speaks, refuses every request whose certificate has a Common Name, with a
// user in the URL or without: acquisition and withlock check are refused
// (ErrRefused, exit 69) with an error that says what to do instead. A
// certificate without a Common Name and the user in the URL take the lock,
// and it excludes: a waiter gets it only once the holder lets go. On the
// system's etcd and the newest release the tests build, at once.
func TestClientCertUser(t *testing.T) {
	for _, v := range []string{"", testenv.EtcdVersions[len(testenv.EtcdVersions)-1]} {
		name := "system"
		if v != "" {
			name = v
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := testenv.RequireEtcd(t, testenv.EtcdOptions{TLS: true, ClientCertAuth: true, Version: v})
			dir := filepath.Dir(e.CertFile)
			withCert := func(user *url.Userinfo, cert string) string {
				u, _ := url.Parse(e.URL + "&cert=" + filepath.Join(dir, cert+".crt") + "&key=" + filepath.Join(dir, cert+".key"))
				u.User = user
				return u.String()
			}
			name := "jobs/" + locktest.Name(t)
			opts := lock.Options{TTL: 3 * time.Second, Grace: time.Second}
			// Without authentication the Common Name does not matter.
			l, err := locktest.Open(t, withCert(nil, "server"), opts).TryAcquire(locktest.Context(t), name)
			if err != nil {
				t.Fatalf("a certificate named %q, authentication off: %v", testenv.EtcdCertCN, err)
			}
			if err := l.Release(locktest.Context(t)); err != nil {
				t.Fatal(err)
			}

			enableAuth(t, e, "rootpw")
			addUser(t, e, testenv.EtcdCertCN, "cnpw", "jobs/")
			addUser(t, e, "wl", "wlpw", "jobs/")

			for _, u := range []string{withCert(nil, "server"), withCert(url.UserPassword(testenv.EtcdCertCN, "cnpw"), "server")} {
				_, err := locktest.Open(t, u, opts).TryAcquire(locktest.Context(t), name)
				if !errors.Is(err, lock.ErrRefused) || !strings.Contains(err.Error(), "certificate without a Common Name") || !strings.Contains(err.Error(), "USER:PASSWORD@") {
					t.Errorf("a certificate named %q (URL user %v): %v; want ErrRefused saying to use a certificate without a Common Name and the user in the URL", testenv.EtcdCertCN, strings.Contains(u, "@"), err)
				}
				_, err = locktest.Open(t, u, opts).Check(locktest.Context(t))
				if !errors.Is(err, lock.ErrRefused) || !strings.Contains(err.Error(), "certificate without a Common Name") {
					t.Errorf("withlock check with a certificate named %q: %v; want the same refusal", testenv.EtcdCertCN, err)
				}
			}

			u := withCert(url.UserPassword("wl", "wlpw"), "client")
			holder, err := locktest.Open(t, u, opts).Acquire(locktest.Context(t), name)
			if err != nil {
				t.Fatalf("a certificate without a Common Name and the user in the URL: %v", err)
			}
			got := make(chan *lock.Held, 1)
			go func() {
				h, err := locktest.Open(t, u, opts).Acquire(locktest.Context(t), name)
				if err != nil {
					t.Error(err)
				}
				got <- h
			}()
			waitWatchers(t, e, 1)
			select {
			case h := <-got:
				t.Fatalf("the waiter got the lock while the holder held it (%v)", h != nil)
			case <-holder.Lost():
				t.Fatalf("the holder lost its lock: %v", holder.Err())
			case <-time.After(opts.TTL): // a renewal of each, over the certificate
			}
			if err := holder.Release(locktest.Context(t)); err != nil {
				t.Fatal(err)
			}
			select {
			case h := <-got:
				if h == nil {
					t.Fatal("the waiter failed")
				}
				h.Release(locktest.Context(t))
			case <-time.After(10 * time.Second):
				t.Fatal("the waiter did not get the lock within 10s of the release")
			}
		})
	}
}
