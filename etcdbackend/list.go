package etcdbackend

import (
	"context"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lockfs/lockfs/internal/stopctx"
	"github.com/lockfs/lockfs/lockmgr"
)

// ListClaims shows every host's claims on id from one read of its keys:
// host, mode, since (the holder's wall clock), session (its etcd lease, in
// hex), and for this host's own claim whether it is held or warm (another
// host's is "claimed"). Every key listed is bound to a lease the server
// still keeps, so its state is "live".
func (b *Backend) ListClaims(ctx context.Context, id lockmgr.LockID) ([]lockmgr.ClaimRecord, error) {
	if err := id.Check(); err != nil {
		return nil, err
	}
	if err := b.enter(); err != nil {
		return nil, err
	}
	defer b.inflight.Done()
	ctx, cancel := stopctx.With(ctx, b.closeCtx)
	defer cancel()
	var resp *clientv3.GetResponse
	err := b.retry(ctx, b.cfg.RequestTimeout, "list claims", func(rctx context.Context) error {
		var err error
		resp, err = b.cli.Get(rctx, b.lockPrefix(id), clientv3.WithPrefix())
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("list claims of %s: %w", id, err)
	}
	b.mu.Lock()
	own := b.sess
	c := b.claims[id]
	held := c != nil && c.lease != nil
	b.mu.Unlock()
	var out []lockmgr.ClaimRecord
	for _, kv := range resp.Kvs {
		_, _, sid := b.parseKey(string(kv.Key))
		rec, mode, err := parseRecord(kv.Value)
		if err != nil {
			return nil, fmt.Errorf("key %q: %w", kv.Key, err)
		}
		use := "claimed"
		if own != nil && sid == own.sid {
			use = "warm"
			if held {
				use = "held"
			}
		}
		out = append(out, lockmgr.ClaimRecord{Host: lockmgr.QuoteName(rec.Host), Mode: mode, Since: rec.Since,
			Session: sid, State: "live", Use: use})
	}
	return out, nil
}
