// Package mysql is the mysql:// backend, for MySQL 5.7 and later and
// MariaDB 10: a user-level lock, GET_LOCK(Key(NAME), timeout), on one
// dedicated connection. The lock lives exactly as long as that session, so
// the server frees it whenever withlock or its connection dies; there is no
// lease to renew. The `mysql` client's GET_LOCK on the same key excludes
// withlock and the other way round.
//
// A semaphore of N holders (--max-holders N) is N such locks, its slots;
// slot 0 is NAME's own key, so that an exclusive holder and a semaphore's
// first holder exclude each other. GET_LOCK has no shared mode: --shared
// is refused.
//
// Waiters wait in the server, in GET_LOCK: an exclusive lock's for
// waitSeconds at a time; a semaphore's tries every slot and then waits in
// one of them, chosen at random, for slotWaitSeconds, since no server can
// wait for any one of several locks.
//
// The session also carries what status shows: the connection attribute
// program_name=withlock, and user variables, set by the statement that
// locks, holding the holder's record (@withlock) and the server's time
// of the attempt (@withlock_at). Other sessions can read them only
// through performance_schema.
//
// Taking. TryAcquire is one packet (lockSQL): GET_LOCK only if the server
// is not read-only, then the session's wait_timeout and the holder's
// record, then what the server says of itself again (Server), so that a
// lock granted on a server where it would exclude nobody (a replica, a
// Galera cluster of more than one node) is given back and refused before
// it is used. The Waiter's Acquire waits in GET_LOCK; when its ctx ends
// first, KILL QUERY from a second connection takes the wait out of the
// server's queue, and if the lock was granted meanwhile the connection is
// closed, which releases it.
//
// Keeping. Keep is one packet that checks that the session is alive,
// still holds the key, and is on a server where the lock still excludes
// everyone; anything else is ErrLost. Watch reads the idle connection
// (socket.go), so that a session the server ends is noticed at once.
//
// Releasing. Release is RELEASE_LOCK; if that fails, the connection is
// closed, which ends the lock too.
//
// Failures. A holder that dies, or whose connection breaks, loses its
// session and with it the lock. A holder that is frozen or cut off keeps
// its session until wait_timeout, the ttl, ends it (the server-side bound
// of docs/mysql.md). A restart or failover ends every session: each
// holder finds its lock lost. A server that cannot be reached, or is at
// its connection limit, is ErrUnavailable; one that answers and refuses
// is ErrRefused, sorted in mysql.go.
//
// Files besides the ones every backend has: server.go (what a server says
// of itself, and which servers are refused) and socket.go (statements
// bounded by socket deadlines, and the idle connection watched).
package mysql
