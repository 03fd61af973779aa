package redis_test

import (
	"bytes"
	"context"
	"errors"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/withlock/withlock/internal/lock"
	"github.com/withlock/withlock/internal/lock/locktest"
	"github.com/withlock/withlock/internal/lock/redis"
	"github.com/withlock/withlock/internal/stress/faultproxy"
	"github.com/withlock/withlock/internal/testenv"
)

func TestConformance(t *testing.T) {
	r := testenv.RequireRedis(t)
	locktest.Run(t, locktest.Config{
		Open: func(t *testing.T, opts lock.Options) *lock.Client { return locktest.Open(t, r.URL, opts) },
		Lease: &locktest.Lease{Break: func(t *testing.T, name string) {
			if n, err := testenv.RedisDo(locktest.Context(t), r.URL, "DEL", redis.Key(name)); err != nil || n != "1" {
				t.Fatalf("DEL %s: %q, %v", redis.Key(name), n, err)
			}
		}},
		Modes: locktest.Modes{RecordsN: true},
	})
}

func TestErrors(t *testing.T) {
	r := testenv.RequireRedis(t, testenv.RedisOptions{Password: "s3cret-pw"})
	bad := strings.Replace(r.URL, "s3cret-pw", "wrong", 1)
	_, err := locktest.Open(t, bad, lock.Options{}).TryAcquire(locktest.Context(t), "job")
	if !errors.Is(err, lock.ErrRefused) {
		t.Errorf("wrong password: %v; want ErrRefused", err)
	}
	_, err = locktest.Open(t, "redis://127.0.0.1:1/0", lock.Options{}).TryAcquire(locktest.Context(t), "job")
	if !errors.Is(err, lock.ErrUnavailable) || !strings.Contains(err.Error(), "connection refused") {
		t.Errorf("closed port: %v; want ErrUnavailable saying connection refused", err)
	}
}

// BenchmarkRoundTrip is one acquire and release on an open connection.
func BenchmarkRoundTrip(b *testing.B) {
	r := testenv.RequireRedis(b)
	locktest.BenchRoundTrip(b, r.URL)
}

func do(t *testing.T, url string, args ...string) string {
	t.Helper()
	reply, err := testenv.RedisDo(locktest.Context(t), url, args...)
	if err != nil {
		t.Fatalf("%q: %v", args, err)
	}
	return reply
}

// serverMicros is the server's clock (TIME) in microseconds.
func serverMicros(t *testing.T, url string) int64 {
	t.Helper()
	parts := strings.Split(do(t, url, "TIME"), "\n")
	sec, err1 := strconv.ParseInt(parts[0], 10, 64)
	usec, err2 := strconv.ParseInt(parts[len(parts)-1], 10, 64)
	if err1 != nil || err2 != nil || len(parts) != 2 {
		t.Fatalf("TIME = %q", parts)
	}
	return sec*1_000_000 + usec
}

func token(t *testing.T, b lock.Backend, name string) int64 {
	t.Helper()
	l, err := b.TryAcquire(locktest.Context(t), name)
	if err != nil {
		t.Fatalf("TryAcquire: %v", err)
	}
	defer l.Release(locktest.Context(t))
	return l.(lock.Expiring).Token()
}

// The fencing token is the server's clock in microseconds, or one more
// than the last token when that is larger: it grows across a lost fence
// counter, and across a counter that went back (a restored snapshot).
func TestFenceFromServerClock(t *testing.T) {
	r := testenv.RequireRedis(t)
	b, name := locktest.Open(t, r.URL, lock.Options{TTL: 10 * time.Second}), locktest.Name(t)
	before := serverMicros(t, r.URL)
	first := token(t, b, name)
	if first < before || first > serverMicros(t, r.URL) {
		t.Errorf("first token %d is not the server's clock in µs (from %d)", first, before)
	}
	if got := do(t, r.URL, "GET", redis.FenceKey(name)); got != strconv.FormatInt(first, 10) {
		t.Errorf("%s = %q, want %d", redis.FenceKey(name), got, first)
	}
	do(t, r.URL, "DEL", redis.FenceKey(name))
	second := token(t, b, name)
	do(t, r.URL, "SET", redis.FenceKey(name), "5")
	third := token(t, b, name)
	if !(first < second && second < third) {
		t.Errorf("tokens %d, %d (counter deleted), %d (counter set back to 5): want strictly increasing", first, second, third)
	}
	// A counter ahead of the clock (set by another server, say) goes on by one.
	ahead := serverMicros(t, r.URL) + 3_600_000_000
	do(t, r.URL, "SET", redis.FenceKey(name), strconv.FormatInt(ahead, 10))
	if got := token(t, b, name); got != ahead+1 {
		t.Errorf("token after a counter of %d = %d, want %d", ahead, got, ahead+1)
	}
	// The fence key is no lease key: a name ending in ":fence" is its own lock.
	if l := locktest.Open(t, r.URL, lock.Options{TTL: 10 * time.Second}); token(t, l, name+":fence") <= 0 {
		t.Error("no token")
	}
	if got := token(t, b, name); got != ahead+2 {
		t.Errorf("token after another name's acquisition = %d, want %d", got, ahead+2)
	}
}

