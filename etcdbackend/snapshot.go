package etcdbackend

import (
	"context"
	"fmt"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lockfs/lockfs/lockmgr"
)

// snapshot is what a claim read of its ranges at one revision.
type snapshot struct {
	rev    int64
	claims []keyRecord // claim keys, each once
	wants  []keyRecord // want keys, each once
}

// keyRecord is one claim or want key of a snapshot.
type keyRecord struct {
	key  string
	id   lockmgr.LockID
	sid  string
	mode lockmgr.Mode
	host string
	// rev is the key's create revision: a want's place in the queue.
	rev int64
}

// gets are the reads of the ranges rs.
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

// parseSnapshot reads the range responses of a transaction at rev.
func (b *Backend) parseSnapshot(rev int64, resps []*pb.ResponseOp) (*snapshot, error) {
	s := &snapshot{rev: rev}
	seen := map[string]bool{}
	for _, r := range resps {
		rr := r.GetResponseRange()
		if rr == nil {
			continue
		}
		for _, kv := range rr.Kvs {
			k := string(kv.Key)
			if seen[k] {
				continue
			}
			seen[k] = true
			kind, id, sid := b.parseKey(k)
			if kind == otherKey {
				continue
			}
			rec, mode, err := parseRecord(kv.Value)
			if err != nil {
				b.log.WithError(err).WithField("key", k).Error("etcd key refused")
				return nil, fmt.Errorf("key %q: %w: %w", k, lockmgr.ErrUnavailable, err)
			}
			kr := keyRecord{key: k, id: id, sid: sid, mode: mode, host: rec.Host, rev: kv.CreateRevision}
			if kind == claimKeyKind {
				s.claims = append(s.claims, kr)
			} else {
				s.wants = append(s.wants, kr)
			}
		}
	}
	return s, nil
}

// holds reports whether session sid has a claim on id in mode in s.
func (s *snapshot) holds(sid string, id lockmgr.LockID, mode lockmgr.Mode) bool {
	for _, k := range s.claims {
		if k.sid == sid && k.id == id && k.mode == mode {
			return true
		}
	}
	return false
}

// without returns s less the keys deleted, at the same revision.
func (s *snapshot) without(deleted []string) *snapshot {
	gone := map[string]bool{}
	for _, k := range deleted {
		gone[k] = true
	}
	keep := func(ks []keyRecord) []keyRecord {
		var out []keyRecord
		for _, k := range ks {
			if !gone[k.key] {
				out = append(out, k)
			}
		}
		return out
	}
	return &snapshot{rev: s.rev, claims: keep(s.claims), wants: keep(s.wants)}
}
