package etcd

import (
	"context"
	"fmt"
	"strings"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/withlock/withlock/internal/lock"
)

// memberTimeout bounds each member's answer to withlock check.
const memberTimeout = 2 * time.Second

// Findings reports the cluster's health (withlock check): every voting
// member that MemberList names is asked for its status on its own client
// URL, then, if it knows a leader, for a linearizable read of the probe's
// keys, which needs the leader as every lock's requests do; a member that
// does not answer, knows no leader or cannot reach the one it knows (cut
// off from its peers, it may still follow the leader), weakens every lock
// (one more failure and no lock can be taken, renewed or released).
// Learners vote on nothing and serve no lock: they are named, not judged.
// The probe lock itself took a lease and put and read a key under the
// lock's prefix, so the rights a lock needs, and the read, are shown
// already.
func (b *backend) Findings(ctx context.Context, probe string) ([]lock.Finding, error) {
	c, err := b.conn(ctx)
	if err != nil {
		return nil, err
	}
	list, err := c.MemberList(ctx)
	if err != nil {
		return []lock.Finding{{Name: "cluster", Status: lock.Warn,
			Detail: fmt.Sprintf("etcd at %s would not list its members (%v): cannot tell whether a member is down", b.addr, lock.Reason(b.classify(err)))}}, nil
	}
	var voters int
	var down, leaderless, cutOff, learners []string
	for _, m := range list.Members {
		name := m.Name
		if name == "" {
			name = fmt.Sprintf("%x", m.ID) // a member added but not started yet has no name
		}
		if m.IsLearner {
			learners = append(learners, name)
			continue
		}
		voters++
		if len(m.ClientURLs) == 0 {
			down = append(down, name+" (not started)")
			continue
		}
		ep := m.ClientURLs[0]
		st, err := b.statusAt(ctx, c, ep)
		switch {
		case err != nil:
			down = append(down, fmt.Sprintf("%s at %s (%s)", name, ep, lock.Reason(b.classify(err))))
		case st.Leader == 0:
			leaderless = append(leaderless, name)
		default:
			if err := b.readAt(ctx, c, ep, Prefix(probe)); err != nil {
				cutOff = append(cutOff, fmt.Sprintf("%s (%s)", name, lock.Reason(b.classify(err))))
			}
		}
	}
	f := clusterFinding(b.addr, voters, down, leaderless, cutOff)
	if len(learners) > 0 {
		f.Detail += fmt.Sprintf("; learners %s (not voting, serving no lock)", strings.Join(learners, ", "))
	}
	return []lock.Finding{f}, nil
}

// statusAt asks the member whose client URL is ep for its status, within
// memberTimeout.
func (b *backend) statusAt(ctx context.Context, c *clientv3.Client, ep string) (*clientv3.StatusResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, memberTimeout)
	defer cancel()
	return c.Status(ctx, ep)
}

// readAt counts the keys under prefix on the member whose client URL is
// ep, linearizably (the member must reach the leader to answer), within
// memberTimeout, with the client's credentials.
func (b *backend) readAt(ctx context.Context, c *clientv3.Client, ep, prefix string) error {
	ctx, cancel := context.WithTimeout(ctx, memberTimeout)
	defer cancel()
	conn, err := c.Dial(ep)
	if err != nil {
		return err
	}
	defer conn.Close()
	_, err = pb.NewKVClient(conn).Range(ctx, &pb.RangeRequest{Key: []byte(prefix), RangeEnd: []byte(clientv3.GetPrefixRangeEnd(prefix)), CountOnly: true})
	return err
}

// clusterFinding judges a cluster of n members of which down do not
// answer, leaderless answer but know no leader, and cutOff know one but
// cannot serve a linearizable read.
func clusterFinding(addr string, n int, down, leaderless, cutOff []string) lock.Finding {
	quorum := n/2 + 1
	spare := n - quorum // members that may fail with the cluster still up
	switch {
	case len(leaderless) > 0:
		return lock.Finding{Name: "cluster", Status: lock.Warn,
			Detail: fmt.Sprintf("etcd at %s: members %s know no leader: no lock can be taken, renewed or released there until one is elected", addr, strings.Join(leaderless, ", ")),
			Fix:    "bring the cluster's members back so that a majority can elect a leader"}
	case len(cutOff) > 0:
		return lock.Finding{Name: "cluster", Status: lock.Warn,
			Detail: fmt.Sprintf("etcd at %s: members %s know a leader but cannot serve a linearizable read within %s: cut off from their peers? No lock can be taken, renewed or released through them; a URL that names others too moves on to those", addr, strings.Join(cutOff, "; "), memberTimeout),
			Fix:    "restore those members' network to their peers, and name several members in the URL"}
	case len(down) > 0:
		return lock.Finding{Name: "cluster", Status: lock.Warn,
			Detail: fmt.Sprintf("etcd at %s: %d of %d members do not answer: %s; the cluster holds locks while a majority (%d) is up, and %d more failures stop every lock", addr, len(down), n, strings.Join(down, "; "), quorum, max(n-len(down)-quorum+1, 0)),
			Fix:    "bring the members back, or remove them from the cluster"}
	case n == 1:
		return lock.Finding{Name: "cluster", Status: lock.Ok,
			Detail: fmt.Sprintf("etcd at %s is a single member: its locks last as long as it does, and none can be taken while it is down", addr)}
	}
	return lock.Finding{Name: "cluster", Status: lock.Ok,
		Detail: fmt.Sprintf("etcd at %s: all %d members answer and know a leader; the cluster keeps its locks with up to %d down", addr, n, spare)}
}
