// Package etcd is the etcd:// and etcds:// backend: etcd's own mutex recipe
// (go.etcd.io/etcd/client/v3/concurrency), on the keys `etcdctl lock NAME`
// uses, so that the two tools exclude each other on the same NAME. It
// speaks to etcd through a small client of its own over etcd's JSON
// gateway (client.go), and sends its transactions as gRPC calls when the
// endpoints are plain HTTP (grpc.go), not through the official client.
//
// Each holder and each waiter has a lease of --ttl and a key NAME/<lease ID
// in lower-case hex> attached to it, put only if absent. The keys of NAME,
// in the order of their create revisions, are its queue: the first key
// holds an exclusive lock, and a waiter watches NAME's keys until their
// events show no key left before its own, so that a hand-off needs no
// polling and no read after the release. A key's create revision grows
// with every acquisition and is the fencing token.
//
// The key's value is the holder's record (JSON: mode, N, host, pid,
// command, when it acquired). A key without one, such as etcdctl's, is an
// exclusive holder. A shared holder waits only for the earlier keys that are
// not shared, and a semaphore holder of N until fewer than N keys are before
// its own; `etcdctl lock` waits for every earlier key, so it still excludes
// and is excluded by both.
//
// The request that queues is that of concurrency.Mutex's TryLock and Lock
// (its Lock reads the queue again after each deletion it waits for, where
// withlock follows the watch's events). A held lock's lease is renewed
// only by lock.Lease's Keep, one KeepAlive request each, so that Keep alone
// says when the lock is lost; a waiter's lease is renewed by Acquire while
// it waits, every lock.Options.KeepInterval (a concurrency.Session keeps
// its lease alive with a loop of its own).
//
// Besides the files every backend has, client.go is the HTTP transport to
// etcd's JSON gateway, wire.go the v3 API's messages and requests, grpc.go
// and proto.go the transactions' gRPC call and protobuf messages, and
// queue.go the queue's model: the keys of NAME, their records, and which
// of them hold (judge).
package etcd
