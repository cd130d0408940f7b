package procinfo

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/lockfs/lockfs/lockmgr"
	"golang.org/x/sys/unix"
)

// A thread's lineage, top down: Lineage finds the thread's process and
// walks up its parents (tree.go has the caches they are kept in, and why
// each answer is checked against a start time), reading the two files of
// each process the walk needs: its stat line (state, flags, start time) and
// its status (Tgid, PPid).

// Lineage returns the process that thread tid belongs to, then its parent,
// grandparent... as they were when each was first seen. It ends at pid 1, at
// a process with no parent in our pid namespace, or, if an ancestor exits
// during the walk, at the oldest ancestor that could be read. The result is
// shared with the cache: callers must not modify it (appending is safe). A
// thread that does not exist yields an error wrapping os.ErrNotExist.
func (t *Tree) Lineage(tid int) (lockmgr.Lineage, error) {
	l, err := t.lineage(tid)
	if err != nil {
		return nil, fmt.Errorf("lineage of thread %d: %w", tid, err)
	}
	return l, nil
}

// lineage is Lineage without the error context.
func (t *Tree) lineage(tid int) (lockmgr.Lineage, error) {
	if tid <= 0 {
		return nil, fmt.Errorf("no such thread: %w", os.ErrNotExist)
	}
	e, cached := t.threads.Get(tid)
	if cached && t.recheckAfter > 0 && time.Since(e.checked) < t.recheckAfter {
		return e.lineage, nil
	}
	st, err := t.readStat(tid)
	if err != nil {
		return nil, err
	}
	tstart := st.start
	if cached && e.start == tstart {
		e.checked = time.Now()
		t.threads.Add(tid, e)
		return e.lineage, nil
	}

	// Miss, or tid now names another thread: resolve it afresh.
	self, err := t.process(tid, tstart)
	if err != nil {
		return nil, err
	}
	l, complete, err := t.walk(self)
	if err != nil {
		return nil, err
	}
	l = l[:len(l):len(l)]
	if complete {
		t.threads.Add(tid, threadEntry{start: tstart, lineage: l, checked: time.Now()})
	}
	return l, nil
}

// process returns the process that thread tid (started at tstart) belongs to.
func (t *Tree) process(tid int, tstart uint64) (lockmgr.ProcID, error) {
	tgid, _, err := t.readStatus(tid)
	if err != nil {
		return lockmgr.ProcID{}, err
	}
	if tgid == tid {
		return lockmgr.ProcID{PID: tid, Start: tstart}, nil
	}
	pst, err := t.readStat(tgid)
	if err != nil {
		return lockmgr.ProcID{}, err
	}
	pstart := pst.start
	// The thread group lives, and its tgid cannot be reused, as long as one
	// of its threads does: if tid is still the thread we started with, tgid
	// and pstart belong to its process.
	if again, err := t.readStat(tid); err != nil {
		return lockmgr.ProcID{}, err
	} else if again.start != tstart || pstart > tstart {
		return lockmgr.ProcID{}, errGone
	}
	return lockmgr.ProcID{PID: tgid, Start: pstart}, nil
}

// walk returns self and its ancestors. complete is false if the walk stopped
// early because an ancestor exited before its parent could be read.
func (t *Tree) walk(self lockmgr.ProcID) (l lockmgr.Lineage, complete bool, err error) {
	l = lockmgr.Lineage{self}
	for p := self; p.PID != 1; {
		if len(l) >= maxLineageDepth {
			return nil, false, fmt.Errorf("lineage deeper than %d processes", maxLineageDepth)
		}
		parent, err := t.parent(p)
		if errors.Is(err, errParentUnknown) || (errors.Is(err, os.ErrNotExist) && p != self) {
			return l, false, nil
		}
		if err != nil {
			return nil, false, err
		}
		if parent.PID == 0 {
			break
		}
		l = append(l, parent)
		p = parent
	}
	return l, true, nil
}

