package redis

import (
	"context"
	"errors"
	"strconv"
	"sync"

	goredis "github.com/redis/go-redis/v9"

	"github.com/withlock/withlock/internal/lock"
)

// A Redis Cluster is given by one node's URL, found to be in a cluster at
// the first command (INFO cluster, cluster_enabled:1), or by several, the
// form of go-redis's cluster URLs (redis://host:port?addr=host2:port2...),
// a cluster from the start. Either way go-redis's cluster client then
// sends each command to the master of its keys' slot and follows MOVED and
// ASK. The keys of one NAME share a slot (see Key), so each script runs on
// one master, as on a single server.
//
// In a cluster the fresh key is per slot, not per server: a script may
// touch the keys of its slot only, and each master restarts on its own.
// FreshKeyFor names it. Releases are published and waited for by sharded
// pub/sub (SPUBLISH, SSUBSCRIBE: Redis 7), which stays within the NAME's
// shard, where classic pub/sub would carry every release to every node.

// NumSlots is the number of hash slots of a Redis Cluster.
const NumSlots = 16384

// Slot is the hash slot of key in a Redis Cluster: CRC16 of its hash tag
// (the text between its first { and the next }, when not empty) or of the
// whole key, modulo NumSlots.
func Slot(key string) int {
	for i := 0; i < len(key); i++ {
		if key[i] == '{' {
			for j := i + 1; j < len(key); j++ {
				if key[j] == '}' {
					if j > i+1 {
						key = key[i+1 : j]
					}
					return int(crc16(key) % NumSlots)
				}
			}
			break
		}
	}
	return int(crc16(key) % NumSlots)
}

// crc16 is CRC-16/XMODEM, the checksum Redis Cluster hashes keys with.
func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc ^= uint16(s[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}

// slotTags are, for each slot, the smallest whole number whose decimal
// text hashes to it: every slot has one below 110,000.
var slotTags = sync.OnceValue(func() *[NumSlots]int32 {
	var tags [NumSlots]int32
	for i := range tags {
		tags[i] = -1
	}
	for n, left := int32(0), NumSlots; left > 0; n++ {
		if s := crc16(strconv.Itoa(int(n))) % NumSlots; tags[s] < 0 {
			tags[s] = n
			left--
		}
	}
	return &tags
})

// FreshKeyFor is the fresh key of a cluster's slot: withlock-fresh:{N},
// N the smallest whole number that hashes to slot. When it holds the
// run_id of the master that serves slot, that master is known to have
// forgotten no lease of a NAME in slot (see FreshKey).
func FreshKeyFor(slot int) string {
	return "withlock-fresh:{" + strconv.Itoa(int(slotTags()[slot])) + "}"
}

// freshKey is the fresh key that the acquire script of name reads.
func (b *backend) freshKey(name string) string {
	if b.cluster != nil {
		return FreshKeyFor(Slot(Key(name)))
	}
	return FreshKey
}

// publish is the command that tells name's waiters of a release.
func (b *backend) publish() string {
	if b.cluster != nil {
		return "SPUBLISH"
	}
	return "PUBLISH"
}

// connect asks the server of a single node's URL, at the first command,
// whether it is in a cluster, and if so goes on with a cluster client
// that starts from it.
//
// Every method that may be a client's first command calls connect first:
// its lock orders their reads of b.client after its one change.
func (b *backend) connect(ctx context.Context) error {
	b.connecting.Lock()
	defer b.connecting.Unlock()
	if !b.detect {
		return nil
	}
	info, err := b.client.Info(ctx, "cluster").Result()
	if goredis.HasErrorPrefix(err, "SELECT is not allowed in cluster mode") {
		// The connection of a URL with another database than 0 selects it
		// first.
		info, err = "cluster_enabled:1", nil
	}
	if err != nil {
		return b.classify(err)
	}
	if infoField(info, "cluster_enabled") != "1" {
		b.detect = false
		return nil
	}
	if b.single.DB != 0 {
		return lock.Errorf(lock.ErrUsage, "redis at %s is a node of a Redis Cluster, which has only database 0; drop /%d from the URL", b.addr, b.single.DB)
	}
	b.detect = false
	single := b.client
	b.useCluster(clusterOptions(b.single))
	single.Close()
	return nil
}

// clusterOptions are the options of a cluster client that starts from the
// node of o and connects to every node as o says.
func clusterOptions(o *goredis.Options) *goredis.ClusterOptions {
	return &goredis.ClusterOptions{
		Addrs:                 []string{o.Addr},
		Username:              o.Username,
		Password:              o.Password,
		TLSConfig:             o.TLSConfig,
		Dialer:                o.Dialer,
		DialTimeout:           o.DialTimeout,
		DialerRetries:         o.DialerRetries,
		ContextTimeoutEnabled: o.ContextTimeoutEnabled,
		MaxRetries:            o.MaxRetries,
		PoolSize:              o.PoolSize,
		ClientName:            o.ClientName,
		DisableIdentity:       o.DisableIdentity,
	}
}

func (b *backend) useCluster(o *goredis.ClusterOptions) {
	o.NewClient = func(o *goredis.Options) *goredis.Client {
		c := goredis.NewClient(o)
		c.AddHook(noResend{})
		return c
	}
	b.cluster = goredis.NewClusterClient(o)
	b.client = b.cluster
}

// noResend keeps the cluster client from sending a script again after a
// connection failed under it. The cluster client retries a command on a
// network error (up to MaxRedirects times, which must stay above zero to
// follow MOVED and ASK), but a script may have run before the connection
// failed: run again, the release script no longer finds its holder (its
// first run deleted it) and says the lease was lost, and the acquire script
// finds the place its first run took held by someone. An outage is the
// truth, and the wait and keep loops in package lock decide when to try
// again, as with a single server (MaxRetries -1).
type noResend struct{}

func (noResend) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (noResend) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return next
}

func (noResend) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		err := next(ctx, cmd)
		var reply goredis.Error
		if err == nil || errors.As(err, &reply) {
			return err
		}
		switch cmd.Name() {
		case "eval", "evalsha":
			return mayHaveRun{err}
		}
		return err
	}
}

// mayHaveRun is the network error of a script that may have run on the
// server. It hides err from errors.Is and errors.As, by which the cluster
// client decides to retry; classifyIn takes err out again.
type mayHaveRun struct{ err error }

func (e mayHaveRun) Error() string { return e.err.Error() }

// node is the client of the server that holds key: the cluster's master
// of key's slot, or the single server.
func (b *backend) node(ctx context.Context, key string) (*goredis.Client, error) {
	if b.cluster != nil {
		return b.cluster.MasterForKey(ctx, key)
	}
	return b.client.(*goredis.Client), nil
}

// forEachMaster calls fn with the client of each master: the cluster's,
// one after the other, or the single server. fn's errors are returned as
// they are; the cluster's own are classified.
func (b *backend) forEachMaster(ctx context.Context, fn func(c *goredis.Client) error) error {
	if b.cluster == nil {
		return fn(b.client.(*goredis.Client))
	}
	var (
		mu      sync.Mutex
		masters []*goredis.Client
	)
	// ForEachMaster calls its function for every master at once.
	if err := b.cluster.ForEachMaster(ctx, func(_ context.Context, c *goredis.Client) error {
		mu.Lock()
		masters = append(masters, c)
		mu.Unlock()
		return nil
	}); err != nil {
		return b.classify(err)
	}
	for _, c := range masters {
		if err := fn(c); err != nil {
			return err
		}
	}
	return nil
}
