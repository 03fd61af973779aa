package file_test

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/withlock/withlock/internal/lock"
	"github.com/withlock/withlock/internal/lock/locktest"
)

// TestStress runs the modes at scale, all at once: 16 contenders on "rw",
// 12 shared and 4 exclusive, and 16 on "sem", 13 holders of a semaphore of
// 3 and 3 exclusive contenders. Each takes its lock again and again through
// Client.Acquire, as withlock does (waiting in flock(2), or woken through
// Notify), and holds it a moment so that holders meet. A semaphore never
// has 4 holders, shared never coexists with exclusive, and exclusive is
// alone; meanwhile a checker reads the holders' records through Inspect,
// which must obey the same rules. The shared holders keep the lock busy
// without a gap; the exclusive contenders still get through (the
// writer-waiting mark), or the test times out.
func TestStress(t *testing.T) {
	sem := lock.Options{Mode: lock.Semaphore, MaxHolders: 3}
	locktest.Stress{
		URL: "file://" + t.TempDir(),
		Contenders: slices.Concat(
			locktest.Repeat(12, locktest.Contender{Name: "rw", Options: lock.Options{Mode: lock.Shared}}),
			locktest.Repeat(4, locktest.Contender{Name: "rw"}),
			locktest.Repeat(13, locktest.Contender{Name: "sem", Options: sem}),
			locktest.Repeat(3, locktest.Contender{Name: "sem"})),
		Rounds: 8,
		Holder: me("contender"),
		Hold:   func(*rand.Rand, lock.Mode) time.Duration { return 2 * time.Millisecond },
		Poll:   time.Millisecond,
	}.Run(t)
}
