package testenv

import (
	"context"
	"errors"
	"fmt"
	"net"
	neturl "net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/withlock/withlock/internal/lock/redis"
)

// RedisSlots is the number of hash slots of a Redis Cluster.
const RedisSlots = redis.NumSlots

// RedisCluster is a running Redis Cluster of three masters on 127.0.0.1,
// without replicas or persistence, each serving a third of the slots. Every
// slot's fresh key (redis.FreshKeyFor) holds its master's run_id, as on a
// new [Redis].
//
// Its URL names every node as the cluster announces it (a node with a
// RedisOptions.Front at the Front's address), in go-redis's form for a
// cluster:
// redis://:PASSWORD@127.0.0.1:PORT1?addr=127.0.0.1:PORT2&addr=127.0.0.1:PORT3.
// Nodes[i].URL is node i's alone, at its own address
// (redis://:PASSWORD@127.0.0.1:PORT/0).
type RedisCluster struct {
	URL   string
	Nodes []*Redis
}

// StartRedisCluster starts a three-master cluster. Of opts, only Password
// and Front count.
func StartRedisCluster(opts ...RedisOptions) (*RedisCluster, error) {
	o := append(opts, RedisOptions{})[0]
	c := &RedisCluster{}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for i := range 3 {
		r, err := StartRedis(RedisOptions{Password: o.Password, clusterNode: true})
		if err != nil {
			c.Close()
			return nil, err
		}
		c.Nodes = append(c.Nodes, r)
		if o.Front != nil {
			if err := r.front(ctx, i, o.Front); err != nil {
				c.Close()
				return nil, err
			}
		}
	}
	for i, r := range c.Nodes {
		first, last := c.slots(i)
		if _, err := RedisDo(ctx, r.URL, "CLUSTER", "ADDSLOTSRANGE", strconv.Itoa(first), strconv.Itoa(last)); err != nil {
			c.Close()
			return nil, fmt.Errorf("testenv: redis cluster: %w", err)
		}
		if i > 0 {
			if _, err := RedisDo(ctx, r.URL, "CLUSTER", "MEET", "127.0.0.1", strconv.Itoa(c.Nodes[0].Port)); err != nil {
				c.Close()
				return nil, fmt.Errorf("testenv: redis cluster: %w", err)
			}
		}
	}
	if err := c.WaitOK(ctx); err != nil {
		c.Close()
		return nil, err
	}
	for i, r := range c.Nodes {
		first, last := c.slots(i)
		if err := markFreshSlots(r, first, last); err != nil {
			c.Close()
			return nil, err
		}
	}
	u, _ := neturl.Parse(c.Nodes[0].URL)
	u.Host, u.Path = c.Nodes[0].announced(), ""
	q := neturl.Values{}
	for _, r := range c.Nodes[1:] {
		q.Add("addr", r.announced())
	}
	u.RawQuery = q.Encode()
	c.URL = u.String()
	return c, nil
}

// RequireRedisCluster is [StartRedisCluster] for t.
func RequireRedisCluster(t testing.TB, opts ...RedisOptions) *RedisCluster {
	c, err := StartRedisCluster(opts...)
	return require(t, c, err, ErrNoRedis)
}

// slots are the first and last slot that node i serves.
func (c *RedisCluster) slots(i int) (first, last int) {
	n := len(c.Nodes)
	return i * RedisSlots / n, (i+1)*RedisSlots/n - 1
}

// NodeOf is the index in Nodes of the master that serves slot.
func (c *RedisCluster) NodeOf(slot int) int {
	for i := range c.Nodes {
		if _, last := c.slots(i); slot <= last {
			return i
		}
	}
	return -1
}

