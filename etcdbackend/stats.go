package etcdbackend

import "sync/atomic"

// Stats counts the backend's requests and events since New.
type Stats struct {
	// Requests is every request sent to etcd (transactions, puts,
	// deletes, grants, keep-alives, revocations, listings), retries
	// included; watches are counted apart.
	Requests uint64
	// Failures are requests that failed and were retried or given up.
	Failures uint64
	// Txns are claim transactions, Reads read-only ones, Watches the
	// waits on what blocks a claim.
	Txns, Reads, Watches uint64
	// Claims are claims that wrote their key; WarmClaims those taken
	// again from a warm key with no request.
	Claims, WarmClaims uint64
	// Releases are lease releases; Drops claim keys deleted (at release,
	// when wanted, or idle).
	Releases, Drops uint64
	// WantsSent are want keys written by waiting claims.
	WantsSent uint64
	// Sessions started, SessionsLost, KeepAlives answered, and leases
	// lost.
	Sessions, SessionsLost, KeepAlives, Losses uint64
}

type counters struct {
	requests, failures, txns, reads, watches      atomic.Uint64
	claims, warmClaims, releases, drops           atomic.Uint64
	wantsSent, sessions, sessionsLost, keepAlives atomic.Uint64
	losses                                        atomic.Uint64
}

func (c *counters) snapshot() Stats {
	return Stats{
		Requests: c.requests.Load(), Failures: c.failures.Load(),
		Txns: c.txns.Load(), Reads: c.reads.Load(), Watches: c.watches.Load(),
		Claims: c.claims.Load(), WarmClaims: c.warmClaims.Load(),
		Releases: c.releases.Load(), Drops: c.drops.Load(), WantsSent: c.wantsSent.Load(),
		Sessions: c.sessions.Load(), SessionsLost: c.sessionsLost.Load(),
		KeepAlives: c.keepAlives.Load(), Losses: c.losses.Load(),
	}
}
