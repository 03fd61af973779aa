// Package redis is the redis://, rediss:// and redis+sentinel:// backend, on
// one server, a Redis Cluster (cluster.go) or a primary found through
// Sentinel (sentinel.go). The lock of NAME is
// one hash, withlock:{NAME}, holding every holder's random token with the end
// of its lease (by the server's clock), its fencing token and its record
// (host, pid, command, when it acquired), and the lock's mode and a
// semaphore's N (scripts.go has the layout). Every write is a script that
// acts only for a token that is still a holder, so only a holder can renew
// or release its own lease, and each holder's lease ends on its own.
//
// The script that takes a place among the holders also sets the fencing
// token kept in withlock-fence:{NAME}: the server's clock in microseconds, or
// one more than the last token if that is larger. Tokens therefore keep
// growing when the server loses its data, as long as its clock does not go
// back, in every mode. A release publishes on withlock:released:{NAME}, which
// waiters subscribe to. An exclusive waiter kept out by shared or semaphore
// holders sets withlock-writer:{NAME} for a few seconds at each attempt; new
// shared and semaphore holders wait while it is there, so that a stream of
// them cannot starve the exclusive waiter.
//
// Before it takes a lease, the same script refuses a replica and holds back
// on a server that started less than ttl ago: that server may have lost,
// with its data, a lease whose holder still runs its command (Redis's
// "delayed restarts" advice, enforced by the client). The key
// withlock-fresh, holding the server's run_id, says that this start of the
// server forgot nothing (a new server), and lifts that wait.
//
// The keys and the channel of one name share the hash tag {NAME} (see Key),
// so that in a Redis Cluster each name is held on one master (cluster.go).
package redis

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/withlock/withlock/internal/lock"
)

func init() {
	lock.Register("redis", open)
	lock.Register("rediss", open)
	lock.Register("redis+sentinel", open)
	// go-redis logs dial failures on stderr by itself; withlock's stderr
	// is its own, and those errors reach us as return values anyway.
	goredis.SetLogger(quiet{})
}

type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}

// maxDial bounds one connection attempt, so that an unreachable host is
// retried and reported instead of hanging the wait.
const maxDial = 5 * time.Second

// FreshKey is the key that lifts the wait after a server's start: when it
// holds the server's current run_id (INFO server), the server is known to
// have forgotten no lease, for example because it is new. A restart changes
// the run_id, so the key never carries over to the next start.
// A cluster has one per slot instead (FreshKeyFor).
const FreshKey = "withlock-fresh"

// Key names. Exported for tests and for anyone who inspects a server.
// withlock:* holds only the names' lock hashes (List scans it); the fence
// and the writer mark are outside it.
//
// Every key and the channel of one NAME carry the hash tag {NAME}, so that
// they fall in one hash slot of a Redis Cluster, where a script may touch
// the keys of one slot only, and NAMEs spread over the cluster's masters.
// Redis hashes the first {...} of a key, so the NAME inside it is escaped
// (see tag) to hold no brace: a NAME with braces hashes as a whole.
func Key(name string) string       { return "withlock:{" + tag(name) + "}" }
func FenceKey(name string) string  { return "withlock-fence:{" + tag(name) + "}" }
func WriterKey(name string) string { return "withlock-writer:{" + tag(name) + "}" }
func Channel(name string) string   { return "withlock:released:{" + tag(name) + "}" }

// keyPattern is the SCAN pattern of every lock hash: Key with any NAME.
const keyPattern = "withlock:{*}"

// tagEscaper writes a NAME inside a hash tag: %, { and } as in a URL, and
// nothing else, so that most NAMEs read as they are.
var tagEscaper = strings.NewReplacer("%", "%25", "{", "%7B", "}", "%7D")

func tag(name string) string { return tagEscaper.Replace(name) }

