package main

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"strconv"
	"time"

	"github.com/sirupsen/logrus"
)

// Daemon tuning for sequential reads, measured on the development VM with
// a 256 MiB read through the mount (docs/BENCHMARKS.md): the readahead
// takes it from about 300 to 480 MB/s, the GC ballast from 480 to 650.

// defaultReadaheadKB is the kernel readahead lockfs asks for a mount: with
// the FUSE default of 128 KiB the kernel reads a file through the mount
// 128 KiB at a time, one READ after the other. Each READ may be 1 MiB
// (the fork's max_pages, PATCHES.md 2); a 4 MiB window keeps up to four
// in flight, which the daemon's readers serve in parallel from SOURCE.
// It matters only without passthrough (passthrough reads use SOURCE's own
// readahead). Against 1 MiB, `lockfs-bench -only seq` read a cold 256 MiB
// file through a --passthrough=off mount at 286 and 274 MB/s against 238
// and 238 (docs/BENCHMARKS.md "Without passthrough").
const defaultReadaheadKB = 4096

// setReadahead sets the readahead of the mount at mountpoint to kb KiB
// through /sys/class/bdi/MAJ:MIN/read_ahead_kb. The kernel takes the
// FUSE handshake's value when the mount starts (bazil's Mount finishes the
// handshake before it returns), so this is done after it. It needs root;
// kb = 0 leaves the kernel's value.
func setReadahead(mountpoint string, kb int) error {
	if kb == 0 {
		return nil
	}
	ms, err := mountsAt(mountpoint)
	if err != nil {
		return err
	}
	if len(ms) == 0 || ms[len(ms)-1].Type != "fuse.lockfs" {
		return fmt.Errorf("no lockfs mount at %s in /proc/self/mountinfo", mountpoint)
	}
	p := filepath.Join("/sys/class/bdi", ms[len(ms)-1].Dev, "read_ahead_kb")
	if err := os.WriteFile(p, []byte(strconv.Itoa(kb)), 0); err != nil {
		return fmt.Errorf("setting readahead: %w", err)
	}
	return nil
}

// tuneReadahead is setReadahead that logs, once, rather than fails: a
// mount without it works, only slower for sequential reads.
func tuneReadahead(mountpoint string, kb int, log logrus.FieldLogger) {
	if err := setReadahead(mountpoint, kb); err != nil {
		log.WithError(err).WithField("readahead_kb", kb).
			Warn("could not raise the kernel readahead of the mount; sequential reads will be slower (it needs root; --readahead-kb 0 turns this off)")
	}
}

// gcBallastSize is the size of a pointer-free allocation the daemon keeps,
// untouched, for its whole life. Go's collector runs when the heap has
// grown by GOGC % (100) over the live heap. The daemon's live heap is a few
// MiB, while every 128 KiB FUSE read makes bazil allocate two fresh 128 KiB
// buffers: the collector ran every ~16 reads. Counted as live, the ballast
// spaces collections ~16 MiB of allocation apart, whatever the real live
// heap. Fresh from the OS and never written, its pages are never resident:
// it costs address space, not memory. (A memory limit would not help: it
// makes collections more frequent, not less.) Measured: a cold 256 MiB read
// 480 -> 650 MB/s; RSS after it 44 -> 59 MiB; idle RSS unchanged.
const gcBallastSize = 16 << 20

// newGCBallast allocates the ballast; keep it reachable (runtime.KeepAlive)
// for as long as the daemon serves.
func newGCBallast() []byte { return make([]byte, gcBallastSize) }

// readerPs is how many Ps beyond the CPUs lockfs mount gives the Go
// runtime (GOMAXPROCS), one per reader the bazil fork keeps waiting in
// read(2) on /dev/fuse (fs.maxIdleReaders there: 4). A goroutine blocked
// in a system call keeps its P. With GOMAXPROCS at the CPU count (2 here)
// two waiting readers hold every P, and Go's sysmon takes one back from a
// reader blocked for more than 20 µs and wakes a thread to look for other
// work, which it does not find: on nearly every lock request
// (docs/BENCHMARKS.md "Lock pair"). With a P to spare,
// sysmon leaves blocked readers alone for 10 ms.
const readerPs = 4

