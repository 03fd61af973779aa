package redis

import (
	"sync"

	goredis "github.com/redis/go-redis/v9"
)

// The lock of NAME is one hash, withlock:{NAME} (Key), in every mode:
//
//	mode     exclusive, shared or semaphore: how the holders hold it
//	max      a semaphore's N
//	TOKEN    one field per holder, named by the holder's random token:
//	         "ENDS FENCE SINCE RECORD", ENDS the end of its lease and
//	         SINCE its acquisition (the server's clock, ms since the
//	         epoch), FENCE its fencing token, RECORD a JSON object with
//	         its host, pid and command
//
// Each holder's lease ends on its own: every script that writes the hash
// first deletes the holders whose ENDS has passed by the server's clock
// (TIME); status, which only reads it, leaves them out. The key's own
// expiry is the latest ENDS, so that a lock whose holders all vanished does
// not stay behind. The hash is deleted when its last holder leaves.
//
// Every script that may write a lease calls redis.replicate_commands first:
// TIME and INFO are not deterministic, and servers before 5 replicate
// scripts that use them only as their effects.
//
// A script that fails half-way keeps the writes it made (Redis has no
// rollback). A script that frees a lock deletes first and publishes last,
// with redis.pcall: a user who may not publish (Redis 7's default
// acl-pubsub-default resetchannels, or -@pubsub) still frees it, and its
// waiters, who could not subscribe either, find out by polling.
//
// A server at maxmemory with noeviction refuses, in a script, the first
// write that may grow memory (HSET, SET) unless the script has already
// written. Renewing and releasing must work there, or every holder would
// lose its lock at once: release only deletes, and renew sets the key's
// expiry (never refused) before it rewrites its own field. Taking a lock
// may be refused there, as an outage.

// luaCommon are the helpers every script below starts with.
const luaCommon = `
-- clock is the server's time in ms and in µs since the epoch.
local function clock()
  local t = redis.call('TIME')
  local s, us = tonumber(t[1]), tonumber(t[2])
  return s * 1000 + math.floor(us / 1000), s * 1000000 + us
end
-- kind is key's type: none, hash (a lock of this withlock) or another.
local function kind(key)
  return redis.call('TYPE', key).ok
end
-- num writes n for a command: tostring would turn 13 digits into 1.2e+12.
local function num(n)
  return string.format('%.0f', n)
end
-- prune deletes from the lock hash key the holders whose lease ended by now.
-- It returns how many are left, the earliest and the latest end of their
-- leases (the latest leaving out the holder skip, if given).
local function prune(key, now, skip)
  local h = redis.call('HGETALL', key)
  local n, first, last = 0, nil, 0
  for i = 1, #h, 2 do
    local field = h[i]
    if field ~= 'mode' and field ~= 'max' then
      local ends = tonumber(string.match(h[i + 1], '^%d+'))
      if ends and ends > now then
        n = n + 1
        if not first or ends < first then first = ends end
        if field ~= skip and ends > last then last = ends end
      else
        redis.call('HDEL', key, field)
      end
    end
  end
  return n, first, last
end
`

// Replies of acquireScript: the first element of its array.
const (
	replyHeld     = 0 // {0, ms until it may be free, 1 if this attempt set the writer mark}
	replyAcquired = 1 // {1, fencing token}
	replyTooYoung = 2 // {2, ms to wait, uptime in seconds}
	replyReplica  = 3 // {3, role}
	replyOtherN   = 4 // {4, the recorded N}
	replyForeign  = 5 // {5, the key's type, its PTTL}: not a lock of this withlock
)

// luaScript is one of the scripts below: its source, kept to tell which of
// its commands an ACL refused, and the script, whose SHA-1 is worked out at
// first use rather than at package init, which every withlock start pays.
type luaScript struct {
	name string // as messages call it: "the acquire script"
	src  string
	get  func() *goredis.Script
}

