// Package etcd is the etcd:// and etcds:// backend: etcd's own mutex recipe
// (go.etcd.io/etcd/client/v3/concurrency), on the keys `etcdctl lock NAME`
// uses, so that the two tools exclude each other on the same NAME. It
// speaks to etcd through the official client (go.etcd.io/etcd/client/v3),
// which balances requests over the URL's members, moves on from one that
// stops or is a learner, resumes watches elsewhere, and renews auth tokens.
//
// Each holder and each waiter has a lease of --ttl and a key NAME/<lease ID
// in lower-case hex> attached to it, put only if absent. The keys of NAME,
// in the order of their create revisions, are its queue: the first key
// holds an exclusive lock. A waiter watches the one earlier key whose
// deletion it waits for (judge), as the recipe does, so that a release
// wakes one waiter; when that key was the only one before its own, the
// deletion alone hands the lock over, with no read after it. A key's
// create revision grows with every acquisition and is the fencing token.
//
// The key's value is the holder's record (JSON: mode, N, host, pid,
// command, when it acquired). A key without one, such as etcdctl's, is an
// exclusive holder. A shared holder waits only for the earlier keys that are
// not shared, and a semaphore holder of N until fewer than N keys are before
// its own; `etcdctl lock` waits for every earlier key, so it still excludes
// and is excluded by both.
//
// Leases are renewed on one LeaseKeepAlive stream per process, one request
// and its answer per renewal (lease.go's renewer), not by the client's own
// keep-alive loop, so that lock.Held's Keep alone says when a renewal was
// sent and whether it was answered. A stream goes on being served by a
// member that is stopping gracefully, where a new request is refused. For
// the same reason a held key is also watched on a stream of its own: while
// a read of it cannot be served, the watch vouches for it, and a deletion
// is learned at once (lock.Watcher). A waiter's lease is renewed while it
// waits, every lock.Options.KeepInterval; a wait that the server's
// unavailability cuts short keeps its key, and its place, for the wait
// loop's next attempt.
package etcd
