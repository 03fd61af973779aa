package etcd

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"time"
)

// The messages, as the gateway writes etcdserverpb's in JSON (proto field
// names, int64 as strings, bytes in base64, enums by name, zero values
// left out).

type header struct {
	Revision int64 `json:"revision,string"`
}

type keyValue struct {
	Key            []byte `json:"key"`
	CreateRevision int64  `json:"create_revision,string"`
	ModRevision    int64  `json:"mod_revision,string"`
	Value          []byte `json:"value"`
	Lease          int64  `json:"lease,string"`
}

type rangeRequest struct {
	Key        []byte `json:"key"`
	RangeEnd   []byte `json:"range_end,omitempty"`
	Limit      int64  `json:"limit,omitempty,string"`
	Revision   int64  `json:"revision,omitempty,string"`
	SortOrder  string `json:"sort_order,omitempty"`
	SortTarget string `json:"sort_target,omitempty"`
	KeysOnly   bool   `json:"keys_only,omitempty"`
	CountOnly  bool   `json:"count_only,omitempty"`
	// MaxCreateRevision leaves out the keys created after it.
	MaxCreateRevision int64 `json:"max_create_revision,omitempty,string"`
}

type rangeResponse struct {
	Header header      `json:"header"`
	Kvs    []*keyValue `json:"kvs"`
	More   bool        `json:"more"`
}

type putRequest struct {
	Key         []byte `json:"key"`
	Value       []byte `json:"value,omitempty"`
	Lease       int64  `json:"lease,omitempty,string"`
	IgnoreValue bool   `json:"ignore_value,omitempty"`
	IgnoreLease bool   `json:"ignore_lease,omitempty"`
}

type deleteRangeRequest struct {
	Key      []byte `json:"key"`
	RangeEnd []byte `json:"range_end,omitempty"`
}

type deleteRangeResponse struct {
	Deleted int64 `json:"deleted,string"`
}

// compare is a transaction's condition; withlock's are all
// "create_revision of key = rev".
type compare struct {
	Key            []byte `json:"key"`
	Target         string `json:"target"`
	Result         string `json:"result"`
	CreateRevision int64  `json:"create_revision,string"`
}

// createRevisionIs is the condition CreateRevision(key) = rev (0: key
// absent), as clientv3.Compare(clientv3.CreateRevision(key), "=", rev).
func createRevisionIs(key string, rev int64) compare {
	return compare{Key: []byte(key), Target: "CREATE", Result: "EQUAL", CreateRevision: rev}
}

type requestOp struct {
	Range       *rangeRequest       `json:"request_range,omitempty"`
	Put         *putRequest         `json:"request_put,omitempty"`
	DeleteRange *deleteRangeRequest `json:"request_delete_range,omitempty"`
}

type txnRequest struct {
	Compare []compare   `json:"compare"`
	Success []requestOp `json:"success"`
}

type responseOp struct {
	Range *rangeResponse `json:"response_range"`
}

type txnResponse struct {
	Header    header       `json:"header"`
	Succeeded bool         `json:"succeeded"`
	Responses []responseOp `json:"responses"`
}

type leaseRequest struct {
	ID  int64 `json:"ID,string"`
	TTL int64 `json:"TTL,omitempty,string"`
}

type leaseResponse struct {
	ID  int64 `json:"ID,string"`
	TTL int64 `json:"TTL,string"`
}

type authRequest struct {
	Name     string `json:"name"`
	Password string `json:"password"`
}

type authResponse struct {
	Token string `json:"token"`
}

type watchCreate struct {
	Key           []byte   `json:"key"`
	RangeEnd      []byte   `json:"range_end,omitempty"`
	StartRevision int64    `json:"start_revision,omitempty,string"`
	Filters       []string `json:"filters,omitempty"`
}

type watchRequest struct {
	Create watchCreate `json:"create_request"`
}

type watchEvent struct {
	Type string    `json:"type"` // "DELETE", or absent for a put
	Kv   *keyValue `json:"kv"`
}

type watchResponse struct {
	Header          header       `json:"header"`
	Created         bool         `json:"created"`
	Canceled        bool         `json:"canceled"`
	CompactRevision int64        `json:"compact_revision,string"`
	CancelReason    string       `json:"cancel_reason"`
	Events          []watchEvent `json:"events"`
}