func script(name, src string) *luaScript {
	return &luaScript{name: name, src: src, get: sync.OnceValue(func() *goredis.Script { return goredis.NewScript(src) })}
}

var (
	// acquire takes a place among NAME's holders if the mode allows it,
	// and sets the fencing token in the same step.
	//
	// KEYS: the lock hash, the fence, FreshKey, the writer mark.
	// ARGV: token, ttl in ms, mode, N (semaphore) or 0, the holder's
	// record (JSON), this client's waiter id, and how long the writer mark
	// lasts in ms (0: this attempt must not set it, as with --no-wait).
	//
	// It first refuses a replica (its role in INFO replication), and holds
	// back while the server's uptime is below the ttl, unless KEYS[3]
	// holds the server's run_id. uptime_in_seconds is whole seconds,
	// truncated at both ends, so the server has been up for more than
	// uptime-1 seconds: that is what is compared with the ttl.
	//
	// Then: an exclusive request needs no holders; a shared one, none or
	// shared holders; a semaphore's, none or fewer than N semaphore holders
	// of the same N (another N is refused). An exclusive request that finds
	// shared or semaphore holders leaves the writer mark, which new shared
	// and semaphore holders respect, so that a stream of them cannot starve
	// it; the exclusive holder that takes the lock clears its own mark.
	acquireScript = script("acquire", `
if redis.replicate_commands then redis.replicate_commands() end`+luaCommon+`
local role = string.match(redis.call('INFO', 'replication'), 'role:([%w-]+)')
if role and role ~= 'master' then
  return {3, role}
end
local info = redis.call('INFO', 'server')
local up = tonumber(string.match(info, 'uptime_in_seconds:(%d+)'))
if up then
  local wait = tonumber(ARGV[2]) - (up - 1) * 1000
  if wait > 0 and redis.call('GET', KEYS[3]) ~= string.match(info, 'run_id:(%x+)') then
    return {2, wait, up}
  end
end
local lock, mode, n_max = KEYS[1], ARGV[3], tonumber(ARGV[4])
local k = kind(lock)
if k ~= 'none' and k ~= 'hash' then
  return {5, k, redis.call('PTTL', lock)}
end
local now, micros = clock()
local n, first, last = prune(lock, now)
if n > 0 then
  local held = redis.call('HGET', lock, 'mode')
  if mode == 'exclusive' or held ~= mode then
    if mode == 'exclusive' and held ~= 'exclusive' and ARGV[7] ~= '0' then
      redis.call('SET', KEYS[4], ARGV[6], 'PX', ARGV[7])
      return {0, last - now, 1}
    end
    return {0, last - now, 0}
  end
  if mode == 'semaphore' then
    local recorded = tonumber(redis.call('HGET', lock, 'max')) or 0
    if recorded ~= n_max then
      return {4, recorded}
    end
    if n >= n_max then
      return {0, first - now, 0}
    end
  end
end
if mode ~= 'exclusive' then
  local marked = redis.call('PTTL', KEYS[4])
  if marked > 0 then
    return {0, marked, 0}
  end
end
local fence = math.max((tonumber(redis.call('GET', KEYS[2])) or 0) + 1, micros)
redis.call('SET', KEYS[2], num(fence))
local ends = now + tonumber(ARGV[2])
if n == 0 then
  redis.call('DEL', lock)
end
redis.call('HSET', lock, ARGV[1], num(ends) .. ' ' .. num(fence) .. ' ' .. num(now) .. ' ' .. ARGV[5])
redis.call('HSET', lock, 'mode', mode)
if mode == 'semaphore' then
  redis.call('HSET', lock, 'max', ARGV[4])
end
redis.call('PEXPIREAT', lock, num(math.max(last, ends)))
if mode == 'exclusive' and redis.call('GET', KEYS[4]) == ARGV[6] then
  redis.call('DEL', KEYS[4])
end
return {1, fence}`)

	// renew sets the end of the holder ARGV[1]'s lease to ARGV[2] ms from
	// now, if it is still a holder. It returns 1 when it did, -1 on a
	// replica (a failover demoted the server we hold the lease on), and
	// {0} when it is not a holder (its lease ended, was deleted or broken),
	// {0, policy} on a server that evicts keys when full, which may be why.
	renewScript = script("renew", `
if redis.replicate_commands then redis.replicate_commands() end`+luaCommon+`
local role = string.match(redis.call('INFO', 'replication'), 'role:([%w-]+)')
if role and role ~= 'master' then
  return -1
end
local function gone()
  local info = redis.call('INFO', 'memory')
  local max = tonumber(string.match(info, 'maxmemory:(%d+)'))
  local policy = string.match(info, 'maxmemory_policy:([%w-]+)')
  if max and max > 0 and policy and policy ~= 'noeviction' then
    return {0, policy}
  end
  return {0}
end
local lock = KEYS[1]
if kind(lock) ~= 'hash' then
  return gone()
end
local now = clock()
local n, first, last = prune(lock, now, ARGV[1])
local mine = redis.call('HGET', lock, ARGV[1])
if not mine then
  return gone()
end
local ends = now + tonumber(ARGV[2])
redis.call('PEXPIREAT', lock, num(math.max(last, ends)))
redis.call('HSET', lock, ARGV[1], num(ends) .. string.match(mine, '^%d+(.*)$'))
return 1`)

	// release removes the holder ARGV[1] if it is still one, deletes the
	// lock when it was the last, and tells the waiters (KEYS[2] is the
	// release channel): a freed semaphore slot or shared place is news to
	// them too, by ARGV[2] (PUBLISH, or SPUBLISH in a cluster). It returns
	// 1, 2 when it could not tell the waiters (the error of the publishing
	// follows), or 0 when ARGV[1] was no longer a holder.
	releaseScript = script("release", `
if redis.replicate_commands then redis.replicate_commands() end`+luaCommon+`
local lock = KEYS[1]
if kind(lock) ~= 'hash' then
  return 0
end
local n = prune(lock, (clock()))
if redis.call('HEXISTS', lock, ARGV[1]) == 0 then
  return 0
end
if n == 1 then
  redis.call('DEL', lock)
else
  redis.call('HDEL', lock, ARGV[1])
end
local told = redis.pcall(ARGV[2], KEYS[2], '')
if type(told) == 'table' and told.err then
  return {2, told.err}
end
return 1`)

	// unmark deletes the writer mark KEYS[1] if this client (ARGV[1]) set
	// it, and tells the waiters that shared holders may come in again
	// (ARGV[2]: PUBLISH, or SPUBLISH in a cluster).
	unmarkScript = script("unmark", `
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.pcall(ARGV[2], KEYS[2], '')
  return 1
end
return 0`)

	// break deletes the lock KEYS[1], whoever holds it, and tells the
	// waiters (KEYS[2], by ARGV[1]: PUBLISH, or SPUBLISH in a cluster). The
	// fence counter stays, so tokens go on growing.
	// It returns {0} if there was no lock, {1, now in ms, type, fields}
	// when it deleted one, and {2, type} for a key that is not a lease (a
	// hash of this withlock, or a string with an expiry from an older one),
	// which it leaves alone.
	breakScript = script("break", `
if redis.replicate_commands then redis.replicate_commands() end`+luaCommon+`
local lock = KEYS[1]
local k = kind(lock)
if k == 'none' then
  return {0}
end
if k ~= 'hash' and not (k == 'string' and redis.call('PTTL', lock) >= 0) then
  return {2, k}
end
local fields = {}
if k == 'hash' then
  fields = redis.call('HGETALL', lock)
end
local now = clock()
redis.call('DEL', lock)
redis.pcall(ARGV[1], KEYS[2], '')
return {1, now, k, fields}`)
)
