package etcdbackend

import (
	"context"
	"fmt"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lockfs/lockfs/lockmgr"
)

// blockers returns the keys that keep a claim on c.id in mode from being
// granted now: other hosts' conflicting claims, and the want keys of other
// hosts queued before this one (or before any want of this host, if it has
// none yet) whose lock and mode conflict with the claim's, unless this
// host holds a claim that such a waiter waits for (it is ahead of them).
// Two hosts that both hold the lock shared and both wait to upgrade would
// wait for each other: the one queued later gets lockmgr.ErrDeadlock.
func (b *Backend) blockers(snap *snapshot, c *ownClaim, sess *session, mode lockmgr.Mode, myWant int64) (claims, wants []keyRecord, err error) {
	for _, k := range snap.claims {
		if k.sid != sess.sid && conflicts(k.id, k.mode, c.id, mode) {
			claims = append(claims, k)
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	upgrading := c.sess == sess && c.mode == lockmgr.Shared && mode == lockmgr.Exclusive
	for _, w := range snap.wants {
		if w.sid == sess.sid || !conflicts(w.id, w.mode, c.id, mode) || (myWant != 0 && w.rev > myWant) {
			continue
		}
		if upgrading && myWant != 0 && snap.holds(w.sid, c.id, lockmgr.Shared) {
			return nil, nil, fmt.Errorf("%w: another host holds %s shared too and waits to upgrade, queued first", lockmgr.ErrDeadlock, c.id)
		}
		if b.aheadOfLocked(sess, w.id, w.mode) {
			continue
		}
		wants = append(wants, w)
	}
	return claims, wants, nil
}

// keysOf returns the keys of the records.
func keysOf(rs ...[]keyRecord) []string {
	var out []string
	for _, r := range rs {
		for _, k := range r {
			out = append(out, k.key)
		}
	}
	return out
}

// waiting returns those of wants whose waiters wait for a claim: a claim
// of a host other than the waiter's, conflicting with what it waits for,
// in one read of the claim ranges of those waits. A want that waits for no
// claim is a waiter about to claim, or one that has stopped waiting and
// not yet deleted its want.
func (b *Backend) waiting(ctx context.Context, giveUp time.Duration, wants []keyRecord) ([]keyRecord, error) {
	var rs []keyRange
	seen := map[keyRange]bool{}
	for _, w := range wants {
		for _, r := range b.claimRanges(w.id, w.mode) {
			if !seen[r] {
				seen[r] = true
				rs = append(rs, r)
			}
		}
	}
	snap, err := b.read(ctx, giveUp, rs)
	if err != nil {
		return nil, err
	}
	var out []keyRecord
	for _, w := range wants {
		for _, k := range snap.claims {
			if k.sid != w.sid && conflicts(k.id, k.mode, w.id, w.mode) {
				out = append(out, w)
				break
			}
		}
	}
	return out, nil
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
