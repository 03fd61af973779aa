package etcd

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/withlock/withlock/internal/lock"
)

// Prefix is the prefix of name's keys, as `etcdctl lock NAME` has it
// (concurrency.NewMutex).
func Prefix(name string) string { return name + "/" }

// Key is the key of name's holder or waiter with lease id, as
// concurrency.Mutex names it.
func Key(name string, id int64) string {
	return fmt.Sprintf("%s%x", Prefix(name), id)
}

// record is the value of withlock's keys: the holder's mode and who it is.
// AcquiredAt is by withlock's clock (etcd has no clock to ask); a waiter
// writes it again once it has held the lock for a while (stamp), so that
// it says when the holder got the lock, not when it began to wait.
type record struct {
	Mode       lock.Mode `json:"mode"`
	MaxHolders int       `json:"max_holders,omitempty"`
	Host       string    `json:"host"`
	PID        int       `json:"pid"`
	Command    []string  `json:"command"`
	AcquiredAt time.Time `json:"acquired_at"`
}

// entry is one key of a lock's queue.
type entry struct {
	key   string
	rev   int64 // create revision: the place in the queue, the fencing token
	lease int64
	rec   *record // nil for a key that is not withlock's (etcdctl lock's)
}

// mode is how the key holds: a key without a withlock record is exclusive,
// as concurrency.Mutex treats every key.
func (e entry) mode() lock.Mode {
	if e.rec == nil {
		return lock.Exclusive
	}
	return e.rec.Mode
}

// lockKey reports whether kv, a key under prefix, is a lock key of that
// prefix's name: one more path element, a lease ID in hex, and a lease. A
// key with more elements belongs to a longer name (NAME/sub/<id>), so
// withlock's locks "a" and "a/b" are two locks; etcdctl lock "a" counts
// the keys of "a/b" too.
func lockKey(prefix string, kv *mvccpb.KeyValue) bool {
	return kv.Lease != 0 && lockID(string(kv.Key[len(prefix):]))
}

// lockID reports whether id, the last path element of a key, is a lease
// ID in hex, as a lock key's is.
func lockID(id string) bool {
	if id == "" || len(id) > 16 {
		return false
	}
	for _, c := range id {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// queue returns the lock keys among kvs, the keys under name's prefix in
// the order of their create revisions.
func queue(name string, kvs []*mvccpb.KeyValue) []entry {
	prefix := Prefix(name)
	var q []entry
	for _, kv := range kvs {
		if !strings.HasPrefix(string(kv.Key), prefix) || !lockKey(prefix, kv) {
			continue
		}
		e := entry{key: string(kv.Key), rev: kv.CreateRevision, lease: kv.Lease}
		var r record
		if json.Unmarshal(kv.Value, &r) == nil && (r.Mode == lock.Exclusive || r.Mode == lock.Shared || r.Mode == lock.Semaphore && r.MaxHolders > 0) {
			e.rec = &r
		}
		q = append(q, e)
	}
	return q
}

// judge says whether the key q[i] holds the lock. If not, wait is the index
// of the earlier key whose deletion to wait for, or -1 if the deletion of
// any earlier key may do (a full semaphore). An exclusive key waits for
// every earlier key, and waits on the one just before it, as the recipe
// does; a shared key for the earlier keys that are not shared; a semaphore
// key of N for the earlier keys that are not the same semaphore, then until
// fewer than N keys are before it. A semaphore key with another N than an
// earlier one's is an error wrapping lock.ErrUsage.
func judge(name string, q []entry, i int) (holds bool, wait int, err error) {
	me := q[i]
	switch me.mode() {
	case lock.Shared:
		for j := i - 1; j >= 0; j-- {
			if q[j].mode() != lock.Shared {
				return false, j, nil
			}
		}
		return true, 0, nil
	case lock.Semaphore:
		n := me.rec.MaxHolders
		for j := 0; j < i; j++ {
			if q[j].mode() == lock.Semaphore && q[j].rec.MaxHolders != n {
				m := q[j].rec.MaxHolders
				return false, 0, lock.Errorf(lock.ErrUsage, "%q is a semaphore of %d (--max-holders %d); this holder asked for %d", name, m, m, n)
			}
		}
		for j := i - 1; j >= 0; j-- {
			if q[j].mode() != lock.Semaphore {
				return false, j, nil
			}
		}
		if i < n {
			return true, 0, nil
		}
		return false, -1, nil
	}
	if i == 0 {
		return true, 0, nil
	}
	return false, i - 1, nil
}

// holders are the keys of q that hold the lock, oldest first.
func holders(name string, q []entry) []entry {
	var hs []entry
	for i := range q {
		if holds, _, err := judge(name, q, i); holds && err == nil {
			hs = append(hs, q[i])
		}
	}
	return hs
}

// record is this holder's record, acquired at.
func (b *backend) record(at time.Time) string {
	r := record{
		Mode:       b.opts.Mode,
		MaxHolders: b.opts.MaxHolders,
		Host:       b.opts.Holder.Host,
		PID:        b.opts.Holder.PID,
		Command:    b.opts.Holder.Command,
		AcquiredAt: at.UTC(),
	}
	v, _ := json.Marshal(r)
	return string(v)
}

// getQueue reads name's keys in the order of their create revisions,
// with their values. Not keys only, although an exclusive key needs only
// the others' leases: etcd 3.7 answers a keys-only read from its index,
// which has no leases, and the lease is what tells a lock key from a key
// of data.
func getQueue(name string) clientv3.Op {
	return clientv3.OpGet(Prefix(name), queueOpts()...)
}

// queueOpts are the options of getQueue's read.
func queueOpts() []clientv3.OpOption {
	return []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend)}
}