// nameOf is the NAME of a lock hash's key, Key's inverse; ok is false for a
// key that Key does not make.
func nameOf(key string) (name string, ok bool) {
	t, ok := strings.CutPrefix(key, "withlock:{")
	if t, ok = strings.CutSuffix(t, "}"); !ok || strings.ContainsAny(t, "{}") {
		return "", false
	}
	name, err := url.PathUnescape(t)
	return name, err == nil && tag(name) == t
}

// markTTL is how long an exclusive waiter's mark keeps new shared and
// semaphore holders out. The waiter renews it at every attempt, and
// lock.Client.Acquire makes one at least every second (its slow poll behind
// notifications), so 3s outlasts the gap between two on a busy machine;
// the mark of a waiter that was killed outright ends by itself this soon.
const markTTL = 3 * time.Second

type backend struct {
	// client is the single server's, or the cluster's (cluster) once
	// known; detect says that client is a single node's URL's, and that
	// whether the node is in a cluster is not known yet (see connect).
	client     goredis.UniversalClient
	cluster    *goredis.ClusterClient
	detect     bool
	connecting sync.Mutex       // held by connect
	single     *goredis.Options // the single node's options, for connect
	// sentinel says that client is a failover client, which finds the
	// primary through Sentinel.
	sentinel bool
	master   string // the primary's name, with sentinel
	addr     string
	opts     lock.Options
	// record is this holder's host, pid and command, as JSON, stored
	// with its lease for withlock status.
	record string
	// waitReplicas is the URL's wait_replicas: how many replicas must
	// acknowledge an acquisition or renewal (Redis WAIT) before it counts.
	waitReplicas int
	saidTooYoung bool // the wait for the server's uptime was logged
	// id is this client's mark in a name's writer mark; marked is the
	// name whose writer mark it set and has not cleared (by taking the
	// lock) yet, for Close to clear.
	id     string
	marked string
}

// record is what a holder's lease says about it, besides the times and
// the token that the acquire script adds.
type record struct {
	Host    string   `json:"host"`
	PID     int      `json:"pid"`
	Command []string `json:"command"`
}

