package redis_test

import (
	"strings"
	"testing"

	"github.com/withlock/withlock/internal/lock"
	"github.com/withlock/withlock/internal/lock/redis"
)

// FuzzKeys checks that the keys of two names never meet: no lease, fence
// or writer mark of one name is any key of another, so that no name can
// read, renew or delete another's; and that one name's keys and channel
// share a hash tag that is the whole name's, braces and all. `go test -fuzz FuzzKeys
// ./internal/lock/redis/` searches for more; the seeds run in make test.
func FuzzKeys(f *testing.F) {
	f.Add("job", "job:")
	f.Add("fence:job", "job")
	f.Add("released:job", "job")
	f.Add("-fence:job", "job")
	f.Add("a{b}c", "b")
	f.Add("{job}", "job")
	f.Add("%7Bjob%7D", "{job}")
	f.Add("a}{b", "a%7D%7Bb")
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
		for _, n := range []string{a, b} {
			tag := hashTag(t, redis.Key(n))
			for _, k := range append(keys(n), redis.Channel(n)) {
				if got := hashTag(t, k); got != tag {
					t.Fatalf("name %q: %q hashes by {%s}, %q by {%s}; want one slot", n, k, got, redis.Key(n), tag)
				}
			}
		}
		if hashTag(t, redis.Key(a)) == hashTag(t, redis.Key(b)) {
			t.Fatalf("names %q and %q have the same hash tag {%s}", a, b, hashTag(t, redis.Key(a)))
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

// hashTag is what Redis Cluster hashes of key: the text between its first
// { and the next }, which must be there and not be empty, or key's keys
// would not stay in one slot.
func hashTag(t *testing.T, key string) string {
	t.Helper()
	_, rest, ok := strings.Cut(key, "{")
	tag, _, closed := strings.Cut(rest, "}")
	if !ok || !closed || tag == "" {
		t.Fatalf("%q has no hash tag", key)
	}
	return tag
}