// WaitOK returns once every node knows all three, at the addresses they
// announce, and says that the cluster is ok (every slot served).
func (c *RedisCluster) WaitOK(ctx context.Context) error {
	for {
		ok := true
		var info string
		var err error
	nodes:
		for _, r := range c.Nodes {
			info, err = RedisDo(ctx, r.URL, "CLUSTER", "INFO")
			if err != nil || !strings.Contains(info, "cluster_state:ok") || !strings.Contains(info, fmt.Sprintf("cluster_known_nodes:%d\r", len(c.Nodes))) {
				ok = false
				break
			}
			if info, err = RedisDo(ctx, r.URL, "CLUSTER", "NODES"); err != nil {
				ok = false
				break
			}
			for _, other := range c.Nodes {
				if !strings.Contains(info, " "+other.announced()+"@") {
					ok = false
					break nodes
				}
			}
		}
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("testenv: redis cluster not ok in time: %v %s", err, info)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// front asks front for the address node i (r) announces, and makes r
// announce it.
func (r *Redis) front(ctx context.Context, i int, front func(node int, addr string) (string, error)) error {
	addr, err := front(i, r.addr())
	if err != nil || addr == "" {
		return err
	}
	r.announce = addr
	host, port, _ := net.SplitHostPort(addr)
	for _, kv := range [][2]string{
		{"cluster-announce-bus-port", strconv.Itoa(r.busPort())},
		{"cluster-announce-ip", host},
		{"cluster-announce-port", port},
	} {
		if _, err := RedisDo(ctx, r.URL, "CONFIG", "SET", kv[0], kv[1]); err != nil {
			return fmt.Errorf("testenv: redis cluster: announce %s: %w", addr, err)
		}
	}
	return nil
}

// announced is the address the node announces to the cluster: a Front's,
// or its own.
func (r *Redis) announced() string {
	if r.announce != "" {
		return r.announce
	}
	return r.addr()
}

// announceConf is the configuration of a node that announces a Front's
// address, for its next start. The bus port is given too: by default it
// would be announced as the announced port + 10000, where nothing listens.
func (r *Redis) announceConf() string {
	if r.announce == "" {
		return ""
	}
	host, port, _ := net.SplitHostPort(r.announce)
	return fmt.Sprintf("cluster-announce-ip %s\ncluster-announce-port %s\ncluster-announce-bus-port %d\n", host, port, r.busPort())
}

// busPort is the node's cluster bus port: Redis's default, its port +
// 10000.
func (r *Redis) busPort() int { return r.Port + 10000 }

// Stop stops every node, keeping the cluster's configuration.
func (c *RedisCluster) Stop() error { return c.each((*Redis).Stop) }

// Start starts every node again and returns once the cluster is ok.
func (c *RedisCluster) Start() error {
	if err := c.each((*Redis).Start); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	return c.WaitOK(ctx)
}

// Pause freezes every node (SIGSTOP); Resume thaws them.
func (c *RedisCluster) Pause() error  { return c.each((*Redis).Pause) }
func (c *RedisCluster) Resume() error { return c.each((*Redis).Resume) }

// Close stops every node and removes its directory.
func (c *RedisCluster) Close() error { return c.each((*Redis).Close) }

func (c *RedisCluster) each(f func(*Redis) error) error {
	var errs []error
	for _, r := range c.Nodes {
		errs = append(errs, f(r))
	}
	return errors.Join(errs...)
}

// markFreshSlots sets the fresh key of slots first to last, served by r,
// to r's run_id, in one pipeline.
func markFreshSlots(r *Redis, first, last int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	info, err := RedisDo(ctx, r.URL, "INFO", "server")
	if err != nil {
		return fmt.Errorf("testenv: mark the new redis cluster: %w", err)
	}
	_, runID, _ := strings.Cut(info, "run_id:")
	runID, _, _ = strings.Cut(runID, "\r\n")
	opts, err := goredis.ParseURL(r.URL)
	if err != nil {
		return err
	}
	opts.MaxRetries, opts.DisableIdentity = -1, true
	client := goredis.NewClient(opts)
	defer client.Close()
	_, err = client.Pipelined(ctx, func(p goredis.Pipeliner) error {
		for slot := first; slot <= last; slot++ {
			p.Set(ctx, redis.FreshKeyFor(slot), runID, 0)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("testenv: mark the new redis cluster: %w", err)
	}
	return nil
}
