// Package bench is lockfs's benchmark harness: `make bench` runs it through
// cmd/lockfs-bench, and TestSmoke runs every measurement at tiny sizes
// inside `make test` so that it cannot rot.
//
// # What it measures
//
// Every figure is measured side by side with a reference in the same run,
// on the same machine: lockfs against a no-op bazil daemon (the FUSE
// transport floor), against a tmpfs file (the kernel), against a 50 ms
// polling loop (the protocol lockfs replaces), against SOURCE itself and
// against go-fuse's loopback file system. The two sides of a comparison
// run alternately (A B, then B A, ...) within each repetition, and a ratio
// is computed per repetition, so that the noise of a shared two-core VM
// hits both sides alike; the reported ratio is the median of the
// per-repetition ratios, with their minimum and maximum.
//
// The load itself comes from separate processes: bench/internal/loadgen
// (flock loops, hand-offs, held locks, file I/O), built by the harness with
// `go build` together with bench/internal/noopfs, bench/internal/loopback
// and cmd/lockfs. The GCS request counts are taken in process, with a
// lockmgr.Engine over gcsbackend, against the GCS emulator (gcsemu, forked
// under third_party/; gcsbackend/gcstest) behind gcsbackend/faultproxy,
// which counts requests by kind and by object and can enforce GCS's
// per-object write limit and add latency. The fleet figures run many such
// hosts in this process (gcsfleet: 16 hosts under the write limit). The
// scale measurements run only with Config.Scale (make bench-scale): gcssim
// runs 1,000 hosts holding 100 locks each in helper processes (this binary
// re-executed, simhosts.go), counting requests in their backends; etcdsim
// the same hosts on one etcd member, counting requests at the member (its
// gRPC metrics) and in the backends; and gcsheld holds 100,000 locks through a `lockfs mount --backend gcs`
// daemon. The takeover figure kills the holder
// host's `lockfs mount --backend gcs` daemon with SIGKILL while a second
// daemon's client waits; with a lockfs binary that lacks the gcs backend,
// the holder host is a re-executed copy of the harness binary instead.
//
// # Output
//
// Run returns Results: named numbers, written as one JSON object
// (bench/results.json) and printed as a table of
// name | lockfs | reference | ratio | goal | met?. See docs/BENCHMARKS.md
// for the definitions of the keys and the latest figures.
//
// # Cleanup
//
// Every daemon the harness starts is stopped with SIGTERM (SIGKILL after a
// grace period) and its mount point detached with `fusermount3 -uz`, on
// success, on error and on panic alike; every helper process is killed and
// reaped; the work directory is removed.
package bench
