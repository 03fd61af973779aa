package postgres

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/withlock/withlock/internal/lock"
	"github.com/withlock/withlock/internal/lock/locktest"
	"github.com/withlock/withlock/internal/testenv"
)

// TestSemaphoreDetectorRace: a waiter's attempt can find a slot taken by
// its own detector, granted the slot its holder just gave back and not yet
// letting go of it. Once the detector has let go, nobody else will say
// that the slot is free (the release's NOTIFY was heard already), so the
// waiter must try again rather than wait for some other slot. Here the
// detector holds the freed slot until the attempt has found it taken (a
// gate lock, held by the test, widens that moment), and its next wait
// would be on the slot that stays held.
func TestSemaphoreDetectorRace(t *testing.T) {
	p := testenv.RequirePostgres(t)
	db, err := p.CreateDatabase("t_detector_race")
	if err != nil {
		t.Fatal(err)
	}
	const gate = 4242 // a bigint advisory key no lock of the test uses
	gateConn, err := pgx.Connect(locktest.Context(t), db)
	if err != nil {
		t.Fatal(err)
	}
	defer gateConn.Close(context.Background())
	if _, err := gateConn.Exec(locktest.Context(t), "select pg_advisory_lock($1::int8)", gate); err != nil {
		t.Fatal(err)
	}

	sem := func(pid int) lock.Options {
		return lock.Options{Mode: lock.Semaphore, MaxHolders: 2, Holder: lock.Holder{Host: "h", PID: pid}}
	}
	name := locktest.Name(t)
	la, err := locktest.Open(t, db, sem(1)).TryAcquire(locktest.Context(t), name) // slot 0
	if err != nil {
		t.Fatal(err)
	}
	// b keeps slot 1 throughout: with a long lease its session outlives the
	// test (a session that idles past its lease would end, and free slot 1).
	optsB := sem(2)
	optsB.TTL = 10 * time.Minute
	lb, err := locktest.Open(t, db, optsB).TryAcquire(locktest.Context(t), name)
	if err != nil {
		t.Fatal(err)
	}

	waiter := locktest.Open(t, db, sem(3))
	picks := 0
	detecting := make(chan struct{})
	raced := false
	waiter.Backend.(*backend).testHooks = &semaphoreTestHooks{
		// The first wait is on slot 0, which a's release frees; any later
		// one on slot 1, which stays held.
		slot: func(int) int {
			picks++
			if picks == 1 {
				close(detecting)
				return 0
			}
			return 1
		},
		detectSQL: `select pg_advisory_unlock($1::int8), pg_advisory_unlock_shared(4242)
			from (select pg_advisory_lock($1::int8), pg_advisory_lock_shared(4242) offset 0) w`,
		blocked: func(d *detector) {
			if d.done == nil || raced {
				return
			}
			// The attempt after a's release found slot 0 taken: by the
			// detector, which waits at the gate. Open it, and let the
			// detector finish before the waiter looks at it.
			raced = true
			if _, err := gateConn.Exec(context.Background(), "select pg_advisory_unlock($1::int8)", gate); err != nil {
				t.Error(err)
			}
			<-d.done
		},
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	got := make(chan error, 1)
	go func() {
		l, _, err := waiter.Backend.(lock.Waiter).Acquire(ctx, name)
		if err == nil {
			l.Release(context.Background())
		}
		got <- err
	}()

	<-detecting
	// Wait until the detector is queued for slot 0 in the server.
	k := SlotKey(name, 0)
	queued := fmt.Sprintf(`select exists(select 1 from pg_locks where locktype = 'advisory' and objsubid = 1 and not granted
		and classid::int8 = %d and objid::int8 = %d)`, uint64(k)>>32, uint32(k))
	for {
		rows, err := testenv.Exec(ctx, db, queued)
		if err != nil {
			t.Fatal(err)
		}
		if rows[0] == "t" {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := la.Release(locktest.Context(t)); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("the waiter: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the waiter did not take the slot its own detector let go of, within 30s")
	}
	if err := lb.Keep(locktest.Context(t)); err != nil {
		t.Errorf("b's slot was freed meanwhile, so the test did not test the race: %v", err)
	}
	if !raced {
		t.Error("the waiter's attempt never found its detector in the slot: the test did not test the race")
	}
}