func open(u *url.URL, opts lock.Options) (lock.Backend, error) {
	// wait_replicas, cacert, cert and key are ours; go-redis refuses
	// options it does not know.
	q := u.Query()
	waitReplicas := 0
	if q.Has("wait_replicas") {
		n, err := strconv.Atoi(q.Get("wait_replicas"))
		if err != nil || n < 0 {
			return nil, lock.Errorf(lock.ErrUsage, "redis URL: wait_replicas must be a whole number of replicas, not %q", q.Get("wait_replicas"))
		}
		waitReplicas = n
	}
	files, err := lock.TLSFiles("redis URL", q)
	if err != nil {
		return nil, err
	}
	if files != nil && u.Scheme != "rediss" {
		return nil, lock.Errorf(lock.ErrUsage, "redis URL: cacert, cert and key are TLS options; use rediss:// for TLS")
	}
	for _, k := range []string{"wait_replicas", "cacert", "cert", "key"} {
		q.Del(k)
	}
	var sentinel *goredis.FailoverOptions
	if u.Scheme == "redis+sentinel" {
		if sentinel, err = sentinelOptions(u, q); err != nil {
			return nil, err
		}
		q = url.Values{}
	}
	c := *u
	if sentinel != nil {
		// The options below are parsed from a single server's URL; the
		// Sentinels' addresses and the primary's name are in sentinel.
		c.Scheme, c.Host, c.Path = "redis", "localhost", ""
	}
	c.RawQuery = q.Encode()
	clustered := q.Has("addr") // go-redis's form of a cluster's URL
	if clustered {
		// go-redis's single-server parser knows no addr; the cluster
		// parser takes the rest, and the options below, from the same URL.
		q.Del("addr")
		c.RawQuery = q.Encode()
	}
	ropts, err := goredis.ParseURL(c.String())
	if err != nil {
		return nil, lock.Errorf(lock.ErrUsage, "redis URL: %v", err)
	}
	if clustered && ropts.DB != 0 {
		return nil, lock.Errorf(lock.ErrUsage, "redis URL: a Redis Cluster has only database 0; drop /%d from the URL", ropts.DB)
	}
	if files != nil && ropts.TLSConfig != nil {
		ropts.TLSConfig.RootCAs, ropts.TLSConfig.Certificates = files.RootCAs, files.Certificates
	}
	ropts.DialTimeout = min(maxDial, opts.ConnectTimeout)
	ropts.Dialer = dialer(ropts.TLSConfig, ropts.DialTimeout)
	// Every command is bounded by its context: the wait and keep loops in
	// package lock decide how long to wait and when to retry.
	ropts.ContextTimeoutEnabled = true
	ropts.MaxRetries = -1
	// One dial per attempt: go-redis would otherwise dial up to 5 times,
	// each up to DialTimeout, inside one command.
	ropts.DialerRetries = 1
	ropts.PoolSize = 2
	ropts.ClientName = fmt.Sprintf("withlock-%d", opts.Holder.PID)
	// go-redis would send CLIENT SETINFO on every new connection; old
	// servers and some proxies refuse it.
	ropts.DisableIdentity = true
	rec, err := json.Marshal(record{Host: opts.Holder.Host, PID: opts.Holder.PID, Command: opts.Holder.Command})
	if err != nil {
		return nil, lock.Errorf(lock.ErrUsage, "redis: the holder's record: %v", err)
	}
	b := &backend{
		addr:         ropts.Addr,
		opts:         opts,
		record:       string(rec),
		waitReplicas: waitReplicas,
		id:           lock.NewToken(),
	}
	if sentinel != nil {
		b.sentinel = true
		// Messages name the Sentinels, which an outage is first of all;
		// go-redis's errors name the primary when it is the one missing.
		b.addr, b.master = u.Host, sentinel.MasterName
		b.client = goredis.NewFailoverClient(failoverOptions(sentinel, ropts))
		return b, nil
	}
	if !clustered {
		b.client, b.single, b.detect = goredis.NewClient(ropts), ropts, true
		return b, nil
	}
	copts, err := goredis.ParseClusterURL(u.String())
	if err != nil {
		return nil, lock.Errorf(lock.ErrUsage, "redis URL: %v", err)
	}
	o := clusterOptions(ropts)
	o.Addrs = copts.Addrs
	b.useCluster(o)
	return b, nil
}

// closeTimeout bounds Close's clearing of a writer mark left by a wait that
// ended without the lock: without it, new shared holders would wait for
// the mark to run out (markTTL).
const closeTimeout = time.Second

// Close clears the writer mark this client left, if any, and drops the
// connection.
func (b *backend) Close() error {
	b.connecting.Lock()
	defer b.connecting.Unlock()
	if b.marked != "" {
		ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
		unmarkScript.get().Run(ctx, b.client, []string{WriterKey(b.marked), Channel(b.marked)}, b.id, b.publish())
		cancel()
		b.marked = ""
	}
	return b.client.Close()
}

