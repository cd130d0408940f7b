package procinfo

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lockfs/lockfs/lockmgr"
)

// This file holds the two questions the engine asks /proc about a lock's
// processes once it is held (SPEC §2.3): when does the process that took it
// exit, and who still holds its descriptor then.
//
// # Exits
//
// WaitExit waits on a pidfd (pidfd_open(2)): it becomes readable when the
// process exits, and Go's poller waits for that without a thread, so a
// watch costs a descriptor and a parked goroutine, never a timer. Where
// pidfds are unavailable (EMFILE, an old kernel) it falls back to reading
// /proc/PID/stat every fallbackPoll.
//
// # Descriptors
//
// Descriptors scans /proc/*/fd for descriptors of a file (by inode number,
// as /proc/PID/fdinfo shows it), and groups them by open file description
// with kcmp(2) (KCMP_FILE): two descriptors in the same group share one
// description, so they hold the same flock. kcmp orders descriptions (it
// answers equal, less or greater, comparing the kernel's pointers), so the
// descriptors are sorted with it and each run of equal ones is a group:
// O(n log n) calls for n descriptors, where comparing each with every
// group found so far took O(n²) (a holder that died with 10,000
// descriptions of its control file open kept the daemon busy for minutes,
// and Close waited for it). The scan stops when its context ends.
// Reading another process's descriptors needs ptrace access to it (root,
// or the same user): a process that cannot be read is left out, and with
// it its claim to the lock (the safe side: it is not exempt from the lock
// it may hold).

var _ lockmgr.ProcessWatcher = (*Tree)(nil)

// fallbackPoll is how often WaitExit looks at /proc when it has no pidfd.
const fallbackPoll = 200 * time.Millisecond

// WaitExit implements ProcessWatcher.
func (t *Tree) WaitExit(ctx context.Context, p lockmgr.ProcID) error {
	fd, err := unix.PidfdOpen(p.PID, unix.PIDFD_NONBLOCK)
	if err == unix.ESRCH {
		return nil
	}
	if err != nil || t.root != defaultProcRoot {
		// No pidfd (or a fake /proc, whose pids are not the kernel's).
		if fd >= 0 && err == nil {
			unix.Close(fd)
		}
		return t.pollExit(ctx, p)
	}
	f := os.NewFile(uintptr(fd), "pidfd:"+strconv.Itoa(p.PID))
	defer f.Close()
	// The pid may have been reused before pidfd_open: the pidfd then
	// names the new process, and p has exited.
	if !t.Alive(p) {
		return nil
	}
	rc, err := f.SyscallConn()
	if err != nil {
		return t.pollExit(ctx, p)
	}
	stop := context.AfterFunc(ctx, func() { f.Close() })
	defer stop()
	err = rc.Read(func(fd uintptr) bool {
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(pfd, 0)
		return err == nil && n > 0
	})
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if err != nil {
		return t.pollExit(ctx, p)
	}
	return nil
}

