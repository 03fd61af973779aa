package etcd_test

import (
	"strings"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/withlock/withlock/internal/lock"
	"github.com/withlock/withlock/internal/lock/locktest"
	"github.com/withlock/withlock/internal/testenv"
)

// TestCheck: withlock check asks every member of the cluster for its
// status: a 3-member cluster with all up passes, one with a member stopped
// is a warning that names it; nothing of the probe is left.
func TestCheck(t *testing.T) {
	testenv.RequireEtcd(t) // the binary, or a skip that says how to get it
	members := startCluster(t)
	check := func() lock.Finding {
		t.Helper()
		c := locktest.Open(t, members[0].URL, lock.Options{})
		findings, err := c.Check(locktest.Context(t))
		if err != nil {
			t.Fatal(err)
		}
		if len(findings) != 2 || findings[0].Status != lock.Ok || findings[1].Name != "cluster" {
			t.Fatalf("%+v; want the probe lock ok, then the cluster", findings)
		}
		return findings[1]
	}
	if f := check(); f.Status != lock.Ok || !strings.Contains(f.Detail, "all 3 members answer") {
		t.Errorf("all up: %s %s", f.Status, f.Detail)
	}
	if err := members[2].Stop(); err != nil {
		t.Fatal(err)
	}
	if f := check(); f.Status != lock.Warn || !strings.Contains(f.Detail, "1 of 3 members do not answer: m2 at ") {
		t.Errorf("m2 stopped: %s %s", f.Status, f.Detail)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{members[0].Endpoint}})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	resp, err := cli.Get(locktest.Context(t), lock.ProbePrefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	if resp.Count != 0 {
		t.Errorf("%d keys of the probe lock left", resp.Count)
	}
}

// TestCheckSingle: one member is fine, and says what that means.
func TestCheckSingle(t *testing.T) {
	e := testenv.RequireEtcd(t)
	c := locktest.Open(t, e.URL, lock.Options{})
	findings, err := c.Check(locktest.Context(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(findings) != 2 || findings[1].Status != lock.Ok || !strings.Contains(findings[1].Detail, "single member") {
		t.Errorf("%+v", findings)
	}
}
