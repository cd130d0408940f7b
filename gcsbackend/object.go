package gcsbackend

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/lockfs/lockfs/lockmgr"
)

// Lock objects.
//
// Each lock is one object, named after its control file under the prefix:
//
//	PREFIX/locks/a/b/.lock          the directory lock of a/b
//	PREFIX/locks/.lock_newdir       the new-dir lock of the root
//
// Path elements keep the bytes [A-Za-z0-9._-]; every other byte is written
// as ~XX (hex), so names are valid UTF-8 and free of the characters GCS
// advises against. A name longer than GCS's 1024 bytes becomes
// PREFIX/locks-long/SHA256(lock)/CONTROL.
//
// An object holds one JSON record (see record). Objects are never deleted:
// the record's epoch, the base of the fencing tokens, must survive every
// release.

// protocolVersion is the record format this package writes and reads.
const protocolVersion = 1

// maxObjectName is GCS's limit on object names, in bytes.
const maxObjectName = 1024

// record is the content of a lock object.
type record struct {
	// Version is protocolVersion.
	Version int `json:"v"`
	// Lock is the lock's control file path, for people reading the bucket.
	Lock string `json:"lock"`
	// Epoch only grows: every write that grants or strengthens a claim
	// increments it and gives the claim the new value. Fencing tokens are
	// built on it.
	Epoch uint64 `json:"epoch"`
	// Holders are the hosts' claims, at most one per claim id.
	Holders []entry `json:"holders"`
	// Write is the random id of the write that produced this version, so a
	// writer whose reply was lost recognises its own write.
	Write string `json:"write"`
}

// entry is one host's claim on the lock.
type entry struct {
	// Claim is a random id, unique to this claim: observations and
	// recognition are keyed by it, never by host.
	Claim string `json:"claim"`
	// Host is the holder's HostID, for people and status output.
	Host string `json:"host"`
	// Mode is "shared" or "exclusive".
	Mode string `json:"mode"`
	// Seq grows with every write of the claim by its holder (a refresh,
	// a conversion). Others judge expiry by seeing it unchanged.
	Seq uint64 `json:"seq"`
	// Epoch is the record's epoch when this claim was granted or last
	// strengthened; the holder's tokens are Epoch<<20 | a local counter.
	Epoch uint64 `json:"epoch"`
	// Upgrading says the holder, holding the claim shared, waits to make it
	// exclusive. Two such holders block each other for ever; the younger
	// claim gives way (see Convert).
	Upgrading bool `json:"upgrading,omitempty"`
	// TTLMillis is the holder's TTL, for people.
	TTLMillis int64 `json:"ttl_ms"`
	// StaleMillis is how long others must see Seq unchanged before they may
	// remove the claim. The holder sets it: hosts may be configured with
	// different TTLs, and only the holder knows how long it vouches.
	StaleMillis int64 `json:"stale_ms"`
	// Since and Refreshed are the holder's wall-clock times of the claim
	// and of this version, for people only: no decision reads them.
	Since     time.Time `json:"since"`
	Refreshed time.Time `json:"refreshed"`
}

func (e *entry) mode() lockmgr.Mode {
	switch e.Mode {
	case "shared":
		return lockmgr.Shared
	case "exclusive":
		return lockmgr.Exclusive
	}
	// An unknown mode conflicts with everything.
	return lockmgr.Exclusive
}

func (e *entry) staleAfter() time.Duration {
	return time.Duration(e.StaleMillis) * time.Millisecond
}

// outranks reports whether e's claim has priority over other's in an
// upgrade deadlock: the older claim (lower epoch; then lower claim id) wins.
func (e *entry) outranks(other *entry) bool {
	if e.Epoch != other.Epoch {
		return e.Epoch < other.Epoch
	}
	return e.Claim < other.Claim
}

// find returns the entry of claim, or nil.
func (r *record) find(claim string) *entry {
	if r == nil {
		return nil
	}
	for i := range r.Holders {
		if r.Holders[i].Claim == claim {
			return &r.Holders[i]
		}
	}
	return nil
}

// without returns the holders other than those whose claim is in drop.
func (r *record) without(drop map[string]bool) []entry {
	out := make([]entry, 0, len(r.Holders))
	for _, e := range r.Holders {
		if !drop[e.Claim] {
			out = append(out, e)
		}
	}
	return out
}

// clone returns a deep copy of r, or a new empty record for lock if r is
// nil.
func (r *record) clone(lock string) *record {
	if r == nil {
		return &record{Version: protocolVersion, Lock: lock}
	}
	c := *r
	c.Holders = append([]entry(nil), r.Holders...)
	return &c
}

// decodeRecord parses an object's content.
func decodeRecord(b []byte) (*record, error) {
	var r record
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("lock object is not a lockfs record: %w", err)
	}
	if r.Version != protocolVersion {
		return nil, fmt.Errorf("lock object has record version %d; this lockfs speaks %d", r.Version, protocolVersion)
	}
	return &r, nil
}

// encode renders r as the object's content.
func (r *record) encode() []byte {
	b, err := json.Marshal(r)
	if err != nil {
		panic("gcsbackend: encode record: " + err.Error())
	}
	return append(b, '\n')
}

// objectName returns the name of id's lock object under prefix, or an error
// wrapping lockmgr.ErrInvalid if id is malformed.
func objectName(prefix string, id lockmgr.LockID) (string, error) {
	switch id.Kind {
	case lockmgr.KindDir, lockmgr.KindNewDir, lockmgr.KindUsage:
	default:
		return "", fmt.Errorf("%w: lock kind %v", lockmgr.ErrInvalid, id.Kind)
	}
	clean, err := lockmgr.CleanPath(id.Path)
	if err != nil || clean != id.Path {
		return "", fmt.Errorf("%w: path %q is not a clean relative path", lockmgr.ErrInvalid, id.Path)
	}
	var sb strings.Builder
	sb.WriteString(prefix)
	sb.WriteString("locks/")
	if id.Path != "." {
		for _, el := range strings.Split(id.Path, "/") {
			escapeElement(&sb, el)
			sb.WriteByte('/')
		}
	}
	sb.WriteString(lockmgr.ControlName(id.Kind))
	if sb.Len() <= maxObjectName {
		return sb.String(), nil
	}
	sum := sha256.Sum256([]byte(id.String()))
	return prefix + "locks-long/" + hex.EncodeToString(sum[:]) + "/" + lockmgr.ControlName(id.Kind), nil
}

// escapeElement writes one path element, escaping every byte outside
// [A-Za-z0-9._-] as ~XX.
func escapeElement(sb *strings.Builder, el string) {
	const hexdig = "0123456789ABCDEF"
	for i := 0; i < len(el); i++ {
		c := el[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '.', c == '_', c == '-':
			sb.WriteByte(c)
		default:
			sb.WriteByte('~')
			sb.WriteByte(hexdig[c>>4])
			sb.WriteByte(hexdig[c&15])
		}
	}
}

// modeName is the record's spelling of a mode.
func modeName(m lockmgr.Mode) string { return m.String() }
