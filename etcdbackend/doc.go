// Package etcdbackend is lockfs's "etcd" lock backend: each host keeps one
// session, an etcd lease the server expires, and its claim on a lock is a
// key bound to that lease, so that lockfs daemons on many hosts share one
// lock namespace in an etcd cluster and hand locks over in milliseconds.
// docs/ETCD-PROTOCOL.md states the protocol and argues its safety; this
// comment is the map of the code.
//
// # What the backend decides
//
// The engine (lockmgr) arbitrates between the processes of one host. The
// backend is a lockmgr.HierarchicalBackend: the engine asks it for the
// claim of each lock held explicitly, never for ancestors, and the backend
// makes that claim safe across hosts including the hierarchy.
//
// # Keys (keys.go)
//
// PREFIX/claims/a/b/.lock/<sid> is session sid's claim on a/b/.lock;
// PREFIX/wants/a/b/.lock/<sid> says that sid waits for it. Both are bound
// to the session's lease. The values are small JSON records: layout
// version, host, mode, since.
//
// # Sessions (session.go)
//
// One lease per host session, granted by the first claim, kept alive with
// one keep-alive about every TTL/3; the host vouches for its claims until
// TTL-Margin after the send of the last keep-alive the server answered,
// and loses every lease at once when that ends or the server no longer
// knows the lease. The next claim starts a new session.
//
// # Claims (claim.go, blockers.go, snapshot.go)
//
// One transaction: if the key ranges that could hold a conflicting claim
// (the lock's own keys, or for an exclusive directory claim everything
// below; the ancestors' directory locks; the lock's wants) are empty, or
// unchanged since the revision they were read at, write the claim key;
// else read them. A conflict, or an earlier waiter of a conflicting mode,
// makes the claim write its want key and watch exactly the keys that
// block it, from the revision of the read.
//
// # Warm claims and wants (lease.go, wants.go)
//
// A release keeps the key (no request); taking the lock again costs none.
// Every host watches PREFIX/wants/: a want that a warm claim blocks has it
// dropped at once, one that a held claim blocks closes the lease's
// Contended channel and has it dropped at its release.
//
// # Fencing tokens (lease.go)
//
// NextToken returns rev<<20 | n: the claim key's mod revision and a count
// of this host's grants under it. No request, except a rewrite of the key
// every 2^20-1 tokens.
//
// # Errors
//
// A conflict without wait gives lockmgr.ErrWouldBlock; etcd failing for
// UnavailableAfter (3s at most without wait), or the session lost while
// waiting, lockmgr.ErrUnavailable; a lost session lockmgr.ErrLeaseLost; a
// call after Close lockmgr.ErrClosed; two hosts upgrading one shared lock
// lockmgr.ErrDeadlock for the one queued later; an ended wait ctx.Err().
//
// # Locking
//
// A claim's slot, then Backend.mu, then session.mu or lease.mu. No mutex
// is held across a request or a wait. Every goroutine (the keeper, the
// want watcher, background drops) is counted in Backend.workers; Close
// cancels, waits, and revokes the session's lease, which deletes every
// key of the host in one request.
//
// # Testing
//
// Package etcdtest runs real etcd servers (Debian's etcd-server) as
// processes on loopback: one member, or three for the fault tests.
package etcdbackend
