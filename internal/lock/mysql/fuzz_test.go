package mysql_test

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"

	"github.com/withlock/withlock/internal/lock"
	"github.com/withlock/withlock/internal/lock/mysql"
)

// FuzzKeys checks the GET_LOCK names of docs/mysql.md: "withlock:" and 55 hex digits
// of SHA-256(NAME), at most 64 characters (MySQL's limit) for every slot of
// a semaphore, and never the same for two names or two slots, except where
// SHA-256's first 192 bits collide. `go test -fuzz FuzzKeys
// ./internal/lock/mysql/` searches for more; the seeds run in make test.
func FuzzKeys(f *testing.F) {
	f.Add("job", "job ", uint16(0), uint16(1))
	f.Add("a", "a\x00", uint16(1), uint16(10))
	f.Add("a", "a", uint16(1), uint16(11))
	f.Add("naïve ☃", "x", uint16(65534), uint16(0))
	f.Fuzz(func(t *testing.T, a, b string, i, j uint16) {
		if lock.CheckName(a) != nil || lock.CheckName(b) != nil {
			return
		}
		sum := sha256.Sum256([]byte(a))
		if k, want := mysql.Key(a), "withlock:"+hex.EncodeToString(sum[:])[:55]; k != want {
			t.Fatalf("Key(%q) = %q, want %q", a, k, want)
		}
		ka, kb := mysql.SlotKey(a, int(i)), mysql.SlotKey(b, int(j))
		for _, k := range []string{ka, kb} {
			if len(k) > 64 || !strings.HasPrefix(k, "withlock:") {
				t.Fatalf("slot key %q: longer than 64 characters, or not withlock:", k)
			}
		}
		if (a != b || i != j) && ka == kb {
			t.Fatalf("slot %d of %q and slot %d of %q share the GET_LOCK name %q", i, a, j, b, ka)
		}
	})
}
