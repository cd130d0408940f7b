package lockmgr

import (
	"context"
	"fmt"
	"runtime"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"
)

// The engine's own cost, over the in-memory backend and a fake process
// tree: what the protocol adds before any kernel or network work.

func benchPath(depth int) string {
	parts := make([]string, depth)
	for i := range parts {
		parts[i] = fmt.Sprintf("d%d", i)
	}
	return strings.Join(parts, "/")
}

func BenchmarkAcquireRelease(b *testing.B) {
	for _, depth := range []int{1, 4, 16} {
		b.Run(fmt.Sprintf("depth=%d", depth), func(b *testing.B) {
			tree, host := newFakeTree(), newMemHost()
			host.noDone = true // like the local backend: no lease watcher
			tree.add(100, 1)
			e := newTestEngine(b, tree, host)
			defer e.Close()
			ctx := context.Background()
			req := Request{Lock: LockID{Path: benchPath(depth), Kind: KindDir}, Mode: Exclusive, Owner: Owner{OwnerFile, 1}, TID: 100}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if _, err := e.Acquire(ctx, req); err != nil {
					b.Fatal(err)
				}
				if err := e.Release(ctx, req.Lock, req.Owner); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkAcquireWithHeld: acquire+release of one more lock while n
// others are held on distinct directories (all sharing the root).
func BenchmarkAcquireWithHeld(b *testing.B) {
	for _, n := range []int{100, 100000} {
		b.Run(fmt.Sprintf("held=%d", n), func(b *testing.B) {
			tree, host := newFakeTree(), newMemHost()
			host.noDone = true
			tree.add(100, 1)
			e := newTestEngine(b, tree, host)
			defer e.Close()
			ctx := context.Background()
			for i := 0; i < n; i++ {
				if _, err := e.Acquire(ctx, Request{Lock: LockID{Path: fmt.Sprintf("h%d/x", i), Kind: KindDir}, Mode: Exclusive,
					Owner: Owner{OwnerFile, uint64(i + 10)}, TID: 100}); err != nil {
					b.Fatal(err)
				}
			}
			req := Request{Lock: LockID{Path: "q/x", Kind: KindDir}, Mode: Exclusive, Owner: Owner{OwnerFile, 1}, TID: 100}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if _, err := e.Acquire(ctx, req); err != nil {
					b.Fatal(err)
				}
				if err := e.Release(ctx, req.Lock, req.Owner); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
		})
	}
}

// BenchmarkHandoff: 8 waiters take turns on one exclusive lock; reports the
// time from a Release to the next holder's grant (p50, p99).
func BenchmarkHandoff(b *testing.B) {
	tree, host := newFakeTree(), newMemHost()
	const waiters = 8
	for i := 0; i < waiters; i++ {
		tree.add(100+i, 1)
	}
	e := newTestEngine(b, tree, host)
	defer e.Close()
	ctx := context.Background()
	id := LockID{Path: "a", Kind: KindDir}
	var (
		mu        sync.Mutex
		released  time.Time
		latencies []time.Duration
		remaining = b.N
	)
	b.ResetTimer()
	var wg sync.WaitGroup
	for i := 0; i < waiters; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			owner := Owner{OwnerFile, uint64(i + 1)}
			for {
				if _, err := e.Acquire(ctx, Request{Lock: id, Mode: Exclusive, Owner: owner, TID: 100 + i, Wait: true}); err != nil {
					b.Error(err)
					return
				}
				now := time.Now()
				mu.Lock()
				if !released.IsZero() {
					latencies = append(latencies, now.Sub(released))
				}
				remaining--
				done := remaining <= 0
				released = time.Now()
				mu.Unlock()
				if err := e.Release(ctx, id, owner); err != nil {
					b.Error(err)
					return
				}
				if done {
					return
				}
			}
		}(i)
	}
	wg.Wait()
	b.StopTimer()
	// The remaining waiters are still queued: Close wakes them.
	sort.Slice(latencies, func(i, j int) bool { return latencies[i] < latencies[j] })
	if len(latencies) > 0 {
		b.ReportMetric(float64(latencies[len(latencies)/2].Nanoseconds()), "p50-ns")
		b.ReportMetric(float64(latencies[len(latencies)*99/100].Nanoseconds()), "p99-ns")
	}
}

// BenchmarkHeld100k: memory for 100,000 locks held on distinct
// directories, reported as bytes per lock (engine and in-memory backend).
func BenchmarkHeld100k(b *testing.B) {
	for i := 0; i < b.N; i++ {
		if i > 0 {
			break // one round is the measurement; more only repeat it
		}
		tree, host := newFakeTree(), newMemHost()
		host.noDone = true // like the local backend: no watcher per lease
		tree.add(100, 1)
		e := newTestEngine(b, tree, host)
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		ctx := context.Background()
		const n = 100000
		for j := 0; j < n; j++ {
			if _, err := e.Acquire(ctx, Request{Lock: LockID{Path: fmt.Sprintf("h%d", j), Kind: KindDir}, Mode: Exclusive,
				Owner: Owner{OwnerFile, uint64(j + 1)}, TID: 100}); err != nil {
				b.Fatal(err)
			}
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapInuse-before.HeapInuse)/n, "B/lock")
		b.ReportMetric(float64(after.HeapInuse-before.HeapInuse)/(1<<20), "MiB")
		e.Close()
	}
}
