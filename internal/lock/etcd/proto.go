package etcd

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// A transaction's messages in protobuf, as etcdserverpb has them (rpc.proto
// and kv.proto), for the transactions that go over gRPC (grpc.go). Only the
// fields withlock sends and reads are here; the decoders skip the others.
// Zero values are left out, as proto3 leaves them out, except a compare's
// target value, which is a oneof and is written even when it is 0.

// Protobuf's wire types that withlock writes and reads.
const (
	wireVarint  = 0
	wireFixed64 = 1
	wireBytes   = 2
	wireFixed32 = 5
)

func appendTag(b []byte, num, wire int) []byte {
	return binary.AppendUvarint(b, uint64(num)<<3|uint64(wire))
}

func appendInt(b []byte, num int, v int64) []byte {
	if v == 0 {
		return b
	}
	return binary.AppendUvarint(appendTag(b, num, wireVarint), uint64(v))
}

func appendBool(b []byte, num int, v bool) []byte {
	if !v {
		return b
	}
	return append(appendTag(b, num, wireVarint), 1)
}

func appendBytes(b []byte, num int, v []byte) []byte {
	if len(v) == 0 {
		return b
	}
	return appendMessage(b, num, v)
}

// appendMessage writes an embedded message, even an empty one: a oneof's
// choice is its field's presence.
func appendMessage(b []byte, num int, m []byte) []byte {
	b = appendTag(b, num, wireBytes)
	b = binary.AppendUvarint(b, uint64(len(m)))
	return append(b, m...)
}

// The enums, by the names the gateway's JSON gives them.
var (
	compareTargets = map[string]int64{"VERSION": 0, "CREATE": 1, "MOD": 2, "VALUE": 3, "LEASE": 4}
	compareResults = map[string]int64{"EQUAL": 0, "GREATER": 1, "LESS": 2, "NOT_EQUAL": 3}
	sortOrders     = map[string]int64{"": 0, "NONE": 0, "ASCEND": 1, "DESCEND": 2}
	sortTargets    = map[string]int64{"": 0, "KEY": 0, "VERSION": 1, "CREATE": 2, "MOD": 3, "VALUE": 4}
)

// enum is name's number in names; an unknown name is withlock's mistake.
func enum(names map[string]int64, name string) (int64, error) {
	v, ok := names[name]
	if !ok {
		return 0, fmt.Errorf("etcd client: no protobuf value for %q", name)
	}
	return v, nil
}

// marshalProto is r as an etcdserverpb.TxnRequest.
func (r *txnRequest) marshalProto() ([]byte, error) {
	var b []byte
	for _, c := range r.Compare {
		target, err := enum(compareTargets, c.Target)
		if err != nil {
			return nil, err
		}
		if target != compareTargets["CREATE"] {
			return nil, fmt.Errorf("etcd client: a compare of %s, not of the create revision", c.Target)
		}
		result, err := enum(compareResults, c.Result)
		if err != nil {
			return nil, err
		}
		m := appendInt(nil, 1, result)
		m = appendInt(m, 2, target)
		m = appendBytes(m, 3, c.Key)
		m = binary.AppendUvarint(appendTag(m, 5, wireVarint), uint64(c.CreateRevision))
		b = appendMessage(b, 1, m)
	}
	for _, op := range r.Success {
		m, err := op.marshalProto()
		if err != nil {
			return nil, err
		}
		b = appendMessage(b, 2, m)
	}
	return b, nil
}

// marshalProto is op as an etcdserverpb.RequestOp.
func (op requestOp) marshalProto() ([]byte, error) {
	switch {
	case op.Range != nil:
		r := op.Range
		order, err := enum(sortOrders, r.SortOrder)
		if err != nil {
			return nil, err
		}
		target, err := enum(sortTargets, r.SortTarget)
		if err != nil {
			return nil, err
		}
		m := appendBytes(nil, 1, r.Key)
		m = appendBytes(m, 2, r.RangeEnd)
		m = appendInt(m, 3, r.Limit)
		m = appendInt(m, 4, r.Revision)
		m = appendInt(m, 5, order)
		m = appendInt(m, 6, target)
		m = appendBool(m, 8, r.KeysOnly)
		m = appendBool(m, 9, r.CountOnly)
		m = appendInt(m, 13, r.MaxCreateRevision)
		return appendMessage(nil, 1, m), nil
	case op.Put != nil:
		p := op.Put
		m := appendBytes(nil, 1, p.Key)
		m = appendBytes(m, 2, p.Value)
		m = appendInt(m, 3, p.Lease)
		m = appendBool(m, 5, p.IgnoreValue)
		m = appendBool(m, 6, p.IgnoreLease)
		return appendMessage(nil, 2, m), nil
	case op.DeleteRange != nil:
		d := op.DeleteRange
		m := appendBytes(nil, 1, d.Key)
		m = appendBytes(m, 2, d.RangeEnd)
		return appendMessage(nil, 3, m), nil
	}
	return nil, errors.New("etcd client: an empty request in a transaction")
}

