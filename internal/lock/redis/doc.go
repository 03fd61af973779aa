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
//
// Besides the files every backend has, dial.go tells a port that speaks the
// other protocol than the URL's scheme (TLS or not) from an unreachable one,
// and acl.go says what a user's ACL refused and the rule that allows it.
package redis
