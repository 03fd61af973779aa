package redis

import (
	"context"
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/withlock/withlock/internal/lock"
)

// scanCount is the COUNT of each SCAN step of List: how many keys the
// server looks at per round trip, not a limit on the result.
const scanCount = 1000

// Inspect returns name's holders whose leases have not ended by the
// server's clock. It only reads, so it works with a user that may not
// write, and on a replica.
func (b *backend) Inspect(ctx context.Context, name string) (lock.State, error) {
	if err := b.connect(ctx); err != nil {
		return lock.State{}, err
	}
	node, err := b.node(ctx, Key(name))
	if err != nil {
		return lock.State{}, b.classify(err)
	}
	states, err := b.inspect(ctx, node, []string{Key(name)})
	if err != nil {
		return lock.State{}, err
	}
	return states[0], nil
}

// List returns every lock held right now: SCAN over withlock:{*} (never
// KEYS, which would stop the server while it walks every key) on the
// server, or on every master of a cluster, each page read in one
// transaction (in a cluster, one per key: a transaction stays in a slot).
func (b *backend) List(ctx context.Context) ([]lock.State, error) {
	if err := b.connect(ctx); err != nil {
		return nil, err
	}
	var held []lock.State
	err := b.forEachMaster(ctx, func(node *goredis.Client) error {
		seen := map[string]bool{} // SCAN may return a key more than once
		var cursor uint64
		for {
			keys, next, err := node.Scan(ctx, cursor, keyPattern, scanCount).Result()
			if err != nil {
				return b.classify(err)
			}
			keys = slices.DeleteFunc(keys, func(k string) bool {
				_, ours := nameOf(k)
				return seen[k] || !ours
			})
			batches := [][]string{keys}
			if b.cluster != nil {
				batches = batches[:0]
				for _, k := range keys {
					batches = append(batches, []string{k})
				}
			}
			for _, batch := range batches {
				if len(batch) == 0 {
					continue
				}
				states, err := b.inspect(ctx, node, batch)
				if err != nil {
					return err
				}
				for i, st := range states {
					seen[batch[i]] = true
					if len(st.Holders) > 0 {
						held = append(held, st)
					}
				}
			}
			if next == 0 {
				return nil
			}
			cursor = next
		}
	})
	if err != nil {
		return nil, err
	}
	return held, nil
}

// inspect reads the locks at keys (withlock:{NAME} each) in one
// transaction on node, with the server's time to judge their holders' leases by.
// It runs no script and writes nothing, so status needs only the right to
// read the withlock:* keys (EVAL needs write access to its keys) and works
// on a replica; expired holders are left out here, not deleted.
func (b *backend) inspect(ctx context.Context, node *goredis.Client, keys []string) ([]lock.State, error) {
	var (
		now    *goredis.TimeCmd
		kinds  = make([]*goredis.StatusCmd, len(keys))
		pttls  = make([]*goredis.Cmd, len(keys))
		fields = make([]*goredis.MapStringStringCmd, len(keys))
	)
	// The error of the transaction is its first command's that failed:
	// HGETALL of a key that is no hash, which state does without.
	node.TxPipelined(ctx, func(p goredis.Pipeliner) error {
		now = p.Time(ctx)
		for i, k := range keys {
			kinds[i] = p.Type(ctx, k)
			pttls[i] = p.Do(ctx, "pttl", k)
			fields[i] = p.HGetAll(ctx, k)
		}
		return nil
	})
	if err := now.Err(); err != nil {
		return nil, b.classifyIn(err, nil, keys...)
	}
	states := make([]lock.State, len(keys))
	for i, key := range keys {
		kind, err := kinds[i].Result()
		if err != nil {
			return nil, b.classify(err)
		}
		pttl, err := pttls[i].Int64()
		if err != nil {
			return nil, b.classify(err)
		}
		var f map[string]string
		if kind == "hash" {
			if f, err = fields[i].Result(); err != nil {
				return nil, b.classify(err)
			}
		}
		states[i] = b.state(key, now.Val().UnixMilli(), kind, pttl, f)
	}
	return states, nil
}

// state is the lock at key as read at the server's time now (ms): the
// holders of a lock hash whose leases have not ended, or, for a key of
// another type, one holder of which nothing is known.
func (b *backend) state(key string, now int64, kind string, pttl int64, fields map[string]string) lock.State {
	name, _ := nameOf(key)
	st := lock.State{Name: name, Key: key}
	switch kind {
	case "none":
		return st
	case "hash":
	default:
		// A string with an expiry is the lease of a withlock from before
		// shared locks; anything else someone else's key. Either excludes
		// every withlock, so status shows it held by someone unknown.
		h := lock.Holder{}
		if pttl >= 0 {
			h.ExpiresAt = time.UnixMilli(now + pttl)
		}
		st.Mode, st.Holders = lock.Exclusive, []lock.Holder{h}
		return st
	}
	for field, value := range fields {
		switch field {
		case "mode":
			st.Mode = lock.Mode(value)
		case "max":
			st.MaxHolders, _ = strconv.Atoi(value)
		default:
			if h, ok := parseHolder(value); ok && h.ExpiresAt.UnixMilli() > now {
				st.Holders = append(st.Holders, h)
			}
		}
	}
	if len(st.Holders) == 0 {
		return lock.State{Name: st.Name, Key: key}
	}
	if st.Mode != lock.Semaphore {
		st.MaxHolders = 0
	}
	return st
}

// parseHolder reads a holder's field value: "ENDS FENCE SINCE RECORD".
func parseHolder(v string) (lock.Holder, bool) {
	parts := strings.SplitN(v, " ", 4)
	if len(parts) != 4 {
		return lock.Holder{}, false
	}
	var n [3]int64
	for i := range n {
		var err error
		if n[i], err = strconv.ParseInt(parts[i], 10, 64); err != nil {
			return lock.Holder{}, false
		}
	}
	var rec record
	// A record that does not parse leaves the holder known by its lease
	// alone; the lease is what counts.
	json.Unmarshal([]byte(parts[3]), &rec)
	return lock.Holder{
		Host:       rec.Host,
		PID:        rec.PID,
		Command:    rec.Command,
		ExpiresAt:  time.UnixMilli(n[0]),
		Token:      n[1],
		AcquiredAt: time.UnixMilli(n[2]),
	}, true
}
