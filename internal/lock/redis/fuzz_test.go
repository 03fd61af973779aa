package redis_test

import (
	"testing"

	"github.com/withlock/withlock/internal/lock"
	"github.com/withlock/withlock/internal/lock/redis"
)

// FuzzKeys checks that the keys of two names never meet: no lease, fence
// or writer mark of one name is any key of another, so that no name can
// read, renew or delete another's. `go test -fuzz FuzzKeys
// ./internal/lock/redis/` searches for more; the seeds run in make test.
func FuzzKeys(f *testing.F) {
	f.Add("job", "job:")
	f.Add("fence:job", "job")
	f.Add("released:job", "job")
	f.Add("-fence:job", "job")
	f.Fuzz(func(t *testing.T, a, b string) {
		if lock.CheckName(a) != nil || lock.CheckName(b) != nil || a == b {
			return
		}
		keys := func(n string) []string { return []string{redis.Key(n), redis.FenceKey(n), redis.WriterKey(n)} }
		for _, ka := range keys(a) {
			for _, kb := range keys(b) {
				if ka == kb {
					t.Fatalf("names %q and %q share the key %q", a, b, ka)
				}
			}
		}
		seen := map[string]bool{}
		for _, k := range keys(a) {
			if seen[k] {
				t.Fatalf("name %q uses the key %q for two things", a, k)
			}
			seen[k] = true
		}
	})
}
