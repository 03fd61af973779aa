package testenv

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	neturl "net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/withlock/withlock/internal/lock/redis"
)

// ErrNoRedis is returned by [StartRedis] when redis-server is not installed.
// Its message says how to install it.
var ErrNoRedis = errors.New("testenv: redis-server not found in PATH; install it with: apt-get install redis-server (or run scripts/test-deps as root)")

// RedisFreshKey is the key whose value, the server's run_id, tells withlock
// that this start of the server forgot no lock.
const RedisFreshKey = redis.FreshKey

// Redis is a running throwaway redis-server on 127.0.0.1, without
// persistence: its data does not survive Stop. A new server is marked as
// one that forgot no lock (its [RedisFreshKey] holds its run_id); a server
// started again after Stop is not: that is the restart withlock must wait
// out.
//
// Its URL is redis://127.0.0.1:PORT/0, with :PASSWORD@ if it has one;
// rediss:// with TLS, without cacert (so that withlock refuses the server's
// certificate), and with ClientCerts ?cert=...&key=... naming the client
// certificate.
type Redis struct {
	*proc
	// announce is the address a cluster node announces instead of its
	// own (RedisOptions.Front); "" for its own.
	announce string
}

// RedisOptions say how [StartRedis] starts a server.
type RedisOptions struct {
	Password string // requirepass (and masterauth of a replica)
	TLS      bool   // TLS only, on the port, with a certificate for 127.0.0.1 only
	// ClientCerts, with TLS, makes the server ask for a client certificate
	// signed by its CA, and refuse clients without one: the server's own
	// pair (server.crt and server.key in Dir) is one.
	ClientCerts bool
	ReplicaOf   *Redis // replicaof that server (without TLS)
	// Cluster starts it in cluster mode, a cluster of this one node that
	// serves every hash slot.
	Cluster bool
	// Front, for StartRedisCluster, puts something (a fault proxy) in
	// front of cluster nodes: it is called with each node's index and
	// address once the node runs, and returns the address that the node
	// announces to the cluster and its clients in place of its own
	// (cluster-announce-ip and -port), or "" to announce its own. A cluster
	// client follows the announced addresses, so all its traffic to that
	// node goes there. The cluster bus stays on the node's own bus port.
	Front func(node int, addr string) (string, error)

	// clusterNode starts it in cluster mode serving no slot yet, to be
	// made one of a cluster's masters (StartRedisCluster).
	clusterNode bool
}

// StartRedis starts a new redis-server on a free port.
func StartRedis(opts ...RedisOptions) (*Redis, error) {
	o := append(opts, RedisOptions{})[0]
	bin := findProgram("redis-server")
	if bin == "" {
		return nil, ErrNoRedis
	}
	proc, err := newProc(os.TempDir(), "redis", nil, o.TLS)
	if err != nil {
		return nil, err
	}
	r := &Redis{proc: proc}
	proc.command = func() *exec.Cmd {
		u := neturl.URL{Scheme: "redis", Host: r.addr(), Path: "/0"}
		// repl-diskless-sync-delay 0: a replica's first sync starts at once.
		conf := fmt.Sprintf("bind 127.0.0.1\ndir %q\nsave \"\"\nappendonly no\nrepl-diskless-sync-delay 0\nport %d\n", r.Dir, r.Port)
		if o.TLS {
			u.Scheme = "rediss"
			conf += fmt.Sprintf("port 0\ntls-port %d\ntls-cert-file server.crt\ntls-key-file server.key\n", r.Port)
			if o.ClientCerts {
				conf += "tls-ca-cert-file ca.crt\ntls-auth-clients yes\n"
				u.RawQuery = neturl.Values{"cert": {filepath.Join(r.Dir, "server.crt")}, "key": {filepath.Join(r.Dir, "server.key")}}.Encode()
			} else {
				conf += "tls-auth-clients no\n"
			}
		}
		if o.Password != "" {
			u.User = neturl.UserPassword("", o.Password)
			conf += fmt.Sprintf("requirepass %q\n", o.Password)
		}
		if p := o.ReplicaOf; p != nil {
			conf += fmt.Sprintf("replicaof 127.0.0.1 %d\n", p.Port)
			if pu, _ := neturl.Parse(p.URL); pu.User != nil {
				password, _ := pu.User.Password()
				conf += fmt.Sprintf("masterauth %q\n", password)
			}
		}
		if o.Cluster || o.clusterNode {
			conf += "cluster-enabled yes\ncluster-config-file nodes.conf\n"
			conf += r.announceConf()
		}
		r.URL = u.String()
		os.WriteFile(filepath.Join(r.Dir, "redis.conf"), []byte(conf), 0o600)
		return exec.Command(bin, "redis.conf")
	}
	proc.ready = func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := RedisDo(ctx, r.URL, "PING")
		return err
	}
	if err := proc.launch(); err != nil {
		return nil, err
	}
	if o.Cluster {
		err := r.serveEverySlot()
		if err == nil {
			err = markFreshSlots(r, 0, RedisSlots-1)
		}
		if err != nil {
			r.Close()
			return nil, err
		}
	}
	if o.ReplicaOf == nil && !o.Cluster && !o.clusterNode {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		info, err := RedisDo(ctx, r.URL, "INFO", "server")
		_, runID, _ := strings.Cut(info, "run_id:")
		runID, _, _ = strings.Cut(runID, "\r\n")
		if err == nil {
			_, err = RedisDo(ctx, r.URL, "SET", RedisFreshKey, runID)
		}
		if err != nil {
			r.Close()
			return nil, fmt.Errorf("testenv: mark the new redis-server: %w", err)
		}
	}
	return r, nil
}

