package etcdbackend

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lockfs/lockfs/lockmgr"
)

// ownClaim is this host's claim key on one lock: held (a lease uses it),
// warm (released, kept), or being claimed.
type ownClaim struct {
	// Constant data
	id lockmgr.LockID
	// slot serialises the operations on the key (capacity 1): a claim,
	// conversion, release or background drop holds it.
	slot chan struct{}

	// Mutable state, GUARDED_BY(Backend.mu)
	sess *session     // the session the key is bound to; nil until written
	mode lockmgr.Mode // the key's mode; 0 until written
	// rev is the key's mod revision as this host last wrote it: the base
	// of fencing tokens.
	rev    int64
	tokens uint64 // tokens handed out under rev
	lease  *lease // the lease using the key; nil while warm
	// idleSince is when the key became warm, on Backend.clock.
	idleSince time.Duration
	// uncertain is set when a write of the key was given up without an
	// answer: it may have landed, so a background drop deletes it.
	uncertain bool
	// gone is set once the claim is no longer in Backend.claims.
	gone bool
}

func (c *ownClaim) unlock() { <-c.slot }

// lockClaim returns this host's claim on id, made if there is none, with
// its slot held.
func (b *Backend) lockClaim(ctx context.Context, id lockmgr.LockID) (*ownClaim, error) {
	for {
		b.mu.Lock()
		c := b.claims[id]
		if c == nil {
			c = &ownClaim{id: id, slot: make(chan struct{}, 1)}
			b.claims[id] = c
		}
		b.mu.Unlock()
		select {
		case c.slot <- struct{}{}:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		b.mu.Lock()
		gone := c.gone
		b.mu.Unlock()
		if !gone {
			return c, nil
		}
		c.unlock()
	}
}

// forgetLocked removes c from the claims. Called with b.mu held.
func (b *Backend) forgetLocked(c *ownClaim) {
	if b.claims[c.id] == c {
		delete(b.claims, c.id)
	}
	c.gone = true
}

// Claim takes this host's claim on id in mode: its key, bound to the
// session's lease, written by one transaction that checks that no other
// host's conflicting claim is on id, on an ancestor's directory lock, or
// (for an exclusive directory claim) anywhere below, and that no host
// queued earlier waits for it. A key kept warm from an earlier claim in the
// same mode is taken again with no request. Without wait a conflict gives
// lockmgr.ErrWouldBlock, after giving holders NoWaitGrace to drop warm
// claims, and the call answers within 3s whatever etcd does; with wait it
// watches exactly what blocks it, until granted or ctx ends.
func (b *Backend) Claim(ctx context.Context, id lockmgr.LockID, mode lockmgr.Mode, wait bool) (lockmgr.Lease, error) {
	l, err := b.claim(ctx, id, mode, wait)
	if err != nil {
		return nil, fmt.Errorf("claim %s %s: %w", mode, id, err)
	}
	return l, nil
}

func (b *Backend) claim(ctx context.Context, id lockmgr.LockID, mode lockmgr.Mode, wait bool) (*lease, error) {
	if mode != lockmgr.Shared && mode != lockmgr.Exclusive {
		return nil, fmt.Errorf("%w: mode %v", lockmgr.ErrInvalid, mode)
	}
	if err := id.Check(); err != nil {
		return nil, err
	}
	if l := b.claimWarm(id, mode); l != nil {
		return l, nil
	}
	if err := b.enter(); err != nil {
		return nil, err
	}
	defer b.inflight.Done()
	callerCtx := ctx
	ctx, cancel, giveUp := b.bound(ctx, wait)
	defer cancel()
	c, err := b.lockClaim(ctx, id)
	if err != nil {
		return nil, b.ctxErr(callerCtx, err)
	}
	defer c.unlock()
	sess, err := b.session(ctx, giveUp)
	if err != nil {
		return nil, b.ctxErr(callerCtx, err)
	}
	b.mu.Lock()
	if c.sess == sess && c.mode == mode && c.lease == nil && !c.uncertain {
		l := b.newLeaseLocked(c)
		b.mu.Unlock()
		b.stats.warmClaims.Add(1)
		return l, nil
	}
	b.mu.Unlock()
	rev, err := b.acquire(ctx, c, sess, mode, wait, giveUp)
	if err != nil {
		b.mu.Lock()
		if c.mode == 0 && !c.uncertain {
			b.forgetLocked(c)
		}
		b.mu.Unlock()
		return nil, b.ctxErr(callerCtx, err)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	c.sess, c.mode, c.rev, c.tokens, c.uncertain = sess, mode, rev, 0, false
	b.stats.claims.Add(1)
	return b.newLeaseLocked(c), nil
}

// claimWarm takes this host's warm key on id in mode again, with no
// request and no context, if there is one, its slot is free and the live
// session vouches for it; else it returns nil and the full path (claim)
// decides, waiting for the slot if need be. It is the same grant as the
// full path's warm one, taken in one critical section: the warm re-take is
// what a busy host does most.
func (b *Backend) claimWarm(id lockmgr.LockID, mode lockmgr.Mode) *lease {
	now := b.clock.Now()
	b.mu.Lock()
	defer b.mu.Unlock()
	c, s := b.claims[id], b.sess
	if b.closed || c == nil || c.gone || s == nil || c.sess != s || c.mode != mode || c.lease != nil ||
		c.uncertain || s.check(now) != nil {
		return nil
	}
	select {
	case c.slot <- struct{}{}: // no drop or claim of the key runs
	default:
		return nil
	}
	defer c.unlock()
	b.stats.warmClaims.Add(1)
	return b.newLeaseLocked(c)
}

// acquisition is the state of one acquire of c's key in mode.
type acquisition struct {
	// Constant data
	c      *ownClaim
	sess   *session
	mode   lockmgr.Mode
	wait   bool
	giveUp time.Duration
	key    string     // the claim key
	wkey   string     // the want key
	rs     []keyRange // the ranges the claim checks
	val    string     // the claim key's value
	// Mutable state
	snap    *snapshot // nil: nothing read yet, try the claim on empty ranges
	myWant  int64     // the create revision of this host's want key, or 0
	wantOut bool      // this host's want key may be in etcd (its write was sent)
	// graceEnd is when the NoWaitGrace of a claim without wait ends;
	// zero until it starts.
	graceEnd time.Time
}

// acquire writes c's key in mode once nothing blocks it, and returns the
// revision of the write. c's slot is held.
func (b *Backend) acquire(ctx context.Context, c *ownClaim, sess *session, mode lockmgr.Mode, wait bool, giveUp time.Duration) (int64, error) {
	a := &acquisition{c: c, sess: sess, mode: mode, wait: wait, giveUp: giveUp,
		key: b.claimKey(c.id, sess.sid), wkey: b.wantKey(c.id, sess.sid), rs: b.ranges(c.id, mode),
		val: newRecord(b.cfg.HostID, mode)}
	defer func() {
		if a.wantOut {
			b.deleteWant(a.sess, a.wkey)
		}
	}()
	for {
		if err := sess.check(b.clock.Now()); err != nil {
			return 0, fmt.Errorf("%w: %w", lockmgr.ErrUnavailable, err)
		}
		if a.snap != nil {
			again, err := b.awaitTurn(ctx, a)
			if err != nil {
				return 0, err
			}
			if again {
				continue
			}
		}
		if rev, err := b.tryClaim(ctx, a); err != nil || rev != 0 {
			return rev, err
		}
	}
}

// awaitTurn evaluates a's snapshot: if nothing blocks the claim it returns
// false. Else, without wait, it fails with lockmgr.ErrWouldBlock unless
// claims block it and the holders' NoWaitGrace has not ended yet, or
// only earlier waiters block it and none of them waits for a claim
// (then it returns false: the claim goes); it puts the want (once), waits
// until a blocker changes, and returns true with a.snap updated: evaluate
// again.
func (b *Backend) awaitTurn(ctx context.Context, a *acquisition) (bool, error) {
	claims, wants, err := b.blockers(a.snap, a.c, a.sess, a.mode, a.myWant)
	if err != nil || len(claims)+len(wants) == 0 {
		return false, err
	}
	if !a.wait && len(claims) == 0 {
		return false, b.behindWaiters(ctx, a, wants)
	}
	if !a.wait && !a.graceEnd.IsZero() && !time.Now().Before(a.graceEnd) {
		return false, lockmgr.ErrWouldBlock
	}
	if err := b.giveBackWarm(ctx, a.c, a.sess, a.giveUp); err != nil {
		return false, err
	}
	if a.myWant == 0 {
		// The want's write reads the ranges too, at its own revision: the
		// watch then starts at the present, where the server delivers at
		// once (a watch from a past revision waits for the server's
		// catch-up loop, up to 100 ms), and the claim's transaction after
		// the wake compares with a snapshot that includes the want.
		a.wantOut = true
		if a.myWant, a.snap, err = b.putWant(ctx, a.giveUp, a.wkey, a.sess, a.mode, a.rs); err != nil {
			return false, err
		}
		if claims, wants, err = b.blockers(a.snap, a.c, a.sess, a.mode, a.myWant); err != nil {
			return false, err
		}
		if len(claims)+len(wants) == 0 {
			return true, nil
		}
	}
	wctx, cancel := ctx, context.CancelFunc(func() {})
	if !a.wait {
		// Holders drop claims they only keep warm as soon as they see the
		// want, each with its own request; held ones stay. The grace
		// lasts until every blocker is gone or NoWaitGrace has passed,
		// not only until the first drop.
		if a.graceEnd.IsZero() {
			a.graceEnd = time.Now().Add(b.cfg.NoWaitGrace)
		}
		wctx, cancel = context.WithDeadline(ctx, a.graceEnd)
	}
	deleted, reread, err := b.waitChange(wctx, a.sess, keysOf(claims, wants), a.snap.rev)
	cancel()
	if err != nil && (a.wait || ctx.Err() != nil || !errors.Is(err, context.DeadlineExceeded)) {
		return false, err
	}
	if err == nil && !reread && !b.noApplyDeletes {
		// Only deletions came: the ranges now hold the snapshot's keys
		// less some. If those left block nothing, the claim's transaction
		// goes at once, no read first: it still compares the ranges with
		// the snapshot's revision, so a key written since makes it fail
		// and read instead.
		next := a.snap.without(deleted)
		if c, w, err := b.blockers(next, a.c, a.sess, a.mode, a.myWant); err == nil && len(c)+len(w) == 0 {
			a.snap = next
			return true, nil
		}
	}
	if a.snap, err = b.read(ctx, a.giveUp, a.rs); err != nil {
		return false, err
	}
	return true, nil
}

// behindWaiters decides a claim without wait that only other hosts'
// earlier waiters block (wants): it is refused (lockmgr.ErrWouldBlock) if
// one of them waits for a claim, since that waiter's turn comes first;
// else (each is about to claim, or has stopped waiting and not yet
// deleted its want) it returns nil and the claim goes, so that a want
// that waits for nothing never refuses a claim without wait.
func (b *Backend) behindWaiters(ctx context.Context, a *acquisition, wants []keyRecord) error {
	if b.perLockWants || b.wholeTreeWants {
		return lockmgr.ErrWouldBlock // the old rules: every earlier want refuses
	}
	waiting, err := b.waiting(ctx, a.giveUp, wants)
	if err != nil {
		return err
	}
	if len(waiting) > 0 {
		return lockmgr.ErrWouldBlock
	}
	return nil
}

// tryClaim sends the claim's transaction (deleting this host's want, if
// any): it returns the revision of the write if it landed; else 0, with
// a.snap the snapshot of the ranges that the transaction read.
func (b *Backend) tryClaim(ctx context.Context, a *acquisition) (int64, error) {
	delWant := ""
	if a.myWant != 0 {
		delWant = a.wkey
	}
	resp, err := b.claimTxn(ctx, a.giveUp, a.rs, a.snap, a.key, a.val, a.sess.id, delWant)
	if err != nil {
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			b.loseSession(a.sess, errRevoked)
		}
		b.mu.Lock()
		c := a.c
		if c.mode == 0 {
			// The write may have landed: drop it in the background.
			c.uncertain = true
			c.sess = a.sess
		}
		b.mu.Unlock()
		if c.uncertain {
			b.dropLater(c)
		}
		return 0, err
	}
	if resp.Succeeded {
		a.myWant, a.wantOut = 0, false // the transaction deleted it
		return resp.Header.Revision, nil
	}
	a.snap, err = b.parseSnapshot(resp.Header.Revision, resp.Responses)
	return 0, err
}

// giveBackWarm deletes c's key before a claim of another mode waits, if
// the key is only kept warm (no lease uses it): kept, it could block the
// very waiter this claim queues behind, and neither would move. An upgrade
// of a held claim (Convert) keeps its shared key while it waits. c's slot
// is held.
func (b *Backend) giveBackWarm(ctx context.Context, c *ownClaim, sess *session, giveUp time.Duration) error {
	b.mu.Lock()
	warm := c.sess == sess && c.mode != 0 && c.lease == nil
	b.mu.Unlock()
	if !warm {
		return nil
	}
	key := b.claimKey(c.id, sess.sid)
	if err := b.retry(ctx, giveUp, "give back a warm claim", func(rctx context.Context) error {
		_, err := b.cli.Delete(rctx, key)
		return err
	}); err != nil {
		return err
	}
	b.stats.drops.Add(1)
	b.mu.Lock()
	c.mode, c.rev, c.tokens = 0, 0, 0
	b.mu.Unlock()
	return nil
}

// claimTxn is the claim's one transaction: if the ranges are empty (no
// snapshot yet) or unchanged since the snapshot's revision, write the
// claim key (and delete this host's want key, if any); else read the
// ranges, for the next snapshot.
func (b *Backend) claimTxn(ctx context.Context, giveUp time.Duration, rs []keyRange, snap *snapshot, key, val string,
	leaseID clientv3.LeaseID, wkey string) (*clientv3.TxnResponse, error) {
	cmps := make([]clientv3.Cmp, 0, len(rs))
	for _, r := range rs {
		if snap == nil {
			cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(r.key).WithRange(r.end), "=", 0))
		} else {
			cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(r.key).WithRange(r.end), "<", snap.rev+1))
		}
	}
	then := []clientv3.Op{clientv3.OpPut(key, val, clientv3.WithLease(leaseID))}
	if wkey != "" {
		then = append(then, clientv3.OpDelete(wkey))
	}
	var resp *clientv3.TxnResponse
	err := b.retry(ctx, giveUp, "claim transaction", func(rctx context.Context) error {
		var err error
		resp, err = b.cli.Txn(rctx).If(cmps...).Then(then...).Else(gets(rs)...).Commit()
		return err
	})
	b.stats.txns.Add(1)
	return resp, err
}
