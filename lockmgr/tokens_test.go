package lockmgr_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/lockfs/lockfs/lockmgr"
)

// Deferred fencing tokens (lockmgr/tokens.go), over the local backend,
// whose counter is the first line of the backing file: a grant that
// defers its token leaves the file alone until the token is read.

// counter reads the token counter of dir's lock in SOURCE src (0 when the
// file is empty or absent).
func counter(t *testing.T, src, dir string) uint64 {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(src, dir, "..LOCK"))
	if errors.Is(err, os.ErrNotExist) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	line, _, _ := strings.Cut(string(b), "\n")
	if strings.TrimSpace(line) == "" {
		return 0
	}
	v, err := strconv.ParseUint(strings.TrimSpace(line), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func deferred(r lockmgr.Request) lockmgr.Request {
	r.DeferToken = true
	return r
}

// holderToken is the token Status shows for owner's explicit hold on dir.
func holderToken(t *testing.T, e *lockmgr.Engine, dir string, owner uint64) uint64 {
	t.Helper()
	for _, h := range e.StatusTokens(lockmgr.LockID{Path: dir, Kind: lockmgr.KindDir}).Holders {
		if h.Explicit && h.Owner.ID == owner {
			return h.Token
		}
	}
	t.Fatalf("no explicit holder %d on %s", owner, dir)
	return 0
}

func TestDeferredTokenIsIssuedWhenRead(t *testing.T) {
	src := t.TempDir()
	mkdirs(t, src, "a")
	e := newLocalEngine(t, src)
	ctx := context.Background()
	id := lockmgr.LockID{Path: "a", Kind: lockmgr.KindDir}
	owner := lockmgr.Owner{Class: lockmgr.OwnerFile, ID: 1}

	pair := func(r lockmgr.Request) lockmgr.Grant {
		t.Helper()
		g, err := e.Acquire(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		if err := e.Release(ctx, id, owner); err != nil {
			t.Fatal(err)
		}
		return g
	}
	// Control: a grant that does not defer bumps the counter each time.
	for i := 1; i <= 3; i++ {
		if g := pair(req("a", lockmgr.Exclusive, 1, false)); g.Token != uint64(i) {
			t.Fatalf("eager grant %d: token %d", i, g.Token)
		}
	}
	if c := counter(t, src, "a"); c != 3 {
		t.Fatalf("after 3 eager grants the counter is %d, want 3", c)
	}
	// Deferred grants that nobody reads leave it alone.
	for i := 0; i < 5; i++ {
		if g := pair(deferred(req("a", lockmgr.Exclusive, 1, false))); g.Token != 0 {
			t.Fatalf("deferred grant carries token %d, want 0", g.Token)
		}
		pair(deferred(req("a", lockmgr.Shared, 1, false)))
	}
	if c := counter(t, src, "a"); c != 3 {
		t.Fatalf("after 10 unread deferred grants the counter is %d, want 3", c)
	}

	// A deferred grant read by StatusTokens gets the next token, once.
	if _, err := e.Acquire(ctx, deferred(req("a", lockmgr.Exclusive, 1, false))); err != nil {
		t.Fatal(err)
	}
	for _, h := range e.Status(id).Holders {
		if h.Token != 0 {
			t.Fatalf("Status (which issues nothing) shows token %d", h.Token)
		}
	}
	if c := counter(t, src, "a"); c != 3 {
		t.Fatalf("counter %d before the read, want 3", c)
	}
	if tok := holderToken(t, e, "a", 1); tok != 4 {
		t.Fatalf("StatusTokens shows token %d, want 4", tok)
	}
	if tok := holderToken(t, e, "a", 1); tok != 4 {
		t.Fatalf("second StatusTokens shows token %d, want 4 again", tok)
	}
	if tok, err := e.Token(id, owner); err != nil || tok != 4 {
		t.Fatalf("Token = %d, %v; want 4", tok, err)
	}
	if c := counter(t, src, "a"); c != 4 {
		t.Fatalf("counter %d after the reads, want 4", c)
	}
	// Asking again in the same mode without deferring gives the token.
	if g, err := e.Acquire(ctx, req("a", lockmgr.Exclusive, 1, false)); err != nil || g.Token != 4 {
		t.Fatalf("same-mode acquire = %d, %v; want 4", g.Token, err)
	}
	if err := e.Release(ctx, id, owner); err != nil {
		t.Fatal(err)
	}

	// Token issues a due token itself; SnapshotTokens issues every due
	// one, and Snapshot none.
	if _, err := e.Acquire(ctx, deferred(req("a", lockmgr.Shared, 1, false))); err != nil {
		t.Fatal(err)
	}
	if tok, err := e.Token(id, owner); err != nil || tok != 5 {
		t.Fatalf("Token of a due grant = %d, %v; want 5", tok, err)
	}
	if _, err := e.Acquire(ctx, deferred(req("a", lockmgr.Shared, 2, false))); err != nil {
		t.Fatal(err)
	}
	tokens := func(sts []lockmgr.LockStatus) map[uint64]uint64 {
		m := map[uint64]uint64{}
		for _, st := range sts {
			if st.Lock == id {
				for _, h := range st.Holders {
					m[h.Owner.ID] = h.Token
				}
			}
		}
		return m
	}
	if m := tokens(e.Snapshot()); m[1] != 5 || m[2] != 0 {
		t.Fatalf("Snapshot tokens %v, want 1:5 and 2:0 (not issued)", m)
	}
	if m := tokens(e.SnapshotTokens(nil)); m[1] != 5 || m[2] != 6 {
		t.Fatalf("SnapshotTokens tokens %v, want 1:5 and 2:6", m)
	}
	if _, err := e.Token(lockmgr.LockID{Path: "a", Kind: lockmgr.KindDir}, lockmgr.Owner{Class: lockmgr.OwnerFile, ID: 3}); !errors.Is(err, lockmgr.ErrNotHeld) {
		t.Fatalf("Token of an owner with no hold: %v, want ErrNotHeld", err)
	}
}

// A token read late is still newer than every token handed out before the
// grant, by this engine or another over the same SOURCE, and older than
// every later one.
func TestDeferredTokensStillFence(t *testing.T) {
	src := t.TempDir()
	mkdirs(t, src, "a")
	e1 := newLocalEngine(t, src)
	e2 := newLocalEngine(t, src)
	ctx := context.Background()
	id := lockmgr.LockID{Path: "a", Kind: lockmgr.KindDir}
	owner := lockmgr.Owner{Class: lockmgr.OwnerFile, ID: 1}
	var last uint64
	for i := 0; i < 6; i++ {
		e, other := e1, e2
		if i%2 == 1 {
			e, other = e2, e1
		}
		// An unread deferred grant on one engine...
		if _, err := other.Acquire(ctx, deferred(req("a", lockmgr.Exclusive, 1, false))); err != nil {
			t.Fatal(err)
		}
		if err := other.Release(ctx, id, owner); err != nil {
			t.Fatal(err)
		}
		// ...then a deferred grant read late on the other.
		if _, err := e.Acquire(ctx, deferred(req("a", lockmgr.Exclusive, 1, false))); err != nil {
			t.Fatal(err)
		}
		tok := holderToken(t, e, "a", 1)
		if tok <= last {
			t.Fatalf("round %d: token %d after %d", i, tok, last)
		}
		last = tok
		if err := e.Release(ctx, id, owner); err != nil {
			t.Fatal(err)
		}
	}
	g, err := e2.Acquire(ctx, req("a", lockmgr.Exclusive, 1, false))
	if err != nil {
		t.Fatal(err)
	}
	if g.Token <= last {
		t.Fatalf("eager token %d after deferred %d", g.Token, last)
	}
}

// A hold lost before anybody read its token never gets one: a late reading
// must not hand a broken holder a token newer than its successor's.
func TestLostHoldGetsNoDeferredToken(t *testing.T) {
	src := t.TempDir()
	mkdirs(t, src, "a", "b", "c")
	e := newLocalEngine(t, src)
	ctx := context.Background()
	dirID := func(p string) lockmgr.LockID { return lockmgr.LockID{Path: p, Kind: lockmgr.KindDir} }
	own := func(n uint64) lockmgr.Owner { return lockmgr.Owner{Class: lockmgr.OwnerFile, ID: n} }
	// Owner 1 holds a, and c shared with owner 3; owner 2 holds b.
	// Breaking a ends every hold of owner 1: a's claim is given back, c's
	// stays for owner 3 (so its lease could still issue owner 1 a token),
	// and owner 2 keeps b.
	for _, r := range []lockmgr.Request{req("a", lockmgr.Exclusive, 1, false), req("c", lockmgr.Shared, 1, false),
		req("c", lockmgr.Shared, 3, false), req("b", lockmgr.Exclusive, 2, false)} {
		if _, err := e.Acquire(ctx, deferred(r)); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.Break(ctx, dirID("a")); err != nil {
		t.Fatal(err)
	}
	for _, st := range e.SnapshotTokens(nil) {
		for _, h := range st.Holders {
			if h.Owner == own(1) && h.Token != 0 {
				t.Fatalf("lost hold on %s shows token %d", st.Lock, h.Token)
			}
		}
	}
	for _, dir := range []string{"a", "c"} {
		if tok, err := e.Token(dirID(dir), own(1)); err == nil {
			t.Fatalf("Token of the lost hold on %s = %d", dir, tok)
		}
	}
	// Only the holds that were not lost got tokens (control: they did).
	if tok, err := e.Token(dirID("b"), own(2)); err != nil || tok != 1 {
		t.Fatalf("Token of the hold kept on b = %d, %v; want 1", tok, err)
	}
	if tok, err := e.Token(dirID("c"), own(3)); err != nil || tok != 1 {
		t.Fatalf("Token of the hold kept on c = %d, %v; want 1", tok, err)
	}
	for dir, want := range map[string]uint64{"a": 0, "b": 1, "c": 1} {
		if c := counter(t, src, dir); c != want {
			t.Fatalf("counter of %s is %d, want %d", dir, c, want)
		}
	}
}

// Readers racing for one due token issue it once.
func TestConcurrentReadersIssueOneToken(t *testing.T) {
	src := t.TempDir()
	mkdirs(t, src, "a")
	e := newLocalEngine(t, src)
	ctx := context.Background()
	if _, err := e.Acquire(ctx, deferred(req("a", lockmgr.Shared, 1, false))); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	got := make([]uint64, 8)
	for i := range got {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if i%2 == 0 {
				got[i], _ = e.Token(lockmgr.LockID{Path: "a", Kind: lockmgr.KindDir}, lockmgr.Owner{Class: lockmgr.OwnerFile, ID: 1})
				return
			}
			for _, h := range e.StatusTokens(lockmgr.LockID{Path: "a", Kind: lockmgr.KindDir}).Holders {
				got[i] = h.Token
			}
		}()
	}
	wg.Wait()
	for i, tok := range got {
		if tok != 1 {
			t.Fatalf("reader %d saw token %d, want 1 (all: %v)", i, tok, got)
		}
	}
	if c := counter(t, src, "a"); c != 1 {
		t.Fatalf("counter %d after 8 racing readers, want 1", c)
	}
}

// A hold whose explicit part is released while it stays for a lock below
// has no token to issue.
func TestImplicitHoldGetsNoDeferredToken(t *testing.T) {
	src := t.TempDir()
	mkdirs(t, src, "a/b")
	e := newLocalEngine(t, src)
	ctx := context.Background()
	a := lockmgr.LockID{Path: "a", Kind: lockmgr.KindDir}
	owner := lockmgr.Owner{Class: lockmgr.OwnerFile, ID: 1}
	for _, dir := range []string{"a", "a/b"} {
		if _, err := e.Acquire(ctx, deferred(req(dir, lockmgr.Shared, 1, false))); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.Release(ctx, a, owner); err != nil {
		t.Fatal(err)
	}
	// Owner 1 now holds a only on behalf of a/b.
	st := e.StatusTokens(a)
	if len(st.Holders) != 1 || st.Holders[0].Explicit || st.Holders[0].Token != 0 {
		t.Fatalf("a after its explicit release: %+v, want one implicit holder without a token", st.Holders)
	}
	if c := counter(t, src, "a"); c != 0 {
		t.Fatalf("counter of a is %d after reading an implicit hold, want 0", c)
	}
	// Control: taken explicitly again, its token is issued at the read.
	if _, err := e.Acquire(ctx, deferred(req("a", lockmgr.Shared, 1, false))); err != nil {
		t.Fatal(err)
	}
	if tok := holderToken(t, e, "a", 1); tok != 1 {
		t.Fatalf("token of a taken again: %d, want 1", tok)
	}
}