// raiseGOMAXPROCS adds readerPs to the runtime's GOMAXPROCS, unless the
// GOMAXPROCS environment variable sets it.
func raiseGOMAXPROCS() {
	if os.Getenv("GOMAXPROCS") != "" {
		return
	}
	runtime.GOMAXPROCS(runtime.GOMAXPROCS(0) + readerPs)
}

// Go's collector lets the heap grow, between collections, by GOGC % of the
// live heap plus the goroutine stacks and globals. A daemon's stacks are
// mostly its waiting lock requests, one goroutine of 8 KiB each, which
// allocate nothing while they wait: 10,000 of them made the collector let
// 80 MiB more garbage pile up, and the drain of 10,000 waiters peaked at
// 253 MiB RSS (bench drain_10k_rss_mb). And a daemon holding many locks
// has a large live heap (about 5 KiB per held lock) but, once they are
// taken, allocates little: GOGC 100 let the heap of one holding 100,000
// locks on gcs grow by another 500 MiB of garbage, an RSS twice its live
// heap (bench held_100k_rss_mb).
//
// trackMemoryLimit sets a soft memory limit that leaves the heap room to
// grow by what it allocates, not by what it keeps: the room is what the
// daemon would allocate in allocWindow at the highest rate it allocated
// at over the last allocLookback, at least minHeapHeadroom and at most the
// live heap (GOGC 100's room). The stacks are counted once, as what they
// are. A busy daemon (a sequential read allocates hundreds of MB/s) is at
// GOGC 100, an idle large one keeps little garbage, one whose live heap
// (ballast included) is under minHeapHeadroom is where it was.
//
// So that the collector cannot thrash: a collection costs CPU in
// proportion to the live heap it marks, and collections come no more often
// than GOGC 100 would have them, or once per allocWindow at the daemon's
// recent peak rate, or once per minHeapHeadroom allocated, whichever is
// the least often. A burst after a quiet allocLookback starts with
// minHeapHeadroom's room for up to one look (memoryLimitEvery), Go's
// limiter capping the collector at half the CPU meanwhile. It is left off
// when GOGC or GOMEMLIMIT is set.

// memoryLimitEvery is how often the limit follows the live heap, the
// stacks and the allocation rate. A heap that grows faster meanwhile makes
// collections more frequent until the next look, the limiter capping them
// at half the CPU.
const memoryLimitEvery = 500 * time.Millisecond

// allocWindow is how long the heap has room to allocate for at the
// recent peak rate: at a steady rate, one collection per allocWindow.
// Each collection marks the whole live heap: at 1 s, a daemon taking
// 100,000 locks on gcs kept half the RSS (378 against 714 MiB) but used
// 55 % more CPU (docs/BENCHMARKS.md "Held locks").
const allocWindow = 10 * time.Second

// allocLookback is how far back the peak rate is taken: once the daemon
// has been quiet that long (the set-up of many locks done), the room
// shrinks and the garbage of the burst is returned to the OS.
const allocLookback = 2 * time.Second

// memorySample is what the limit is computed from (runtime/metrics, bytes).
type memorySample struct {
	live     uint64 // /gc/heap/live: the heap marked live by the last collection
	total    uint64 // /memory/classes/total
	released uint64 // /memory/classes/heap/released
	heap     uint64 // /memory/classes/heap/{objects,unused,free}
	unused   uint64 // /memory/classes/heap/unused: free slots in spans in use
	allocs   uint64 // /gc/heap/allocs: all the heap allocated so far
}

