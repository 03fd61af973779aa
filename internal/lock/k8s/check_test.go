package k8s_test

import (
	"strings"
	"testing"

	"github.com/withlock/withlock/internal/lock"
	"github.com/withlock/withlock/internal/lock/locktest"
)

// TestCheck: withlock check asks the API server for the account's rights
// on Leases, and deletes its probe's Lease, which a release keeps for a
// lock's next holder: none is left in the namespace. (rbac.txtar checks an
// account without delete.)
func TestCheck(t *testing.T) {
	k, ns, url := space(t)
	c := locktest.Open(t, url, lock.Options{})
	findings, err := c.Check(locktest.Context(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(findings) != 2 || findings[0].Status != lock.Ok || findings[1].Name != "rights" || findings[1].Status != lock.Ok {
		t.Errorf("%+v; want the probe lock and the rights, both ok", findings)
	}
	var list struct {
		Items []struct {
			Metadata struct{ Name string } `json:"metadata"`
		} `json:"items"`
	}
	if err := k.Do("GET", "/apis/coordination.k8s.io/v1/namespaces/"+ns+"/leases", nil, &list); err != nil {
		t.Fatal(err)
	}
	for _, l := range list.Items {
		if strings.HasPrefix(l.Metadata.Name, lock.ProbePrefix) {
			t.Errorf("the probe's Lease %s was left behind", l.Metadata.Name)
		}
	}
}