// TryAcquire takes a place among name's holders in the client's mode: the
// only place for an exclusive lock, one of any number for a shared one, one
// of N for a semaphore.
func (b *backend) TryAcquire(ctx context.Context, name string) (lock.Lease, error) {
	if err := b.connect(ctx); err != nil {
		return nil, err
	}
	token := lock.NewToken()
	// Only a waiter marks: a --no-wait attempt gives up at once, and its
	// mark would only keep shared holders out for nothing.
	var mark int64
	if !b.opts.NoWait {
		mark = markTTL.Milliseconds()
	}
	keys := []string{Key(name), FenceKey(name), b.freshKey(name), WriterKey(name)}
	cmd, acks, err := b.run(ctx, acquireScript, keys,
		token, b.opts.TTL.Milliseconds(), string(b.opts.Mode), b.opts.MaxHolders, b.record, b.id, mark)
	if err != nil {
		if cmd.Err() == nil {
			// The lease may be ours but WAIT did not answer: give it back
			// if the connection still lets us.
			releaseScript.get().Run(ctx, b.client, []string{Key(name), Channel(name)}, token, b.publish())
		}
		return nil, b.classifyIn(err, acquireScript, keys...)
	}
	reply, err := cmd.Slice()
	if err != nil || len(reply) < 2 {
		return nil, lock.Errorf(lock.ErrRefused, "redis at %s: unexpected reply %v to the acquire script", b.addr, reply)
	}
	code, _ := reply[0].(int64)
	switch code {
	case replyAcquired:
		if b.marked == name {
			b.marked = "" // the script cleared our mark
		}
		fence, _ := reply[1].(int64)
		l := &lease{b: b, name: name, token: token, fence: fence}
		if acks >= 0 && acks < int64(b.waitReplicas) {
			l.Release(ctx)
			return nil, lock.Errorf(lock.ErrUnavailable, "redis at %s: %d of the %d replicas that wait_replicas asks for acknowledged the lock within %s; it was given back",
				b.addr, acks, b.waitReplicas, b.waitTimeout(ctx).Round(time.Millisecond))
		}
		return l, nil
	case replyHeld:
		left, _ := reply[1].(int64)
		if len(reply) > 2 && reply[2] == int64(1) {
			b.marked = name
		}
		return nil, lock.HeldFor(time.Duration(left) * time.Millisecond)
	case replyOtherN:
		n, _ := reply[1].(int64)
		return nil, lock.Errorf(lock.ErrUsage, "%q is a semaphore of %d (--max-holders %d); this holder asked for %d", name, n, n, b.opts.MaxHolders)
	case replyForeign:
		kind, _ := reply[1].(string)
		var pttl int64 = -1
		if len(reply) > 2 {
			pttl, _ = reply[2].(int64)
		}
		switch {
		case kind == "string" && pttl >= 0:
			// The lease of a withlock from before shared locks, which kept
			// an exclusive holder's token in a string.
			return nil, lock.HeldFor(time.Duration(pttl) * time.Millisecond)
		case kind == "string":
			// No withlock writes a key without expiry: someone else's. It
			// is never freed by expiry, so no early retry.
			return nil, lock.Errorf(lock.ErrHeld, "redis at %s: %s exists without an expiry; it is not a withlock lease", b.addr, Key(name))
		}
		return nil, lock.Errorf(lock.ErrHeld, "redis at %s: %s is a %s, not a withlock lock; it counts as held until someone deletes it", b.addr, Key(name), kind)
	case replyTooYoung:
		wait, _ := reply[1].(int64)
		var up int64
		if len(reply) > 2 {
			up, _ = reply[2].(int64)
		}
		return nil, b.tooYoung(name, time.Duration(up)*time.Second, time.Duration(wait)*time.Millisecond)
	case replyReplica:
		role, _ := reply[1].(string)
		if b.sentinel {
			return nil, b.demoted("role:" + role)
		}
		return nil, lock.Unsafe(fmt.Sprintf("redis at %s is a replica (role:%s), where a lock excludes nobody", b.addr, role), "point withlock at the primary")
	}
	return nil, lock.Errorf(lock.ErrRefused, "redis at %s: unexpected reply %v to the acquire script", b.addr, reply)
}

// demoted is the error of an attempt that found a replica where Sentinel
// had named the primary: an outage until the client learns of the new
// primary, which the wait loop retries.
func (b *backend) demoted(why string) error {
	return lock.Errorf(lock.ErrUnavailable, "redis %s, as the Sentinels at %s named it, is a replica now (%s): a failover is under way", b.master, b.addr, why)
}

