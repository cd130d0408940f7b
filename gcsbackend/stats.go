package gcsbackend

import "sync/atomic"

// Stats counts a backend's GCS requests by operation and outcome, and the
// protocol events they served. Every field only grows.
type Stats struct {
	// Reads is the number of object reads sent; ReadsNotFound of them
	// found no object.
	Reads, ReadsNotFound uint64
	// Writes is the number of conditional uploads sent; WritesOK of them
	// succeeded.
	Writes, WritesOK uint64
	// Lists counts listing requests (of the locks below a directory, of
	// the wants addressed to this session), one per page of up to 1,000
	// objects; Deletes the deletes of session and want objects.
	Lists, Deletes uint64
	// PreconditionFailed counts 412 answers: another host wrote first.
	PreconditionFailed uint64
	// RateLimited counts 429 answers, ServerErrors 5xx answers, and
	// NetworkErrors requests that got no answer (timeouts, resets).
	RateLimited, ServerErrors, NetworkErrors uint64
	// OtherErrors counts every other failed request (403, 400...).
	OtherErrors uint64
	// Ambiguous counts writes whose fate was unknown and was read back;
	// Recognised of them were found to have landed.
	Ambiguous, Recognised uint64

	// Claims, Conversions and Releases count the calls that succeeded;
	// WarmClaims of the claims were served from a record kept after its
	// release, with no request. Refreshes counts the session heartbeats
	// that landed, Sessions the sessions started; Losses the leases lost;
	// Takeovers the dead sessions of other hosts this backend declared
	// dead. Withdrawals counts claim records taken back after a conflict
	// seen by the verify step; WantsSent the wants this backend asked of
	// holders; WantsServed the records it dropped because another host
	// wanted them. Rings counts the holders' bells this backend rang (a
	// want's notice, or another waiter's ring seen in its place);
	// Contended the leases it told that another host waits for them.
	// LockDelays counts the sessions declared dead whose records kept a
	// claim of this backend waiting for their lock-delay.
	Claims, Conversions, Releases, WarmClaims, Refreshes, Sessions, Losses, Takeovers uint64
	Withdrawals, WantsSent, WantsServed, Rings, Contended, LockDelays                 uint64
}

// counters is Stats with atomic fields.
type counters struct {
	reads, readsNotFound, writes, writesOK, lists, deletes, preconditionFailed atomic.Uint64
	rateLimited, serverErrors, networkErrors, otherErrors                      atomic.Uint64
	ambiguous, recognised                                                      atomic.Uint64
	claims, conversions, releases, warmClaims, refreshes, sessions             atomic.Uint64
	losses, takeovers, withdrawals, wantsSent, wantsServed                     atomic.Uint64
	rings, contended, lockDelays                                               atomic.Uint64
}

func (c *counters) snapshot() Stats {
	return Stats{
		Reads: c.reads.Load(), ReadsNotFound: c.readsNotFound.Load(),
		Writes: c.writes.Load(), WritesOK: c.writesOK.Load(),
		Lists: c.lists.Load(), Deletes: c.deletes.Load(),
		PreconditionFailed: c.preconditionFailed.Load(),
		RateLimited:        c.rateLimited.Load(), ServerErrors: c.serverErrors.Load(),
		NetworkErrors: c.networkErrors.Load(), OtherErrors: c.otherErrors.Load(),
		Ambiguous: c.ambiguous.Load(), Recognised: c.recognised.Load(),
		Claims: c.claims.Load(), Conversions: c.conversions.Load(), Releases: c.releases.Load(),
		WarmClaims: c.warmClaims.Load(), Refreshes: c.refreshes.Load(), Sessions: c.sessions.Load(),
		Losses: c.losses.Load(), Takeovers: c.takeovers.Load(), Withdrawals: c.withdrawals.Load(),
		WantsSent: c.wantsSent.Load(), WantsServed: c.wantsServed.Load(),
		Rings: c.rings.Load(), Contended: c.contended.Load(), LockDelays: c.lockDelays.Load(),
	}
}

// Requests returns the number of GCS requests sent.
func (s Stats) Requests() uint64 { return s.Reads + s.Writes + s.Lists + s.Deletes }

// Sub returns s minus an earlier snapshot t, field by field.
func (s Stats) Sub(t Stats) Stats {
	return Stats{
		Reads: s.Reads - t.Reads, ReadsNotFound: s.ReadsNotFound - t.ReadsNotFound,
		Writes: s.Writes - t.Writes, WritesOK: s.WritesOK - t.WritesOK,
		Lists: s.Lists - t.Lists, Deletes: s.Deletes - t.Deletes,
		PreconditionFailed: s.PreconditionFailed - t.PreconditionFailed,
		RateLimited:        s.RateLimited - t.RateLimited, ServerErrors: s.ServerErrors - t.ServerErrors,
		NetworkErrors: s.NetworkErrors - t.NetworkErrors, OtherErrors: s.OtherErrors - t.OtherErrors,
		Ambiguous: s.Ambiguous - t.Ambiguous, Recognised: s.Recognised - t.Recognised,
		Claims: s.Claims - t.Claims, Conversions: s.Conversions - t.Conversions, Releases: s.Releases - t.Releases,
		WarmClaims: s.WarmClaims - t.WarmClaims, Refreshes: s.Refreshes - t.Refreshes, Sessions: s.Sessions - t.Sessions,
		Losses: s.Losses - t.Losses, Takeovers: s.Takeovers - t.Takeovers, Withdrawals: s.Withdrawals - t.Withdrawals,
		WantsSent: s.WantsSent - t.WantsSent, WantsServed: s.WantsServed - t.WantsServed,
		Rings: s.Rings - t.Rings, Contended: s.Contended - t.Contended, LockDelays: s.LockDelays - t.LockDelays,
	}
}