// A server that restarted without its data: the holder's next renewal is a
// loss, and nobody takes a lock there until the server has been up for ttl;
// then the token is larger than the lost holder's.
func TestRestartWithoutData(t *testing.T) {
	r := testenv.RequireRedis(t)
	const ttl = 2 * time.Second
	a, b, name := locktest.Open(t, r.URL, lock.Options{TTL: ttl}), locktest.Open(t, r.URL, lock.Options{TTL: ttl}), locktest.Name(t)
	la, err := a.TryAcquire(locktest.Context(t), name)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Stop(); err != nil {
		t.Fatal(err)
	}
	restarted := time.Now() // no later than the server's start
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	_, err = b.TryAcquire(locktest.Context(t), name)
	var remaining interface{ Remaining() time.Duration }
	if !errors.Is(err, lock.ErrUnsettled) || errors.Is(err, lock.ErrHeld) || !errors.As(err, &remaining) {
		t.Fatalf("TryAcquire on a server up for less than ttl: %v; want ErrUnsettled (not ErrHeld) with Remaining", err)
	}
	if d := remaining.Remaining(); d <= 0 || d > ttl+time.Second {
		t.Errorf("Remaining() = %v; want in (0, ttl+1s]", d)
	}
	if !strings.Contains(err.Error(), "less than --ttl (2s)") {
		t.Errorf("message %q does not say why", err)
	}
	shared := locktest.Open(t, r.URL, lock.Options{TTL: ttl, Mode: lock.Shared})
	if _, err := shared.TryAcquire(locktest.Context(t), name); !errors.Is(err, lock.ErrUnsettled) {
		t.Errorf("a shared TryAcquire on a server up for less than ttl: %v; want ErrUnsettled", err)
	}
	// The old holder may be reconnecting: the first Keep can fail to reach.
	for {
		err := la.Keep(locktest.Context(t))
		if errors.Is(err, lock.ErrLost) {
			break
		}
		if !errors.Is(err, lock.ErrUnavailable) {
			t.Fatalf("Keep after the restart: %v; want ErrLost", err)
		}
	}
	var lb lock.Lease
	for {
		lb, err = b.TryAcquire(locktest.Context(t), name)
		if err == nil {
			break
		}
		if !errors.As(err, &remaining) || !errors.Is(err, lock.ErrUnsettled) {
			t.Fatalf("TryAcquire while the server settles: %v", err)
		}
		time.Sleep(min(remaining.Remaining(), 200*time.Millisecond))
	}
	defer lb.Release(locktest.Context(t))
	if up := time.Since(restarted); up < ttl {
		t.Errorf("acquired %v after the restart; want at least ttl (%v)", up, ttl)
	}
	if old, cur := la.(lock.Expiring).Token(), lb.(lock.Expiring).Token(); cur <= old {
		t.Errorf("token after the restart %d, before %d: want larger", cur, old)
	}
}

// FreshKey with the server's run_id lifts the wait; with another run_id
// (left from an earlier start, say) it does not.
func TestFreshKey(t *testing.T) {
	r := testenv.RequireRedis(t)
	if err := r.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	b, name := locktest.Open(t, r.URL, lock.Options{TTL: time.Minute}), locktest.Name(t)
	do(t, r.URL, "SET", redis.FreshKey, strings.Repeat("0", 40))
	if _, err := b.TryAcquire(locktest.Context(t), name); !errors.Is(err, lock.ErrUnsettled) {
		t.Fatalf("TryAcquire with another run_id in %s: %v; want ErrUnsettled", redis.FreshKey, err)
	}
	_, after, _ := strings.Cut(do(t, r.URL, "INFO", "server"), "run_id:")
	runID, _, _ := strings.Cut(after, "\r\n")
	do(t, r.URL, "SET", redis.FreshKey, runID)
	l, err := b.TryAcquire(locktest.Context(t), name)
	if err != nil {
		t.Fatalf("TryAcquire with the run_id in %s: %v", redis.FreshKey, err)
	}
	l.Release(locktest.Context(t))
}