// errProto is an answer that is not a well-formed protobuf message.
var errProto = errors.New("etcd's answer is not a well-formed protobuf message")

// eachField calls fn with each field of the message b: its number, its
// wire type, and its value (v for a varint, data for a length-delimited
// field; fixed-size fields, which withlock does not read, are skipped).
func eachField(b []byte, fn func(num, wire int, v uint64, data []byte) error) error {
	for len(b) > 0 {
		tag, n := binary.Uvarint(b)
		if n <= 0 {
			return errProto
		}
		b = b[n:]
		num, wire := int(tag>>3), int(tag&7)
		var v uint64
		var data []byte
		switch wire {
		case wireVarint:
			if v, n = binary.Uvarint(b); n <= 0 {
				return errProto
			}
			b = b[n:]
		case wireBytes:
			l, n := binary.Uvarint(b)
			if n <= 0 || l > uint64(len(b)-n) {
				return errProto
			}
			data, b = b[n:n+int(l)], b[n+int(l):]
		case wireFixed64, wireFixed32:
			size := 8
			if wire == wireFixed32 {
				size = 4
			}
			if len(b) < size {
				return errProto
			}
			b = b[size:]
			continue
		default:
			return errProto
		}
		if err := fn(num, wire, v, data); err != nil {
			return err
		}
	}
	return nil
}

// unmarshalProto reads an etcdserverpb.TxnResponse into r: its header's
// revision, whether it succeeded, and the keys of its ranges.
func (r *txnResponse) unmarshalProto(b []byte) error {
	return eachField(b, func(num, wire int, v uint64, data []byte) error {
		switch {
		case num == 1 && wire == wireBytes:
			return r.Header.unmarshalProto(data)
		case num == 2 && wire == wireVarint:
			r.Succeeded = v != 0
		case num == 3 && wire == wireBytes:
			var op responseOp
			err := eachField(data, func(num, wire int, _ uint64, data []byte) error {
				if num == 1 && wire == wireBytes {
					op.Range = new(rangeResponse)
					return op.Range.unmarshalProto(data)
				}
				return nil // a put's or a delete's answer: nothing withlock reads
			})
			r.Responses = append(r.Responses, op)
			return err
		}
		return nil
	})
}

// unmarshalProto reads an etcdserverpb.ResponseHeader's revision into h.
func (h *header) unmarshalProto(b []byte) error {
	return eachField(b, func(num, wire int, v uint64, _ []byte) error {
		if num == 3 && wire == wireVarint {
			h.Revision = int64(v)
		}
		return nil
	})
}

// unmarshalProto reads an etcdserverpb.RangeResponse into r.
func (r *rangeResponse) unmarshalProto(b []byte) error {
	return eachField(b, func(num, wire int, v uint64, data []byte) error {
		switch {
		case num == 1 && wire == wireBytes:
			return r.Header.unmarshalProto(data)
		case num == 2 && wire == wireBytes:
			kv := new(keyValue)
			r.Kvs = append(r.Kvs, kv)
			return kv.unmarshalProto(data)
		case num == 3 && wire == wireVarint:
			r.More = v != 0
		}
		return nil
	})
}

// unmarshalProto reads an mvccpb.KeyValue into kv.
func (kv *keyValue) unmarshalProto(b []byte) error {
	return eachField(b, func(num, wire int, v uint64, data []byte) error {
		switch {
		case num == 1 && wire == wireBytes:
			kv.Key = data
		case num == 2 && wire == wireVarint:
			kv.CreateRevision = int64(v)
		case num == 3 && wire == wireVarint:
			kv.ModRevision = int64(v)
		case num == 5 && wire == wireBytes:
			kv.Value = data
		case num == 6 && wire == wireVarint:
			kv.Lease = int64(v)
		}
		return nil
	})
}
