package gcsbackend

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"strconv"
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
// PREFIX/locks/a/b/~long/SHA256(lock)/CONTROL, under the deepest of the
// lock's directory and its ancestors whose prefix leaves room for the rest
// (longBase): still inside every directory listing that must see it, so
// that no claim lists more than the locks below the directory it claims.
// ("~long" cannot be an escaped element: ~ is always followed by two
// upper-case hex digits there.)
//
// An object holds one JSON record (see record) and, in its custom
// metadata, a summary of the claims. Lock objects are never deleted: the
// record's epoch, the base of the fencing tokens, must survive every
// release.
//
// Sessions are PREFIX/sessions/<session id> (see session.go); a waiter's
// request to a holder is PREFIX/wants/<holder session>/<waiter session>-<n>
// (see wants.go).

// layoutVersion is the object layout this package writes and reads: every
// object it writes carries it, in its JSON ("v") and in its metadata
// (metaVersion). Version 1 was the layout of one claim per lock per host,
// each refreshed by its own writes; version 2 has host sessions.
const layoutVersion = 2

// ErrLayout is wrapped by the errors about objects written in a layout this
// lockfs does not speak (a newer one, or version 1 with live claims). Those
// errors also wrap lockmgr.ErrUnavailable: the lock cannot be had here
// (ENOLCK), and nothing was misread.
var ErrLayout = errors.New("gcs object layout not spoken by this lockfs")

// layoutError wraps ErrLayout and lockmgr.ErrUnavailable with a message.
func layoutError(format string, args ...any) error {
	return fmt.Errorf("%w: %w: %s", ErrLayout, lockmgr.ErrUnavailable, fmt.Sprintf(format, args...))
}

// Custom metadata keys of lock objects: a listing shows the claims without
// reading the content.
const (
	metaVersion = "lockfs-v"      // the layout version, "2"
	metaClaims  = "lockfs-claims" // "session mode sinceMillis" per claim, ";"-separated
	metaPath    = "lockfs-lock"   // the lock, as lockmgr.LockID.String() spells it
)

// maxObjectName is GCS's limit on object names, in bytes.
const maxObjectName = 1024

// record is the content of a lock object.
type record struct {
	// Version is layoutVersion.
	Version int `json:"v"`
	// Lock is the lock (its control file path), for people and for the
	// listing of long names.
	Lock string `json:"lock"`
	// Epoch only grows: every write that grants or strengthens a claim
	// increments it and gives the claim the new value. Fencing tokens are
	// built on it.
	Epoch uint64 `json:"epoch"`
	// Claims are the sessions' claims, at most one per session.
	Claims []claimRec `json:"claims"`
	// Write is the random id of the write that produced this version, so a
	// writer whose reply was lost recognises its own write.
	Write string `json:"write"`
	// Next, if set, is the waiter whose turn it is: written by a holder
	// that gave its record up because others asked for it, naming the one
	// that asked first (see turn).
	Next *turn `json:"next,omitempty"`
}

// turn names the waiter of another host whose turn it is at a lock
// object: the holder that gave its record up for waiters names the one
// whose wait began first, and other hosts' claims that conflict with what
// it waits for let it go first, for at most turnGrace after they first see
// it, and while the waiter's want is there (a waiter that gives up deletes
// it). Its own claim write clears it.
// So turns across hosts follow the order in which hosts asked (SPEC §2.7),
// at no request: the drop writes the object anyway.
type turn struct {
	Session string `json:"session"`
	Host    string `json:"host"`
	Lock    string `json:"lock"` // what it waits for (LockID.String)
	Mode    string `json:"mode"`
	Since   int64  `json:"since_ms"` // when its wait began, on its wall clock
	Want    string `json:"want"`     // its want object: the turn stands while it is there
	ID      string `json:"id"`       // tells one turn from the next
}

// claimRec is one session's claim on the lock. It is valid while its
// session is live; a claim of a dead or missing session counts as absent.
type claimRec struct {
	// Session is the claiming host's session id (sessions/<Session>).
	Session string `json:"session"`
	// Host is the holder's HostID, for people and status output.
	Host string `json:"host"`
	// Mode is "shared" or "exclusive".
	Mode string `json:"mode"`
	// Epoch is the record's epoch when this claim was written or last
	// strengthened; the holder's tokens are Epoch<<20 | a local counter.
	Epoch uint64 `json:"epoch"`
	// Since is the holder's wall-clock time of the claim's write. People
	// read it; the protocol uses it only as the first key of the priority
	// order between two claims that see each other (both sides compare the
	// same two values, so clock offsets cannot make them disagree).
	Since time.Time `json:"since"`
}