func TestReplica(t *testing.T) {
	p := testenv.RequireRedis(t, testenv.RedisOptions{Password: "s3cret-pw"})
	r := testenv.RequireRedis(t, testenv.RedisOptions{Password: "s3cret-pw", ReplicaOf: p})
	name := locktest.Name(t)
	_, err := locktest.Open(t, r.URL, lock.Options{}).TryAcquire(locktest.Context(t), name)
	if !errors.Is(err, lock.ErrRefused) || !strings.Contains(err.Error(), "is a replica (role:slave)") ||
		!strings.Contains(err.Error(), "point withlock at the primary") {
		t.Fatalf("TryAcquire on a replica: %v; want ErrRefused saying it is a replica", err)
	}
	if got := do(t, p.URL, "EXISTS", redis.Key(name)); got != "0" {
		t.Errorf("the attempt on the replica left %s on the primary", redis.Key(name))
	}
	for _, o := range []lock.Options{{Mode: lock.Shared}, {Mode: lock.Semaphore, MaxHolders: 2}} {
		if _, err := locktest.Open(t, r.URL, o).TryAcquire(locktest.Context(t), name); !errors.Is(err, lock.ErrRefused) {
			t.Errorf("TryAcquire in mode %s on a replica: %v; want ErrRefused", o.Mode, err)
		}
	}

	// status reads without writing: it works on a replica.
	shown := name + "/shown"
	ls, err := locktest.Open(t, p.URL, lock.Options{Mode: lock.Shared}).TryAcquire(locktest.Context(t), shown)
	if err != nil {
		t.Fatal(err)
	}
	for do(t, r.URL, "EXISTS", redis.Key(shown)) != "1" {
		time.Sleep(20 * time.Millisecond) // until the replica has it
	}
	st, err := locktest.Open(t, r.URL, lock.Options{}).Inspect(locktest.Context(t), shown)
	if err != nil || len(st.Holders) != 1 || st.Mode != lock.Shared || st.Holders[0].Token != ls.(lock.Expiring).Token() {
		t.Errorf("Inspect on a replica: %+v, %v; want the shared holder", st, err)
	}

	// A failover demotes the server we hold a lease on: a loss.
	l, err := locktest.Open(t, p.URL, lock.Options{}).TryAcquire(locktest.Context(t), name)
	if err != nil {
		t.Fatal(err)
	}
	other := testenv.RequireRedis(t, testenv.RedisOptions{Password: "s3cret-pw"})
	do(t, p.URL, "CONFIG", "SET", "masterauth", "s3cret-pw")
	do(t, p.URL, "REPLICAOF", "127.0.0.1", strconv.Itoa(other.Port))
	if err := l.Keep(locktest.Context(t)); !errors.Is(err, lock.ErrLost) || !strings.Contains(err.Error(), "became a replica") {
		t.Errorf("Keep on a demoted primary: %v; want ErrLost saying it became a replica", err)
	}
}

func TestWaitReplicas(t *testing.T) {
	p := testenv.RequireRedis(t)
	r := testenv.RequireRedis(t, testenv.RedisOptions{ReplicaOf: p})
	// Synced: the replica has a write of the primary.
	do(t, p.URL, "SET", "synced", "1")
	for do(t, r.URL, "GET", "synced") != "1" {
		time.Sleep(20 * time.Millisecond)
	}
	opts := lock.Options{TTL: 3 * time.Second}
	b, name := locktest.Open(t, p.URL+"?wait_replicas=1", opts), locktest.Name(t)
	l, err := b.TryAcquire(locktest.Context(t), name)
	if err != nil {
		t.Fatalf("TryAcquire with a replica that acknowledges: %v", err)
	}
	if err := l.Keep(locktest.Context(t)); err != nil {
		t.Errorf("Keep with a replica that acknowledges: %v", err)
	}
	if got := do(t, r.URL, "EXISTS", redis.Key(name)); got != "1" {
		t.Error("the replica does not have the lease")
	}

	if err := r.Pause(); err != nil {
		t.Fatal(err)
	}
	defer r.Resume()
	if err := l.Keep(locktest.Context(t)); !errors.Is(err, lock.ErrUnavailable) || !strings.Contains(err.Error(), "0 of the 1 replicas") {
		t.Errorf("Keep while the replica does not answer: %v; want ErrUnavailable saying 0 of the 1 replicas", err)
	}
	if err := l.Release(locktest.Context(t)); err != nil {
		t.Fatal(err)
	}
	_, err = b.TryAcquire(locktest.Context(t), name)
	if !errors.Is(err, lock.ErrUnavailable) || !strings.Contains(err.Error(), "0 of the 1 replicas") {
		t.Errorf("TryAcquire while the replica does not answer: %v; want ErrUnavailable saying 0 of the 1 replicas", err)
	}
	// The unconfirmed lease was given back.
	l, err = locktest.Open(t, p.URL, opts).TryAcquire(locktest.Context(t), name)
	if err != nil {
		t.Fatalf("the lease taken without enough replicas was not given back: %v", err)
	}
	l.Release(locktest.Context(t))

	for _, bad := range []string{"-1", "x", ""} {
		if _, err := lock.Open(p.URL+"?wait_replicas="+bad, lock.Options{}); !errors.Is(err, lock.ErrUsage) {
			t.Errorf("wait_replicas=%q: %v; want ErrUsage", bad, err)
		}
	}
}

