// Package localbackend is lockfs's "local" lock backend: it keeps the host's
// claims on locks in the host's kernel flock table, so that programs locking
// SOURCE directly with flock(1), and every lockfs daemon over the same
// SOURCE, exclude each other and the mount's users.
//
// # Backing files
//
// The claim on a lock is a flock(2) on a hidden file in the locked directory
// of SOURCE, named as existing tools of the protocol name it:
//
//	kind      control file   backing file
//	dir       .lock          SOURCE/<dir>/..LOCK
//	newdir    .lock_newdir   SOURCE/<dir>/..LOCK_NEWDIR
//	usage     .lock_usage    SOURCE/<dir>/..LOCK_USAGE
//
// The root directory "." is SOURCE itself. The file is created (mode 0644,
// less the umask) if missing. Every open is made with openat2(2) beneath a
// descriptor of SOURCE with RESOLVE_BENEATH, RESOLVE_NO_SYMLINKS and
// RESOLVE_NO_MAGICLINKS: a symlink anywhere on the path, the backing file
// included, makes the claim fail rather than create or lock a file outside
// SOURCE. A backing file that is not a regular file with a single link is
// refused. A missing directory gives an error wrapping os.ErrNotExist.
//
// The backend never removes a backing file; rmdir through the mount does,
// for a directory nobody holds a lock on, unlinking each file while it
// holds the file's flock exclusively (fs/rmdir.go). A claim that had the
// file open, or waited on it, is then granted its flock after the removal,
// and sees a link count of 0: the backend drops that flock and opens the
// name again (which gives os.ErrNotExist if the directory went too). An
// upgrade that let such a removal through in its moment without the shared
// lock (see Conversion) loses the lease.
//
// New refuses a SOURCE on NFS, SMB/CIFS, FUSE, 9p, Ceph and the like, whose
// flock is not this host's lock table, unless Config.AllowNetworkFS is set.
//
// # Claims
//
// Each claim is one open file description (one descriptor) holding
// LOCK_SH (shared) or LOCK_EX (exclusive). Releasing a shared claim keeps
// its flock for up to Config.KeepShared (5 ms), for the next shared claim of
// the same file to reuse with no system call; this daemon's exclusive
// claim, GuardTree and DropKept give it up at once (keep.go). Releasing any
// other claim unlocks it (LOCK_UN) at once; the unlocked descriptor is kept for up to 20 ms so
// that the next claim of the same file can flock it again without resolving
// the path anew (idle.go); a flock granted on a file removed meanwhile is
// dropped and the name opened again, as for a fresh open (see above).
// A daemon that dies loses all its descriptors, so the kernel releases its
// claims at once; claims are never lost otherwise, which is why
// Lease.Done returns nil while a lease is held.
//
// # Waiting
//
// A claim first tries LOCK_NB. If the lock is busy and the caller waits,
// the backend cannot simply block in flock(2): Go's signal handlers use
// SA_RESTART, so such a thread could not be interrupted when the caller's
// ctx ends, and polling would spin and lose to queued waiters. Since flock
// locks belong to the open file description, the backend instead runs
// flock(1) from util-linux ("flock -x 3" or "flock -s 3") with its own
// descriptor as the child's fd 3: the child waits in the kernel's queue, and
// when it exits 0 the backend's description holds the lock. Cancelling ctx
// (or closing the backend) kills and reaps the child, then unlocks the
// descriptor, in case the child was granted the lock as it died, and
// closes it. No goroutine outlives the call.
//
// # Outside waiters
//
// A lease tells the engine when someone outside this daemon (another
// daemon over SOURCE, a program running flock on a backing file) waits for
// a conflicting flock (lockmgr.ContendedLease), so that a lock under
// continuous local demand is given up in turn. Only leases the engine asks
// about are watched, by one goroutine that reads the kernel's table of
// blocked requests, /proc/locks, every 5 ms or more (20 times the CPU one
// read costs). A lease so given up is not kept after its release, and the
// next claim of its file lets the woken waiter take it first. See
// contend.go for the design, its cost and its notice time.
//
// # Conversion
//
// A downgrade is LOCK_SH on the held descriptor and cannot fail. An upgrade
// is not atomic on Linux: a LOCK_EX|LOCK_NB that fails on a descriptor holding
// LOCK_SH has already dropped the shared lock. So every attempt is followed
// at once by LOCK_SH|LOCK_NB; if that fails too, someone took the lock
// exclusively in the gap, the lease is lost (Convert returns an error wrapping
// lockmgr.ErrLeaseLost, Err gives the cause and Done a closed channel). An
// upgrade that waits polls this cycle with jittered backoff from 1 ms to
// 50 ms instead of blocking, because a blocking LOCK_EX would leave the
// shared claim dropped for the whole wait.
//
// # Fencing tokens
//
// NextToken increments a decimal counter kept as the first line of the
// backing file, under a short OFD write lock on it (independent of flock on
// Linux), so tokens strictly increase per lock across daemons and restarts.
// With Config.SyncTokens they also survive a host crash. Another program
// that writes into a backing file (say "echo $$ >..LOCK" under flock) resets
// or breaks the counter; a first line that is not a number makes NextToken
// fail until the file is fixed.
//
// # Errors
//
// A busy lock without wait gives lockmgr.ErrWouldBlock; a call after Close
// gives lockmgr.ErrClosed; a malformed LockID or Mode gives
// lockmgr.ErrInvalid; an ended wait gives ctx.Err(). Errors name the lock.
//
// # Locking
//
// The engine serialises Claim, Convert, NextToken and Release per lock; the
// backend only guards its bookkeeping with mutexes, never held across a
// system call that can block. Every use of a descriptor holds a reference
// on its os.File, so Release or Close never let a descriptor number be reused
// under a call still using it.
package localbackend
