// Package gcsbackend is lockfs's "gcs" lock backend: each host's claim on a
// lock is an entry in that lock's object in a Google Cloud Storage bucket,
// so that lockfs daemons on many hosts share one lock namespace with no lock
// server. docs/GCS-PROTOCOL.md states the protocol and argues its safety and
// liveness; this comment is the map of the code.
//
// # What the backend decides
//
// The engine (lockmgr) arbitrates between the processes of one host and
// asks the backend for one claim per lock per host, in the strongest mode
// the host needs; implicit ancestor holds are claims on the ancestors'
// locks. So the backend only makes host-level claims on single locks safe
// across hosts: shared claims of many hosts coexist, an exclusive claim
// excludes every other. The hierarchy across hosts follows.
//
// # Objects and records (object.go)
//
// The lock a/b/.lock is the object PREFIX/locks/a/b/.lock. It holds a JSON
// record: an epoch counter, the write id of its last write, and one entry
// per claim (claim id, host, mode, Seq, epoch, the period after which others
// may judge it stale). Objects are never deleted: the epoch must survive.
//
// # Requests (store.go, mutate.go)
//
// Two requests only: a read of the object's content (with its generation),
// and an upload conditional on the generation read (DoesNotExist for the
// first version). No PATCH, no delete, no metadata update: the emulator
// honours preconditions on uploads only. The client library's retries are
// off; mutate retries 429, 5xx and missing answers with jittered backoff,
// and resolves a write whose reply was lost by reading back: the write id
// or the write's effect in the record means it landed; an unchanged
// generation means the same bytes may be sent again; a new generation
// without the effect means it never will land.
//
// # Claims and waiting (backend.go, observe.go)
//
// A claim reads the object, judges the other entries (observe.go), and, if
// no live entry conflicts, writes its own entry with Seq 1 and a new epoch,
// removing the entries it judged stale. A waiter polls with reads, with
// jittered backoff from 50ms to 1s (or an eighth of the stale period),
// waking early when a blocker is due to turn stale. A write is made only
// when it can grant.
//
// An entry of another host is stale once this host has seen its Seq
// unchanged for the entry's stale period (TTL + refresh interval of its
// holder), measured on this host's monotonic clock from the first read that
// showed that Seq. Observations are kept across calls, so repeated
// non-blocking attempts see an abandoned claim expire. No wall clock is
// compared with another host's.
//
// # Leases (lease.go, refresh.go)
//
// A lease vouches for its claim until TTL-Margin after the send of its
// last write that landed; one refresher goroutine per backend refreshes
// each lease every RefreshInterval (one conditional write, no read), marks
// a lease lost when its validity ends, and every request of a refresh is
// bounded by that validity. Err and Mode check the clock themselves, so a
// lease reads as lost the moment it is, even if the refresher could not
// run. A refresh or conversion that finds its entry gone loses the lease.
// Done closes on loss.
//
// # Fencing tokens
//
// NextToken returns epoch<<20 | n, n counting this host's grants under the
// claim: no request, except a write for a new epoch every 2^20-1 tokens.
// Tokens of conflicting grants increase in grant order across hosts and
// restarts; concurrent shared grants of different hosts may interleave.
//
// # Conversion and upgrade deadlocks
//
// A downgrade is one write. An upgrade waits like a claim while keeping
// the shared claim refreshed. Two hosts that both hold a lock shared and
// both wait to upgrade would wait for ever: a waiting upgrader marks its
// entry, and the one whose claim is younger gives way with an error
// wrapping lockmgr.ErrDeadlock.
//
// # Errors
//
// A conflict without wait gives lockmgr.ErrWouldBlock; GCS failing for
// UnavailableAfter gives lockmgr.ErrUnavailable; a lost lease
// lockmgr.ErrLeaseLost; a call after Close lockmgr.ErrClosed; a malformed
// LockID or Mode lockmgr.ErrInvalid; an ended wait ctx.Err().
//
// # Locking
//
// Backend.mu, then lease.mu, then the observations' mutex. None is held
// across a request or a wait; the writes of one claim are serialised by
// the lease's one-slot channel wsem. Every goroutine (the refresher, its
// refreshes, the clean-up of a claim abandoned with its write in flight)
// is counted in Backend.workers; Close cancels, waits for the API calls and
// the workers, then releases the leases still held.
//
// # Testing
//
// Package gcstest runs fake-gcs-server, pinned by go.mod's tool line, as a
// process on loopback, and offers a fake Clock; package faultproxy injects
// 429s, 503s, resets, lost replies and latency between client and emulator.
package gcsbackend
