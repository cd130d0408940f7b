package etcdbackend

import (
	"context"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lockfs/lockfs/internal/backoff"
	"github.com/lockfs/lockfs/lockmgr"
)

// want is another host's want key as the want watcher saw it: that host
// waits for id in mode, queued at revision rev.
type want struct {
	id   lockmgr.LockID
	sid  string
	mode lockmgr.Mode
	rev  int64
}

// putWant writes this host's want key for a claim in mode and reads the
// claim's ranges rs, in one transaction: it returns the want's create
// revision (the claim's place in the lock's queue) and the ranges as of
// that revision. Holders that see the want give up warm claims it waits
// for.
func (b *Backend) putWant(ctx context.Context, giveUp time.Duration, wkey string, sess *session, mode lockmgr.Mode, rs []keyRange) (int64, *snapshot, error) {
	var resp *clientv3.TxnResponse
	err := b.retry(ctx, giveUp, "write the want", func(rctx context.Context) error {
		var err error
		put := clientv3.OpPut(wkey, newRecord(b.cfg.HostID, mode), clientv3.WithLease(sess.id))
		resp, err = b.cli.Txn(rctx).Then(append([]clientv3.Op{put}, gets(rs)...)...).Commit()
		return err
	})
	if err != nil {
		return 0, nil, err
	}
	b.stats.wantsSent.Add(1)
	snap, err := b.parseSnapshot(resp.Header.Revision, resp.Responses)
	if err != nil {
		return 0, nil, err
	}
	return resp.Header.Revision, snap, nil
}

// deleteWant deletes this host's want key once its wait ended, with its
// own bounded context (the wait's may be over). A delete that fails is
// retried in the background until it succeeds or the session ends (the
// key goes with it): a want left standing would hold back other hosts'
// claims that queue behind it.
func (b *Backend) deleteWant(sess *session, wkey string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*b.cfg.RequestTimeout)
	defer cancel()
	del := func(rctx context.Context) error {
		_, err := b.cli.Delete(rctx, wkey)
		return err
	}
	err := b.retry(ctx, 2*b.cfg.RequestTimeout, "delete the want", del)
	if err == nil {
		return
	}
	b.log.WithError(err).WithField("key", wkey).Warn("could not delete this host's want key; retrying in the background")
	b.goWorker(func() {
		bo := backoff.New(100*time.Millisecond, 5*time.Second)
		for backoff.Sleep(b.closeCtx, nil, bo.Next(), sess.lostc) == nil {
			rctx, cancel := context.WithTimeout(clientv3.WithRequireLeader(b.closeCtx), b.cfg.RequestTimeout)
			err := del(rctx)
			cancel()
			b.stats.requests.Add(1)
			if err == nil {
				return
			}
		}
	})
}

// watchWants keeps Backend.wants up to date for session s: a listing of
// the wants, then a watch from the listing's revision, again after any
// break. Each want of another host that conflicts with a warm claim of
// this host has that claim dropped at once; one that conflicts with a held
// claim marks it wanted (dropped at its release).
func (b *Backend) watchWants(ctx context.Context, s *session) {
	bo := backoff.New(50*time.Millisecond, 2*time.Second)
	pfx := b.cfg.Prefix + "wants/"
	for ctx.Err() == nil {
		rctx, cancel := context.WithTimeout(clientv3.WithRequireLeader(ctx), b.cfg.RequestTimeout)
		resp, err := b.cli.Get(rctx, pfx, clientv3.WithPrefix())
		cancel()
		b.stats.requests.Add(1)
		if err != nil {
			backoff.Sleep(ctx, nil, bo.Next(), nil)
			continue
		}
		fresh := map[string]want{}
		for _, kv := range resp.Kvs {
			if w, ok := b.parseWant(s, kv.Key, kv.Value, kv.CreateRevision); ok {
				fresh[string(kv.Key)] = w
			}
		}
		b.mu.Lock()
		if b.sess != s {
			b.mu.Unlock()
			return
		}
		b.wants = fresh
		b.mu.Unlock()
		for _, w := range fresh {
			b.noticeWant(s, w)
		}
		wch := b.cli.Watch(clientv3.WithRequireLeader(ctx), pfx, clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision+1))
		for wr := range wch {
			if wr.Err() != nil || wr.Canceled {
				break
			}
			bo.Reset()
			for _, ev := range wr.Events {
				k := string(ev.Kv.Key)
				if ev.Type == clientv3.EventTypeDelete {
					b.mu.Lock()
					delete(b.wants, k)
					b.mu.Unlock()
					continue
				}
				w, ok := b.parseWant(s, ev.Kv.Key, ev.Kv.Value, ev.Kv.CreateRevision)
				if !ok {
					continue
				}
				b.mu.Lock()
				if b.sess == s {
					b.wants[k] = w
				}
				b.mu.Unlock()
				b.noticeWant(s, w)
			}
		}
		backoff.Sleep(ctx, nil, bo.Next(), nil)
	}
}

