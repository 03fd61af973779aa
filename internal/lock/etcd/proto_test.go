package etcd

import (
	"bytes"
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"google.golang.org/protobuf/proto"
)

// TestTxnRequestProto: each transaction withlock sends, encoded by hand,
// reads back through etcd's own generated code as the request it means:
// the compare of a create revision (0 too, which is a oneof's value and
// must be there), a put with a lease or with ignore_lease/ignore_value, a
// range of a queue, and a delete.
func TestTxnRequestProto(t *testing.T) {
	queue := queueRange("job")
	queue.MaxCreateRevision = 41
	r := &txnRequest{
		Compare: []compare{createRevisionIs("job/694d", 0), createRevisionIs("job/694e", 42)},
		Success: []requestOp{
			{Put: &putRequest{Key: []byte("job/694d"), Value: []byte(`{"mode":"exclusive"}`), Lease: 0x694d7b2e8c1f0a03}},
			{Put: &putRequest{Key: []byte("job/694e"), IgnoreLease: true, IgnoreValue: true}},
			{Range: queue},
			{DeleteRange: &deleteRangeRequest{Key: []byte("job/694d")}},
		},
	}
	b, err := r.marshalProto()
	if err != nil {
		t.Fatal(err)
	}
	var got pb.TxnRequest
	if err := proto.Unmarshal(b, &got); err != nil {
		t.Fatalf("etcd cannot read the request: %v", err)
	}
	if len(got.Compare) != 2 || len(got.Success) != 4 || len(got.Failure) != 0 {
		t.Fatalf("got %d compares, %d successes, %d failures; want 2, 4, 0", len(got.Compare), len(got.Success), len(got.Failure))
	}
	for i, want := range []int64{0, 42} {
		c := got.Compare[i]
		rev, ok := c.TargetUnion.(*pb.Compare_CreateRevision)
		if c.Target != pb.Compare_CREATE || c.Result != pb.Compare_EQUAL || string(c.Key) != string(r.Compare[i].Key) || !ok || rev.CreateRevision != want {
			t.Errorf("compare %d: got %+v, want CREATE(%s) EQUAL %d", i, c, r.Compare[i].Key, want)
		}
	}
	put := got.Success[0].GetRequestPut()
	if put == nil || string(put.Key) != "job/694d" || string(put.Value) != `{"mode":"exclusive"}` || put.Lease != 0x694d7b2e8c1f0a03 || put.IgnoreLease || put.IgnoreValue {
		t.Errorf("put: got %+v", put)
	}
	put = got.Success[1].GetRequestPut()
	if put == nil || string(put.Key) != "job/694e" || len(put.Value) != 0 || put.Lease != 0 || !put.IgnoreLease || !put.IgnoreValue {
		t.Errorf("put ignoring lease and value: got %+v", put)
	}
	rg := got.Success[2].GetRequestRange()
	if rg == nil || string(rg.Key) != "job/" || string(rg.RangeEnd) != "job0" || rg.SortOrder != pb.RangeRequest_ASCEND ||
		rg.SortTarget != pb.RangeRequest_CREATE || rg.MaxCreateRevision != 41 || rg.KeysOnly || rg.CountOnly || rg.Limit != 0 {
		t.Errorf("range: got %+v", rg)
	}
	del := got.Success[3].GetRequestDeleteRange()
	if del == nil || string(del.Key) != "job/694d" || len(del.RangeEnd) != 0 {
		t.Errorf("delete: got %+v", del)
	}
}

