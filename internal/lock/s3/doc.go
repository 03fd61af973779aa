// Package s3 is the s3:// backend: a lock is one object in an S3 bucket,
// written only by conditional PUTs, for teams whose only shared
// infrastructure is object storage. It speaks to AWS S3 and to every
// S3-compatible store that honours conditional writes, through the AWS
// SDK for Go and its default credential chain (s3.go).
//
// The object of NAME is PREFIX/NAME, NAME escaped as for file://
// (lock.EscapeName); a semaphore of N (--max-holders) is N objects, slot 0
// being NAME's and slot i NAME.slot-i. Its body is a small JSON record
// (record.go): the state (held or free), a random owner id per
// acquisition, a renewal counter, the count of acquisitions and the
// fencing token, the ttl, and the holder's host, pid and command.
//
// Every write is conditional, so of two contenders exactly one wins: the
// first with If-None-Match: *, every later one (a renewal, a release, a
// takeover of a run-out lease, release --force) with If-Match: the ETag
// last read or written. The owner id and the renewal counter make every
// body differ from every other, so no stale holder's ETag can match a new
// owner's (an ETag is a hash of the body). The object is never deleted: a
// release writes a free body, so the fencing token keeps growing.
//
// Expiry is judged by the store's clock alone: a holder has run out once
// a response's Date reaches the object's Last-Modified plus the recorded
// ttl plus a second (both are whole seconds, truncated). A holder counts
// its lease from when it sent the write, on its own clock, which is before
// the store recorded it, so it is done before anyone can take over.
//
// S3 has no notification a command-line client can use: a waiter polls,
// with the wait loop's back-off.
package s3