// parent returns the parent p had when first seen, or the zero lockmgr.ProcID if p
// has none (init, kernel threads, a process whose parent is outside our pid
// namespace). It fails with an error wrapping os.ErrNotExist if p has exited,
// and with errParentUnknown if its parent kept exiting while being read.
func (t *Tree) parent(p lockmgr.ProcID) (lockmgr.ProcID, error) {
	if q, ok := t.parents.Get(p); ok {
		return q, nil
	}
	for range parentRetries {
		_, ppid, err := t.readStatus(p.PID)
		if err != nil {
			return lockmgr.ProcID{}, err
		}
		q := lockmgr.ProcID{PID: ppid}
		if ppid != 0 {
			var pst stat
			pst, err = t.readStat(ppid)
			q.Start = pst.start
			if errors.Is(err, os.ErrNotExist) {
				continue // the parent exited: p has been reparented
			}
			if err != nil {
				return lockmgr.ProcID{}, err
			}
		}
		// p must not have exited (and its pid been reused) since its PPid
		// was read.
		if st, err := t.readStat(p.PID); err != nil {
			return lockmgr.ProcID{}, err
		} else if st.start != p.Start {
			return lockmgr.ProcID{}, errGone
		}
		if q.Start > p.Start {
			continue // ppid was reused by a younger process: p has been reparented
		}
		// Keep the first parent recorded if another goroutine raced us.
		if prev, ok, _ := t.parents.PeekOrAdd(p, q); ok {
			return prev, nil
		}
		return q, nil
	}
	return lockmgr.ProcID{}, errParentUnknown
}

// readStat returns the stat line of the thread or process pid. It reads into a stack buffer: this is the
// cache-hit path. On the real procfs it reads ROOT/PID/task/PID/stat, the
// task's own line: ROOT/PID/stat adds up the times of every thread of
// pid's thread group, so that each read cost O(threads) and a pool of
// 10,000 threads waiting for one lock took minutes to queue (state and
// start time are the task's own in both). A fake procfs (tests) has
// ROOT/PID/stat only.
func (t *Tree) readStat(pid int) (stat, error) {
	var pathBuf [96]byte
	path := append(pathBuf[:0], t.root...)
	path = append(path, '/')
	path = strconv.AppendInt(path, int64(pid), 10)
	if t.root == defaultProcRoot {
		path = append(path, "/task/"...)
		path = strconv.AppendInt(path, int64(pid), 10)
	}
	path = append(path, "/stat"...)
	var buf [statBufSize]byte
	n, err := readInto(path, buf[:])
	if err != nil {
		return stat{}, err
	}
	st, err := parseStat(buf[:n])
	if err != nil {
		return stat{}, fmt.Errorf("%s: %w", string(path), err)
	}
	return st, nil
}