// parseWant reads another session's want key; its own and unreadable ones
// are skipped.
func (b *Backend) parseWant(s *session, key, value []byte, rev int64) (want, bool) {
	kind, id, sid := b.parseKey(string(key))
	if kind != wantKeyKind || sid == s.sid {
		return want{}, false
	}
	_, mode, err := parseRecord(value)
	if err != nil {
		return want{}, false
	}
	return want{id: id, sid: sid, mode: mode, rev: rev}, true
}

// noticeWant drops the warm claims of session s that w waits for, and
// tells the leases of the held ones that someone waits.
func (b *Backend) noticeWant(s *session, w want) {
	var drop []*ownClaim
	var held []*lease
	b.mu.Lock()
	for _, c := range b.claims {
		if c.sess != s || c.mode == 0 || !conflicts(c.id, c.mode, w.id, w.mode) {
			continue
		}
		if c.lease == nil {
			drop = append(drop, c)
		} else {
			held = append(held, c.lease)
		}
	}
	b.mu.Unlock()
	for _, l := range held {
		l.Contend()
	}
	for _, c := range drop {
		b.dropLater(c)
	}
}

// wantedLocked reports whether another host waits for c. Called with b.mu
// held.
func (b *Backend) wantedLocked(c *ownClaim) bool {
	for _, w := range b.wants {
		if w.sid != c.sess.sid && conflicts(c.id, c.mode, w.id, w.mode) {
			return true
		}
	}
	return false
}

// dropLater drops c in the background if it is warm (or uncertain) once
// its slot is free.
func (b *Backend) dropLater(c *ownClaim) {
	b.goWorker(func() {
		select {
		case c.slot <- struct{}{}:
		case <-b.closeCtx.Done():
			return
		}
		defer c.unlock()
		b.mu.Lock()
		ok := !c.gone && c.lease == nil && (c.mode != 0 || c.uncertain)
		sess := c.sess
		b.mu.Unlock()
		if !ok || sess == nil {
			return
		}
		if err := b.dropKeyLocked(b.closeCtx, c, sess); err != nil {
			b.log.WithError(err).WithField("lock", c.id.String()).Warn("could not drop a warm claim; retried when wanted or idle again")
		}
	})
}

// dropKeyLocked deletes c's key and forgets c. c's slot is held.
func (b *Backend) dropKeyLocked(ctx context.Context, c *ownClaim, sess *session) error {
	key := b.claimKey(c.id, sess.sid)
	err := b.retry(ctx, 2*b.cfg.RequestTimeout, "drop the claim", func(rctx context.Context) error {
		_, err := b.cli.Delete(rctx, key)
		return err
	})
	if err != nil {
		return err
	}
	b.stats.drops.Add(1)
	b.mu.Lock()
	b.forgetLocked(c)
	b.mu.Unlock()
	return nil
}

// dropIdle drops the warm claims of s idle for WarmFor.
func (b *Backend) dropIdle(s *session) {
	now := b.clock.Now()
	var idle []*ownClaim
	b.mu.Lock()
	for _, c := range b.claims {
		if c.sess == s && c.lease == nil && (c.uncertain || c.mode != 0 && now-c.idleSince >= b.cfg.WarmFor) {
			idle = append(idle, c)
		}
	}
	b.mu.Unlock()
	for _, c := range idle {
		b.dropLater(c)
	}
}
