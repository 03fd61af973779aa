package mongodb_test

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/withlock/withlock/internal/lock"
	"github.com/withlock/withlock/internal/lock/locktest"
	"github.com/withlock/withlock/internal/lock/mongodb"
	"github.com/withlock/withlock/internal/stress/faultproxy"
	"github.com/withlock/withlock/internal/testenv"
)

// cutAt returns a rule that cuts the connection at the nth message carrying
// cmd (every one of them if nth is 0), as c says.
func cutAt(cmd string, nth int, c faultproxy.Cut) func(faultproxy.Message) faultproxy.Action {
	var seen atomic.Int64
	return func(m faultproxy.Message) faultproxy.Action {
		if m.Kind != cmd {
			return faultproxy.Action{}
		}
		if n := seen.Add(1); nth == 0 || n == int64(nth) {
			return faultproxy.Action{Cut: c}
		}
		return faultproxy.Action{}
	}
}

// mustBeUnavailable checks that err says "try again": a connection cut is
// not a refusal, and not a loss of the lock.
func mustBeUnavailable(t *testing.T, what string, err error) {
	t.Helper()
	if !errors.Is(err, lock.ErrUnavailable) || errors.Is(err, lock.ErrRefused) || errors.Is(err, lock.ErrLost) || errors.Is(err, lock.ErrHeld) {
		t.Fatalf("%s: %v; want ErrUnavailable only", what, err)
	}
	if !strings.HasPrefix(err.Error(), "cannot reach mongodb at ") {
		t.Errorf("%s: %q; want it to say it cannot reach mongodb", what, err)
	}
}

