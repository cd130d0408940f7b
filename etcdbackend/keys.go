package etcdbackend

import (
	"encoding/json"
	"fmt"
	"path"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lockfs/lockfs/lockmgr"
)

// Key layout (docs/ETCD-PROTOCOL.md §2), under the prefix P:
//
//	P/claims/a/b/.lock/<sid>   a claim of session sid on a/b/.lock
//	P/wants/a/b/.lock/<sid>    session sid waits for a/b/.lock
//	P/probe/<host>             written and deleted by Check
//
// The root directory's locks are P/claims/.lock/<sid> and so on, so that
// P/claims/D/ is everything inside D (D's new-dir and usage locks
// included) and P/claims/ everything. No directory is named .lock,
// .lock_newdir or .lock_usage (they are reserved), so a control name never
// meets a directory name. Both kinds of key are bound to the session's
// etcd lease and vanish with it.

// layoutVersion is written into every value; a value of another version
// is refused (ErrLayout).
const layoutVersion = 1

// keyRange is a range of keys [key, end), or the single key if end is "".
type keyRange struct{ key, end string }

func (r keyRange) opts() []clientv3.OpOption {
	if r.end == "" {
		return nil
	}
	return []clientv3.OpOption{clientv3.WithRange(r.end)}
}

func prefixRange(p string) keyRange { return keyRange{p, clientv3.GetPrefixRangeEnd(p)} }

// dirPrefix is the prefix of every claim key of a lock inside dir (dir's
// own locks included).
func (b *Backend) dirPrefix(dir string) string {
	if dir == "." {
		return b.cfg.Prefix + "claims/"
	}
	return b.cfg.Prefix + "claims/" + dir + "/"
}

// lockPrefix is the prefix of the claim keys of one lock.
func (b *Backend) lockPrefix(id lockmgr.LockID) string {
	return b.dirPrefix(id.Path) + lockmgr.ControlName(id.Kind) + "/"
}

// claimKey is session sid's claim key on id.
func (b *Backend) claimKey(id lockmgr.LockID, sid string) string { return b.lockPrefix(id) + sid }

// wantPrefix is the prefix of the want keys of one lock.
func (b *Backend) wantPrefix(id lockmgr.LockID) string { return b.wantsOf(b.lockPrefix(id)) }

// wantKey is session sid's want key on id.
func (b *Backend) wantKey(id lockmgr.LockID, sid string) string { return b.wantPrefix(id) + sid }

// keyKind says what a key under the prefix is.
type keyKind int

const (
	otherKey keyKind = iota
	claimKeyKind
	wantKeyKind
)

// parseKey reads a claim or want key: its lock and session.
func (b *Backend) parseKey(key string) (keyKind, lockmgr.LockID, string) {
	var kind keyKind
	rest, ok := strings.CutPrefix(key, b.cfg.Prefix+"claims/")
	if ok {
		kind = claimKeyKind
	} else if rest, ok = strings.CutPrefix(key, b.cfg.Prefix+"wants/"); ok {
		kind = wantKeyKind
	} else {
		return otherKey, lockmgr.LockID{}, ""
	}
	i := strings.LastIndexByte(rest, '/')
	if i < 0 {
		return otherKey, lockmgr.LockID{}, ""
	}
	lock, sid := rest[:i], rest[i+1:]
	dir, control := path.Split(lock)
	dir = strings.TrimSuffix(dir, "/")
	if dir == "" {
		dir = "."
	}
	k, ok := lockmgr.ControlKind(control)
	if !ok {
		return otherKey, lockmgr.LockID{}, ""
	}
	return kind, lockmgr.LockID{Path: dir, Kind: k}, sid
}

// record is the value of a claim or want key.
type record struct {
	V     int       `json:"v"`
	Host  string    `json:"host"`
	Mode  string    `json:"mode"`
	Since time.Time `json:"since"`
}

func newRecord(host string, mode lockmgr.Mode) string {
	b, _ := json.Marshal(record{V: layoutVersion, Host: host, Mode: mode.String(), Since: time.Now().UTC()})
	return string(b)
}

// ErrLayout is wrapped by the error for a key whose value this version of
// lockfs does not speak (another layout version, or not lockfs's).
var ErrLayout = fmt.Errorf("etcd key of an unknown layout")

