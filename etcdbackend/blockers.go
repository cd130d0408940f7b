package etcdbackend

import (
	"context"
	"fmt"
	"sync"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lockfs/lockfs/lockmgr"
)

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
