package mysql

import (
	"errors"
	"strings"
	"testing"

	"github.com/withlock/withlock/internal/lock"
)

// TestServerTraps: which servers are refused, lost or warned of, from
// what Detect read (the tests against real servers make each of these
// states but a held lock on a single node that leaves the Primary
// component, which only a failure of the cluster's other nodes makes).
func TestServerTraps(t *testing.T) {
	const addr = "db:3306"
	single := Server{Galera: true, ClusterSize: 1, ClusterStatus: "Primary", Ready: true}
	for _, tc := range []struct {
		s    Server
		want string // in the refusal and the loss; "" for neither
		kind error  // the refusal's
	}{
		{Server{}, "", nil},
		{Server{Replicating: true}, "", nil},
		{single, "", nil},
		{Server{ReadOnly: true}, "read-only", lock.ErrRefused},
		{Server{ReadOnly: true, Galera: true, ClusterSize: 1, ClusterStatus: "Primary", Ready: true}, "read-only", lock.ErrRefused},
		{Server{Galera: true, ClusterSize: 3, ClusterStatus: "Primary", Ready: true}, "Galera cluster of 3 nodes", lock.ErrRefused},
		{Server{Galera: true, ClusterSize: 2, ClusterStatus: "non-Primary"}, "Galera cluster of 2 nodes", lock.ErrRefused},
		{Server{Galera: true, ClusterSize: 1, ClusterStatus: "non-Primary"}, "wsrep_cluster_status non-Primary, wsrep_ready OFF", lock.ErrUnavailable},
		{Server{Galera: true, ClusterSize: 1, ClusterStatus: "Primary"}, "wsrep_ready OFF", lock.ErrUnavailable},
		{Server{Galera: true, ClusterStatus: "Disconnected"}, "wsrep_cluster_status Disconnected", lock.ErrUnavailable},
	} {
		refused, lost := tc.s.Refusal(addr), tc.s.loss(addr)
		switch {
		case tc.want == "" && (refused != nil || lost != nil):
			t.Errorf("%+v: refused %v, lost %v; want neither", tc.s, refused, lost)
		case tc.want == "":
		case !errors.Is(refused, tc.kind) || !strings.Contains(refused.Error(), tc.want) || !strings.Contains(refused.Error(), addr):
			t.Errorf("%+v: refused %v; want %v saying %q", tc.s, refused, tc.kind, tc.want)
		case !errors.Is(lost, lock.ErrLost) || !strings.Contains(lost.Error(), tc.want):
			t.Errorf("%+v: lost %v; want ErrLost saying %q", tc.s, lost, tc.want)
		}
	}
	if w := (Server{Replicating: true}).Warning(addr); !strings.Contains(w, "mysql at db:3306 replicates") {
		t.Errorf("Warning of a replica that is not read-only: %q", w)
	}
	for _, s := range []Server{{}, single, {Replicating: true, ReadOnly: true}} {
		if w := s.Warning(addr); w != "" {
			t.Errorf("Warning of %+v: %q; want none", s, w)
		}
	}
}
