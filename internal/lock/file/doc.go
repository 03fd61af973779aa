// Package file is the file:///DIR backend: flock(2) on DIR/<escaped NAME>.lock,
// the same file and the same lock that flock(1) takes, so the two exclude
// each other. It works on one host only, and on Linux only: it reads /proc
// to say who holds a lock.
//
// The files of a lock NAME, all directly in DIR. F is FileName(NAME), at
// most 205 bytes, so every name below stays under NAME_MAX (255); only main
// files end in ".lock", so no name's files can be another name's.
//
//	F            the lock. An exclusive holder takes LOCK_EX (as flock(1)
//	             does), a shared holder LOCK_SH (as flock -s does), a
//	             semaphore holder LOCK_SH too, so that an exclusive holder,
//	             withlock's or flock(1)'s, excludes them all. An exclusive
//	             holder's record is written in it.
//	F.<k>        slot k of a semaphore (0 <= k < N). A semaphore holder
//	             takes LOCK_EX on the first free slot and writes its record
//	             there.
//	F.shared<k>  a shared holder's record: it takes LOCK_EX on the first
//	             free one (no limit) and writes its record there. Kept apart
//	             from a semaphore's slots, so that the locks alone tell a
//	             semaphore's holders from shared ones.
//	F.writer     the writer-waiting mark. An exclusive waiter holds LOCK_EX on
//	             it while it waits; shared and semaphore holders take
//	             LOCK_SH on it for a moment before the lock, so that they
//	             queue behind a waiting writer instead of starving it.
//
// A record is one line of JSON (see record) that says who holds the lock.
// It is written only through the descriptor that holds the lock, only into
// a file that is empty or already holds a record, and cleared before the
// lock is let go. The lock is the flock, not the content: /proc/locks says
// who holds what, the record only adds the details.
//
// Lock directories are often writable by everyone (/tmp/locks). Every file
// in DIR is opened with O_NOFOLLOW and must be a regular file with one link,
// so that something planted at a lock file's name (a symbolic link, a FIFO,
// a hard link to another file) is refused instead of opened or written.
package file
