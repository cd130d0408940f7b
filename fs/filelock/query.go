package filelock

import (
	"bufio"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"

	"bazil.org/fuse"
	"golang.org/x/sys/unix"

	"github.com/lockfs/lockfs/internal/resolve"
)

// QueryLock answers F_GETLK on h: a lock that would conflict with the
// request, as the backing file's lock table sees it from the requesting
// owner.
func (t *Table) QueryLock(h File, req *fuse.QueryLockRequest, resp *fuse.QueryLockResponse) error {
	lk := flockT(req.Lock, req.Lock.Type)
	t.ownersMu.Lock()
	o := t.owners[ownerKey{inode: h.Inode(), owner: req.LockOwner}]
	t.ownersMu.Unlock()
	query := func(fd int) error { return unix.FcntlFlock(uintptr(fd), unix.F_OFD_GETLK, &lk) }
	ok := false
	var err error
	if o != nil {
		ok, err = o.do(query)
	}
	if !ok {
		// The owner holds nothing: any new description sees every lock.
		err = h.UseFd(true, func(pfd int) error {
			fd, err := resolve.Reopen(pfd, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY)
			if err == nil {
				err = query(fd)
				_ = unix.Close(fd)
			}
			return err
		})
	}
	if err != nil {
		return t.cfg.Fail("getlk", h.Path(), err)
	}
	if lk.Type == unix.F_UNLCK {
		return nil // resp is prefilled with F_UNLCK
	}
	end := uint64(math.MaxInt64)
	if lk.Len > 0 {
		end = uint64(lk.Start + lk.Len - 1)
	}
	pid := lk.Pid
	if pid <= 0 {
		// An OFD lock: one of our owners (or an OFD lock taken on
		// SOURCE directly, which has no pid).
		pid = t.ofdHolder(h.Inode(), req.LockOwner, lk)
	}
	resp.Lock = fuse.FileLock{Start: uint64(lk.Start), End: end, Type: fuse.LockType(lk.Type), PID: pid}
	return nil
}

// ofdHolder returns the pid of the process whose owner holds the OFD lock
// lk on inode, found in /proc/self/fdinfo of the owners' descriptors, or 0.
func (t *Table) ofdHolder(inode Inode, except fuse.LockOwner, lk unix.Flock_t) int32 {
	if o := t.ofdOwner(inode, except, lk); o != nil {
		return o.pid.Load()
	}
	return 0
}

// ofdOwner returns the owner whose carrier holds the OFD lock lk on inode,
// or nil (a lock taken on SOURCE directly, or released meanwhile).
func (t *Table) ofdOwner(inode Inode, except fuse.LockOwner, lk unix.Flock_t) *fileLockOwner {
	t.ownersMu.Lock()
	var cands []*fileLockOwner
	for k, o := range t.owners {
		if k.inode == inode && k.owner != except {
			cands = append(cands, o)
		}
	}
	t.ownersMu.Unlock()
	want := []string{strconv.FormatInt(lk.Start, 10), "EOF"}
	if lk.Len > 0 {
		want[1] = strconv.FormatInt(lk.Start+lk.Len-1, 10)
	}
	typ := "WRITE"
	if lk.Type == unix.F_RDLCK {
		typ = "READ"
	}
	for _, o := range cands {
		found := false
		_, _ = o.do(func(fd int) error {
			found = fdHoldsLock(fd, typ, want[0], want[1])
			return nil
		})
		if found {
			return o
		}
	}
	return nil
}

// fdHoldsLock reports whether /proc/self/fdinfo/FD lists a lock of type typ
// over start..end ("lock:\t1: OFDLCK ADVISORY  WRITE -1 fe:00:123 10 14").
func fdHoldsLock(fd int, typ, start, end string) bool {
	fi, err := os.Open(fmt.Sprintf("/proc/self/fdinfo/%d", fd))
	if err != nil {
		return false
	}
	defer fi.Close()
	sc := bufio.NewScanner(fi)
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "lock:")
		if !ok {
			continue
		}
		fs := strings.Fields(rest)
		if len(fs) >= 8 && fs[3] == typ && fs[6] == start && fs[7] == end {
			return true
		}
	}
	return false
}
