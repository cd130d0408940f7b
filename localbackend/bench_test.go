package localbackend

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/lockfs/lockfs/lockmgr"
)

// BenchmarkClaimRelease measures an uncontended claim and release: openat2,
// fstat, flock and close, plus bookkeeping.
func BenchmarkClaimRelease(b *testing.B) {
	for _, mode := range []lockmgr.Mode{lockmgr.Shared, lockmgr.Exclusive} {
		b.Run(mode.String(), func(b *testing.B) {
			be := newBackend(b, b.TempDir())
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				l, err := be.Claim(ctx, dirID("."), mode, true)
				if err != nil {
					b.Fatal(err)
				}
				l.Release(ctx)
			}
		})
	}
}

// BenchmarkConvert measures an uncontended upgrade and downgrade pair.
func BenchmarkConvert(b *testing.B) {
	be := newBackend(b, b.TempDir())
	ctx := context.Background()
	l, err := be.Claim(ctx, dirID("."), lockmgr.Shared, false)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if err := l.Convert(ctx, lockmgr.Exclusive, true); err != nil {
			b.Fatal(err)
		}
		if err := l.Convert(ctx, lockmgr.Shared, false); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkNextToken measures an uncontended token increment (no fdatasync).
func BenchmarkNextToken(b *testing.B) {
	be := newBackend(b, b.TempDir())
	ctx := context.Background()
	l, err := be.Claim(ctx, dirID("."), lockmgr.Exclusive, false)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := l.NextToken(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkPairDepth4 measures the backend's part of a depth-4 lock pair
// (four shared ancestors and the exclusive lock, claimed and released as
// the engine does), with the shared claims kept (keep.go) and without, and
// a depth-0 pair (one exclusive claim) for reference.
func BenchmarkPairDepth4(b *testing.B) {
	ctx := context.Background()
	for _, c := range []struct {
		name string
		keep time.Duration
		path []string
	}{
		{"kept", 0, []string{".", "a", "a/b", "a/b/c", "a/b/c/d"}},
		{"notkept", -1, []string{".", "a", "a/b", "a/b/c", "a/b/c/d"}},
		{"depth0", 0, []string{"."}},
	} {
		b.Run(c.name, func(b *testing.B) {
			src := b.TempDir()
			if err := os.MkdirAll(filepath.Join(src, "a/b/c/d"), 0o755); err != nil {
				b.Fatal(err)
			}
			be, err := New(Config{Source: src, KeepShared: c.keep})
			if err != nil {
				b.Fatal(err)
			}
			defer be.Close()
			ls := make([]lockmgr.Lease, len(c.path))
			for b.Loop() {
				for i, p := range c.path {
					mode := lockmgr.Shared
					if i == len(c.path)-1 {
						mode = lockmgr.Exclusive
					}
					if ls[i], err = be.Claim(ctx, dirID(p), mode, false); err != nil {
						b.Fatal(err)
					}
				}
				for i := len(ls) - 1; i >= 0; i-- {
					ls[i].Release(ctx)
				}
			}
		})
	}
}