func (c *claimRec) mode() lockmgr.Mode { return parseMode(c.Mode) }

// parseMode reads a mode; an unknown one conflicts with everything.
func parseMode(s string) lockmgr.Mode {
	if m, err := lockmgr.ParseMode(s); err == nil {
		return m
	}
	return lockmgr.Exclusive
}

// outranks reports whether claim a has priority over claim b when the two
// see each other: the older write (Since), then the lower session id.
func outranks(a, b claimRef) bool {
	if a.since != b.since {
		return a.since < b.since
	}
	return a.session < b.session
}

// claimRef is what the protocol needs of a claim found anywhere: in a
// record or in a listing's metadata.
type claimRef struct {
	object  string // the lock object it is in
	session string
	host    string
	mode    lockmgr.Mode
	since   int64 // unix milliseconds
	// turn: not a record but another host's turn (record.Next) that this
	// claim lets go first, until turnEnd on this host's clock.
	turn    bool
	turnEnd time.Duration
}

func (c *claimRec) ref(object string) claimRef {
	return claimRef{object: object, session: c.Session, host: c.Host, mode: c.mode(), since: c.Since.UnixMilli()}
}

// find returns the claim of session, or nil.
func (r *record) find(session string) *claimRec {
	if r == nil {
		return nil
	}
	for i := range r.Claims {
		if r.Claims[i].Session == session {
			return &r.Claims[i]
		}
	}
	return nil
}

// without returns the claims for which drop is false.
func (r *record) without(drop func(c *claimRec) bool) []claimRec {
	out := make([]claimRec, 0, len(r.Claims))
	for i := range r.Claims {
		if !drop(&r.Claims[i]) {
			out = append(out, r.Claims[i])
		}
	}
	return out
}

// clone returns a deep copy of r, or a new empty record for lock if r is
// nil.
func (r *record) clone(lock string) *record {
	if r == nil {
		return &record{Version: layoutVersion, Lock: lock}
	}
	c := *r
	c.Claims = append([]claimRec(nil), r.Claims...)
	return &c
}

// metadata is the custom metadata written with r.
func (r *record) metadata() map[string]string {
	var sb strings.Builder
	for i, c := range r.Claims {
		if i > 0 {
			sb.WriteByte(';')
		}
		fmt.Fprintf(&sb, "%s %s %d", c.Session, c.Mode, c.Since.UnixMilli())
	}
	return map[string]string{metaVersion: strconv.Itoa(layoutVersion), metaClaims: sb.String(), metaPath: r.Lock}
}

// parseClaimsMeta reads the metaClaims summary of object.
func parseClaimsMeta(object, s string) ([]claimRef, error) {
	if s == "" {
		return nil, nil
	}
	var out []claimRef
	for _, part := range strings.Split(s, ";") {
		f := strings.Fields(part)
		if len(f) != 3 {
			return nil, fmt.Errorf("object %s: malformed %s metadata %q", object, metaClaims, s)
		}
		ms, err := strconv.ParseInt(f[2], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("object %s: malformed %s metadata %q", object, metaClaims, s)
		}
		out = append(out, claimRef{object: object, session: f[0], mode: parseMode(f[1]), since: ms})
	}
	return out, nil
}

// v1Record is the part of a layout-1 object that matters here.
type v1Record struct {
	Epoch   uint64 `json:"epoch"`
	Holders []struct {
		Host string `json:"host"`
		Mode string `json:"mode"`
	} `json:"holders"`
}

