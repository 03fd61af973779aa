package etcd

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/withlock/withlock/internal/lock"
)

// member is one member of the cluster, as MemberList says it.
type member struct {
	ID         string   `json:"ID"`
	Name       string   `json:"name"`
	ClientURLs []string `json:"clientURLs"`
}

// memberStatus is what a member says of itself (Maintenance.Status): its
// id and the leader it knows ("0" or empty for none).
type memberStatus struct {
	Header struct {
		MemberID string `json:"member_id"`
	} `json:"header"`
	Leader string `json:"leader"`
}

// memberTimeout bounds each member's answer to withlock check.
const memberTimeout = 2 * time.Second

// Findings reports the cluster's health (withlock check): every member that
// MemberList names is asked for its status on its own client URL, then,
// if it knows a leader, for a linearizable read of the probe's keys, which
// needs the leader as every lock's requests do; a member that does not
// answer, knows no leader or cannot reach the one it knows (cut off from
// its peers, it may still follow the leader), weakens every lock (one more
// failure and no lock can be taken, renewed or released). The probe lock
// itself took a lease and put and read a key under the lock's prefix, so
// the rights a lock needs, and the read, are shown already.
func (b *backend) Findings(ctx context.Context, probe string) ([]lock.Finding, error) {
	var list struct {
		Members []member `json:"members"`
	}
	if err := b.c.do(ctx, "/v3/cluster/member/list", struct{}{}, &list); err != nil {
		return []lock.Finding{{Name: "cluster", Status: lock.Warn,
			Detail: fmt.Sprintf("etcd at %s would not list its members (%v): cannot tell whether a member is down", b.addr, err)}}, nil
	}
	var down, leaderless, cutOff []string
	for _, m := range list.Members {
		name := m.Name
		if name == "" {
			name = m.ID // a member added but not started yet has no name
		}
		if len(m.ClientURLs) == 0 {
			down = append(down, name+" (not started)")
			continue
		}
		st, err := b.c.statusAt(ctx, m.ClientURLs[0])
		switch {
		case err != nil:
			down = append(down, fmt.Sprintf("%s at %s (%s)", name, m.ClientURLs[0], lock.Reason(err)))
		case st.Leader == "" || st.Leader == "0":
			leaderless = append(leaderless, name)
		default:
			if err := b.c.readAt(ctx, m.ClientURLs[0], Prefix(probe)); err != nil {
				cutOff = append(cutOff, fmt.Sprintf("%s (%s)", name, lock.Reason(err)))
			}
		}
	}
	return []lock.Finding{clusterFinding(b.addr, len(list.Members), down, leaderless, cutOff)}, nil
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

// statusAt asks the member whose client URL is base for its status, with
// the client's token: the member may be none of the URL's endpoints.
func (c *client) statusAt(ctx context.Context, base string) (*memberStatus, error) {
	var st memberStatus
	return &st, c.askMember(ctx, base, "/v3/maintenance/status", struct{}{}, &st)
}

// readAt counts the keys under prefix on the member whose client URL is
// base, linearizably: the member must reach the leader to answer.
func (c *client) readAt(ctx context.Context, base, prefix string) error {
	var resp rangeResponse
	return c.askMember(ctx, base, "/v3/kv/range", &rangeRequest{Key: []byte(prefix), RangeEnd: prefixEnd(prefix), CountOnly: true}, &resp)
}

// askMember sends in to path on the member whose client URL is base, with
// the client's token, within memberTimeout, and decodes the answer into
// out.
func (c *client) askMember(ctx context.Context, base, path string, in, out any) error {
	ctx, cancel := context.WithTimeout(ctx, memberTimeout)
	defer cancel()
	body, err := json.Marshal(in)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimSuffix(base, "/")+path, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	c.mu.Lock()
	if c.token != "" {
		req.Header.Set("Authorization", c.token)
	}
	c.mu.Unlock()
	resp, err := c.hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return httpError(resp)
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("reading etcd's answer: %w", err)
	}
	return nil
}
