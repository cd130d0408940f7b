package etcdbackend

import (
	"context"
	"errors"
	"fmt"
	"sync"
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
	if err := validID(id); err != nil {
		return nil, err
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

// bound returns ctx bounded as a call with or without wait is: also ended
// by Close, and without wait by noWaitGiveUp; and how long etcd may fail
// before the call gives up.
func (b *Backend) bound(ctx context.Context, wait bool) (context.Context, context.CancelFunc, time.Duration) {
	ctx, cancel := b.withClose(ctx)
	if wait {
		return ctx, cancel, b.cfg.UnavailableAfter
	}
	ctx, cancel2 := context.WithTimeout(ctx, noWaitGiveUp)
	return ctx, func() { cancel2(); cancel() }, min(b.cfg.UnavailableAfter, noWaitGiveUp)
}

// ctxErr maps an error of a call bounded by bound: the caller's own end
// as ctx.Err(), the bound's as lockmgr.ErrUnavailable, Close's as
// lockmgr.ErrClosed.
func (b *Backend) ctxErr(caller context.Context, err error) error {
	switch {
	case caller.Err() != nil:
		return caller.Err()
	case b.closeCtx.Err() != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)):
		return errBackendClosed
	case errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, lockmgr.ErrUnavailable):
		return fmt.Errorf("%w: no answer from etcd within %v: %w", lockmgr.ErrUnavailable, noWaitGiveUp, err)
	}
	return err
}

