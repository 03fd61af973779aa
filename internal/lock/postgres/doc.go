// Package postgres is the postgres:// backend: a session advisory lock,
// pg_advisory_lock(k1, k2), on one dedicated connection. The lock lives
// exactly as long as that session, so PostgreSQL frees it whenever withlock
// or its connection dies; there is no lease to renew. Shared locks are
// pg_advisory_lock_shared on the same keys; a semaphore adds a slot lock
// (semaphore.go). docs/postgres.md is the user's account of all of this.
//
// Taking. TryAcquire is one statement (lockSQL) that takes NAME's keys only
// if the session can hold a lock for everyone: not on a hot standby, and
// not in a server session that a pooler shares between clients (take
// connects again until it can tell). The same statement sets the
// server-side bound on the session (boundSQL). The Waiter's Acquire waits
// in pg_advisory_lock, in PostgreSQL's own queue, so that the lock is
// handed over the moment its holder lets go; a wait given up is cancelled
// on the server (ctxHandler), so that nothing stays queued. A semaphore's
// waiter waits as acquireSlot says.
//
// Keeping. Keep is one statement that checks that the session is alive,
// still ours (the same server process, carrying our mark), on a primary,
// and still holds the lock; anything else is ErrLost. Watch waits on the
// idle connection, so that a session the server ends is noticed at once.
//
// Releasing. Release unlocks in the server process that holds the lock
// only: behind a pooler a statement may land in another client's session.
//
// Failures. A holder that dies, or whose connection breaks, loses its
// session and with it the lock. A holder that is frozen or cut off keeps
// its session until the server-side bound ends it, once the holder has
// been silent for the ttl (idle_session_timeout, tcp_user_timeout, TCP
// keepalives). A restart or failover ends every session: each holder finds
// its lock lost. A server that cannot be reached is ErrUnavailable; one
// that answers and refuses (authentication, rights, a standby, a shared
// session) is ErrRefused or ErrUnsafe, sorted in postgres.go.
//
// Files besides the ones every backend has: semaphore.go (the slots and
// their waiter), record.go (what pg_stat_activity shows of a holder) and
// tls.go (TLS negotiated as libpq does).
package postgres
