package localbackend

import (
	"context"
	"testing"

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