// readInto reads the file at path into buf until EOF or buf is full. A
// process that exits between the open and the read yields ESRCH, reported
// as os.ErrNotExist like a missing file. The path is a byte slice so that
// the caller's buffer does not escape: the string is made only for errors.
func readInto(path []byte, buf []byte) (int, error) {
	fd, err := unix.Open(string(path), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	for err == unix.EINTR {
		fd, err = unix.Open(string(path), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	}
	if err != nil {
		return 0, &os.PathError{Op: "open", Path: string(path), Err: err}
	}
	defer unix.Close(fd)
	n := 0
	for n < len(buf) {
		m, err := unix.Read(fd, buf[n:])
		if err == unix.EINTR {
			continue
		}
		if err == unix.ESRCH {
			return 0, &os.PathError{Op: "read", Path: string(path), Err: errGone}
		}
		if err != nil {
			return 0, &os.PathError{Op: "read", Path: string(path), Err: err}
		}
		if m == 0 {
			break
		}
		n += m
	}
	return n, nil
}

// stat is what lockfs reads of a /proc/PID/stat line.
type stat struct {
	state byte   // field 3: R, S, D, Z, X, ...
	flags uint64 // field 9: the kernel's PF_* task flags
	cpu   uint64 // fields 14 and 15: user and system time, in clock ticks
	start uint64 // field 22: start time in clock ticks since boot
}

// pfExiting is the kernel's PF_EXITING task flag (include/linux/sched.h):
// set as a task starts to exit, before it closes its files.
const pfExiting = 0x4

// exited is lockfs's one answer to "has this process exited": it is a
// zombie or dead, or flagged PF_EXITING. The kernel closes an exiting
// process's files, and so releases its locks, before its parent reaps
// it, while /proc still shows it. (A process gone from /proc has exited
// too: the callers see that as an error reading its stat.)
func (s stat) exited() bool {
	return s.state == 'Z' || s.state == 'X' || s.state == 'x' || s.flags&pfExiting != 0
}

// parseStat parses a /proc/PID/stat line. Field 2, the command name, is in
// parentheses and may itself contain spaces and parentheses, so fields are
// counted from the last ')'.
func parseStat(b []byte) (stat, error) {
	var st stat
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return stat{}, errors.New("malformed stat: no ')' after the command name")
	}
	rest := b[i+1:]
	// Fields 3..22 follow, each preceded by one space.
	const first, flags, utime, stime, want = 3, 9, 14, 15, 22
	for f := first; ; f++ {
		if len(rest) == 0 || rest[0] != ' ' {
			return stat{}, fmt.Errorf("malformed stat: field %d missing", f)
		}
		rest = rest[1:]
		end := bytes.IndexAny(rest, " \n")
		if end < 0 {
			end = len(rest)
		}
		field := rest[:end]
		rest = rest[end:]
		var err error
		switch f {
		case first:
			if len(field) != 1 {
				return stat{}, fmt.Errorf("malformed stat: state %q", string(field))
			}
			st.state = field[0]
		case flags:
			if st.flags, err = strconv.ParseUint(string(field), 10, 64); err != nil {
				return stat{}, fmt.Errorf("malformed stat: flags: %w", err)
			}
		case utime, stime:
			t, err := strconv.ParseUint(string(field), 10, 64)
			if err != nil {
				return stat{}, fmt.Errorf("malformed stat: field %d (CPU time): %w", f, err)
			}
			st.cpu += t
		case want:
			if st.start, err = strconv.ParseUint(string(field), 10, 64); err != nil {
				return stat{}, fmt.Errorf("malformed stat: start time: %w", err)
			}
			return st, nil
		}
	}
}

// readStatus returns the Tgid and PPid of ROOT/PID/status. It is off the
// cache-hit path, so it allocates freely.
func (t *Tree) readStatus(pid int) (tgid, ppid int, err error) {
	path := t.root + "/" + strconv.Itoa(pid) + "/status"
	b, err := os.ReadFile(path)
	if errors.Is(err, unix.ESRCH) {
		return 0, 0, &os.PathError{Op: "read", Path: path, Err: errGone}
	}
	if err != nil {
		return 0, 0, err
	}
	// Name is escaped in status, so every line starts with its key.
	var haveTgid, havePPid bool
	for line := range bytes.SplitSeq(b, []byte("\n")) {
		key, val, ok := bytes.Cut(line, []byte(":"))
		if !ok {
			continue
		}
		var dst *int
		switch string(key) {
		case "Tgid":
			dst, haveTgid = &tgid, true
		case "PPid":
			dst, havePPid = &ppid, true
		default:
			continue
		}
		if *dst, err = strconv.Atoi(string(bytes.TrimSpace(val))); err != nil {
			return 0, 0, fmt.Errorf("%s: malformed %s: %w", path, key, err)
		}
	}
	if !haveTgid || !havePPid {
		return 0, 0, fmt.Errorf("%s: no Tgid or PPid line", path)
	}
	return tgid, ppid, nil
}