// cutAt starts a fault proxy to target that cuts every connection at one
// step of the protocol, as a flaky network does: just before the client
// sends a command that contains clientSends (lower case, as go-redis sends
// commands; the command never reaches the server), or once the server has
// answered the client's first message with serverBytes bytes. With
// neither, it is a black hole: it accepts and never answers. It returns the
// proxy and url with its host:port replaced by the proxy's.
func cutAt(t *testing.T, target, u, clientSends string, serverBytes int) (*faultproxy.Proxy, string) {
	t.Helper()
	p, err := faultproxy.Start(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	switch {
	case clientSends != "":
		p.SetRule(func(m faultproxy.Message) faultproxy.Action {
			if bytes.Contains(bytes.ToLower(m.Data), []byte(clientSends)) {
				return faultproxy.Action{Cut: faultproxy.CloseBefore}
			}
			return faultproxy.Action{}
		})
	case serverBytes > 0:
		p.SetRule(func(m faultproxy.Message) faultproxy.Action {
			if m.Index == 1 {
				return faultproxy.Action{Cut: faultproxy.CloseAfter, Answer: serverBytes}
			}
			return faultproxy.Action{}
		})
	default:
		p.BlackHole()
	}
	parsed, _ := url.Parse(u)
	parsed.Host = p.Addr()
	return p, parsed.String()
}

// A connection cut at any step of connecting or locking, or a server that
// never answers, is ErrUnavailable (retried within --connect-timeout), not a
// refusal: only an answer from the server refuses us.
func TestCutConnections(t *testing.T) {
	plain := testenv.RequireRedis(t, testenv.RedisOptions{Password: "s3cret-pw"})
	secure := testenv.RequireRedis(t, testenv.RedisOptions{TLS: true, Password: "s3cret-pw"})
	addr := func(r *testenv.Redis) string { return "127.0.0.1:" + strconv.Itoa(r.Port) }
	for _, tc := range []struct {
		what        string
		server      *testenv.Redis
		clientSends string
		serverBytes int
		notify      bool // cut the subscription, not the attempt
	}{
		{"at HELLO, which authenticates", plain, "hello", 0, false},
		{"at CLIENT SETNAME", plain, "client", 0, false},
		{"at the acquire script", plain, "evalsha", 0, false},
		{"at SUBSCRIBE", plain, "subscribe", 0, true},
		{"in the middle of the reply to HELLO", plain, "", 20, false},
		{"a plaintext server that never answers", plain, "", 0, false},
		{"before the TLS server's first byte", secure, "\x16\x03", 0, false},
		{"in the middle of the TLS handshake", secure, "", 100, false},
		{"a TLS server that never answers", secure, "", 0, false},
	} {
		t.Run(tc.what, func(t *testing.T) {
			p, u := cutAt(t, addr(tc.server), tc.server.URL, tc.clientSends, tc.serverBytes)
			// A short connect timeout bounds the dial and TLS handshake of
			// a server that never answers; ctx bounds the rest.
			b := locktest.Open(t, u, lock.Options{ConnectTimeout: 500 * time.Millisecond})
			ctx, cancel := context.WithTimeout(t.Context(), time.Second)
			defer cancel()
			var err error
			if tc.notify {
				_, _, err = b.Backend.(lock.Notifier).Notify(ctx, locktest.Name(t))
			} else {
				_, err = b.TryAcquire(ctx, locktest.Name(t))
			}
			if !errors.Is(err, lock.ErrUnavailable) || errors.Is(err, lock.ErrRefused) {
				t.Errorf("%v; want ErrUnavailable", err)
			}
			if tc.clientSends != "" || tc.serverBytes > 0 {
				if p.RuleCuts() == 0 {
					t.Error("the proxy cut nothing: the test did not test")
				}
			}
		})
	}

	// What the server does say is a refusal, at once.
	for _, tc := range []struct{ what, url, want string }{
		{"a wrong password", strings.Replace(plain.URL, "s3cret-pw", "wrong", 1), "WRONGPASS"},
		{"a certificate we do not trust", secure.URL, "certificate"},
	} {
		t.Run(tc.what, func(t *testing.T) {
			_, err := locktest.Open(t, tc.url, lock.Options{}).TryAcquire(locktest.Context(t), locktest.Name(t))
			if !errors.Is(err, lock.ErrRefused) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%v; want ErrRefused saying %s", err, tc.want)
			}
		})
	}
}

