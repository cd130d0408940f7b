package localbackend

import (
	"bytes"
	"io"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lockfs/lockfs/lockmgr"
)

// Reading the kernel's lock table (/proc/locks) for contend.go: who waits
// for a backing file's flock, and how a lease's file is named there.

// procLocks is the kernel's table of file locks.
const procLocks = "/proc/locks"

// lockTable reads /proc/locks again and again through one descriptor
// (seq_file starts over at offset 0): two system calls a round.
type lockTable struct {
	f   *os.File
	buf []byte
	// measure: the last read was large enough for its CPU time to
	// matter (contendMeasureBytes).
	measure bool
}

// contendMeasureBytes is the size of /proc/locks (some 400 lines) from
// which the poller measures what a read costs: below it, a round costs
// a few tens of µs, well under 5% of contendPoll.
const contendMeasureBytes = 32 << 10

// read returns the whole table and, if it was measured, the CPU time the
// read took.
func (t *lockTable) read() (data []byte, cost time.Duration, err error) {
	if t.f == nil {
		if t.f, err = os.Open(procLocks); err != nil {
			return nil, 0, err
		}
		t.buf = make([]byte, contendMeasureBytes)
	}
	if t.measure {
		// One thread, so that its CPU clock measures the read.
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		start := threadCPU()
		defer func() { cost = threadCPU() - start }()
	}
	for {
		n, err := t.f.ReadAt(t.buf, 0)
		switch {
		case err == io.EOF:
			t.measure = n >= contendMeasureBytes
			return t.buf[:n], 0, nil
		case err != nil:
			return nil, 0, err
		}
		t.buf = make([]byte, 2*len(t.buf)) // n == len(buf): more to come
	}
}

func (t *lockTable) close() {
	if t.f != nil {
		t.f.Close()
	}
}

// waitersFor returns the processes behind the blocked requests on a file
// that come from outside this backend (not from own) and conflict with
// mode.
func waitersFor(reqs []blockedReq, mode lockmgr.Mode, own map[int]struct{}) []int {
	var pids []int
	for _, r := range reqs {
		if _, ok := own[r.pid]; ok {
			continue
		}
		if mode == lockmgr.Exclusive || r.exclusive {
			pids = append(pids, r.pid)
		}
	}
	return pids
}

// blockedReq is a blocked flock request in /proc/locks.
type blockedReq struct {
	pid       int
	exclusive bool
}

// threadCPU is the CPU time of the calling thread.
func threadCPU() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
		return 0
	}
	return time.Duration(ts.Nano())
}

// locksOf returns the flock lines, held and blocked, of the file key in a
// read of /proc/locks.
func locksOf(data []byte, key string) []lockLine {
	var out []lockLine
	for _, line := range bytes.Split(data, []byte("\n")) {
		if !bytes.Contains(line, []byte(key)) {
			continue
		}
		if lk, ok := parseLockLine(string(line)); ok && lk.key == key && lk.kind == "FLOCK" {
			out = append(out, lk)
		}
	}
	return out
}

// parseBlocked returns the blocked flock requests of a read of
// /proc/locks, by file key.
func parseBlocked(data []byte) map[string][]blockedReq {
	var out map[string][]blockedReq
	for {
		i := bytes.Index(data, []byte("->"))
		if i < 0 {
			return out
		}
		start := bytes.LastIndexByte(data[:i], '\n') + 1
		end := bytes.IndexByte(data[i:], '\n')
		var line []byte
		if end < 0 {
			line, data = data[start:], nil
		} else {
			line, data = data[start:i+end], data[i+end+1:]
		}
		lk, ok := parseLockLine(string(line))
		if !ok || !lk.blocked || lk.kind != "FLOCK" {
			continue
		}
		if out == nil {
			out = make(map[string][]blockedReq)
		}
		out[lk.key] = append(out[lk.key], blockedReq{pid: lk.pid, exclusive: lk.exclusive})
	}
}

// lockLine is one line of /proc/locks, or a "lock:" line of fdinfo.
type lockLine struct {
	blocked   bool   // a waiting request ("->")
	kind      string // FLOCK, POSIX, OFDLCK, LEASE...
	exclusive bool   // WRITE
	pid       int
	key       string // MAJ:MIN:INODE
}

// parseLockLine reads "ID: [->] KIND ADVISORY MODE PID MAJ:MIN:INO START
// END", as fs/locks.c lock_get_status writes it.
func parseLockLine(s string) (lockLine, bool) {
	var lk lockLine
	f := strings.Fields(s)
	if len(f) > 0 && f[0] == "lock:" {
		f = f[1:]
	}
	if len(f) < 2 {
		return lk, false
	}
	f = f[1:] // "ID:"
	if f[0] == "->" {
		lk.blocked = true
		f = f[1:]
	}
	if len(f) < 5 {
		return lk, false
	}
	pid, err := strconv.Atoi(f[3])
	if err != nil {
		return lk, false
	}
	lk.kind, lk.exclusive, lk.pid, lk.key = f[0], f[2] == "WRITE", pid, f[4]
	return lk, true
}

// kernelKey returns the MAJ:MIN:INODE by which the kernel's lock table
// names l's backing file, read from the "lock:" line of l's own flock in
// /proc/self/fdinfo; "" if it holds none at this moment (an upgrade's
// attempt) or the file cannot be read.
func (l *lease) kernelKey() string {
	var key string
	fdDo(l.file, func(fd int) error {
		data, err := os.ReadFile("/proc/self/fdinfo/" + strconv.Itoa(fd))
		if err != nil {
			return err
		}
		for _, line := range bytes.Split(data, []byte("\n")) {
			if !bytes.HasPrefix(line, []byte("lock:")) {
				continue
			}
			if lk, ok := parseLockLine(string(line)); ok && lk.kind == "FLOCK" && !lk.blocked {
				key = lk.key
				return nil
			}
		}
		return nil
	})
	return key
}
