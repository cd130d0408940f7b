package gcsbackend

import (
	"context"
	"fmt"

	"github.com/lockfs/lockfs/lockmgr"
)

// Test hooks, visible to the external test package only.

// ObjectNameForTest exposes objectName.
func ObjectNameForTest(prefix string, id lockmgr.LockID) (string, error) {
	return objectName(prefix, id)
}

// ObjectName returns the name of id's lock object.
func (b *Backend) ObjectName(id lockmgr.LockID) string {
	n, err := objectName(b.cfg.Prefix, id)
	if err != nil {
		panic(err)
	}
	return n
}

// ReadRecord reads a lock object as the backend does and returns its
// generation, epoch and records as "host:mode" strings.
func (b *Backend) ReadRecord(ctx context.Context, name string) (gen int64, epoch uint64, holders []string, err error) {
	s, _, err := b.read(ctx, name)
	if err != nil || s.rec == nil {
		return s.gen, 0, nil, err
	}
	for _, c := range s.rec.Claims {
		holders = append(holders, c.Host+":"+c.Mode)
	}
	return s.gen, s.rec.Epoch, holders, nil
}

// SetUnsafeWallExpiry turns on the broken wall-clock expiry that the
// clock-offset tests must catch.
func (b *Backend) SetUnsafeWallExpiry(on bool) { b.unsafeWallExpiry = on }

// SetListLegacyLong adds to every exclusive directory claim the listing of
// all of PREFIX/locks-long/ that the layout before longBase made: the
// control of the test that a claim's cost does not grow with the bucket.
func (b *Backend) SetListLegacyLong(on bool) { b.listLegacyLong = on }

// SetNoVerify turns off the hierarchy checks of claims (the scan before
// the write and the verify after it): the broken design the model-checked
// history must catch.
func (b *Backend) SetNoVerify(on bool) { b.noVerify = on }

// SetPollWants turns on the want path of before bells: the wants are listed
// at every poll while a record is warm, every refresh interval while
// records are only held (the control of the want path's cost).
func (b *Backend) SetPollWants(on bool) { b.pollWants.Store(on) }

// PauseHeartbeats stops (or restarts) the session's heartbeats, as a host
// whose heartbeats stall would.
func (b *Backend) PauseHeartbeats(on bool) {
	b.paused.Store(on)
	b.wake()
}

// Crash stops the backend as a killed daemon would: nothing is released,
// heartbeats stop, records and session stay in the bucket until others
// judge the session dead.
func (b *Backend) Crash() {
	b.crashed.Store(true)
	b.Close()
}

// SessionID returns the live session's id, "" if none.
func (b *Backend) SessionID() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.sess == nil {
		return ""
	}
	return b.sess.id
}

// SessionValidity returns the live session's last landed heartbeat's send
// time and the end of its validity on the backend's clock; zeros if none.
func (b *Backend) SessionValidity() (lastSent, validUntil int64) {
	b.mu.Lock()
	s := b.sess
	b.mu.Unlock()
	if s == nil {
		return 0, 0
	}
	ls, vu := s.validity()
	return int64(ls), int64(vu)
}

// LoseTrackOfRecord puts the backend's warm record of id in the state a
// record that a write of unknown outcome landed after the drop that
// followed it leaves: in the bucket, while the backend believes it is not.
// It reports whether there was an unused record to do this to.
func (b *Backend) LoseTrackOfRecord(id lockmgr.LockID) bool {
	name := b.ObjectName(id)
	b.mu.Lock()
	defer b.mu.Unlock()
	r := b.recs[name]
	if r == nil || r.lease != nil || !r.present {
		return false
	}
	r.present, r.uncertain = false, true
	return true
}

// HoldRecordSlot takes the slot of this host's record handle for id, as
// the want poller does to drop a warm record, and returns the rest of such
// a drop: the record is removed, the handle forgotten (no lease uses it)
// and the slot let go.
func (b *Backend) HoldRecordSlot(ctx context.Context, id lockmgr.LockID) (dropAndLetGo func(context.Context) error, err error) {
	name := b.ObjectName(id)
	b.mu.Lock()
	r := b.recs[name]
	b.mu.Unlock()
	if r == nil {
		return nil, fmt.Errorf("no record handle for %s", id)
	}
	if err := r.lock(ctx); err != nil {
		return nil, err
	}
	return func(ctx context.Context) error {
		defer r.unlock()
		return b.dropLocked(ctx, r)
	}, nil
}

// KeptVersion compares the version of id's object that this host keeps as
// the base of its next write with the object in the bucket: rebuilt
// reports whether it is kept as the claim's fields alone (not whole),
// matches whether it says what the object says, write ids aside.
func (b *Backend) KeptVersion(ctx context.Context, id lockmgr.LockID) (rebuilt, matches bool, err error) {
	name := b.ObjectName(id)
	b.mu.Lock()
	r := b.recs[name]
	var kept snapshot
	if r != nil {
		rebuilt = r.rec == nil && r.gen != 0
		kept = b.snapOfLocked(r)
	}
	b.mu.Unlock()
	if r == nil {
		return false, false, fmt.Errorf("no record of %s", id)
	}
	s, _, err := b.read(ctx, name)
	if err != nil {
		return rebuilt, false, err
	}
	matches = s.gen == kept.gen && (s.rec == nil) == (kept.rec == nil) && (s.rec == nil || s.rec.same(kept.rec))
	return rebuilt, matches, nil
}