func parseRecord(v []byte) (record, lockmgr.Mode, error) {
	var r record
	if err := json.Unmarshal(v, &r); err != nil {
		return r, 0, fmt.Errorf("%w: %v", ErrLayout, err)
	}
	if r.V != layoutVersion {
		return r, 0, fmt.Errorf("%w: version %d (this lockfs speaks %d)", ErrLayout, r.V, layoutVersion)
	}
	m, err := lockmgr.ParseMode(r.Mode)
	if err != nil {
		return r, 0, fmt.Errorf("%w: %v", ErrLayout, err)
	}
	return r, m, nil
}

// properAncestors returns the directories above p, the root first.
func properAncestors(p string) []string {
	if p == "." {
		return nil
	}
	out := []string{"."}
	for i := 0; i < len(p); i++ {
		if p[i] == '/' {
			out = append(out, p[:i])
		}
	}
	return out
}

// inside reports whether p is d or below d.
func inside(p, d string) bool {
	return d == "." || p == d || strings.HasPrefix(p, d+"/")
}

// conflicts is the hierarchy's conflict rule between two claims of
// different hosts: the same lock in conflicting modes; an exclusive
// directory claim on D against every claim inside D (D's new-dir and usage
// locks included); nothing else. It is symmetric.
func conflicts(a lockmgr.LockID, am lockmgr.Mode, b lockmgr.LockID, bm lockmgr.Mode) bool {
	if a == b {
		return lockmgr.Conflicts(am, bm)
	}
	return covers(a, am, b) || covers(b, bm, a)
}

// covers reports whether a claim on a in mode m excludes every claim on b:
// a is an exclusive directory claim on a directory that holds b.
func covers(a lockmgr.LockID, m lockmgr.Mode, b lockmgr.LockID) bool {
	return m == lockmgr.Exclusive && a.Kind == lockmgr.KindDir && inside(b.Path, a.Path)
}

// claimRanges are the ranges of the claim keys that a claim on id in mode
// must see free of other hosts' conflicting claims: id's own claims (or,
// for an exclusive directory claim, everything inside id's directory),
// then the directory locks of id's ancestors (and of id's own directory,
// for the new-dir and usage kinds).
func (b *Backend) claimRanges(id lockmgr.LockID, mode lockmgr.Mode) []keyRange {
	if b.noHierarchy {
		return []keyRange{prefixRange(b.lockPrefix(id))}
	}
	var rs []keyRange
	if id.Kind == lockmgr.KindDir && mode == lockmgr.Exclusive {
		rs = append(rs, prefixRange(b.dirPrefix(id.Path)))
	} else {
		rs = append(rs, prefixRange(b.lockPrefix(id)))
	}
	for _, a := range properAncestors(id.Path) {
		rs = append(rs, prefixRange(b.lockPrefix(lockmgr.LockID{Path: a, Kind: lockmgr.KindDir})))
	}
	if id.Kind != lockmgr.KindDir {
		rs = append(rs, prefixRange(b.lockPrefix(lockmgr.LockID{Path: id.Path, Kind: lockmgr.KindDir})))
	}
	return rs
}

// ranges are the claim's claimRanges and the wants it queues behind: id's
// own wants and those of the directory locks above it (the ancestors', and
// for the new-dir and usage kinds id's own directory's), so that a claim
// inside a directory that another host waits for takes its turn after
// that waiter. Wants inside an exclusive directory claim's subtree are not
// among them: such a want waits for claims that the directory claim
// conflicts with too, and once those are gone it would only hold the
// directory claim back for a waiter that may never come
// (docs/ETCD-PROTOCOL.md §5).
func (b *Backend) ranges(id lockmgr.LockID, mode lockmgr.Mode) []keyRange {
	crs := b.claimRanges(id, mode)
	rs := append(crs[:len(crs):len(crs)], prefixRange(b.wantPrefix(id)))
	if b.noHierarchy || b.perLockWants {
		return rs
	}
	for _, r := range crs[1:] {
		rs = append(rs, prefixRange(b.wantsOf(r.key)))
	}
	if b.wholeTreeWants {
		rs = append(rs, prefixRange(b.wantsOf(crs[0].key)))
	}
	return rs
}

// wantsOf maps a prefix of claim keys to the prefix of the want keys of
// the same locks.
func (b *Backend) wantsOf(claims string) string {
	return b.cfg.Prefix + "wants/" + strings.TrimPrefix(claims, b.cfg.Prefix+"claims/")
}
