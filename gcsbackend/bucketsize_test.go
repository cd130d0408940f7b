package gcsbackend_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"cloud.google.com/go/storage"

	"github.com/lockfs/lockfs/gcsbackend"
	"github.com/lockfs/lockfs/gcsbackend/gcstest"
	"github.com/lockfs/lockfs/internal/testutil"
	"github.com/lockfs/lockfs/lockmgr"
)

// longPath returns a directory path under dir whose lock objects' names are
// longer than GCS's 1024 bytes.
func longPath(dir string, i int) string {
	return fmt.Sprintf("%s/%s/n%d", dir, strings.TrimSuffix(strings.Repeat(strings.Repeat("x", 200)+"/", 6), "/"), i)
}

// fill uploads n objects that no claim on directory "d" has to see, under
// prefix: a third short-named lock objects of other directories, a third
// long-named ones of other directories, a third named as long-named locks
// were before they moved under their directory (PREFIX/locks-long/...).
func fill(t *testing.T, emu *gcstest.Emulator, prefix string, n int) {
	t.Helper()
	bucket := emu.Client(t).Bucket(emu.Bucket)
	ctx := ctxT(t, 5*time.Minute)
	var (
		next atomic.Int64
		wg   sync.WaitGroup
		errs = make(chan error, 16)
	)
	for w := 0; w < 16; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1) - 1); i < n; i = int(next.Add(1) - 1) {
				var name string
				switch i % 3 {
				case 0:
					name = prefix + fmt.Sprintf("locks/other/k%d/.lock", i)
				case 1:
					var err error
					if name, err = gcsbackend.ObjectNameForTest(prefix, dirLock(longPath("other", i))); err != nil {
						errs <- err
						return
					}
				default:
					sum := sha256.Sum256([]byte(fmt.Sprint(i)))
					name = prefix + "locks-long/" + hex.EncodeToString(sum[:]) + "/.lock"
				}
				w := bucket.Object(name).NewWriter(ctx)
				w.ChunkSize = 0
				body := []byte("{}\n")
				gcstest.SendCRC32C(w, body)
				w.Write(body)
				if err := w.Close(); err != nil {
					errs <- fmt.Errorf("upload %s: %w", name, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// An exclusive claim on a directory costs the same requests whether the
// bucket holds 10 or 10,000 objects it need not see (long-named locks of
// other directories among them), and the listing counts its pages. The
// control lists PREFIX/locks-long/ as every such claim did before
// long-named locks moved under their directory: with 3,333 objects there,
// each of its two listings (scan and verify) takes 4 pages instead of 1.
func TestClaimCostFlatInBucketSize(t *testing.T) {
	testutil.CheckGoroutinesOf(t, "github.com/lockfs/lockfs/gcsbackend")
	emu := gcstest.Start(t)
	claimCost := func(n int, legacy bool) gcsbackend.Stats {
		t.Helper()
		prefix := fmt.Sprintf("test/%s/n%d-%v/", t.Name(), n, legacy)
		fill(t, emu, prefix, n)
		// The default TTL, for requests of up to 5 s: a page of the
		// control's listing can take longer than the 1 s that testTTL
		// gives one under -race on a busy machine.
		b := newBackend(t, emu, func(c *gcsbackend.Config) {
			c.Prefix, c.TTL, c.UnavailableAfter = prefix, 30*time.Second, time.Minute
			// The bell's poll is no part of a claim: none within the
			// window (seen once under load: 4 reads against 3).
			c.WantPoll = time.Hour
		})
		b.SetListLegacyLong(legacy)
		ctx := ctxT(t, 2*time.Minute)
		// The session first, so that only the claim is counted.
		if _, err := b.Claim(ctx, dirLock("s"), lockmgr.Shared, false); err != nil {
			t.Fatal(err)
		}
		s0 := b.Stats()
		// With wait: the control's listings of thousands of objects
		// can take longer than a claim without wait may (3 s) under -race.
		l, err := b.Claim(ctx, dirLock("d"), lockmgr.Exclusive, true)
		if err != nil {
			t.Fatal(err)
		}
		d := b.Stats().Sub(s0)
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		t.Logf("%d objects (legacy listing %v): exclusive claim of d: %d reads, %d lists, %d writes", n, legacy, d.Reads, d.Lists, d.Writes)
		return d
	}
	small, big := claimCost(10, false), claimCost(10000, false)
	if small.Reads != big.Reads || small.Lists != big.Lists || small.Writes != big.Writes {
		t.Errorf("claim with 10 objects: %d reads, %d lists, %d writes; with 10,000: %d, %d, %d; want the same",
			small.Reads, small.Lists, small.Writes, big.Reads, big.Lists, big.Writes)
	}
	cSmall, cBig := claimCost(10, true), claimCost(10000, true)
	// At least: a claim that took longer scans again.
	if got := cBig.Lists - cSmall.Lists; got < 2*3 {
		t.Errorf("control: the listing of locks-long/ with 3,333 objects took %d more pages than with 3, want at least 6 (scan and verify, 4 pages each)", got)
	}
}

// A long-named lock inside a directory, held by another host, keeps an
// exclusive claim on the directory out, both where the directory's own
// name leaves room for the long-named locks below it (they are listed with
// it) and where it does not (they are under its deepest ancestor that
// does, listed and filtered). Control: the claim on a sibling directory is
// granted.
func TestLongNamedLocksInsideADirectory(t *testing.T) {
	testutil.CheckGoroutinesOf(t, "github.com/lockfs/lockfs/gcsbackend")
	emu := gcstest.Start(t)
	a, b := newBackend(t, emu, nil), newBackend(t, emu, nil)
	ctx := ctxT(t, time.Minute)
	deep := longPath("t2", 0) + "/" + strings.Repeat("y", 100) // its own prefix leaves no room
	for _, c := range []struct{ dir, sibling string }{
		{"t1", "u1"},
		{deep, deep + "-sibling"},
	} {
		inner := lockmgr.LockID{Path: longPath(c.dir, 1), Kind: lockmgr.KindNewDir}
		name := b.ObjectName(inner)
		if len(name) > 1024 || !strings.Contains(name, "/~long/") {
			t.Fatalf("%v: object %q (%d bytes), want a long name of at most 1024", inner, name, len(name))
		}
		held, err := b.Claim(ctx, inner, lockmgr.Exclusive, false)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := a.Claim(ctx, dirLock(c.dir), lockmgr.Exclusive, false); !errors.Is(err, lockmgr.ErrWouldBlock) {
			t.Errorf("exclusive claim of %.40s... while another host holds %.40s...: %v, want ErrWouldBlock", c.dir, inner.Path, err)
		}
		l, err := a.Claim(ctx, dirLock(c.sibling), lockmgr.Exclusive, false)
		if err != nil {
			t.Errorf("control: the sibling %.40s...: %v", c.sibling, err)
		} else if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if err := held.Release(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	// The long-named objects sit under their directories, not in one
	// listing shared by the whole bucket.
	it := emu.Client(t).Bucket(emu.Bucket).Objects(ctx, &storage.Query{Prefix: "test/" + t.Name() + "/locks-long/"})
	if o, err := it.Next(); err == nil {
		t.Errorf("object %s under locks-long/", o.Name)
	}
}
