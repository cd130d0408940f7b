package gcsbackend

import (
	"context"

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
// generation and holders as "host:mode:seq" strings.
func (b *Backend) ReadRecord(ctx context.Context, name string) (gen int64, epoch uint64, holders []string, err error) {
	s, _, err := b.read(ctx, name)
	if err != nil || s.rec == nil {
		return s.gen, 0, nil, err
	}
	for _, e := range s.rec.Holders {
		holders = append(holders, e.Host+":"+e.Mode)
	}
	return s.gen, s.rec.Epoch, holders, nil
}

// SetUnsafeWallExpiry turns on the broken wall-clock expiry that the
// clock-offset tests must catch.
func (b *Backend) SetUnsafeWallExpiry(on bool) { b.unsafeWallExpiry = on }

// Crash stops the backend as a killed daemon would: nothing is released,
// refreshes stop, claims stay in the bucket until others judge them stale.
func (b *Backend) Crash() {
	b.mu.Lock()
	for l := range b.leases {
		l.mu.Lock()
		l.released = true
		l.mu.Unlock()
	}
	clear(b.leases)
	b.mu.Unlock()
	b.Close()
}

// LeaseValidity returns a gcs lease's remaining validity and last landed
// write's send time on the backend's clock.
func LeaseValidity(l lockmgr.Lease) (lastSent, validUntil int64) {
	x := l.(*lease)
	x.mu.Lock()
	defer x.mu.Unlock()
	return int64(x.lastSent), int64(x.validUntil)
}

// LeaseSeq returns a gcs lease's Seq.
func LeaseSeq(l lockmgr.Lease) uint64 {
	x := l.(*lease)
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.seq
}
