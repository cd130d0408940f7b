package main

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"

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
// (docs/BENCHMARKS.md "Where a pair's time goes"). With a P to spare,
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