// acquire writes c's key in mode once nothing blocks it, and returns the
// revision of the write. c's slot is held.
func (b *Backend) acquire(ctx context.Context, c *ownClaim, sess *session, mode lockmgr.Mode, wait bool, giveUp time.Duration) (int64, error) {
	key := b.claimKey(c.id, sess.sid)
	wkey := b.wantKey(c.id, sess.sid)
	rs := b.ranges(c.id, mode)
	val := newRecord(b.cfg.HostID, mode)
	var (
		snap      *snapshot // nil: nothing read yet, try the claim on empty ranges
		myWant    int64     // the create revision of this host's want key, or 0
		graceUsed bool
	)
	defer func() {
		if myWant != 0 {
			b.deleteWant(wkey)
		}
	}()
	for {
		if err := sess.check(b.clock.Now()); err != nil {
			return 0, fmt.Errorf("%w: %w", lockmgr.ErrUnavailable, err)
		}
		if snap != nil {
			blockers, byClaims, err := b.blockers(snap, c, sess, mode, myWant)
			if err != nil {
				return 0, err
			}
			if len(blockers) > 0 {
				if !wait && (graceUsed || !byClaims) {
					return 0, lockmgr.ErrWouldBlock
				}
				if err := b.giveBackWarm(ctx, c, sess, giveUp); err != nil {
					return 0, err
				}
				if myWant == 0 {
					// The want's write reads the ranges too, at its own
					// revision: the watch then starts at the present, where
					// the server delivers at once (a watch from a past
					// revision waits for the server's catch-up loop, up to
					// 100 ms), and the claim's transaction after the wake
					// compares with a snapshot that includes the want.
					if myWant, snap, err = b.putWant(ctx, giveUp, wkey, sess, mode, rs); err != nil {
						return 0, err
					}
					if blockers, _, err = b.blockers(snap, c, sess, mode, myWant); err != nil {
						return 0, err
					}
					if len(blockers) == 0 {
						continue
					}
				}
				graceUsed = true
				wctx, cancel := ctx, context.CancelFunc(func() {})
				if !wait {
					// Holders drop claims they only keep warm as soon as they
					// see the want; held ones stay.
					wctx, cancel = context.WithTimeout(ctx, b.cfg.NoWaitGrace)
				}
				deleted, reread, err := b.waitChange(wctx, sess, blockers, snap.rev)
				cancel()
				if err != nil && (wait || ctx.Err() != nil || !errors.Is(err, context.DeadlineExceeded)) {
					return 0, err
				}
				if err == nil && !reread && !b.noApplyDeletes {
					// Only deletions came: the ranges now hold the
					// snapshot's keys less some. If those left block
					// nothing, the claim's transaction goes at once, no
					// read first: it still compares the ranges with the
					// snapshot's revision, so a key written since makes
					// it fail and read instead.
					next := snap.without(deleted)
					if bl, _, err := b.blockers(next, c, sess, mode, myWant); err == nil && len(bl) == 0 {
						snap = next
						continue
					}
				}
				if snap, err = b.read(ctx, giveUp, rs); err != nil {
					return 0, err
				}
				continue
			}
		}
		delWant := ""
		if myWant != 0 {
			delWant = wkey
		}
		resp, err := b.claimTxn(ctx, giveUp, rs, snap, key, val, sess.id, delWant)
		if err != nil {
			if errors.Is(err, rpctypes.ErrLeaseNotFound) {
				b.loseSession(sess, errRevoked)
			}
			b.mu.Lock()
			if c.mode == 0 {
				// The write may have landed: drop it in the background.
				c.uncertain = true
				c.sess = sess
			}
			b.mu.Unlock()
			if c.uncertain {
				b.dropLater(c)
			}
			return 0, err
		}
		if resp.Succeeded {
			myWant = 0 // the transaction deleted it
			return resp.Header.Revision, nil
		}
		if snap, err = b.parseSnapshot(resp.Header.Revision, resp.Responses); err != nil {
			return 0, err
		}
	}
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

func gets(rs []keyRange) []clientv3.Op {
	ops := make([]clientv3.Op, len(rs))
	for i, r := range rs {
		ops[i] = clientv3.OpGet(r.key, r.opts()...)
	}
	return ops
}

// read reads the ranges at one revision.
func (b *Backend) read(ctx context.Context, giveUp time.Duration, rs []keyRange) (*snapshot, error) {
	var resp *clientv3.TxnResponse
	err := b.retry(ctx, giveUp, "read", func(rctx context.Context) error {
		var err error
		resp, err = b.cli.Txn(rctx).Then(gets(rs)...).Commit()
		return err
	})
	b.stats.reads.Add(1)
	if err != nil {
		return nil, err
	}
	return b.parseSnapshot(resp.Header.Revision, resp.Responses)
}

// blockers returns the keys that keep a claim on c.id in mode from being
// granted now: other hosts' conflicting claims, and the want keys of other
// hosts queued before this one for a conflicting mode, unless this host
// holds a claim that such a waiter waits for (it is ahead of them). Two
// hosts that both hold the lock shared and both wait to upgrade would wait
// for each other: the one queued later gets lockmgr.ErrDeadlock.
func (b *Backend) blockers(snap *snapshot, c *ownClaim, sess *session, mode lockmgr.Mode, myWant int64) (keys []string, byClaims bool, err error) {
	var out []string
	for _, k := range snap.claims {
		if k.sid != sess.sid && conflicts(k.id, k.mode, c.id, mode) {
			out = append(out, k.key)
		}
	}
	byClaims = len(out) > 0
	b.mu.Lock()
	upgrading := c.sess == sess && c.mode == lockmgr.Shared && mode == lockmgr.Exclusive
	for _, w := range snap.wants {
		if w.sid == sess.sid || !lockmgr.Conflicts(w.mode, mode) || (myWant != 0 && w.rev > myWant) {
			continue
		}
		if upgrading && myWant != 0 && snap.holds(w.sid, c.id, lockmgr.Shared) {
			b.mu.Unlock()
			return nil, false, fmt.Errorf("%w: another host holds %s shared too and waits to upgrade, queued first", lockmgr.ErrDeadlock, c.id)
		}
		if b.aheadOfLocked(sess, w.id, w.mode) {
			continue
		}
		out = append(out, w.key)
	}
	b.mu.Unlock()
	return out, byClaims, nil
}

// aheadOfLocked reports whether this host holds a claim that a waiter for
// id in mode waits for. Called with b.mu held.
func (b *Backend) aheadOfLocked(sess *session, id lockmgr.LockID, mode lockmgr.Mode) bool {
	for _, o := range b.claims {
		if o.sess == sess && o.mode != 0 && o.lease != nil && conflicts(o.id, o.mode, id, mode) {
			return true
		}
	}
	return false
}

// waitChange waits until one of keys changes after rev (a watch on each,
// from rev+1, so that a change between the read and the watch is seen),
// ctx ends, or the session is lost. It returns the keys deleted so far,
// and reread if anything else came (a write, a broken watch): then only a
// new read tells what the ranges hold.
func (b *Backend) waitChange(ctx context.Context, sess *session, keys []string, rev int64) (deleted []string, reread bool, err error) {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	var (
		mu      sync.Mutex
		dels    []string // GUARDED_BY(mu)
		other   bool     // GUARDED_BY(mu)
		changed = make(chan struct{}, 1)
		done    = make(chan struct{}, len(keys))
	)
	note := func(f func()) {
		mu.Lock()
		f()
		mu.Unlock()
		select {
		case changed <- struct{}{}:
		default:
		}
	}
	for _, k := range keys {
		wch := b.cli.Watch(wctx, k, clientv3.WithRev(rev+1))
		go func() {
			defer func() { done <- struct{}{} }()
			for wr := range wch {
				if wr.Err() != nil || wr.Canceled {
					note(func() { other = true })
					continue
				}
				if len(wr.Events) == 0 {
					continue
				}
				note(func() {
					for _, ev := range wr.Events {
						if ev.Type == clientv3.EventTypeDelete {
							dels = append(dels, string(ev.Kv.Key))
						} else {
							other = true
						}
					}
				})
			}
			note(func() { other = true })
		}()
	}
	defer func() {
		cancel()
		for range keys {
			<-done
		}
	}()
	b.stats.watches.Add(1)
	select {
	case <-changed:
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), dels...), other, nil
	case <-ctx.Done():
		return nil, true, ctx.Err()
	case <-sess.lostc:
		return nil, true, fmt.Errorf("%w: %w", lockmgr.ErrUnavailable, sess.check(b.clock.Now()))
	}
}
