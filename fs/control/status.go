package control

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/lockfs/lockfs/lockmgr"
)

// Status text (SPEC §6).
//
// Reading a control file returns the state of its lock as it is at the read
// (a read at offset 0 takes a new snapshot; later offsets continue it).
// Every line is a keyword followed by values separated by single spaces;
// values in key=value form may come in any order and new keys may be added,
// so parsers should ignore keys they do not know. Lines, in this order:
//
//	you holder token=17               only when read through a descriptor that holds
//	                                  the lock explicitly: the reader's own token,
//	                                  then the word lost if its lease was lost.
//	                                  Tokens are issued at their first reading
//	                                  (lockmgr.Request.DeferToken): this read
//	                                  issues every shown holder's; 0: none
//	                                  (lost before it was read, not issuable, or
//	                                  held up for 5 s: the next read tries again)
//	lock a/b/.lock                    the control file, relative to the mount root;
//	                                  Go-quoted if the path has a character that
//	                                  would need escaping (lockmgr.QuoteName)
//	kind dir                          dir, newdir or usage
//	mode exclusive                    the strongest mode held: none, shared or exclusive
//	holder host=h1 pid=1234 uid=0 mode=exclusive since=2026-11-29T18:00:00Z token=17 explicit you note="deploying v1.2"
//	holder mode=shared implicit=2 hidden
//	implicit 3                        holds taken on behalf of locks below
//	waiters 2                         queued requests, then one line each:
//	waiter pid=99 uid=0 mode=exclusive since=2026-11-29T18:01:00Z
//	waiter pid=98 uid=0 mode=shared since=... for=a/b/c/.lock for_mode=exclusive
//	waiter pid=97 uid=0 mode=exclusive since=... outside blocker="another process or daemon on this host (backing file)"
//	waiter mode=shared hidden
//	lease exclusive                   the backend's claim: its mode, or the backend's
//	                                  description (gcs: expiry); "none" if none
//	claim host=h2 mode=shared since=2026-11-29T18:00:00Z session=h2.3c9d00e1a2b4 state=live use=claimed
//	                                  gcs only: one line per host's claim on this lock,
//	                                  from one read of its object; state is the
//	                                  session's (live, stale, dead), use is held or
//	                                  warm for this host's own claim, claimed for
//	                                  another host's; "claims unknown "error"" if
//	                                  the object could not be read
//
// One holder line per owner, explicit holders first, then by age. Its
// fields: host, pid (the process the hold belongs to now), uid, mode
// (shared for an owner that holds the lock only on behalf of locks below),
// since (UTC, RFC 3339), token (the fencing token of the grant), the word
// explicit if the owner asked for this very lock, implicit=N for the holds
// taken on behalf of locks below, the word you if the reader holds through
// this descriptor, lost="reason" once the hold's lease was lost, and
// note="..." (what was written to the control file through the descriptor
// that took the lock, Go-quoted, one trailing newline dropped).
//
// Identities (host, pid, uid, since, token, note) are shown only to root
// and to the holder's own uid; others see the mode, explicit, implicit=N,
// lost and the word hidden.
//
// A waiter line per queued request, oldest first: pid, uid and since
// (identities, shown as for holders), mode (the mode it waits for on this
// lock), for= and for_mode= when it waits here for an ancestor hold of the
// lock it asked for, and outside with blocker="..." when it waits for the
// backend's claim, held outside this daemon (another daemon or a program
// locking SOURCE directly, with the local backend).

