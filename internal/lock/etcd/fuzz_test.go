package etcd

import (
	"go.etcd.io/etcd/api/v3/mvccpb"

	"strings"
	"testing"

	"github.com/withlock/withlock/internal/lock"
)

// FuzzKeys checks that names whose prefixes nest ("a" and "a/b", as
// etcdctl lock has them: NAME/ and the lease ID in hex) never see each
// other's keys: a key of one name, under another name's prefix, is not
// one of that name's lock keys, so that no holder waits for, or counts,
// another name's holders. `go test -fuzz FuzzKeys ./internal/lock/etcd/`
// searches for more; the seeds run in make test.
func FuzzKeys(f *testing.F) {
	f.Add("a", "a/1", int64(0x694d7b2e8c1f0a03), int64(1))
	f.Add("a", "a/ab", int64(0xab), int64(0xab))
	f.Add("a/", "a", int64(2), int64(3))
	f.Add("job", "job/0/x", int64(7), int64(-1))
	f.Fuzz(func(t *testing.T, a, b string, ida, idb int64) {
		if lock.CheckName(a) != nil || lock.CheckName(b) != nil || ida == 0 || idb == 0 {
			return
		}
		own := &mvccpb.KeyValue{Key: []byte(Key(a, ida)), Lease: ida}
		if !strings.HasPrefix(string(own.Key), Prefix(a)) || !lockKey(Prefix(a), own) {
			t.Fatalf("%q, the key of %q, is not one of its lock keys", own.Key, a)
		}
		if a == b {
			return
		}
		other := &mvccpb.KeyValue{Key: []byte(Key(b, idb)), Lease: idb}
		if strings.HasPrefix(string(other.Key), Prefix(a)) && lockKey(Prefix(a), other) {
			t.Fatalf("%q, a key of name %q, counts as a lock key of name %q", other.Key, b, a)
		}
	})
}