// tooYoung is the error of an attempt on a server that started less than
// ttl ago. It matches lock.ErrUnsettled (and so lock.ErrHeld): Acquire
// waits, retrying when wait has passed.
func (b *backend) tooYoung(name string, uptime, wait time.Duration) error {
	if !b.saidTooYoung {
		b.saidTooYoung = true
		b.opts.Log.Debug("redis has been up for less than the ttl and may have lost a lease still in use; waiting until its uptime reaches the ttl",
			"lock", name, "addr", b.addr, "uptime", uptime, "ttl", b.opts.TTL, "wait", wait)
	}
	return unsettledError{
		msg: fmt.Sprintf("redis at %s has been up for %s, less than --ttl (%s), so it may have lost a lease still in use; locks can be taken there in %s",
			b.addr, uptime, b.opts.TTL, wait.Round(100*time.Millisecond)),
		remaining: wait,
	}
}

// unsettledError is ErrUnsettled with the time until the server can be
// trusted, as Acquire reads it from ErrHeld errors (Remaining).
type unsettledError struct {
	msg       string
	remaining time.Duration
}

func (e unsettledError) Error() string            { return e.msg }
func (e unsettledError) Unwrap() error            { return lock.ErrUnsettled }
func (e unsettledError) Remaining() time.Duration { return e.remaining }

// run runs ls with keys and args, followed on the same connection by
// WAIT when the URL asks for replicas, in one round trip. acks is how many
// replicas acknowledged, or -1 without WAIT. A non-nil err with a nil
// cmd.Err() means that the script ran but WAIT failed.
func (b *backend) run(ctx context.Context, ls *luaScript, keys []string, args ...any) (cmd *goredis.Cmd, acks int64, err error) {
	s := ls.get()
	if b.waitReplicas == 0 {
		cmd = s.Run(ctx, b.client, keys, args...)
		return cmd, -1, cmd.Err()
	}
	// WAIT counts the replicas of the connection's server that have its
	// writes: the script's, on the server of its keys.
	node, err := b.node(ctx, keys[0])
	if err != nil {
		cmd = goredis.NewCmd(ctx)
		cmd.SetErr(err)
		return cmd, 0, err
	}
	for _, eval := range []bool{false, true} {
		var wait *goredis.Cmd
		node.Pipelined(ctx, func(p goredis.Pipeliner) error {
			if eval {
				cmd = s.Eval(ctx, p, keys, args...)
			} else {
				cmd = s.EvalSha(ctx, p, keys, args...)
			}
			wait = p.Do(ctx, "wait", b.waitReplicas, b.waitTimeout(ctx).Milliseconds())
			return nil
		})
		switch {
		case !eval && goredis.HasErrorPrefix(cmd.Err(), "NOSCRIPT"):
			continue // the server does not know the script yet
		case cmd.Err() != nil:
			return cmd, 0, cmd.Err()
		case wait.Err() != nil:
			return cmd, 0, wait.Err()
		}
		acks, err := wait.Int64()
		return cmd, acks, err
	}
	panic("unreachable")
}

// maxWait bounds WAIT. A replica acknowledges within milliseconds when it
// is up; this also stays below go-redis's read timeout (3s).
const maxWait = time.Second

// waitTimeout bounds WAIT: maxWait, or less when the renewal interval
// (ttl/3) or ctx ends sooner. Never 0, which would make WAIT block for ever.
func (b *backend) waitTimeout(ctx context.Context) time.Duration {
	d := min(maxWait, b.opts.TTL/3)
	if deadline, ok := ctx.Deadline(); ok {
		d = min(d, time.Until(deadline)/2)
	}
	return max(d, 10*time.Millisecond)
}

