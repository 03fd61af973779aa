package redis

import (
	"context"
	"fmt"
	"strings"

	goredis "github.com/redis/go-redis/v9"

	"github.com/withlock/withlock/internal/lock"
)

// Findings removes what the probe lock leaves (its fencing counter outlives
// every lease of a name; the probe's name is its alone), then reports what
// weakens a lock on this server, or on each master of a cluster, beyond
// what taking one refuses (a replica; withlock check): eviction, and
// whether a restart or a failover can forget a lock. It reads INFO, which
// every client may, and CONFIG only for the snapshot schedule, which
// managed servers hide.
func (b *backend) Findings(ctx context.Context, probe string) ([]lock.Finding, error) {
	if err := b.connect(ctx); err != nil {
		return nil, err
	}
	if err := b.client.Del(ctx, Key(probe), FenceKey(probe), WriterKey(probe)).Err(); err != nil {
		return nil, b.classify(err)
	}
	var findings []lock.Finding
	err := b.forEachMaster(ctx, func(node *goredis.Client) error {
		addr := b.addr // a single server's, or the Sentinels'
		if b.cluster != nil {
			addr = node.Options().Addr
		}
		memory, err := node.Info(ctx, "memory").Result()
		if err != nil {
			return b.classify(err)
		}
		persistence, err := node.Info(ctx, "persistence").Result()
		if err != nil {
			return b.classify(err)
		}
		save := "unknown"
		if kv, err := node.ConfigGet(ctx, "save").Result(); err == nil {
			save = kv["save"]
		}
		findings = append(findings,
			evictionFinding(addr, infoField(memory, "maxmemory"), infoField(memory, "maxmemory_policy")),
			durabilityFinding(addr, infoField(persistence, "aof_enabled") == "1", save, b.waitReplicas))
		return nil
	})
	if err != nil {
		return nil, err
	}
	return findings, nil
}

// infoField is field's value in an INFO reply, "" when it has none.
func infoField(info, field string) string {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			return v
		}
	}
	return ""
}

// evictionFinding judges maxmemory (bytes, "0" for no limit) and
// maxmemory_policy: a server that evicts keys when full can drop a held
// lock's key, and another withlock then takes the lock beside its holder.
func evictionFinding(addr, maxmemory, policy string) lock.Finding {
	switch {
	case policy == "":
		return lock.Finding{Name: "eviction", Status: lock.Warn, Detail: fmt.Sprintf("redis at %s does not say its maxmemory-policy in INFO memory: cannot tell whether it evicts a held lock's key", addr)}
	case policy == "noeviction":
		return lock.Finding{Name: "eviction", Status: lock.Ok, Detail: fmt.Sprintf("redis at %s never evicts keys (maxmemory-policy noeviction); on a full server withlock's renewals and releases still work", addr)}
	case maxmemory == "0":
		return lock.Finding{Name: "eviction", Status: lock.Ok, Detail: fmt.Sprintf("redis at %s has no memory limit (maxmemory 0), so maxmemory-policy %s evicts nothing", addr, policy)}
	}
	first := ""
	if strings.HasPrefix(policy, "volatile-") {
		first = ", and a lock's key, one of the few with an expiry, is among the first to go"
	}
	return lock.Finding{Name: "eviction", Status: lock.Warn,
		Detail: fmt.Sprintf("redis at %s evicts keys when it reaches maxmemory (maxmemory-policy %s)%s: a held lock's key can vanish, and another withlock then runs beside its holder", addr, policy, first),
		Fix:    "set maxmemory-policy noeviction on the server (or use a Redis of its own for locks)"}
}

// durabilityFinding judges whether a restart or a failover can forget a
// held lock: appendonly keeps every write across a restart, wait_replicas
// makes a lock count only once replicas have it. RDB snapshots (save) keep
// only what was written before the last one. withlock does not trust a
// server that started less than a ttl ago (see FreshKey), so a restart
// without the lock costs a wait, not an overlap; a failover to a replica
// that never had the lock is not covered.
func durabilityFinding(addr string, aof bool, save string, waitReplicas int) lock.Finding {
	switch {
	case waitReplicas > 0:
		return lock.Finding{Name: "durability", Status: lock.Ok,
			Detail: fmt.Sprintf("wait_replicas=%d: a lock counts only once %d replicas have it, so a failover keeps it", waitReplicas, waitReplicas)}
	case aof:
		return lock.Finding{Name: "durability", Status: lock.Ok,
			Detail: fmt.Sprintf("redis at %s writes an append-only file, so a restart keeps every lock; a failover to a replica can still lose one taken just before it (add wait_replicas to the URL)", addr)}
	}
	var what string
	switch save {
	case "unknown":
		what = "has no append-only file, and would not say its snapshot schedule (CONFIG GET save refused, as on many managed servers)"
	case "":
		what = "has no persistence (no append-only file, no snapshots)"
	default:
		what = fmt.Sprintf("keeps only snapshots (save %q), not every write", save)
	}
	return lock.Finding{Name: "durability", Status: lock.Warn,
		Detail: fmt.Sprintf("redis at %s %s, and the URL has no wait_replicas: a restart or a failover can forget a held lock (after a restart withlock grants nothing for a ttl, for holders it may have forgotten; a failover to a replica that never had the lock is not covered)", addr, what),
		Fix:    "turn on appendonly, or add wait_replicas=N to the URL where the server has replicas"}
}
