package etcd_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/withlock/withlock/internal/lock"
	"github.com/withlock/withlock/internal/lock/locktest"
	"github.com/withlock/withlock/internal/testenv"
)

// With authentication on, a holder and a waiter keep their lock and their
// place through what changes or ends their auth tokens: a token's expiry
// (JWT tokens with a TTL shorter than the hold), a change of the user's
// password (set again to the same one, which invalidates the user's simple
// tokens and makes every token older than the auth store), a change of the
// user's role, and a restart of the member (simple tokens live in its
// memory alone). On the system's etcd and on every release of
// testenv.EtcdVersions, with simple tokens and with JWTs: every release
// since 3.5.28 and 3.6.10 checks the token of each lease renewal.
//
// The subtests run four at a time, whatever -parallel says: each spends
// its time waiting for leases to be renewed, and they are many; all eight
// at once (eight servers, sixteen clients) starve each other on a small
// machine.
func TestAuthTokens(t *testing.T) {
	var wg sync.WaitGroup
	slots := make(chan struct{}, 4)
	for _, v := range append([]string{""}, testenv.EtcdVersions...) {
		for _, jwt := range []bool{false, true} {
			name := "system"
			if v != "" {
				name = v
			}
			name += map[bool]string{false: "/simple", true: "/jwt"}[jwt]
			wg.Go(func() {
				slots <- struct{}{}
				defer func() { <-slots }()
				t.Run(name, func(t *testing.T) {
					o := testenv.EtcdOptions{Version: v}
					if jwt {
						o.JWTTTL = 2 * time.Second
					}
					testAuthTokens(t, testenv.RequireEtcd(t, o))
				})
			})
		}
	}
	wg.Wait()
}

func testAuthTokens(t *testing.T, e *testenv.Etcd) {
	// The user is made before authentication is on: with JWTs of 2s, a
	// root client's token can run out in the middle of the set-up on a busy
	// machine, and the official client does not always fetch a new one.
	addUser(t, e, "wl", "wlpw", "jobs/")
	enableAuth(t, e, "rootpw")
	// A new client of root's for each step: on etcd 3.4, the official
	// client (3.7) sends a token that a restart or its expiry made invalid
	// again and again instead of fetching a new one.
	root := func() *clientv3.Client { return client(t, e) }
	u, _ := url.Parse(e.URL)
	u.User = url.UserPassword("wl", "wlpw")
	name := "jobs/" + locktest.Name(t)
	// Long enough for the restart to fit within ttl - kill-after on a busy
	// machine: a member stopping gracefully waits for the streams it serves
	// to end, up to its request timeout (5.2s here), and a JWT of 2s can
	// run out on the holder's renewal stream meanwhile, when no new stream
	// can be opened.
	const ttl = 9 * time.Second
	opts := func(log *warnings) lock.Options {
		return lock.Options{TTL: ttl, Grace: 2 * time.Second, ConnectTimeout: time.Minute, Log: slog.New(log)}
	}

	holderLog := &warnings{}
	holder, err := locktest.Open(t, u.String(), opts(holderLog)).Acquire(locktest.Context(t), name)
	if err != nil {
		t.Fatal(err)
	}
	waiterLog := &warnings{}
	got := make(chan *lock.Held, 1)
	// The waiter waits through every step below: five lease lengths and a
	// restart, longer than locktest.Context allows.
	waitCtx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	t.Cleanup(cancel)
	go func() {
		h, err := locktest.Open(t, u.String(), opts(waiterLog)).Acquire(waitCtx, name)
		if err != nil && waitCtx.Err() == nil {
			t.Error(err)
		}
		got <- h
	}()
	waitWatchers(t, e, 2) // the holder's, of its key, and the waiter's
	queued := keys(t, root(), name)
	if len(queued) != 2 {
		t.Fatalf("keys of a holder and a waiter: %q", queued)
	}

	// Each event is followed by a lease length, in which each lease is
	// renewed (or it would run out) and a JWT of 2s expires.
	keptThrough := func(event string, restarted bool) {
		t.Helper()
		time.Sleep(ttl) // the renewals that follow the event are the point
		select {
		case <-holder.Lost():
			t.Fatalf("after %s: the holder lost its lock: %v", event, holder.Err())
		case h := <-got:
			t.Fatalf("after %s: the waiter got the lock while the holder held it (%v; keys %q, queued %q; holder's warnings %q, waiter's %q)", event, h != nil, keys(t, root(), name), queued, holderLog.take(), waiterLog.take())
		default:
		}
		if restarted {
			// A watch that the restart broke queues the waiter again.
			return
		}
		if w := holderLog.take(); len(w) > 0 {
			t.Errorf("after %s: the holder could not confirm its lock: %q", event, w)
		}
		if w := waiterLog.take(); len(w) > 0 {
			t.Errorf("after %s: the waiter had to queue again: %q", event, w)
		}
		if ks := keys(t, root(), name); fmt.Sprint(ks) != fmt.Sprint(queued) {
			t.Errorf("after %s: keys %q; want %q: the waiter kept its place", event, ks, queued)
		}
	}
	ctx := locktest.Context(t)
	keptThrough("a lease length", false)
	if _, err := root().UserChangePassword(ctx, "wl", "wlpw"); err != nil {
		t.Fatal(err)
	}
	keptThrough("a change of the user's password", false)
	if _, err := root().RoleGrantPermission(ctx, "wl-role", "more/", clientv3.GetPrefixRangeEnd("more/"), clientv3.PermissionType(clientv3.PermRead)); err != nil {
		t.Fatal(err)
	}
	keptThrough("a change of the user's role", false)
	restartMember(t, e)
	keptThrough("a restart of the member", true)
	// The restart broke the waiter's watch: it queued again.
	waitWatchers(t, e, 2)
	if queued = keys(t, root(), name); len(queued) != 2 {
		t.Fatalf("keys of a holder and a waiter after the restart: %q", queued)
	}
	holderLog.take()
	waiterLog.take()
	keptThrough("a lease length after the restart", false)

	if err := holder.Release(locktest.Context(t)); err != nil {
		t.Fatal(err)
	}
	select {
	case h := <-got:
		if h != nil {
			h.Release(locktest.Context(t))
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter did not get the lock within 10s of the release")
	}
}

// warnings is a slog.Handler that keeps what says a request failed and is
// retried: a holder's Keep ("could not confirm the lock"), a waiter's
// attempt ("backend unavailable").
type warnings struct {
	mu   sync.Mutex
	msgs []string
}

func (w *warnings) Enabled(context.Context, slog.Level) bool { return true }
func (w *warnings) Handle(_ context.Context, r slog.Record) error {
	msg := r.Message
	if !strings.HasSuffix(msg, "retrying") {
		return nil
	}
	r.Attrs(func(a slog.Attr) bool { msg += " " + a.String(); return true })
	w.mu.Lock()
	w.msgs = append(w.msgs, msg)
	w.mu.Unlock()
	return nil
}
func (w *warnings) WithAttrs([]slog.Attr) slog.Handler { return w }
func (w *warnings) WithGroup(string) slog.Handler      { return w }

// take returns the warnings so far and forgets them.
func (w *warnings) take() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	m := w.msgs
	w.msgs = nil
	return m
}