// statusText renders the status of n's lock for a reader with uid, reading
// through handle reader.
func (n *controlNode) statusText(reader *controlHandle, uid uint32) []byte {
	id := n.lockID()
	st := n.c.engine.StatusTokens(id)

	n.mu.Lock()
	records := make(map[lockmgr.Owner]*controlHandle, n.owners.len())
	n.owners.each(func(o lockmgr.Owner, rec ownerRecord) {
		if rec.id == id {
			records[o] = rec.h
		}
	})
	n.mu.Unlock()

	var b bytes.Buffer
	for _, h := range st.Holders {
		if h.Explicit && records[h.Owner] == reader {
			fmt.Fprintf(&b, "you holder token=%d", h.Token)
			if h.Lost != nil {
				b.WriteString(" lost")
			}
			b.WriteByte('\n')
			break
		}
	}
	fmt.Fprintf(&b, "lock %s\n", lockmgr.QuoteName(id.String()))
	fmt.Fprintf(&b, "kind %s\n", id.Kind)
	fmt.Fprintf(&b, "mode %s\n", st.Mode)
	for _, h := range st.Holders {
		note := ""
		if hd := records[h.Owner]; h.Explicit && hd != nil {
			note = hd.noteText()
		}
		b.WriteString(holderLine(h, uid == 0 || uid == h.UID, h.Explicit && records[h.Owner] == reader, note))
		b.WriteByte('\n')
	}
	fmt.Fprintf(&b, "implicit %d\n", st.Implicit)
	fmt.Fprintf(&b, "waiters %d\n", len(st.Waiters))
	for _, w := range st.Waiters {
		b.WriteString(waiterLine(w, uid == 0 || uid == w.UID))
		b.WriteByte('\n')
	}
	lease := st.Lease
	if lease == "" {
		lease = "none"
	}
	fmt.Fprintf(&b, "lease %s\n", strings.ReplaceAll(lease, "\n", " "))
	// Every host's claims on the lock, where the backend keeps them
	// (gcs: one read of the lock's object).
	ctx, cancel := context.WithTimeout(context.Background(), claimsTimeout)
	claims, err := n.c.engine.Claims(ctx, id)
	cancel()
	if err != nil {
		fmt.Fprintf(&b, "claims unknown %s\n", strconv.Quote(err.Error()))
	}
	for _, c := range claims {
		fmt.Fprintf(&b, "claim %s\n", strings.ReplaceAll(c.String(), "\n", " "))
	}
	return b.Bytes()
}

// claimsTimeout bounds the backend read behind the claim lines of a status
// read.
const claimsTimeout = 3 * time.Second

// waiterLine renders one waiter; visible says whether the reader may see
// its identity.
func waiterLine(w lockmgr.Waiter, visible bool) string {
	f := []string{"waiter"}
	if visible {
		f = append(f,
			"pid="+strconv.Itoa(w.Process.PID),
			"uid="+strconv.FormatUint(uint64(w.UID), 10),
		)
	}
	f = append(f, "mode="+w.Mode.String())
	if visible {
		f = append(f, "since="+w.Since.UTC().Format(time.RFC3339))
	}
	if w.Implicit {
		f = append(f, "for="+lockmgr.QuoteName(w.Wants.String()), "for_mode="+w.WantsMode.String())
	}
	if w.Outside {
		f = append(f, "outside", "blocker="+strconv.Quote(w.Blocker))
	}
	if !visible {
		f = append(f, "hidden")
	}
	return strings.Join(f, " ")
}

// holderLine renders one holder; visible says whether the reader may see
// its identity, you whether the reader holds through this descriptor.
func holderLine(h lockmgr.Holder, visible, you bool, note string) string {
	mode := h.Mode
	if !h.Explicit {
		mode = lockmgr.Shared
	}
	f := []string{"holder"}
	if visible {
		f = append(f,
			"host="+h.Host,
			"pid="+strconv.Itoa(h.Process.PID),
			"uid="+strconv.FormatUint(uint64(h.UID), 10),
			"mode="+mode.String(),
			"since="+h.Since.UTC().Format(time.RFC3339),
			"token="+strconv.FormatUint(h.Token, 10),
		)
	} else {
		f = append(f, "mode="+mode.String())
	}
	if h.Explicit {
		f = append(f, "explicit")
	}
	if h.Implicit > 0 {
		f = append(f, "implicit="+strconv.Itoa(h.Implicit))
	}
	if you {
		f = append(f, "you")
	}
	if h.Lost != nil {
		f = append(f, "lost="+strconv.Quote(h.Lost.Error()))
	}
	if !visible {
		f = append(f, "hidden")
	} else if note != "" {
		f = append(f, "note="+strconv.Quote(strings.TrimSuffix(note, "\n")))
	}
	return strings.Join(f, " ")
}