// TestOneDial: one attempt is one connection; withlock's wait loop, not the
// driver, tries again. A server that closes a plaintext connection without
// a word is asked once whether it expects TLS: that question (a TLS
// ClientHello, whose first byte is 22) is no attempt.
func TestOneDial(t *testing.T) {
	for _, scheme := range []string{"redis", "rediss"} {
		t.Run(scheme, func(t *testing.T) {
			probe := func(first []byte) bool { return scheme == "redis" && len(first) > 0 && first[0] == 22 }
			locktest.RunOneDial(t, func(hostport string) string { return scheme + "://" + hostport + "/0" }, probe)
		})
	}
}

// TestFullServer: on a server at maxmemory with noeviction, holders in every
// mode still renew and release, while taking a lock is an outage.
func TestFullServer(t *testing.T) {
	r := testenv.RequireRedis(t)
	ctx := locktest.Context(t)
	var leases []lock.Lease
	var keys []string
	for _, opts := range []lock.Options{{}, {Mode: lock.Shared}, {Mode: lock.Semaphore, MaxHolders: 3}} {
		name := locktest.Name(t) + "-" + string(opts.Mode)
		keys = append(keys, redis.Key(name))
		for range 2 {
			l, err := locktest.Open(t, r.URL, opts).TryAcquire(ctx, name)
			if opts.Mode == "" && err != nil {
				break // the exclusive lock's second holder
			}
			if err != nil {
				t.Fatalf("%s: TryAcquire: %v", name, err)
			}
			leases = append(leases, l)
		}
	}
	do(t, r.URL, "CONFIG", "SET", "maxmemory-policy", "noeviction")
	do(t, r.URL, "CONFIG", "SET", "maxmemory", "1")
	if _, err := testenv.RedisDo(ctx, r.URL, "SET", "k", "v"); err == nil || !strings.HasPrefix(err.Error(), "OOM") {
		t.Fatalf("SET on the full server: %v; want OOM", err)
	}
	for i, l := range leases {
		if err := l.Keep(ctx); err != nil {
			t.Errorf("holder %d: Keep on the full server: %v", i, err)
		}
	}
	_, err := locktest.Open(t, r.URL, lock.Options{}).TryAcquire(ctx, locktest.Name(t)+"-new")
	if !errors.Is(err, lock.ErrUnavailable) || !strings.Contains(err.Error(), "OOM") {
		t.Errorf("TryAcquire on the full server: %v; want ErrUnavailable (OOM)", err)
	}
	for i, l := range leases {
		if err := l.Release(ctx); err != nil {
			t.Errorf("holder %d: Release on the full server: %v", i, err)
		}
	}
	if n := do(t, r.URL, append([]string{"EXISTS"}, keys...)...); n != "0" {
		t.Errorf("%s of the locks %q left after every holder's release", n, keys)
	}
}

// TestKeyNames: a NAME with braces or percent signs is held, listed and
// broken under its own name, apart from the NAME its braces enclose.
func TestKeyNames(t *testing.T) {
	r := testenv.RequireRedis(t)
	ctx := locktest.Context(t)
	c := locktest.Open(t, r.URL, lock.Options{})
	names := []string{"a{b}c", "b", "{x}", "x", "%7Bx%7D", "}{", "50%"}
	for _, n := range names {
		if _, err := c.TryAcquire(ctx, n); err != nil {
			t.Fatalf("TryAcquire(%q): %v", n, err)
		}
	}
	held, err := c.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, st := range held {
		got = append(got, st.Name)
	}
	want := slices.Sorted(slices.Values(names))
	if !slices.Equal(got, want) {
		t.Errorf("List: %q; want %q", got, want)
	}
	if hs, err := c.Break(ctx, "{x}"); err != nil || len(hs) != 1 {
		t.Fatalf("Break({x}): %v, %v", hs, err)
	}
	for _, n := range []string{"x", "%7Bx%7D"} {
		if st, err := c.Inspect(ctx, n); err != nil || len(st.Holders) != 1 {
			t.Errorf("Inspect(%q) after breaking {x}: %+v, %v; want still held", n, st, err)
		}
	}
}
