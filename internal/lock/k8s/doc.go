// Package k8s is the k8s:// and kubernetes:// backend: a lock is a
// coordination.k8s.io/v1 Lease in one namespace, the object client-go's
// leader election uses, reached with the pod's service account or a
// kubeconfig (config.go) through a small REST client of its own
// (wire.go).
//
// The Lease of NAME is named NAME when NAME is a DNS-1123 subdomain, else
// "withlock-" and the first 32 hex digits of SHA-256(NAME) (LeaseName); the
// annotation withlock.io/name always holds NAME, and the label
// withlock.io/lock the hash, so that status finds a lock's Leases. Its spec
// says who holds it: holderIdentity is "host/pid", leaseDurationSeconds the
// ttl rounded up to whole seconds (at least 1), acquireTime and renewTime
// the holder's clock, leaseTransitions the number of acquisitions: the
// fencing token. The holder's record (host, pid, command) is in
// annotations. A semaphore of N (--max-holders) is N Leases, slot 0 being
// NAME's Lease and slot i the Lease "withlock-<hash>-i"; each records N.
//
// Every write is a create (409 AlreadyExists: someone else was first) or an
// update conditional on the resourceVersion last read (409 Conflict:
// someone else wrote first), so of two contenders exactly one wins.
//
// Expiry is judged by the API server's clock (expiry.go): a holder has run
// out once the time the server stamps on an answer (Date) reaches the
// server's own record of the last renewal (the managedFields time of the
// entry that owns renewTime) plus leaseDurationSeconds plus a second for
// the record's resolution. Every attempt, status and release --force make
// this one judgement. A holder counts its lease from when it sent the write
// that took or last renewed it, on its own clock (lock.Backend's
// TryAcquire, lock.Options' Grace), which is before the server recorded
// that write, so it is done before anyone can take over. Where the server's
// times are missing, a contender falls back to client-go's leader election
// rule, on its own monotonic clock.
//
// A release clears holderIdentity (conditional on the resourceVersion, so
// it never clears a newer holder) instead of deleting the Lease:
// leaseTransitions, the fencing token, must keep growing, and a Lease
// created again would count from 1. release --force does the same.
// Waiters watch the Lease (Notify), so a release wakes them at once.
package k8s
