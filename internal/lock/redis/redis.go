package redis

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
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
	var nodes url.URL          // the cluster's nodes alone, for go-redis's cluster parser
	if clustered {
		// go-redis's single-server parser knows no addr; the cluster
		// parser knows none of the single server's options, nor ours:
		// the options are parsed from the URL without addr, the nodes
		// from one with addr alone.
		nodes = url.URL{Scheme: u.Scheme, Host: u.Host, RawQuery: url.Values{"addr": q["addr"]}.Encode()}
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
	// Every command is bounded by its context and makes one attempt: a
	// backend never retries (lock.Backend).
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
	copts, err := goredis.ParseClusterURL(nodes.String())
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

// waitTimeout bounds WAIT: maxWait, or a third of the ttl when that is
// shorter, so that waiting for the replicas takes a small part of the lease
// only; and at most half of what ctx has left, so that WAIT's answer comes
// back within ctx. Never 0, which would make WAIT block for ever.
func (b *backend) waitTimeout(ctx context.Context) time.Duration {
	d := min(maxWait, b.opts.TTL/3)
	if deadline, ok := ctx.Deadline(); ok {
		d = min(d, time.Until(deadline)/2)
	}
	return max(d, 10*time.Millisecond)
}

// demoted is the error of an attempt that found a replica where Sentinel
// had named the primary: ErrUnavailable, an outage until the client learns
// of the new primary.
func (b *backend) demoted(why string) error {
	return lock.Errorf(lock.ErrUnavailable, "redis %s, as the Sentinels at %s named it, is a replica now (%s): a failover is under way", b.master, b.addr, why)
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
	if lock.TLSRefusal(err) {
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

// unexpected is the error (ErrRefused) of a reply that the script named
// script never gives.
func (b *backend) unexpected(script string, reply any) error {
	return lock.Errorf(lock.ErrRefused, "redis at %s: unexpected reply %v to the %s script", b.addr, reply, script)
}