// pollExit is WaitExit without a pidfd.
func (t *Tree) pollExit(ctx context.Context, p lockmgr.ProcID) error {
	tick := time.NewTicker(fallbackPoll)
	defer tick.Stop()
	for t.Alive(p) {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
	return nil
}

// Descriptors implements ProcessWatcher: one pass over /proc for all the
// inodes, so that the exit of a process that held thousands of locks
// costs one scan, not one per lock. The candidates known to hold a
// description of their own (a waiter's) are set apart without a kcmp; the
// others are sorted by description (groupDescriptors).
func (t *Tree) Descriptors(ctx context.Context, inos []uint64, known func(ino uint64, pid int) bool) (map[uint64][][]lockmgr.ProcID, error) {
	want := make(map[string]uint64, len(inos))
	for _, ino := range inos {
		if ino != 0 {
			want[strconv.FormatUint(ino, 10)] = ino
		}
	}
	out := make(map[uint64][][]lockmgr.ProcID, len(want))
	if len(want) == 0 {
		return out, nil
	}
	dirs, err := os.ReadDir(t.root)
	if err != nil {
		return nil, fmt.Errorf("descriptors: %w", err)
	}
	self := os.Getpid()
	cands := map[uint64][]fdRef{}
	perPID := map[uint64]map[int]int{}
	for _, d := range dirs {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		pid, err := strconv.Atoi(d.Name())
		if err != nil || pid == self {
			continue
		}
		fds, err := os.ReadDir(filepath.Join(t.root, d.Name(), "fd"))
		if err != nil {
			continue // gone, or not ours to read
		}
		var p lockmgr.ProcID
		for _, e := range fds {
			fd, err := strconv.Atoi(e.Name())
			if err != nil {
				continue
			}
			ino, ok := t.fdInode(d.Name(), e.Name(), want)
			if !ok {
				continue
			}
			if p.PID == 0 {
				st, err := t.readStat(pid)
				if err != nil || st.exited() {
					break
				}
				p = lockmgr.ProcID{PID: pid, Start: st.start}
			}
			cands[ino] = append(cands[ino], fdRef{p: p, fd: fd})
			if perPID[ino] == nil {
				perPID[ino] = map[int]int{}
			}
			perPID[ino][pid]++
		}
	}
	for ino, cs := range cands {
		out[ino] = groupDescriptors(cs, func(pid int) bool {
			return known != nil && perPID[ino][pid] == 1 && known(ino, pid)
		}, kcmpFiles(ctx))
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return out, nil
}

// fdRef is descriptor fd of process p.
type fdRef struct {
	p  lockmgr.ProcID
	fd int
}

// groupDescriptors groups the descriptors of one file by open file
// description; a process for which alone returns true is a group of its
// own without comparing. cmp orders two descriptors by description (0:
// the same one); a descriptor it cannot compare even with itself (its
// process is gone or not ours to read, or it was closed) is a group of its
// own, as if no other shared its description. The others are sorted with
// cmp and each run of equal ones is a group. If a comparison fails during
// the sort (a process exited meanwhile), the failing descriptors are set
// apart and the rest sorted again, at most sortRetries times; after that
// the order may be inconsistent, and one description may then show as
// several groups: more candidates, so no heir is named rather than a
// wrong one (heirs.go scans again later).
func groupDescriptors(cands []fdRef, alone func(pid int) bool, cmp func(a, b fdRef) (int, error)) [][]lockmgr.ProcID {
	var out [][]lockmgr.ProcID
	var rest []fdRef
	for _, c := range cands {
		if alone(c.p.PID) {
			out = append(out, []lockmgr.ProcID{c.p})
		} else {
			rest = append(rest, c)
		}
	}
	for try := 0; ; try++ {
		var ok []fdRef
		for _, c := range rest {
			if _, err := cmp(c, c); err != nil {
				out = append(out, []lockmgr.ProcID{c.p})
			} else {
				ok = append(ok, c)
			}
		}
		rest = ok
		failed := false
		slices.SortFunc(rest, func(a, b fdRef) int {
			r, err := cmp(a, b)
			failed = failed || err != nil
			return r
		})
		if !failed || try == sortRetries {
			break
		}
	}
	for i := 0; i < len(rest); {
		procs := []lockmgr.ProcID{rest[i].p}
		j := i + 1
		for ; j < len(rest); j++ {
			if r, err := cmp(rest[i], rest[j]); err != nil || r != 0 {
				break
			}
			if procs[len(procs)-1] != rest[j].p {
				procs = append(procs, rest[j].p)
			}
		}
		out = append(out, procs)
		i = j
	}
	return out
}

// sortRetries bounds how often groupDescriptors sorts again after a
// comparison failed.
const sortRetries = 2

// fdInode returns the inode that ROOT/PID/fdinfo/FD names if it is one of
// want (inode numbers by their decimal text). The link is read first: it
// costs one call, and only control files (and anything else named like
// them) go on to fdinfo.
func (t *Tree) fdInode(pid, fd string, want map[string]uint64) (uint64, bool) {
	link, err := os.Readlink(filepath.Join(t.root, pid, "fd", fd))
	if err != nil {
		return 0, false
	}
	base := filepath.Base(strings.TrimSuffix(link, " (deleted)"))
	if base != lockmgr.ControlName(lockmgr.KindDir) && base != lockmgr.ControlName(lockmgr.KindNewDir) && base != lockmgr.ControlName(lockmgr.KindUsage) {
		return 0, false
	}
	b, err := os.ReadFile(filepath.Join(t.root, pid, "fdinfo", fd))
	if err != nil {
		return 0, false
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "ino:"); ok {
			ino, ok := want[strings.TrimSpace(v)]
			return ino, ok
		}
	}
	return 0, false
}

// kcmpFile is KCMP_FILE of kcmp(2).
const kcmpFile = 0

// errUnordered reports a kcmp answer of 3: not equal, order unknown.
var errUnordered = errors.New("kcmp: descriptions differ but are not ordered")

// kcmpFiles returns groupDescriptors's comparison by kcmp(2): -1, 0 or 1
// as a's open file description is less than, the same as or greater than
// b's in the kernel's order. It fails (without a system call) once ctx
// has ended, so that a long sort ends quickly.
func kcmpFiles(ctx context.Context) func(a, b fdRef) (int, error) {
	return func(a, b fdRef) (int, error) {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		r, _, errno := unix.Syscall6(unix.SYS_KCMP, uintptr(a.p.PID), uintptr(b.p.PID), kcmpFile, uintptr(a.fd), uintptr(b.fd), 0)
		switch {
		case errno != 0:
			return 0, errno
		case r == 0:
			return 0, nil
		case r == 1:
			return -1, nil
		case r == 2:
			return 1, nil
		}
		return 0, errUnordered
	}
}