var memoryMetrics = []string{"/gc/heap/live:bytes", "/memory/classes/total:bytes",
	"/memory/classes/heap/released:bytes", "/memory/classes/heap/objects:bytes",
	"/memory/classes/heap/unused:bytes", "/memory/classes/heap/free:bytes",
	"/gc/heap/allocs:bytes"}

func readMemorySample() memorySample {
	samples := make([]metrics.Sample, len(memoryMetrics))
	for i, name := range memoryMetrics {
		samples[i].Name = name
	}
	metrics.Read(samples)
	v := func(i int) uint64 {
		if samples[i].Value.Kind() != metrics.KindUint64 {
			return 0
		}
		return samples[i].Value.Uint64()
	}
	return memorySample{live: v(0), total: v(1), released: v(2), heap: v(3) + v(4) + v(5), unused: v(4), allocs: v(6)}
}

// minHeapHeadroom is the least the heap may grow by between collections
// under the limit (the ballast, counted live, adds its 16 MiB too).
const minHeapHeadroom = 32 << 20

// memoryLimit is the soft limit for sample s: what is not heap (stacks,
// the runtime's metadata) plus the live heap and the free slots of the
// spans it is in, plus burst (what the daemon allocates in allocWindow at
// its recent peak rate, allocPeak), at least minHeapHeadroom and at most
// the live heap again. ok is false before the first collection has
// measured the live heap.
//
// The free slots count because the runtime counts them: a span in use is
// mapped whole, and no collection gives a slot back, it only lets the
// next allocations reuse it. A heap whose long-lived objects are spread
// thin (a daemon that took 100,000 locks on gcs kept ≈ 130 MiB of such
// slots beside 300 MiB live) would otherwise stay over a limit of live +
// room for good, and Go collects without pause over its limit: that idle
// daemon used 17.6 s of CPU in 15 s. Counted, the garbage that fills the
// slots is what brings the heap to the limit, as it should.
func memoryLimit(s memorySample, burst uint64) (limit int64, ok bool) {
	if s.live == 0 {
		return 0, false
	}
	mapped := s.total - s.released
	nonHeap := mapped - min(s.heap, mapped)
	return int64(nonHeap + s.live + s.unused + max(min(s.live, burst), minHeapHeadroom)), true
}

// allocPeak remembers how much was allocated between consecutive looks
// over the last allocLookback.
type allocPeak struct {
	last uint64   // the allocs counter at the last look; 0 before the first
	per  []uint64 // ring of the bytes allocated between looks
	next int      // where per's next entry goes
}

func newAllocPeak() *allocPeak {
	return &allocPeak{per: make([]uint64, allocLookback/memoryLimitEvery)}
}

// add records a look at the allocs counter and returns the burst: what
// allocWindow at the highest rate of the looks of the last allocLookback
// allocates.
func (p *allocPeak) add(allocs uint64) (burst uint64) {
	if p.last != 0 && allocs >= p.last {
		p.per[p.next] = allocs - p.last
		p.next = (p.next + 1) % len(p.per)
	}
	p.last = allocs
	var peak uint64
	for _, b := range p.per {
		peak = max(peak, b)
	}
	return peak * uint64(allocWindow/memoryLimitEvery)
}

// trackMemoryLimit keeps the soft memory limit at memoryLimit until stop
// is closed, then lifts it; done is closed once it has. It does nothing
// (but close done) when GOGC or GOMEMLIMIT is set.
func trackMemoryLimit(stop <-chan struct{}) (done <-chan struct{}) {
	d := make(chan struct{})
	if os.Getenv("GOGC") != "" || os.Getenv("GOMEMLIMIT") != "" {
		close(d)
		return d
	}
	go func() {
		defer close(d)
		defer debug.SetMemoryLimit(math.MaxInt64)
		tick := time.NewTicker(memoryLimitEvery)
		defer tick.Stop()
		peak := newAllocPeak()
		for {
			s := readMemorySample()
			if limit, ok := memoryLimit(s, peak.add(s.allocs)); ok {
				debug.SetMemoryLimit(limit)
			}
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	}()
	return d
}