// prefixEnd is the end of the range of keys that begin with prefix, as
// clientv3.GetPrefixRangeEnd.
func prefixEnd(prefix string) []byte {
	end := []byte(prefix)
	for i := len(end) - 1; i >= 0; i-- {
		if end[i] < 0xff {
			end[i]++
			return end[:i+1]
		}
	}
	return []byte{0} // every key after prefix
}

// The requests: one method of client for each request of the v3 API that
// the lock needs.

func (c *client) get(ctx context.Context, r *rangeRequest) (*rangeResponse, error) {
	var resp rangeResponse
	return &resp, c.do(ctx, "/v3/kv/range", r, &resp)
}

func (c *client) grant(ctx context.Context, ttl int64) (int64, error) {
	var resp leaseResponse
	if err := c.do(ctx, "/v3/lease/grant", leaseRequest{TTL: ttl}, &resp); err != nil {
		return 0, err
	}
	return resp.ID, nil
}

func (c *client) revoke(ctx context.Context, id int64) error {
	var resp struct{}
	return c.do(ctx, "/v3/lease/revoke", leaseRequest{ID: id}, &resp)
}

// timeToLive returns the seconds lease id has left, -1 if it is gone.
func (c *client) timeToLive(ctx context.Context, id int64) (int64, error) {
	var resp leaseResponse
	if err := c.do(ctx, "/v3/lease/timetolive", leaseRequest{ID: id}, &resp); err != nil {
		return 0, err
	}
	return resp.TTL, nil
}

// keepAliveOnce renews lease id once: one LeaseKeepAlive stream, one
// request, one answer. An expired or revoked lease is a serverError with
// msgLeaseNotFound, as the official client says it (the server answers
// it with a TTL of 0).
func (c *client) keepAliveOnce(ctx context.Context, id int64) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var resp leaseResponse
	s, err := c.openStream(ctx, "/v3/lease/keepalive", leaseRequest{ID: id}, nil, func(s *stream) error { return s.next(&resp) })
	if err != nil {
		return err
	}
	// The server ends the stream right after its answer (the request's
	// body has ended); a server that stalls then does not hold the
	// renewal up for long: its connection is dropped instead.
	t := time.AfterFunc(time.Second, cancel)
	s.close()
	t.Stop()
	if resp.TTL <= 0 {
		return &serverError{code: codeNotFound, msg: msgLeaseNotFound}
	}
	return nil
}

// requireLeader asks the server to end a watch when its member has no
// leader (clientv3.WithRequireLeader): the gateway passes Grpc-Metadata-*
// on as gRPC metadata.
var requireLeader = http.Header{"Grpc-Metadata-Hasleader": {"true"}}

const watchPath = "/v3/watch"

// watch opens a watch and reads its first answer, which says that it was
// created or why not.
func (c *client) watch(ctx context.Context, w watchCreate) (*stream, error) {
	return c.openStream(ctx, watchPath, watchRequest{Create: w}, requireLeader, func(s *stream) error {
		var resp watchResponse
		if err := s.next(&resp); err != nil {
			return err
		}
		if err := resp.err(); err != nil {
			return err
		}
		if !resp.Created {
			return errors.New("etcd did not say the watch was created")
		}
		return nil
	})
}

// err is the reason of a cancelled watch: a serverError with etcdserver's
// text (the server writes gRPC's "rpc error: code = ... desc = " before
// it).
func (r *watchResponse) err() error {
	if !r.Canceled {
		return nil
	}
	if r.CompactRevision != 0 {
		return errCompacted
	}
	msg := r.CancelReason
	if i := strings.Index(msg, "desc = "); i >= 0 {
		msg = msg[i+len("desc = "):]
	}
	if msg == "" {
		msg = "etcd cancelled the watch"
	}
	return &serverError{code: codeUnknown, msg: msg}
}

// errCompacted is a watch from a revision the server no longer has.
var errCompacted = errors.New("etcdserver: mvcc: required revision has been compacted")

// rangeAt is the keys read by the transaction's i-th request, a range.
func rangeAt(resp *txnResponse, i int) []*keyValue {
	if i >= len(resp.Responses) || resp.Responses[i].Range == nil {
		return nil
	}
	return resp.Responses[i].Range.Kvs
}
