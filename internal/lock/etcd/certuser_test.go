package etcd_test

import (
	"errors"
	clientv3 "go.etcd.io/etcd/client/v3"
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
// off. With authentication on, a user known only by a certificate's Common
// Name, allowed the lock's keys and no more, takes the lock with no user
// in the URL, and withlock check passes; the lock excludes: a waiter gets
// it only once the holder lets go, after renewals of each. On the system's
// etcd and every release the tests build, at once.
func TestClientCertUser(t *testing.T) {
	for _, v := range append([]string{""}, testenv.EtcdVersions...) {
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
			// withlock check takes its probe lock on a name of its own.
			if _, err := client(t, e).RoleGrantPermission(locktest.Context(t), testenv.EtcdCertCN+"-role", "withlock-check-", clientv3.GetPrefixRangeEnd("withlock-check-"), clientv3.PermissionType(clientv3.PermReadWrite)); err != nil {
				t.Fatal(err)
			}

			u := withCert(nil, "server")
			if _, err := locktest.Open(t, u, opts).Check(locktest.Context(t)); err != nil {
				t.Errorf("withlock check as the certificate's user %q: %v", testenv.EtcdCertCN, err)
			}
			if _, err := locktest.Open(t, withCert(nil, "server"), opts).Acquire(locktest.Context(t), "other/"+name); !errors.Is(err, lock.ErrRefused) || !strings.Contains(err.Error(), "permission denied") {
				t.Errorf("a name outside the user's keys: %v; want ErrRefused, permission denied", err)
			}
			holder, err := locktest.Open(t, u, opts).Acquire(locktest.Context(t), name)
			if err != nil {
				t.Fatalf("a certificate named %q, its user's keys: %v", testenv.EtcdCertCN, err)
			}
			got := make(chan *lock.Held, 1)
			go func() {
				h, err := locktest.Open(t, u, opts).Acquire(locktest.Context(t), name)
				if err != nil {
					t.Error(err)
				}
				got <- h
			}()
			waitWatchers(t, e, 2)
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