// TestTxnResponseProto: an answer that etcd's own code encodes, with a
// range among put and delete answers and fields withlock does not read,
// decodes to the revision, the outcome and the keys.
func TestTxnResponseProto(t *testing.T) {
	kvs := []*mvccpb.KeyValue{
		{Key: []byte("job/1"), CreateRevision: 7, ModRevision: 9, Version: 2, Value: []byte("v1"), Lease: 0x694d7b2e8c1f0a03},
		{Key: []byte("job/2"), CreateRevision: 8, ModRevision: 8, Version: 1, Lease: 1},
	}
	in := &pb.TxnResponse{
		Header:    &pb.ResponseHeader{ClusterId: 14841639068965178418, MemberId: 10276657743932975437, Revision: 1 << 40, RaftTerm: 3},
		Succeeded: true,
		Responses: []*pb.ResponseOp{
			{Response: &pb.ResponseOp_ResponsePut{ResponsePut: &pb.PutResponse{Header: &pb.ResponseHeader{Revision: 1 << 40}}}},
			{Response: &pb.ResponseOp_ResponseRange{ResponseRange: &pb.RangeResponse{Header: &pb.ResponseHeader{Revision: 1 << 40}, Kvs: kvs, More: true, Count: 3}}},
			{Response: &pb.ResponseOp_ResponseDeleteRange{ResponseDeleteRange: &pb.DeleteRangeResponse{Deleted: 1}}},
		},
	}
	b, err := proto.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	var got txnResponse
	if err := got.unmarshalProto(b); err != nil {
		t.Fatal(err)
	}
	if got.Header.Revision != 1<<40 || !got.Succeeded || len(got.Responses) != 3 || got.Responses[0].Range != nil || got.Responses[2].Range != nil {
		t.Fatalf("got %+v", got)
	}
	rg := got.Responses[1].Range
	if rg == nil || !rg.More || rg.Header.Revision != 1<<40 || len(rg.Kvs) != 2 {
		t.Fatalf("range: got %+v", rg)
	}
	for i, kv := range rg.Kvs {
		w := kvs[i]
		if !bytes.Equal(kv.Key, w.Key) || kv.CreateRevision != w.CreateRevision || kv.ModRevision != w.ModRevision || !bytes.Equal(kv.Value, w.Value) || kv.Lease != w.Lease {
			t.Errorf("key %d: got %+v, want %+v", i, kv, w)
		}
	}

	in = &pb.TxnResponse{Header: &pb.ResponseHeader{Revision: 5}}
	b, _ = proto.Marshal(in)
	got = txnResponse{}
	if err := got.unmarshalProto(b); err != nil || got.Succeeded || got.Header.Revision != 5 || len(got.Responses) != 0 {
		t.Errorf("a failed compare: got %+v, %v", got, err)
	}
}

// TestProtoMalformed: an answer cut short or with a length past its end is
// an error, never a panic or a silent half.
func TestProtoMalformed(t *testing.T) {
	in := &pb.TxnResponse{Header: &pb.ResponseHeader{Revision: 5}, Succeeded: true, Responses: []*pb.ResponseOp{
		{Response: &pb.ResponseOp_ResponseRange{ResponseRange: &pb.RangeResponse{Kvs: []*mvccpb.KeyValue{{Key: []byte("job/1"), Lease: 1}}}}},
	}}
	b, _ := proto.Marshal(in)
	for n := 1; n < len(b); n++ {
		var got txnResponse
		err := got.unmarshalProto(b[:n])
		if err == nil && len(got.Responses) == 1 && len(got.Responses[0].Range.Kvs) == 1 && got.Responses[0].Range.Kvs[0].Lease == 1 {
			t.Errorf("%d of %d bytes decoded as the whole answer", n, len(b))
		}
	}
	for _, bad := range [][]byte{{0x0a, 0x10, 0x18}, {0x80}, {0x0b}, {0x12, 0xff, 0xff, 0xff, 0xff, 0x0f}} {
		var got txnResponse
		if err := got.unmarshalProto(bad); err == nil {
			t.Errorf("% x: no error", bad)
		}
	}
}

// FuzzTxnResponseProto: no input makes the decoder panic.
func FuzzTxnResponseProto(f *testing.F) {
	in := &pb.TxnResponse{Header: &pb.ResponseHeader{Revision: 5}, Succeeded: true, Responses: []*pb.ResponseOp{
		{Response: &pb.ResponseOp_ResponseRange{ResponseRange: &pb.RangeResponse{Kvs: []*mvccpb.KeyValue{{Key: []byte("job/1"), Lease: 1}}}}},
	}}
	b, _ := proto.Marshal(in)
	f.Add(b)
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		var got txnResponse
		got.unmarshalProto(b)
	})
}
