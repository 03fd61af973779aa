package etcd_test

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/withlock/withlock/internal/lock"
	"github.com/withlock/withlock/internal/lock/locktest"
	"github.com/withlock/withlock/internal/testenv"
)

// TestMemberIsolated: on a 3-member cluster whose peer ports are behind
// fault proxies, the member withlock talks to is cut off from its peers
// while a holder holds, with a ttl of 6s, and a waiter waits, both through
// that member. Every connection a peer makes to it is black-holed, so
// nothing it says reaches them; what they send on the connections it made
// still reaches it. It goes on following the leader, so it takes requests
// and waits for answers that never come instead of answering "no leader":
// the harder case for a client.
//
//   - all: the URL names the three members, the isolated one first. The
//     majority still holds the lock, so the holder keeps it for two ttls:
//     its renewals through the isolated member reach the leader (a follower
//     sends them on on a connection of its own) or fail, and the next go to
//     another member in time. The waiter does not get it meanwhile, and gets
//     it once the holder lets go. withlock check, meanwhile, warns that the
//     isolated member cannot serve.
//   - only: the URL names the isolated member alone. Its reads fail (they
//     need the leader's answer), and its lease renewals may too: then the
//     holder stops before its lease can run out in the majority, and the
//     waiter gets the lock only once the lease ran out there and the member
//     is back. If its renewals reach the leader, the holder keeps its lock
//     (its key is there in the majority throughout), and the waiter gets it
//     once the member is back and the holder lets go.
//
// Throughout, a monitor reads the majority (the two other members) and
// fails the test if a withlock that believes it holds the lock has no key
// there, or if two believe it at once. On the newest release the tests
// build and on the system's etcd, at once.
func TestMemberIsolated(t *testing.T) {
	for _, v := range []string{testenv.EtcdVersions[len(testenv.EtcdVersions)-1], ""} {
		name := "system"
		if v != "" {
			name = v
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			o := testenv.EtcdOptions{Version: v, PeerProxies: true}
			members := startCluster(t, o)
			t.Run("all", func(t *testing.T) { testIsolated(t, members, true) })
			t.Run("only", func(t *testing.T) { testIsolated(t, members, false) })
		})
	}
}

