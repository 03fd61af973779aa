package mongodb_test

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/withlock/withlock/internal/lock"
	"github.com/withlock/withlock/internal/lock/locktest"
	"github.com/withlock/withlock/internal/testenv"
)

// release --force is a document of the chain like any change: op "break",
// no holders, the breaker's host and pid, a waiting writer's mark kept. The
// semaphore's holders then each find the break at their next renewal and
// say who broke the lock; the next acquisition's token is larger still.
func TestBreakRecorded(t *testing.T) {
	m := testenv.RequireMongo(t)
	name := locktest.Name(t)
	sem := func(host string) *lock.Client {
		return locktest.Open(t, m.URL, lock.Options{Mode: lock.Semaphore, MaxHolders: 2, TTL: 10 * time.Second, Holder: lock.Holder{Host: host, PID: 5, Command: []string{"report"}}})
	}
	la, lb := mustTake(t, sem("a"), name), mustTake(t, sem("b"), name)
	// An exclusive waiter's mark, which the break must not drop: the
	// waiter is still waiting.
	x := locktest.Open(t, m.URL, lock.Options{})
	if _, err := x.TryAcquire(locktest.Context(t), name); !errors.Is(err, lock.ErrHeld) {
		t.Fatalf("exclusive TryAcquire of a full semaphore: %v; want ErrHeld", err)
	}
	breaker := locktest.Open(t, m.URL, lock.Options{Holder: lock.Holder{Host: "ops", PID: 99}})
	broken, err := breaker.Break(locktest.Context(t), name)
	if err != nil {
		t.Fatalf("Break: %v", err)
	}
	var hosts []string
	for _, h := range broken {
		hosts = append(hosts, h.Host)
	}
	if !slices.Equal(hosts, []string{"a", "b"}) || broken[0].PID != 5 || broken[0].Command[0] != "report" {
		t.Errorf("Break returned %+v; want a's then b's record", broken)
	}

	d := newest(t, m.URL, name)
	var by struct {
		By struct {
			Host string `bson:"host"`
			PID  int    `bson:"pid"`
		} `bson:"by"`
	}
	if err := locks(t, m.URL).FindOne(locktest.Context(t), bson.D{{Key: "_id", Value: d.ID}}).Decode(&by); err != nil {
		t.Fatal(err)
	}
	if d.Op != "break" || len(d.Holders) != 0 || d.Mode != "" || by.By.Host != "ops" || by.By.PID != 99 {
		t.Errorf("the break's document: %+v, by %+v; want op break, no holders, by ops pid 99", d, by.By)
	}
	if d.Writer == nil {
		t.Errorf("the break dropped the waiting writer's mark: %+v", d)
	}

	for _, l := range []lock.Lease{la, lb} {
		err := l.Keep(locktest.Context(t))
		if !errors.Is(err, lock.ErrLost) || !strings.Contains(err.Error(), "release --force on ops (pid 99)") {
			t.Errorf("a broken holder's renewal: %v; want ErrLost saying who broke it", err)
		}
	}
	if broken, err := breaker.Break(locktest.Context(t), name); err != nil || len(broken) != 0 {
		t.Errorf("Break of the broken lock: %+v, %v; want nothing to break", broken, err)
	}
	lx, err := x.TryAcquire(locktest.Context(t), name)
	if err != nil {
		t.Fatalf("the exclusive waiter after the break: %v", err)
	}
	if lx.(lock.Expiring).Token() <= d.Seq {
		t.Errorf("token %d after the break at seq %d; want it larger", lx.(lock.Expiring).Token(), d.Seq)
	}
	mustRelease(t, lx)
}

// status shows only holders whose lease has not run out by the server's
// clock; the list skips names whose holders are all gone, and documents
// that are no state of a chain (an older withlock's {_id: NAME} lease,
// anyone's).
func TestStatusLiveHolders(t *testing.T) {
	m := testenv.RequireMongo(t)
	name, gone := locktest.Name(t), locktest.Name(t)+"-gone"
	c := locks(t, m.URL)
	if _, err := c.InsertMany(locktest.Context(t), []any{
		bson.D{{Key: "_id", Value: gone + "-old"}, {Key: "holder", Value: "x"}, {Key: "expiresAt", Value: time.Now().Add(time.Hour)}},
		bson.D{{Key: "_id", Value: "other"}, {Key: "name", Value: 7}},
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.DeleteMany(locktest.Context(t), bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: bson.A{gone + "-old", "other"}}}}})
	})
	short := locktest.Open(t, m.URL, lock.Options{Mode: lock.Shared, TTL: 1500 * time.Millisecond, Holder: lock.Holder{Host: "short", PID: 1}})
	long := locktest.Open(t, m.URL, lock.Options{Mode: lock.Shared, TTL: 10 * time.Second, Holder: lock.Holder{Host: "long", PID: 2}})
	mustTake(t, short, name)
	ll := mustTake(t, long, name)
	mustTake(t, short, gone) // left to run out

	st, err := long.Inspect(locktest.Context(t), name)
	if err != nil || len(st.Holders) != 2 || st.Mode != lock.Shared {
		t.Fatalf("Inspect: %+v, %v; want both shared holders", st, err)
	}
	time.Sleep(1600 * time.Millisecond) // the short lease must run out: that is what is checked
	st, err = long.Inspect(locktest.Context(t), name)
	if err != nil || len(st.Holders) != 1 || st.Holders[0].Host != "long" || st.Holders[0].Token != ll.(lock.Expiring).Token() {
		t.Errorf("Inspect once the short lease ran out: %+v, %v; want the long holder only", st, err)
	}
	all, err := long.List(locktest.Context(t))
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	var names []string
	for _, s := range all {
		names = append(names, s.Name)
	}
	if !slices.Contains(names, name) || slices.Contains(names, gone) || slices.Contains(names, gone+"-old") {
		t.Errorf("List: %v; want %q and not the one whose lease ran out, nor the foreign documents", names, name)
	}
	mustRelease(t, ll)
}