// decodeRecord parses an object's content. A layout-1 object without
// claims becomes an empty record that keeps its epoch (so fencing tokens
// keep growing); one with claims, or any other layout, is refused with an
// error wrapping ErrLayout.
func decodeRecord(name string, b []byte) (*record, error) {
	var head struct {
		Version int `json:"v"`
	}
	if err := json.Unmarshal(b, &head); err != nil {
		return nil, fmt.Errorf("object %s is not a lockfs lock object: %w", name, err)
	}
	switch head.Version {
	case layoutVersion:
		var r record
		if err := json.Unmarshal(b, &r); err != nil {
			return nil, fmt.Errorf("object %s is not a lockfs lock object: %w", name, err)
		}
		return &r, nil
	case 1:
		var old v1Record
		if err := json.Unmarshal(b, &old); err != nil {
			return nil, fmt.Errorf("object %s is not a lockfs lock object: %w", name, err)
		}
		if len(old.Holders) == 0 {
			return &record{Version: layoutVersion, Epoch: old.Epoch}, nil
		}
		return nil, layoutError("object %s has layout version 1 with %d live claim(s) (first by host %q): "+
			"a lockfs daemon of the old layout is using this bucket and prefix; stop every old daemon "+
			"(a clean stop removes its claims) or give the new ones another --gcs-prefix", name, len(old.Holders), old.Holders[0].Host)
	}
	return nil, layoutError("object %s has layout version %d; this lockfs speaks %d: upgrade this daemon, "+
		"or give it another --gcs-prefix", name, head.Version, layoutVersion)
}

// encode renders r as the object's content.
func (r *record) encode() []byte {
	b, err := json.Marshal(r)
	if err != nil {
		panic("gcsbackend: encode record: " + err.Error())
	}
	return append(b, '\n')
}

// parseLockID reads a lock as LockID.String spells it ("a/b/.lock_newdir").
func parseLockID(s string) (lockmgr.LockID, error) {
	dir, ctl := path.Split(s)
	k, ok := lockmgr.ControlKind(ctl)
	if !ok {
		return lockmgr.LockID{}, fmt.Errorf("%q is not a lock", s)
	}
	p, err := lockmgr.CleanPath(strings.TrimSuffix(dir, "/"))
	if err != nil {
		return lockmgr.LockID{}, err
	}
	return lockmgr.LockID{Path: p, Kind: k}, nil
}

// dirPrefix returns the prefix of every lock object inside directory p
// (p's own new-dir and usage locks, and everything below).
func dirPrefix(prefix, p string) string {
	var sb strings.Builder
	sb.WriteString(prefix)
	sb.WriteString("locks/")
	if p != "." {
		for _, el := range strings.Split(p, "/") {
			escapeElement(&sb, el)
			sb.WriteByte('/')
		}
	}
	return sb.String()
}

// objectName returns the name of id's lock object under prefix, or an error
// wrapping lockmgr.ErrInvalid if id is malformed.
func objectName(prefix string, id lockmgr.LockID) (string, error) {
	if err := id.Check(); err != nil {
		return "", err
	}
	var sb strings.Builder
	sb.WriteString(dirPrefix(prefix, id.Path))
	sb.WriteString(lockmgr.ControlName(id.Kind))
	if sb.Len() <= maxObjectName {
		return sb.String(), nil
	}
	sum := sha256.Sum256([]byte(id.String()))
	return longBase(prefix, id.Path) + hex.EncodeToString(sum[:]) + "/" + lockmgr.ControlName(id.Kind), nil
}

// longElem is the element under which long-named lock objects live, and
// longRoom what such a name adds to its directory's prefix: the element,
// a SHA-256 in hex and the longest control name, with their slashes.
const (
	longElem = "~long"
	longRoom = len(longElem) + 1 + sha256.Size*2 + 1 + len(".lock_newdir")
)

// longBase returns the prefix of the long-named lock objects of directory
// p: dirPrefix of the deepest of p and its ancestors that leaves longRoom
// bytes within maxObjectName (the root's, if none does), then longElem.
// Every long-named lock in a directory D whose prefix leaves that room is
// thus listed with D's prefix; those of a directory that does not are all
// under longBase of D, with the long-named locks of D's deepest such
// ancestor only.
func longBase(prefix, p string) string {
	var sb, el strings.Builder
	sb.WriteString(prefix)
	sb.WriteString("locks/")
	if p != "." {
		for _, e := range strings.Split(p, "/") {
			el.Reset()
			escapeElement(&el, e)
			if sb.Len()+el.Len()+1+longRoom > maxObjectName {
				break
			}
			sb.WriteString(el.String())
			sb.WriteByte('/')
		}
	}
	sb.WriteString(longElem)
	sb.WriteByte('/')
	return sb.String()
}

// fitsLongBase reports whether the long-named locks inside directory p are
// all under dirPrefix(prefix, p): whether p's prefix leaves longRoom.
func fitsLongBase(prefix, p string) bool {
	return len(dirPrefix(prefix, p))+longRoom <= maxObjectName
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