// eventually calls f until it returns nil, for up to 10s while it returns
// ErrUnavailable (the driver reconnecting); any other error fails t.
func eventually(t *testing.T, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := f()
		if err == nil {
			return
		}
		if !errors.Is(err, lock.ErrUnavailable) || time.Now().After(deadline) {
			t.Fatalf("%s once the connection is whole again: %v", what, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestCutConnection cuts the connection at every step of acquiring, renewing
// and releasing: while connecting, authenticating, before each request
// reaches the server, and after the server answered but before the answer
// arrives, by a reset and by a close. Each time the backend must say
// "unavailable" (lock.Acquire retries that within --connect-timeout), never
// "refused" (exit 69 at once) or "lost"; and once the connection is whole
// again, the same client goes on: in particular an acquisition or renewal
// that landed although its answer was lost is found to be its own.
func TestCutConnection(t *testing.T) {
	m := testenv.RequireMongo(t)
	u, err := url.Parse(m.URL)
	if err != nil {
		t.Fatal(err)
	}
	const ttl = 30 * time.Second // no lease may run out during a subtest
	cuts := []faultproxy.Cut{faultproxy.ResetBefore, faultproxy.CloseBefore, faultproxy.ResetAfter, faultproxy.CloseAfter}
	// The steps, as the proxy sees them (PLAIN authentication, which
	// FerretDB accepts with any password, adds saslStart).
	type step struct {
		cmd string
		nth int // 0: every one
	}
	// Every hello is cut: the driver's monitor sends its own on a connection
	// of its own, and the first one the proxy sees may be the monitor's.
	acquire := []step{{"isMaster", 0}, {"saslStart", 0}, {"find", 1}, {"hello", 0}, {"insert", 1}, {"find", 2}}
	keepSteps := []step{{"hello", 0}, {"insert", 1}, {"find", 1}}
	release := []step{{"insert", 1}}

	// cut has p cut the connection at s, as c says, while f runs, which
	// must find the server unavailable.
	cut := func(t *testing.T, p *faultproxy.Proxy, s step, c faultproxy.Cut, what string, f func() error) {
		t.Helper()
		p.SetRule(cutAt(s.cmd, s.nth, c))
		mustBeUnavailable(t, what, f())
		p.SetRule(nil)
	}
	// held takes a new name through a client behind a new proxy, and opens
	// another client straight to the server.
	held := func(t *testing.T) (p *faultproxy.Proxy, l lock.Lease, other *lock.Client, name string) {
		t.Helper()
		p = startProxy(t, u.Host)
		b := locktest.Open(t, "mongodb://"+p.Addr()+"/", lock.Options{TTL: ttl, ConnectTimeout: time.Second})
		other = locktest.Open(t, m.URL, lock.Options{})
		name = locktest.Name(t)
		l, err := b.TryAcquire(locktest.Context(t), name)
		if err != nil {
			t.Fatal(err)
		}
		return p, l, other, name
	}

	for _, s := range acquire {
		for _, c := range cuts {
			t.Run(fmt.Sprintf("TryAcquire/%s#%d/%v", s.cmd, s.nth, c), func(t *testing.T) {
				t.Parallel()
				p := startProxy(t, u.Host)
				b := locktest.Open(t, "mongodb://u:pw@"+p.Addr()+"/?authMechanism=PLAIN", lock.Options{TTL: ttl, ConnectTimeout: time.Second})
				name := locktest.Name(t)
				cut(t, p, s, c, "TryAcquire", func() error {
					_, err := b.TryAcquire(locktest.Context(t), name)
					return err
				})
				eventually(t, "TryAcquire", func() error {
					l, err := b.TryAcquire(locktest.Context(t), name)
					if err == nil {
						mustRelease(t, l)
					}
					return err
				})
			})
		}
	}
	for _, s := range keepSteps {
		for _, c := range cuts {
			t.Run(fmt.Sprintf("Keep/%s#%d/%v", s.cmd, s.nth, c), func(t *testing.T) {
				t.Parallel()
				p, l, other, name := held(t)
				cut(t, p, s, c, "Keep", func() error { return l.Keep(locktest.Context(t)) })
				eventually(t, "Keep", func() error { return l.Keep(locktest.Context(t)) })
				if _, err := other.TryAcquire(locktest.Context(t), name); !errors.Is(err, lock.ErrHeld) {
					t.Fatalf("another client's TryAcquire: %v; want ErrHeld", err)
				}
				mustRelease(t, l)
			})
		}
	}
	for _, s := range release {
		for _, c := range cuts {
			t.Run(fmt.Sprintf("Release/%s#%d/%v", s.cmd, s.nth, c), func(t *testing.T) {
				t.Parallel()
				p, l, other, name := held(t)
				cut(t, p, s, c, "Release", func() error { return l.Release(locktest.Context(t)) })
				landed := s.cmd == "insert" && (c == faultproxy.ResetAfter || c == faultproxy.CloseAfter)
				eventually(t, "Release", func() error {
					err := l.Release(locktest.Context(t))
					if landed && err != nil && strings.Contains(err.Error(), "no longer ours") {
						return nil // the first release did land
					}
					return err
				})
				lo, err := other.TryAcquire(locktest.Context(t), name)
				if err != nil {
					t.Fatalf("another client's TryAcquire after the release: %v", err)
				}
				mustRelease(t, lo)
			})
		}
	}
}

// TestStaleInsert: a renewal or an acquisition whose insert reaches the
// server only after the chain has moved on by more than keep, so that the
// _id it claims was deleted and is free again, must not count (see the
// package doc). Without the check after each insert, the stale holder
// would go on renewing a lock someone else holds.
func TestStaleInsert(t *testing.T) {
	m := testenv.RequireMongo(t)
	u, err := url.Parse(m.URL)
	if err != nil {
		t.Fatal(err)
	}
	const ttl = 300 * time.Millisecond
	p := startProxy(t, u.Host)
	slow := locktest.Open(t, "mongodb://"+p.Addr()+"/", lock.Options{TTL: ttl})
	// An acquisition gives up after TTL-Grace; this one must wait long
	// enough for its insert to be stale.
	slowAcquirer := locktest.Open(t, "mongodb://"+p.Addr()+"/", lock.Options{TTL: 10 * time.Second, Grace: time.Second})
	fast := locktest.Open(t, m.URL, lock.Options{TTL: 10 * time.Second})
	for _, b := range []*lock.Client{slow, slowAcquirer, fast} {
		mongodb.SetKeep(b, 2)
		mongodb.SetSpare(b, 0) // delete as soon as keep allows
	}
	c := locks(t, m.URL)

	// holdInsert makes the proxy keep slow's next insert until release is
	// called (at the latest when t ends); arrived is closed once the insert
	// has reached the proxy.
	holdInsert := func(t *testing.T) (arrived chan struct{}, release func()) {
		arrived, held := make(chan struct{}), make(chan struct{})
		var once atomic.Bool
		p.SetRule(func(m faultproxy.Message) faultproxy.Action {
			if m.Kind == "insert" && once.CompareAndSwap(false, true) {
				close(arrived)
				return faultproxy.Action{Wait: held}
			}
			return faultproxy.Action{}
		})
		release = sync.OnceFunc(func() { close(held) })
		t.Cleanup(release)
		return arrived, release
	}
	// moveOn has fast take the lock as soon as it can and renew it until
	// the document at seq is deleted.
	moveOn := func(name string, seq int64) lock.Lease {
		t.Helper()
		var l lock.Lease
		deadline := time.Now().Add(10 * time.Second)
		for {
			var err error
			if l, err = fast.TryAcquire(locktest.Context(t), name); err == nil {
				break
			}
			if !errors.Is(err, lock.ErrHeld) || time.Now().After(deadline) {
				t.Fatalf("fast's TryAcquire: %v", err)
			}
			time.Sleep(20 * time.Millisecond) // polling, as lock.Acquire does
		}
		for n := 0; ; n++ {
			if n == 20 {
				t.Fatalf("seq %d was never deleted: %+v", seq, chain(t, c, name))
			}
			if err := l.Keep(locktest.Context(t)); err != nil {
				t.Fatal(err)
			}
			gone := true
			for _, d := range chain(t, c, name) {
				gone = gone && d.Seq != seq
			}
			if gone {
				return l
			}
		}
	}

	t.Run("Keep", func(t *testing.T) {
		name := locktest.Name(t)
		l, _ := take(t, slow, name)
		docs := chain(t, c, name)
		next := docs[len(docs)-1].Seq + 1
		arrived, release := holdInsert(t)
		kept := make(chan error, 1)
		go func() { kept <- l.Keep(locktest.Context(t)) }()
		<-arrived
		lf := moveOn(name, next) // takes the lock once slow's lease runs out
		release()
		err = <-kept
		if !errors.Is(err, lock.ErrLost) {
			t.Errorf("the stale renewal: %v; want ErrLost", err)
		}
		var landed bool
		for _, d := range chain(t, c, name) {
			landed = landed || d.Seq == next && d.Op == "renew"
		}
		if !landed {
			t.Errorf("the stale renewal never landed at seq %d, so this test tested nothing", next)
		}
		if err := lf.Keep(locktest.Context(t)); err != nil {
			t.Errorf("the new holder's Keep after the stale insert: %v", err)
		}
		mustRelease(t, lf)
	})
	t.Run("TryAcquire", func(t *testing.T) {
		name := locktest.Name(t)
		lf, err := fast.TryAcquire(locktest.Context(t), name)
		if err != nil {
			t.Fatal(err)
		}
		mustRelease(t, lf)
		docs := chain(t, c, name)
		next := docs[len(docs)-1].Seq + 1
		arrived, release := holdInsert(t)
		got := make(chan error, 1)
		go func() {
			l, err := slowAcquirer.TryAcquire(locktest.Context(t), name)
			if err == nil {
				l.Release(locktest.Context(t))
			}
			got <- err
		}()
		<-arrived
		lf = moveOn(name, next)
		release()
		if err := <-got; !errors.Is(err, lock.ErrHeld) {
			t.Errorf("the stale acquisition: %v; want ErrHeld", err)
		}
		if err := lf.Keep(locktest.Context(t)); err != nil {
			t.Errorf("the new holder's Keep after the stale insert: %v", err)
		}
		mustRelease(t, lf)
	})
}
