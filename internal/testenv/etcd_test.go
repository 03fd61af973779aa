package testenv

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

func etcdClient(t *testing.T, e *Etcd) *clientv3.Client {
	t.Helper()
	c, err := e.Client()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestStartEtcd(t *testing.T) {
	start := time.Now()
	a := RequireEtcd(t)
	t.Logf("first server: %v", time.Since(start))
	b := RequireEtcd(t)
	if a.Port == b.Port || a.PeerPort == b.PeerPort || a.Dir == b.Dir {
		t.Fatalf("servers share a port or dir: %+v %+v", a, b)
	}
	if !strings.HasPrefix(a.URL, "etcd://127.0.0.1:") {
		t.Errorf("URL = %q", a.URL)
	}
	ca := etcdClient(t, a)
	if _, err := ca.Put(ctx(t), "k", "v"); err != nil {
		t.Fatal(err)
	}
	// The server's smallest lease is 1s (see Etcd).
	g, err := ca.Grant(ctx(t), 1)
	if err != nil || g.TTL != 1 {
		t.Errorf("Grant(1): TTL %v, %v; want 1", g, err)
	}
	// Stop keeps the data; Start brings it back on the same port.
	if err := a.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := a.Start(); err != nil {
		t.Fatal(err)
	}
	resp, err := ca.Get(ctx(t), "k")
	if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "v" {
		t.Errorf("Get after a restart: %v, %v", resp, err)
	}
	// b is a server of its own.
	if resp, err := etcdClient(t, b).Get(ctx(t), "k"); err != nil || len(resp.Kvs) != 0 {
		t.Errorf("Get on the other server: %v, %v", resp, err)
	}
	dir := a.Dir
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("Dir after Close: %v", err)
	}
}

func TestEtcdPause(t *testing.T) {
	e := RequireEtcd(t)
	c := etcdClient(t, e)
	if err := e.Pause(); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx(t), 300*time.Millisecond)
	_, err := c.Get(short, "k")
	cancel()
	if err == nil {
		t.Error("a paused server answered")
	}
	if err := e.Resume(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Get(ctx(t), "k"); err != nil {
		t.Errorf("after Resume: %v", err)
	}
}

func TestEtcdTLS(t *testing.T) {
	e := RequireEtcdWith(t, EtcdOptions{TLS: true})
	if !strings.HasPrefix(e.URL, "etcds://127.0.0.1:") || !strings.Contains(e.URL, "cacert=") {
		t.Errorf("URL = %q", e.URL)
	}
	if _, err := etcdClient(t, e).Put(ctx(t), "k", "v"); err != nil {
		t.Fatal(err)
	}
	// etcdctl, as the scripts run it, trusts the certificate it is given.
	if _, err := exec.LookPath("etcdctl"); err == nil {
		out, err := exec.Command("etcdctl", "--endpoints", e.Endpoint, "--cacert", e.CertFile, "get", "k").CombinedOutput()
		if err != nil || !strings.Contains(string(out), "v") {
			t.Errorf("etcdctl get over TLS: %v\n%s", err, out)
		}
	}
}

func TestEtcdAuth(t *testing.T) {
	e := RequireEtcd(t)
	if err := e.EnableAuth("rootpw"); err != nil {
		t.Fatal(err)
	}
	if err := e.AddUser("app", "apppw", "jobs/"); err != nil {
		t.Fatal(err)
	}
	root := etcdClient(t, e)
	if _, err := root.Put(ctx(t), "k", "v"); err != nil {
		t.Fatalf("root: %v", err)
	}
	e.root = "wrong"
	if c, err := e.Client(); err == nil {
		c.Close()
		t.Error("a wrong password was accepted")
	} else if !errors.Is(err, rpctypes.ErrAuthFailed) {
		t.Errorf("a wrong password: %v; want ErrAuthFailed", err)
	}
	// app may write under jobs/ only.
	app, err := clientv3.New(clientv3.Config{Endpoints: []string{e.Endpoint}, Username: "app", Password: "apppw", DialTimeout: 10 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer app.Close()
	if _, err := app.Put(ctx(t), "jobs/a", "v"); err != nil {
		t.Errorf("app under jobs/: %v", err)
	}
	if _, err := app.Put(ctx(t), "other", "v"); !errors.Is(err, rpctypes.ErrPermissionDenied) {
		t.Errorf("app outside jobs/: %v; want ErrPermissionDenied", err)
	}
}

func TestEtcdWatchers(t *testing.T) {
	e := RequireEtcd(t)
	c := etcdClient(t, e)
	n, err := e.Watchers()
	if err != nil || n != 0 {
		t.Fatalf("Watchers of a new server: %d, %v", n, err)
	}
	wctx, cancel := context.WithCancel(ctx(t))
	defer cancel()
	c.Watch(wctx, "k")
	deadline := time.Now().Add(10 * time.Second)
	for {
		if n, err = e.Watchers(); err != nil || n == 1 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err != nil || n != 1 {
		t.Errorf("Watchers with one watch: %d, %v", n, err)
	}
}
