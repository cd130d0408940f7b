// Package lockmgr is lockfs's protocol engine: it decides who may hold
// which directory lock, who waits, and who gets an error. It knows nothing
// of FUSE or GCS: the fs package translates kernel lock requests into
// Requests, and a Backend (localbackend, gcsbackend) holds the host's claim
// on each lock so that other daemons and plain flock(1) users agree.
//
// # Locks, kinds and modes
//
// Every directory D has three locks, named by LockID{Path, Kind}: the
// directory lock (KindDir, control file ".lock"), the new-subdirectory lock
// (KindNewDir, ".lock_newdir") and the usage lock (KindUsage,
// ".lock_usage", exclusive only). A lock is held Shared or Exclusive; the
// one conflict rule is Conflicts:
//
//	            shared   exclusive
//	shared      -        conflict
//	exclusive   conflict conflict
//
// # Implicit holds
//
// A Request for D is a plan of steps (see plan): a shared hold on the
// directory lock of every proper ancestor of D, root first, then — for the
// newdir and usage kinds — D's own directory lock shared, then the lock
// itself. Each step may wait; taking them root first means contention
// happens only at the lowest common ancestor. A request that fails or is
// cancelled midway gives back the steps it took (rollbackDropsMu). Releasing
// the lock releases its implicit holds.
//
// # Owners and lineage
//
// Holds belong to an Owner (an open file description for flock and OFD
// locks, a process's POSIX owner for fcntl record locks); one owner never
// conflicts with itself, and a second request by it is a conversion. Each
// hold also records the Lineage of the process that took it. A request
// does not wait for a hold whose process is a proper ancestor of the
// requester, nor for other holds of its own process, except that two
// explicit holds of one control file taken by one process conflict, as two
// open file descriptions do in the kernel (see exemptLocked). When the
// process that took a hold has exited while its descriptor lives on, the
// hold belongs to the processes that still hold that open file description
// (heirs.go); never to the dead process's parent for being its parent.
// Exits are watched (ProcessWatcher), not polled.
//
// # Waiting, fairness and deadlock
//
// Each lock has a FIFO queue. A waiter is granted when no live hold
// conflicts with it (exemptions aside) and no earlier waiter's mode
// conflicts with its own, so shared waiters behind shared waiters go
// together and an exclusive waiter is never overtaken by later shared
// requests. A request whose own lineage already holds the lock does not
// queue (its parent may be the very holder the queue waits for). Each
// waiter sleeps on its own channel and a change wakes only the waiters it
// may let in (queue.go), so a release costs O(1) however long the queue.
//
// Fairness holds across daemons too (lease.go). A lease that local demand
// keeps busy would pass from one local holder to the next for ever, so
// when a local request first waits behind a leased lock's holds, or shares
// the lease with them, the engine asks the lease whether its backend can
// tell of someone outside this engine who waits for a conflicting claim
// (ContendedLease: another host, another daemon over the same SOURCE, a
// program that flocks SOURCE's backing file). Once the backend says so,
// the lease is handed to no new request, the holds running finish, the
// lease is given back, and the local waiters claim the lock through the
// backend like anyone else, behind the outside waiter, in their FIFO
// order. Requests whose owner or lineage holds the lock (conversions, a
// child under its parent's lock) are no new demand and are still granted;
// a request held back waits for every hold of the lock, for deadlock
// detection. Nothing is asked, and nothing changes, while no local request
// waits for or shares a leased lock (Config.KeepContended turns it off, as the
// control of the tests).
//
// Threads are the nodes of the wait-for graph: a waiting thread waits for
// the threads that took the conflicting holds and for the earlier waiters
// it queues behind. A hold whose taker has exited stands for its heirs,
// and a heir waits for what its descendants wait for (the shell of
// `exec 8>a/.lock; flock 8` waits for its children). A request whose wait
// would close a cycle fails at once with ErrDeadlock (closesCycleLocked).
// Holds of other hosts or of processes outside lockfs are not seen.
//
// # Conversion
//
// OwnerFile follows flock(2): an upgrade that can be granted at once is
// atomic; otherwise the shared hold is released and the request waits
// (and a non-blocking upgrade that fails keeps the shared hold). OwnerPOSIX
// follows fcntl(2): the upgrade keeps its shared hold while it waits, so
// two processes upgrading at once get ErrDeadlock.
//
// # Usage rule
//
// While a process or one of its ancestors holds a usage lock, it may take
// only locks its lineage already holds (in at least the mode asked for);
// anything else fails at once with ErrDeadlock.
//
// # Backend, leases and fencing
//
// For each lock with live holds the engine keeps one Lease from the
// Backend, in the strongest mode any local hold needs, shared by every
// local holder; a hand-off between local processes costs no backend call
// while waiters remain. Each grant asks the lease for a fencing token,
// strictly increasing per lock, at once or, if the request defers it
// (Request.DeferToken, as every lock through the mount does), when the
// token is first read (tokens.go). When a lease is lost (Done closes, or
// Convert returns ErrLeaseLost) or an operator breaks a lock (Break), its
// holds are marked lost: they conflict with nobody, lock calls on them
// return ErrLeaseLost, OnLoss is told, and releasing them still succeeds.
//
// A backend that checks the hierarchy across hosts itself
// (HierarchicalBackend: the gcs backend) gets no claim for implicit holds:
// they are arbitrated locally only, and a lock's lease covers the strongest
// mode of its explicit holds. The local backend gets a claim per step.
//
// # Locking
//
// Engine.mu guards the whole table. It is never held across a backend
// call or a /proc read: a step that needs the backend marks the lock busy,
// drops mu, calls out, and takes mu again; others wait for the lock's
// changed channel, which is closed and replaced on every change. Lineages
// are read before mu is taken, exits arrive from watches, and the scans
// for a dead holder's heirs drop mu. Snapshot copies the table under mu
// and asks leases for their descriptions after. Waiters never hold mu while
// they sleep. A request of AcquireAsync that sleeps in a queue holds no
// goroutine either: it parks, and the wake-up that would have woken its
// goroutine resumes it on a new one (park.go).
//
// A helper's name says what it does with mu:
//
//   - …Locked: called with mu held; mu stays held throughout, so what the
//     caller read under mu before the call is still true after it.
//   - …DropsMu: called with mu held and returns with it held, but releases
//     it part way through (a backend call, a sleep, a /proc scan): after
//     the call, the caller must look at the table again. So is every
//     helper that calls a …DropsMu one (stepDropsMu, settleDropsMu,
//     loseDropsMu, …).
//   - …UnlocksMu: called with mu held, returns with it released
//     (convertUnlocksMu).
//
// A function with none of these suffixes takes mu itself, if it needs it.
// TestMuNames checks the first two rules on the source: no …Locked helper
// unlocks mu or calls a …DropsMu or …UnlocksMu one.
//
// # Errors
//
// Acquire returns ErrWouldBlock, ErrDeadlock, ErrInvalid, ErrLeaseLost,
// ErrUnavailable, ErrClosed or the context's error, wrapped with the mode
// and the lock; compare with errors.Is. The fs package maps each to one
// errno.
package lockmgr