// Notify subscribes to the name's release channel: in a cluster, as a
// sharded channel, on the master of the name's slot.
func (b *backend) Notify(ctx context.Context, name string) (<-chan struct{}, func(), error) {
	if err := b.connect(ctx); err != nil {
		return nil, nil, err
	}
	var sub *goredis.PubSub
	if b.cluster != nil {
		sub = b.cluster.SSubscribe(ctx, Channel(name))
	} else {
		sub = b.client.Subscribe(ctx, Channel(name))
	}
	if _, err := sub.Receive(ctx); err != nil {
		sub.Close()
		return nil, nil, b.classifyIn(err, nil, Channel(name))
	}
	released := make(chan struct{}, 1)
	stop := make(chan struct{})
	go func() {
		msgs := sub.Channel()
		for {
			select {
			case <-stop:
				return
			case _, ok := <-msgs:
				if !ok {
					return
				}
				select {
				case released <- struct{}{}:
				default: // one pending wake-up is enough
				}
			}
		}
	}()
	return released, func() { close(stop); sub.Close() }, nil
}

// transient are the prefixes of error replies that a later attempt may not
// get: the server is loading its data, busy with a script, without its
// primary or replicas, or out of memory or connections.
var transient = []string{"LOADING", "BUSY", "MASTERDOWN", "TRYAGAIN", "CLUSTERDOWN", "NOREPLICAS", "OOM", "ERR max number of clients"}

// classify sorts a go-redis error into lock's sentinels. The server's own
// error replies are refusals unless they are transient; anything that went
// wrong on the way (refused, reset or cut connections, timeouts, a TLS
// handshake cut short) is ErrUnavailable, unless the TLS peer answered and
// refused us (certificate, not a TLS server, an alert) or the port speaks
// the other protocol than the URL's scheme. An ACL refusal says what was
// refused and the rule that allows it.
func (b *backend) classify(err error) error { return b.classifyIn(err, nil) }

// classifyIn is classify for an error of the script s (nil: of another
// command) run with keys, which name what an ACL refused.
func (b *backend) classifyIn(err error, s *luaScript, keys ...string) error {
	var ran mayHaveRun
	if errors.As(err, &ran) {
		err = ran.err
	}
	var reply goredis.Error
	if errors.As(err, &reply) {
		msg := reply.Error()
		if what := aclRefusal(msg, s, keys); what != "" {
			msg, _, _ = strings.Cut(msg, " script: ")
			return lock.Errorf(lock.ErrRefused, "redis at %s: %s (%s)", b.addr, what, strings.TrimSuffix(msg, "."))
		}
		switch {
		case strings.HasPrefix(msg, "READONLY") && b.sentinel:
			return b.demoted(msg)
		case strings.HasPrefix(msg, "READONLY"):
			return lock.Unsafe(fmt.Sprintf("redis at %s is a replica (%s), where a lock excludes nobody", b.addr, msg), "point withlock at the primary")
		case hasAnyPrefix(msg, transient):
			return lock.Errorf(lock.ErrUnavailable, "redis at %s is not ready (%s)", b.addr, msg)
		}
		return lock.Errorf(lock.ErrRefused, "redis at %s refused: %s", b.addr, msg)
	}
	var wrong wrongProtocolError
	if errors.As(err, &wrong) {
		return lock.Errorf(lock.ErrRefused, "%v", wrong)
	}
	if tlsRefusal(err) {
		return lock.Errorf(lock.ErrRefused, "redis at %s: %v", b.addr, err)
	}
	return lock.Unreachable("redis at "+b.addr, lock.Reason(err))
}

func hasAnyPrefix(s string, prefixes []string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}

// tlsRefusal reports whether err is a TLS peer's answer that retrying will
// not change: a certificate we do not trust, a server that does not speak
// TLS, or an alert it sent. A handshake that was cut or timed out is not.
func tlsRefusal(err error) bool {
	var (
		verify   *tls.CertificateVerificationError
		unknown  x509.UnknownAuthorityError
		hostname x509.HostnameError
		invalid  x509.CertificateInvalidError
		header   tls.RecordHeaderError
		op       *net.OpError
	)
	return errors.As(err, &verify) || errors.As(err, &unknown) || errors.As(err, &hostname) ||
		errors.As(err, &invalid) || errors.As(err, &header) ||
		errors.As(err, &op) && op.Op == "remote error"
}

