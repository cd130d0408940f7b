package admin

// The status reply: the engine's table and the backend's claims, as one
// admin reply shows them.

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/lockfs/lockfs/internal/procinfo"
	"github.com/lockfs/lockfs/lockmgr"
)

// status renders the locks at or under p, as reader uid may see them, and
// on the locks above p the requests queued there for a lock at or under p:
// a request for a/b/.lock waits on a first while a is held, and the status
// of a/b shows it.
func (s *Server) status(p string, uid int) []Lock {
	out := []Lock{}
	under := func(path string) bool {
		return p == "." || path == p || strings.HasPrefix(path, p+"/")
	}
	above := func(path string) bool {
		return p != "." && (path == "." || strings.HasPrefix(p, path+"/"))
	}
	for _, st := range s.cfg.Engine.SnapshotTokens(func(id lockmgr.LockID) bool { return under(id.Path) }) {
		if above(st.Lock.Path) {
			var waiters []lockmgr.Waiter
			for _, w := range st.Waiters {
				if under(w.Wants.Path) {
					waiters = append(waiters, w)
				}
			}
			if len(waiters) == 0 {
				continue
			}
			st.Holders, st.Waiters = nil, waiters
		} else if !under(st.Lock.Path) {
			continue
		}
		l := Lock{Path: st.Lock.Path, Kind: st.Lock.Kind.String(), Mode: st.Mode.String(), Lease: st.Lease,
			Holders: []Holder{}, Waiters: []Waiter{}}
		for _, h := range st.Holders {
			mode := h.Mode
			if !h.Explicit {
				mode = lockmgr.Shared
			}
			hv := Holder{Mode: mode.String(), Explicit: h.Explicit, Implicit: h.Implicit}
			if h.Lost != nil {
				hv.Lost = h.Lost.Error()
			}
			if uid == 0 || uint32(uid) == h.UID {
				u := h.UID
				hv.Host, hv.PID, hv.UID, hv.Since, hv.Token = h.Host, h.Process.PID, &u, h.Since.UTC(), h.Token
				c := procinfo.Describe(s.cfg.ProcRoot, h.Process.PID)
				hv.Command, hv.Cmdline, hv.Runs = c.Name, c.Line, c.Runs
				if s.cfg.Notes != nil {
					hv.Note = s.cfg.Notes(st.Lock, h.Owner)
				}
			} else {
				hv.Hidden = true
			}
			l.Holders = append(l.Holders, hv)
		}
		for _, w := range st.Waiters {
			wv := Waiter{Mode: w.Mode.String(), Implicit: w.Implicit, Wants: w.Wants.String(), WantsMode: w.WantsMode.String(), Blocker: w.Blocker}
			if uid == 0 || uint32(uid) == w.UID {
				u := w.UID
				wv.PID, wv.UID, wv.Since = w.Process.PID, &u, w.Since.UTC()
				c := procinfo.Describe(s.cfg.ProcRoot, w.Process.PID)
				wv.Command, wv.Cmdline, wv.Runs = c.Name, c.Line, c.Runs
			} else {
				wv.Hidden = true
			}
			l.Waiters = append(l.Waiters, wv)
		}
		out = append(out, l)
	}
	return out
}

// claimsTimeout bounds the backend reads of a status request.
const claimsTimeout = 3 * time.Second

// claims reads every host's claims on the three locks of directory p from
// the backend, in parallel (one read each for gcs; nothing for local).
func (s *Server) claims(p string) ([]Claim, string) {
	ctx, cancel := context.WithTimeout(context.Background(), claimsTimeout)
	defer cancel()
	kinds := []lockmgr.Kind{lockmgr.KindDir, lockmgr.KindNewDir, lockmgr.KindUsage}
	recs := make([][]lockmgr.ClaimRecord, len(kinds))
	errs := make([]error, len(kinds))
	var wg sync.WaitGroup
	for i, k := range kinds {
		wg.Add(1)
		go func() {
			defer wg.Done()
			recs[i], errs[i] = s.cfg.Engine.Claims(ctx, lockmgr.LockID{Path: p, Kind: k})
		}()
	}
	wg.Wait()
	var out []Claim
	var failed []string
	for i, k := range kinds {
		if errs[i] != nil {
			failed = append(failed, errs[i].Error())
			continue
		}
		for _, c := range recs[i] {
			out = append(out, claimOf(p, k, c))
		}
	}
	return out, strings.Join(failed, "; ")
}

// claimOf renders c, a claim on lock p of kind k, for a reply.
func claimOf(p string, k lockmgr.Kind, c lockmgr.ClaimRecord) Claim {
	return Claim{Path: p, Kind: k.String(), Host: c.Host, Mode: c.Mode.String(), Since: c.Since,
		Session: c.Session, State: c.State, Use: c.Use, LockDelayUntil: c.DelayUntil}
}
