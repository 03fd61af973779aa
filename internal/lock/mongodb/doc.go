// Package mongodb is the mongodb:// and mongodb+srv:// backend. A lock is a
// chain of immutable documents in the collection "locks" of the URL's database
// (default "withlock"), one document per change of the lock's state, each
// written only by inserting it under the next sequence number:
//
//	{_id: "NAME#<seq>", name, seq, op, at, mode, max, holders: [{id, token,
//	  host, pid, command, acquiredAt, expiresAt}], writer: {id, host, pid, until}}
//
// The document of NAME with the highest seq is the lock's state: holders is
// empty when NAME is free; mode says how they hold it (exclusive, shared,
// semaphore; absent means exclusive) and max is a semaphore's N. Every
// change is decided on a state n and written by inserting state n+1:
// acquire (n has room for us: no live holder for an exclusive lock, only
// shared ones for a shared lock, fewer than N of the same N for a
// semaphore; a holder is live until its lease runs out by the server's
// clock), renew and release (n lists our holder id). Two clients that
// decided on the same state race for the same _id; exactly one insert
// succeeds, the other gets a duplicate-key error, reads the state that won
// and decides again (a bounded loop inside one attempt: each lost race
// means that someone else's write landed).
//
// # Why this is atomic on FerretDB v1 as on MongoDB
//
// FerretDB v1 runs a conditional update or delete as "read the matching
// documents, then write each back by _id": the condition is not checked
// again when the write lands, so two clients can both act on the same
// version of a document. Only an insert is atomic there: SQLite's unique
// index on _id lets exactly one insert of an _id succeed. This backend never
// updates a document, and deletes only documents that nobody decides on any
// more (below). Every decision to change the lock is a claim on one _id.
// So a renewal and a takeover cannot both win: both decided on state n and
// both need "NAME#n+1". (An updated lease document cannot give this: its
// renewal, filtered on "expiresAt > now" with a now read a round trip
// earlier, can land after another client took the expired lease over.)
// Shared and semaphore holders are entries of one list, each with its own
// lease: a writer drops the entries whose lease has run out, so a crashed
// holder frees only its own place.
//
// # Expiry
//
// Expiry is judged by the server's clock only: an attempt reads it from
// hello's localTime (whole milliseconds). A holder writes expiresAt = that
// time + ttl, rounded down to the millisecond, and that time is later than
// when the attempt was sent, which is when the lease counts from on the
// holder's clock (lock.Backend's TryAcquire). Another client takes over
// only once the server's time it read is after expiresAt, strictly, which
// with millisecond times means later than the holder's send time + ttl. A
// renewal needs no "still live" condition: if it is written right
// after a state that lists us, nobody took the lock over in between. One
// TryAcquire is bounded by TTL-Grace, so that it never hands its caller a
// lease whose time is already up.
//
// # The check after each write
//
// An acquisition or a renewal counts only if the newest state, read after
// its insert, lists the writer with the expiry it wrote. Old documents are
// deleted (below), and a deleted _id can be inserted again: a client that
// decided on state n and stalled (or whose insert sat in a network buffer)
// while the chain moved on can insert "NAME#n+1" after it was deleted, on a
// state long gone. Such an insert is never the newest document, so nobody
// decides on it, and no newer state can copy its entry: only its writer
// could believe in it, and the check stops that. A renewal whose insert
// did not count but whose holder the newest state still lists (its insert
// was such a late one, or lost a race) writes again after the newest. A
// renewal also checks that its insert is not the oldest document of the
// name: if the documents were deleted (an operator, a dropped collection),
// its insert began a chain of its own, and the lock is lost.
//
// # Deleting old documents, and what a poll reads
//
// A write whose check read the whole chain deletes the documents of its
// name that are more than keep below the newest and older than spare: each
// is below a state whose writer read the server's time, after the state it
// followed had been written, more than spare ago. Until then, every state
// written after one that a client read as the newest is still there. So a
// waiting client, which knows the newest state as of its last poll, polls
// by reading the state after it by _id (FerretDB v1's one indexed query),
// usually finding nothing: one operation. It reads the newest state instead
// when that state is more than spare/2 old or the chain moved on by more
// than walk, and the server's time only when the state it knows could let
// it in by the server's clock as last read (upper) and running on since:
// a lock held for sure is reported with the time its holders' leases have
// left (lock.HeldFor).
//
// # Fairness
//
// An exclusive waiter kept out by shared or semaphore holders writes a
// writer-waiting mark (writer: its id, until the server's time + markTTL)
// and refreshes it while it waits; every writer copies a live mark on. New
// shared and semaphore holders do not join while another's mark is live;
// the holders' renewals are not affected, so the lock drains and the
// exclusive waiter takes it, dropping its mark. A mark whose waiter is gone
// runs out after markTTL; one that gave up waiting (a timeout, a signal)
// takes it back in Close. With several exclusive waiters the writers come
// first: shared waiters wait while any writer waits.
//
// # Fencing tokens
//
// WITHLOCK_TOKEN is the seq of the document that recorded the acquisition, so
// it grows with every acquisition, in every mode (and with every other
// change). The first document of a name, when it has none (new, or the
// collection was dropped), is "NAME#0" with seq = the server's time in
// microseconds; the later ones count up from there. Tokens therefore keep
// growing across a drop as long as the server's clock does not go back and
// the name changes state less than once a microsecond on average. "NAME#0"
// is the same _id for every first acquisition, so that they race for it, and
// it is never deleted, so that a stale first acquisition cannot land later.
//
// # What it costs
//
// Round trips: a poll of a held lock 1 (the state after the newest known,
// by _id; one more for each state written since); an acquisition 3 more
// (the server's time, the insert, the check); an exclusive holder's
// renewal 3 (the server's time, the insert, the check: it writes after its
// own last state without reading first); a shared or semaphore holder's
// renewal 4 (it reads the newest state first, since the others write too);
// a release 1 (shared: 2). Each lost race adds a read of the newest state
// and of the server's time. On MongoDB "the newest state of NAME" is a
// range of the _id index. FerretDB v1 hands only a filter on _id alone to
// SQLite; any other query reads and decodes the whole collection, which
// the deletions keep to keep+1 documents per name and those written in the
// last spare.
package mongodb