type lease struct {
	b     *backend
	name  string
	token string
	fence int64
}

func (l *lease) Token() int64 { return l.fence }

// Keep renews the lease for another TTL, judged by the server's clock. With
// wait_replicas, a renewal counts only once the replicas have it.
func (l *lease) Keep(ctx context.Context) error {
	cmd, acks, err := l.b.run(ctx, renewScript, []string{Key(l.name)}, l.token, l.b.opts.TTL.Milliseconds())
	if err != nil {
		if goredis.HasErrorPrefix(err, "READONLY") {
			return lock.Errorf(lock.ErrLost, "redis at %s became a replica (a failover?), where the lease can no longer be renewed", l.b.addr)
		}
		return l.b.classifyIn(err, renewScript, Key(l.name))
	}
	if err := l.renewed(cmd.Val()); err != nil {
		return err
	}
	if acks >= 0 && acks < int64(l.b.waitReplicas) {
		return lock.Errorf(lock.ErrUnavailable, "redis at %s: %d of the %d replicas that wait_replicas asks for acknowledged the renewal", l.b.addr, acks, l.b.waitReplicas)
	}
	return nil
}

// Release deletes this holder's place. It frees the lock even when the user
// may not publish the release to the waiters: they poll.
func (l *lease) Release(ctx context.Context) error {
	reply, err := releaseScript.get().Run(ctx, l.b.client, []string{Key(l.name), Channel(l.name)}, l.token, l.b.publish()).Result()
	if err != nil {
		return l.b.classifyIn(err, releaseScript, Key(l.name), Channel(l.name))
	}
	switch r := reply.(type) {
	case int64:
		if r == 0 {
			return errors.New("redis: the lease was no longer ours at release")
		}
		return nil
	case []any:
		if len(r) == 2 && r[0] == int64(2) {
			l.b.opts.Log.Debug("released; the waiters were not told, and find out at their next poll", "lock", l.name, "publish", r[1])
			return nil
		}
	}
	return l.b.unexpected("release", reply)
}

// ReleaseAt lets the lease run out at until instead of deleting it now. The
// server's clock decides, so the time left is sent, not the time of day.
func (l *lease) ReleaseAt(ctx context.Context, until time.Time) error {
	left := time.Until(until)
	if left < time.Millisecond {
		return l.Release(ctx)
	}
	reply, err := renewScript.get().Run(ctx, l.b.client, []string{Key(l.name)}, l.token, left.Milliseconds()).Result()
	if err != nil {
		return l.b.classifyIn(err, renewScript, Key(l.name))
	}
	if err := l.renewed(reply); err != nil {
		return fmt.Errorf("redis: the lease was no longer ours at release: %v", err)
	}
	return nil
}

// renewed sorts the reply of the renew script: nil when it renewed,
// ErrLost when the lease is no longer ours, saying why it may be gone.
func (l *lease) renewed(reply any) error {
	switch r := reply.(type) {
	case int64:
		switch r {
		case 1:
			return nil
		case -1:
			return lock.Errorf(lock.ErrLost, "redis at %s became a replica (a failover?), where the lease can no longer be renewed", l.b.addr)
		}
	case []any:
		if len(r) == 2 {
			// An evicted lease is one that another may have taken.
			return lock.Errorf(lock.ErrLost, "the lease key %s is gone: redis at %s evicts keys when full (maxmemory-policy %v), which may be why; set noeviction", Key(l.name), l.b.addr, r[1])
		}
		if len(r) == 1 {
			return lock.Errorf(lock.ErrLost, "the lease key %s expired, was deleted or was taken by another holder", Key(l.name))
		}
	}
	return l.b.unexpected("renew", reply)
}
