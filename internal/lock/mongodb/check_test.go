package mongodb

import (
	"strings"
	"testing"

	"github.com/withlock/withlock/internal/lock"
)

// TestWriteConcernFinding: a write concern below a majority of a replica
// set is a warning; a standalone server is one too (no failover to undo a
// lease, but no second copy either).
func TestWriteConcernFinding(t *testing.T) {
	for _, c := range []struct {
		w       string
		set     string
		mongos  bool
		members int
		want    lock.Status
		says    string
	}{
		{"", "rs0", false, 3, lock.Ok, "majority (withlock's default)"},
		{"majority", "rs0", false, 3, lock.Ok, "w: majority"},
		{"2", "rs0", false, 3, lock.Ok, "a majority of the replica set's 3 members"},
		{"1", "rs0", false, 3, lock.Warn, "below a majority"},
		{"2", "rs0", false, 5, lock.Warn, "below a majority"},
		{"1", "", true, 0, lock.Warn, "below a majority"},
		{"", "", true, 0, lock.Ok, "majority"},
		{"", "", false, 0, lock.Warn, "standalone server"},
	} {
		f := writeConcernFinding("db:27017", c.w, c.set, c.mongos, c.members)
		if f.Status != c.want || !strings.Contains(f.Detail, c.says) {
			t.Errorf("w=%q set=%q mongos=%v members=%d: %s %s; want %s, saying %q", c.w, c.set, c.mongos, c.members, f.Status, f.Detail, c.want, c.says)
		}
	}
}
