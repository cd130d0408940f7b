// Package gcsbackend is lockfs's "gcs" lock backend: each host keeps one
// session in a Google Cloud Storage bucket, and its claim on a lock is a
// record of that session in the lock's object, so that lockfs daemons on
// many hosts share one lock namespace with no lock server.
// docs/GCS-PROTOCOL.md states the protocol (object layout version 2) and
// argues its safety and liveness; this comment is the map of the code.
//
// # What the backend decides
//
// The engine (lockmgr) arbitrates between the processes of one host. The
// backend is a lockmgr.HierarchicalBackend: the engine asks it for the
// claim of each lock held explicitly, never for ancestors, and the backend
// makes that claim safe across hosts including the hierarchy (ancestors'
// exclusive claims, and for an exclusive directory claim, everything below).
//
// # Objects (object.go, session.go, wants.go)
//
// PREFIX/sessions/<sid> is a host's session; PREFIX/locks/a/b/.lock the
// record of one lock (epoch, one claim per session; metadata summarises the
// claims for listings; never deleted); PREFIX/wants/<holder>/<waiter>-<n> a
// waiter's request that a holder give a record up; PREFIX/bells/<sid> the
// object waiters rewrite so that the holder lists its wants.
//
// # Requests (store.go, mutate.go)
//
// Reads, conditional uploads, listings with metadata, and deletes of
// session and want objects. The client library's retries are off; mutate
// retries 429, 5xx, missing answers and 412 with jittered backoff, counts
// them towards UnavailableAfter, and resolves a write whose reply was lost
// by reading back.
//
// # Sessions (session.go, heartbeat.go, observe.go)
//
// One heartbeat write per host about every RefreshInterval keeps every
// claim alive; the host vouches until TTL-Margin after the send of its last
// landed heartbeat, and loses every lease at once when that ends. Others
// judge a session stale after seeing its generation unchanged for its TTL
// on their own monotonic clock, and declare it dead with a conditional
// write; records of dead sessions count as absent.
//
// # Claims (scan.go, claim.go, record.go)
//
// Scan (reads and listings in parallel), write the record into the lock's
// own object (one conditional write, bumping the epoch), verify (the same
// reads). A conflict seen after the write: the claim with priority keeps
// its record and waits; the other withdraws. Waiters poll with reads.
//
// # Warm records, wants, bells and turns (lease.go, wants.go, wantserve.go, bell.go)
//
// A release keeps the record warm (no request); taking the lock again costs
// none. A waiter asks the holder with a want object and rings the holder's
// bell; a host with records reads its bell every WantPoll and lists its
// wants only when it rang. A warm record asked for is dropped at once; a
// held one makes its lease Contended, so that the engine gives it up after
// the holds running, and is dropped at its release. A drop for waiters
// names the one that asked first (record.Next): other hosts' conflicting
// claims let it go first. A warm record idle for WarmFor is dropped.
//
// # Lock-delay (observe.go)
//
// The records of a session declared dead keep others out for its
// lock-delay more, measured on each host from its own knowledge of the
// death, so that a paused host stops its holders before anyone enters.
//
// # Fencing tokens (lease.go)
//
// NextToken returns epoch<<20 | n, n counting this host's grants under the
// record: no request, except a new epoch every 2^20-1 tokens.
//
// # Errors
//
// A conflict without wait gives lockmgr.ErrWouldBlock; GCS failing for
// UnavailableAfter (3s at most without wait) lockmgr.ErrUnavailable; a lost
// session lockmgr.ErrLeaseLost; an object of another layout an error
// wrapping ErrLayout and lockmgr.ErrUnavailable; a call after Close
// lockmgr.ErrClosed; a malformed LockID or Mode lockmgr.ErrInvalid; an
// ended wait ctx.Err().
//
// # Locking
//
// A record's slot (one operation on a record at a time), then Backend.mu,
// then session.mu or lease.mu, then the observations' mutex. No mutex is
// held across a request or a wait. Every goroutine (the heartbeater, the
// want poller, background drops) is counted in Backend.workers; Close
// cancels, waits for the API calls and the workers, then drops the records
// and deletes the session.
//
// # Testing
//
// Package gcstest runs a GCS emulator as a process on loopback (gcsemu,
// forked under third_party/, by default; fake-gcs-server, pinned by go.mod's
// tool line, where a test needs a missing bucket refused), and offers a
// fake Clock; package faultproxy injects 429s, 503s, resets, lost replies
// and latency between client and emulator.
package gcsbackend
