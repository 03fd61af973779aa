package etcd_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/withlock/withlock/internal/lock"
	"github.com/withlock/withlock/internal/lock/etcd"
	"github.com/withlock/withlock/internal/lock/locktest"
	"github.com/withlock/withlock/internal/testenv"
)

// TestModesStress: 16 contenders against the real server, each with a
// client per mode: 8 mix shared and exclusive holders of one name, one of
// them always through concurrency.Mutex (what etcdctl lock runs), and 8
// hold a semaphore of 3 on another name, now and then exclusively. One
// acquisition in ten ends as if its holder's host died: its lease is
// revoked behind its back (as release --force does) and it only learns of
// it from its keep loop. The semaphore never has 4 holders, shared never
// overlaps exclusive, exclusive is always alone, and every exclusive
// holder's token is larger than those handed out before it on the same
// name. On every release, with authentication off and on, one after
// another: sixteen contenders are load enough. The JWTs outlive the test:
// the official client's session behind the Mutex ends when its token
// expires on a busy machine (withlock's holders keep theirs through
// expiring tokens: TestAuthTokens, TestConformance).
func TestModesStress(t *testing.T) {
	eachSetUp(t, false, 5*time.Minute, testModesStress)
}

func testModesStress(t *testing.T, e *testenv.Etcd, url string) {
	admin := client(t, e)
	const rounds = 25
	var session *concurrency.Session
	t.Cleanup(func() {
		if session != nil {
			session.Close()
		}
	})
	locktest.Stress{
		URL:        url,
		Contenders: locktest.Mixed(),
		Rounds:     rounds,
		TTL:        3 * time.Second,
		Tokens:     true,
		// The first contender is etcdctl lock's recipe, taking "rw"
		// exclusively; its token is withlock's: its key's create revision.
		Take: func(ctx context.Context, r locktest.Round) (locktest.Stint, bool, error) {
			if r.Who != 0 {
				return locktest.Stint{}, false, nil
			}
			if session != nil {
				select {
				case <-session.Done():
					// Its lease ran out: the client's keep-alive, on a
					// machine this busy, did not run in time. A new one.
					session.Close()
					session = nil
				default:
				}
			}
			if session == nil {
				var err error
				if session, err = concurrency.NewSession(admin, concurrency.WithTTL(10)); err != nil {
					return locktest.Stint{}, true, err
				}
			}
			m := concurrency.NewMutex(session, r.Name)
			lctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
			err := m.Lock(lctx)
			cancel()
			if err != nil {
				return locktest.Stint{}, true, fmt.Errorf("Mutex.Lock: %w", err)
			}
			resp, err := admin.Get(ctx, m.Key())
			if err != nil || len(resp.Kvs) != 1 {
				return locktest.Stint{}, true, fmt.Errorf("the Mutex's key: %v, %v", resp, err)
			}
			s := locktest.Stint{Mode: lock.Exclusive, Kind: "mutex", Enter: time.Now(), Token: resp.Kvs[0].CreateRevision}
			time.Sleep(time.Duration(5+r.Rng.IntN(25)) * time.Millisecond) // the critical section
			s.Exit = time.Now()
			if err := m.Unlock(ctx); err != nil {
				return s, true, fmt.Errorf("Mutex.Unlock: %w", err)
			}
			return s, true, nil
		},
		// The lease of name's key with create revision token is revoked.
		Crash: func(t *testing.T, c *lock.Client, name string, token int64) {
			resp, err := admin.Get(context.Background(), etcd.Prefix(name), clientv3.WithPrefix())
			if err != nil {
				t.Error(err)
				return
			}
			for _, kv := range resp.Kvs {
				if kv.CreateRevision == token {
					if _, err := admin.Revoke(context.Background(), clientv3.LeaseID(kv.Lease)); err != nil {
						t.Error(err)
					}
					return
				}
			}
			t.Errorf("no key of %s with create revision %d", name, token)
		},
		// The Mutex took its every round.
		Untested: func(stints []locktest.Stint) []string {
			n := 0
			for _, s := range stints {
				if s.Kind == "mutex" {
					n++
				}
			}
			if n != rounds {
				return []string{fmt.Sprintf("%d Mutex acquisitions; want %d", n, rounds)}
			}
			return nil
		},
	}.Run(t)
}
