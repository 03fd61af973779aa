package postgres_test

import (
	"crypto/sha256"
	"encoding/binary"
	"testing"

	"github.com/withlock/withlock/internal/lock"
	"github.com/withlock/withlock/internal/lock/postgres"
)

// FuzzKeys checks the key derivation of docs/postgres.md against its own
// definition, written out again here, and that two names or two semaphore
// slots never share a key, except where SHA-256's first 64 bits (the two
// keys) or 48 bits (a slot key's name part) collide, which the fuzzer
// cannot find. `go test -fuzz FuzzKeys ./internal/lock/postgres/` searches
// for more; the seeds run in make test.
func FuzzKeys(f *testing.F) {
	f.Add("test-lock", "test-lock ", uint16(0), uint16(1))
	f.Add("job", "JOB", uint16(2), uint16(2))
	f.Add("a", "a\x00", uint16(65534), uint16(0))
	f.Add("naïve ☃", "na\u0131ve ☃", uint16(7), uint16(8))
	f.Fuzz(func(t *testing.T, a, b string, i, j uint16) {
		if lock.CheckName(a) != nil || lock.CheckName(b) != nil {
			return
		}
		sum := sha256.Sum256([]byte(a))
		k1, k2 := postgres.Keys(a)
		if k1 != int32(binary.LittleEndian.Uint32(sum[0:4])) || k2 != int32(binary.LittleEndian.Uint32(sum[4:8])) {
			t.Fatalf("Keys(%q) = %d, %d: not bytes 0-3 and 4-7 of SHA-256, little-endian", a, k1, k2)
		}
		if a == "test-lock" && (k1 != -107789403 || k2 != -1898803861) {
			t.Fatalf("Keys(test-lock) = %d, %d; npm advisory-lock has -107789403, -1898803861", k1, k2)
		}
		if a != b {
			if l1, l2 := postgres.Keys(b); l1 == k1 && l2 == k2 {
				t.Fatalf("%q and %q share the keys %d, %d", a, b, k1, k2)
			}
		}
		if (a != b || i != j) && postgres.SlotKey(a, int(i)) == postgres.SlotKey(b, int(j)) {
			t.Fatalf("slot %d of %q and slot %d of %q share the key %d", i, a, j, b, postgres.SlotKey(a, int(i)))
		}
	})
}
