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
	// Refreshes the refreshes that landed; Losses the leases lost;
	// Takeovers the stale claims of other hosts this backend removed.
	Claims, Conversions, Releases, Refreshes, Losses, Takeovers uint64
}

// counters is Stats with atomic fields.
type counters struct {
	reads, readsNotFound, writes, writesOK, preconditionFailed  atomic.Uint64
	rateLimited, serverErrors, networkErrors, otherErrors       atomic.Uint64
	ambiguous, recognised                                       atomic.Uint64
	claims, conversions, releases, refreshes, losses, takeovers atomic.Uint64
}

func (c *counters) snapshot() Stats {
	return Stats{
		Reads: c.reads.Load(), ReadsNotFound: c.readsNotFound.Load(),
		Writes: c.writes.Load(), WritesOK: c.writesOK.Load(),
		PreconditionFailed: c.preconditionFailed.Load(),
		RateLimited:        c.rateLimited.Load(), ServerErrors: c.serverErrors.Load(),
		NetworkErrors: c.networkErrors.Load(), OtherErrors: c.otherErrors.Load(),
		Ambiguous: c.ambiguous.Load(), Recognised: c.recognised.Load(),
		Claims: c.claims.Load(), Conversions: c.conversions.Load(), Releases: c.releases.Load(),
		Refreshes: c.refreshes.Load(), Losses: c.losses.Load(), Takeovers: c.takeovers.Load(),
	}
}

// Requests returns the number of GCS requests sent.
func (s Stats) Requests() uint64 { return s.Reads + s.Writes }

// Sub returns s minus an earlier snapshot t, field by field.
func (s Stats) Sub(t Stats) Stats {
	return Stats{
		Reads: s.Reads - t.Reads, ReadsNotFound: s.ReadsNotFound - t.ReadsNotFound,
		Writes: s.Writes - t.Writes, WritesOK: s.WritesOK - t.WritesOK,
		PreconditionFailed: s.PreconditionFailed - t.PreconditionFailed,
		RateLimited:        s.RateLimited - t.RateLimited, ServerErrors: s.ServerErrors - t.ServerErrors,
		NetworkErrors: s.NetworkErrors - t.NetworkErrors, OtherErrors: s.OtherErrors - t.OtherErrors,
		Ambiguous: s.Ambiguous - t.Ambiguous, Recognised: s.Recognised - t.Recognised,
		Claims: s.Claims - t.Claims, Conversions: s.Conversions - t.Conversions, Releases: s.Releases - t.Releases,
		Refreshes: s.Refreshes - t.Refreshes, Losses: s.Losses - t.Losses, Takeovers: s.Takeovers - t.Takeovers,
	}
}