// testIsolated isolates a member (the leader with all, else a follower)
// from its peers while a holder holds and a waiter waits through it, and
// ends the isolation before it returns.
func testIsolated(t *testing.T, members []*testenv.Etcd, all bool) {
	leader := leaderOf(t, members)
	iso := leader
	if !all {
		iso = (leader + 1) % len(members)
	}
	var majority, endpoints []string
	for i, m := range members {
		if i != iso {
			majority = append(majority, m.Endpoint)
		}
	}
	endpoints = append([]string{members[iso].Endpoint}, majority...)
	if !all {
		endpoints = endpoints[:1]
	}
	url := "etcd://" + strings.Join(endpoints, ",")
	maj, err := clientv3.New(clientv3.Config{Endpoints: majority, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer maj.Close()

	name := locktest.Name(t)
	// The holder has ttl − grace to renew through the majority once the
	// isolated member stops answering: room for an election and a
	// failover on a busy machine.
	opts := lock.Options{TTL: 6 * time.Second, Grace: time.Second, ConnectTimeout: time.Minute}
	holderLog := &warnings{}
	hopts := opts
	hopts.Log = slog.New(holderLog)
	holder, err := locktest.Open(t, url, hopts).Acquire(locktest.Context(t), name)
	if err != nil {
		t.Fatal(err)
	}
	waiterCtx, cancelWaiter := context.WithCancel(locktest.Context(t))
	defer cancelWaiter()
	got := make(chan *lock.Held, 1)
	go func() {
		h, err := locktest.Open(t, url, opts).Acquire(waiterCtx, name)
		if err != nil && waiterCtx.Err() == nil {
			t.Error(err)
		}
		got <- h
	}()
	// Queued (two keys in the majority) and watching on the member.
	kvs := lockKeys(t, maj, name)
	for ; len(kvs) < 2; kvs = lockKeys(t, maj, name) {
		time.Sleep(20 * time.Millisecond)
	}
	waitWatchers(t, members[iso], 1)
	if tok, _ := holder.Token(); kvs[0].rev != tok {
		t.Fatalf("the first key's create revision is %d; the holder's token %d", kvs[0].rev, tok)
	}
	holderLease := kvs[0].lease

	mon := &monitor{t: t, c: maj, name: name}
	mon.add(holder)
	stop := mon.run()
	defer stop()

	st, err := maj.Status(locktest.Context(t), members[iso].Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	isoID := st.Header.MemberId
	members[iso].PeerProxy.BlackHole()
	isolated := time.Now()
	healed := false
	heal := func() {
		if !healed {
			members[iso].PeerProxy.Heal()
			healed = true
		}
	}
	defer heal()
	t.Logf("isolated member %d (leader: %d); URL %s", iso, leader, url)

	if all {
		// Meanwhile, withlock check through a member of the majority, once
		// every member of the majority knows a leader of its own (a
		// request that the isolated leader took is lost; a member that
		// has not heard of the new leader yet says it knows none).
		checked := make(chan lock.Finding, 1)
		go func() {
			for wait := locktest.Context(t); ; time.Sleep(20 * time.Millisecond) {
				var err error
				led := 0
				for _, ep := range majority {
					ctx, cancel := context.WithTimeout(wait, time.Second)
					var st *clientv3.StatusResponse
					st, err = maj.Status(ctx, ep)
					cancel()
					if err == nil && st.Leader != 0 && st.Leader != isoID {
						led++
					}
				}
				if led == len(majority) {
					break
				}
				if wait.Err() != nil {
					t.Errorf("the majority elected no leader: %v", err)
					break
				}
			}
			// An election can start again on a busy machine, whose
			// members miss heartbeats: check again while a member
			// knows no leader.
			var f lock.Finding
			c := locktest.Open(t, "etcd://"+majority[0], opts)
			for wait := locktest.Context(t); ; time.Sleep(100 * time.Millisecond) {
				findings, err := c.Check(wait)
				if err != nil {
					t.Errorf("withlock check: %v", err)
					break
				}
				if len(findings) == 2 {
					f = findings[1]
				}
				if !strings.Contains(f.Detail, "know no leader") || wait.Err() != nil {
					break
				}
			}
			checked <- f
		}()
		select {
		case <-holder.Lost():
			t.Fatalf("the holder lost its lock %s after the isolation, which the majority still held: %v", time.Since(isolated).Round(time.Millisecond), holder.Err())
		case h := <-got:
			t.Fatalf("the waiter got the lock while the holder held it (%v)", h != nil)
		case <-time.After(2 * opts.TTL):
		}
		f := <-checked
		if want := fmt.Sprintf("members m%d (", iso); f.Status != lock.Warn || !strings.Contains(f.Detail, want) || !strings.Contains(f.Detail, "cannot serve a linearizable read") {
			t.Errorf("withlock check: %s %s; want a warning that m%d cannot serve a linearizable read", f.Status, f.Detail, iso)
		}
		t.Logf("withlock check: %s %s", f.Status, f.Detail)
		t.Logf("the holder kept its lock for %s; its renewals that failed: %q", 2*opts.TTL, holderLog.take())
		mon.remove(holder)
		if err := holder.Release(locktest.Context(t)); err != nil {
			t.Fatalf("release: %v", err)
		}
	} else {
		select {
		case <-holder.Lost():
		case h := <-got:
			t.Fatalf("the waiter got the lock through the isolated member (%v)", h != nil)
		case <-time.After(2 * opts.TTL):
			// Its renewals reach the leader; the monitor has checked
			// that its key stayed in the majority meanwhile.
			t.Logf("the holder kept its lock %s after its member was isolated: its renewals reached the leader", 2*opts.TTL)
			heal()
			mon.remove(holder)
			waitServes(t, members[iso])
			if err := holder.Release(locktest.Context(t)); err != nil {
				t.Fatalf("release once the member is back: %v", err)
			}
			all = true // the holder let go, as with all
		}
		if !healed {
			stopped := time.Since(isolated)
			if !keyOfLease(lockKeys(t, maj, name), holderLease) {
				t.Errorf("the holder stopped only once its lease had run out in the majority")
			}
			t.Logf("the holder stopped %s after the isolation: %v", stopped.Round(time.Millisecond), holder.Err())
			// The lease runs on in the majority until the last renewal that
			// reached it, plus the ttl.
			for keyOfLease(lockKeys(t, maj, name), holderLease) {
				select {
				case h := <-got:
					t.Fatalf("the waiter got the lock while the holder's lease ran in the majority (%v)", h != nil)
				case <-time.After(50 * time.Millisecond):
				}
			}
			t.Logf("the holder's lease ran out in the majority %s after the isolation", time.Since(isolated).Round(time.Millisecond))
			heal()
		}
	}
	select {
	case h := <-got:
		if h == nil {
			t.Fatal("the waiter failed")
		}
		// The holder let go or stopped, and the majority says the waiter
		// holds: its key is the first.
		select {
		case <-holder.Lost():
		default:
			if !all {
				t.Error("the waiter got the lock while the holder still believed it held it")
			}
		}
		tok1, _ := holder.Token()
		tok2, _ := h.Token()
		if kvs := lockKeys(t, maj, name); len(kvs) == 0 || kvs[0].rev != tok2 {
			t.Errorf("the waiter got the lock (token %d), but the majority's keys are %v", tok2, kvs)
		}
		if tok2 <= tok1 {
			t.Errorf("tokens %d then %d; want them to grow", tok1, tok2)
		}
		if err := h.Release(locktest.Context(t)); err != nil {
			t.Errorf("the waiter's release: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the waiter did not get the lock within 15s")
	}
	stop()
	heal()
	// The member is back once it serves a linearizable read again.
	back, err := clientv3.New(clientv3.Config{Endpoints: []string{members[iso].Endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer back.Close()
	for wait := locktest.Context(t); ; time.Sleep(20 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(wait, time.Second)
		_, err := back.Get(ctx, name)
		cancel()
		if err == nil {
			break
		}
		if wait.Err() != nil {
			t.Fatalf("member %d did not come back: %v", iso, err)
		}
	}
}

// leaderOf is the index of the member that leads.
func leaderOf(t *testing.T, members []*testenv.Etcd) int {
	t.Helper()
	c := client(t, members[0])
	// During an election (after a member was isolated and healed, or on
	// a busy machine) no member leads for a moment: ask until one does.
	for wait := locktest.Context(t); ; time.Sleep(50 * time.Millisecond) {
		for i, m := range members {
			st, err := c.Status(wait, m.Endpoint)
			if err == nil && st.Leader == st.Header.MemberId {
				return i
			}
		}
		if wait.Err() != nil {
			t.Fatal("no member says it leads")
		}
	}
}

// lockKeys reads name's keys from c, linearizably, oldest first.
func lockKeys(t *testing.T, c *clientv3.Client, name string) []mvccKV {
	t.Helper()
	kvs, err := readKeys(t, c, name)
	if err != nil {
		t.Fatalf("reading the majority: %v", err)
	}
	return kvs
}

// readKeys is lockKeys for any goroutine.
func readKeys(t *testing.T, c *clientv3.Client, name string) ([]mvccKV, error) {
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	resp, err := c.Get(ctx, name+"/", clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
	if err != nil {
		return nil, err
	}
	var kvs []mvccKV
	for _, kv := range resp.Kvs {
		kvs = append(kvs, mvccKV{key: string(kv.Key), rev: kv.CreateRevision, lease: kv.Lease})
	}
	return kvs, nil
}

type mvccKV struct {
	key   string
	rev   int64
	lease int64
}

func keyOfLease(kvs []mvccKV, lease int64) bool {
	for _, kv := range kvs {
		if kv.lease == lease {
			return true
		}
	}
	return false
}

// monitor reads the majority's keys of name again and again, and checks
// them against what the withlocks it watches believe: each that has not
// lost its lock must be the first key there (its token, the key's create
// revision). A belief is read after the keys, so that a withlock that
// still believes it holds after the majority said otherwise is caught.
type monitor struct {
	t    *testing.T
	c    *clientv3.Client
	name string

	mu   sync.Mutex
	held []*lock.Held
}

func (m *monitor) add(h *lock.Held) {
	m.mu.Lock()
	m.held = append(m.held, h)
	m.mu.Unlock()
}

// remove stops checking h, which is about to release.
func (m *monitor) remove(h *lock.Held) {
	m.mu.Lock()
	m.held = slices.DeleteFunc(m.held, func(x *lock.Held) bool { return x == h })
	m.mu.Unlock()
}

// run starts the monitor; the function it returns stops it and waits.
func (m *monitor) run() (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-done:
				return
			case <-time.After(20 * time.Millisecond):
			}
			kvs, err := readKeys(m.t, m.c, m.name)
			if err != nil {
				m.t.Errorf("reading the majority: %v", err)
				return
			}
			m.mu.Lock()
			var believers []string
			for _, h := range m.held {
				select {
				case <-h.Lost():
					continue
				default:
				}
				tok, _ := h.Token()
				if len(kvs) == 0 || kvs[0].rev != tok {
					first := "no key"
					if len(kvs) > 0 {
						first = fmt.Sprintf("the first key's create revision is %d", kvs[0].rev)
					}
					m.t.Errorf("a withlock believes it holds the lock (token %d) but in the majority %s", tok, first)
				}
				believers = append(believers, fmt.Sprint(tok))
			}
			m.mu.Unlock()
			if len(believers) > 1 {
				m.t.Errorf("withlocks with tokens %s believe they hold the lock at once", strings.Join(believers, ", "))
			}
		}
	})
	var once sync.Once
	return func() { once.Do(func() { close(done); wg.Wait() }) }
}

// waitServes waits until m, back among its peers, serves a linearizable
// read: on a busy machine it takes a while to hear from the leader again.
func waitServes(t *testing.T, m *testenv.Etcd) {
	t.Helper()
	c := client(t, m)
	testenv.WaitFor(t, m.Endpoint+" serving again", func() bool {
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		_, err := c.Get(ctx, "withlock-test-serves")
		return err == nil
	})
}