// RequireRedis is [StartRedis] for t.
func RequireRedis(t testing.TB, opts ...RedisOptions) *Redis {
	r, err := StartRedis(opts...)
	return require(t, r, err, ErrNoRedis)
}

// RedisDo runs one command on a connection of its own to the server of url
// (rediss:// trusts any certificate; the URL's cert and key are a client
// certificate), or of a cluster's URL (with addr=...) to the master of its
// key and returns the reply as text: a string as is, an integer in
// decimal, nil as "(nil)", an array as its elements' texts, one a line. An
// error reply is an error with the reply's text.
func RedisDo(ctx context.Context, url string, args ...string) (string, error) {
	u, err := neturl.Parse(url)
	if err != nil {
		return "", err
	}
	q := u.Query()
	cert, key := q.Get("cert"), q.Get("key")
	for _, k := range []string{"wait_replicas", "cacert", "cert", "key"} { // withlock's own options
		q.Del(k)
	}
	u.RawQuery = q.Encode()
	if q.Has("addr") {
		// A cluster's URL: the command goes to the master of its key.
		copts, err := goredis.ParseClusterURL(u.String())
		if err != nil {
			return "", err
		}
		copts.Protocol, copts.MaxRetries, copts.DisableIdentity = 2, -1, true
		return redisReply(goredis.NewClusterClient(copts), ctx, args)
	}
	opts, err := goredis.ParseURL(u.String())
	if err != nil {
		return "", err
	}
	if opts.TLSConfig != nil {
		opts.TLSConfig.InsecureSkipVerify = true // a test's own server
		if cert != "" {
			pair, err := tls.LoadX509KeyPair(cert, key)
			if err != nil {
				return "", err
			}
			opts.TLSConfig.Certificates = []tls.Certificate{pair}
		}
	}
	// RESP2, whose replies are strings, integers and arrays; no retries, no
	// pool beyond this one connection.
	opts.Protocol, opts.MaxRetries, opts.DialerRetries, opts.PoolSize, opts.DisableIdentity = 2, -1, 1, 1, true
	return redisReply(goredis.NewClient(opts), ctx, args)
}

// redisReply runs args on c, closes it, and returns the reply as RedisDo
// does.
func redisReply(c goredis.UniversalClient, ctx context.Context, args []string) (string, error) {
	defer c.Close()
	cmdArgs := make([]any, len(args))
	for i, a := range args {
		cmdArgs[i] = a
	}
	reply, err := c.Do(ctx, cmdArgs...).Result()
	if errors.Is(err, goredis.Nil) {
		return "(nil)", nil
	}
	return redisText(reply), err
}

func redisText(reply any) string {
	if list, ok := reply.([]any); ok {
		lines := make([]string, len(list))
		for i, v := range list {
			lines[i] = redisText(v)
		}
		return strings.Join(lines, "\n")
	}
	if reply == nil {
		return "(nil)"
	}
	return fmt.Sprint(reply)
}

// serveEverySlot gives a cluster-mode server every hash slot and returns
// once its cluster says it is ok.
func (r *Redis) serveEverySlot() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := RedisDo(ctx, r.URL, "CLUSTER", "ADDSLOTSRANGE", "0", "16383"); err != nil {
		return fmt.Errorf("testenv: redis cluster: %w", err)
	}
	for {
		info, err := RedisDo(ctx, r.URL, "CLUSTER", "INFO")
		if err == nil && strings.Contains(info, "cluster_state:ok") {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("testenv: redis cluster not ok within 30s: %v %s", err, info)
		case <-time.After(20 * time.Millisecond):
		}
	}
}
