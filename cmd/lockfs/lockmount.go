package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lockfs/lockfs/internal/procinfo"
	"github.com/lockfs/lockfs/lockmgr"
)

// mountLocker takes a lock through a lockfs mount: it opens the directory's
// control file and flocks it, as flock(1) would, and reads the grant's
// token from the descriptor's status (SPEC §6: "you holder token=N").
type mountLocker struct {
	path string // the control file, absolute
	fd   int
}

func newMountLocker(dir string, kind lockmgr.Kind) (*mountLocker, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, &targetError{err: err}
	}
	fi, err := os.Stat(abs)
	if err != nil {
		return nil, &targetError{err: err}
	}
	if !fi.IsDir() {
		return nil, targetErrorf("%s is not a directory (TARGET is the directory whose lock to take, or its control file)", abs)
	}
	if _, err := resolveTarget(abs, ""); err != nil {
		return nil, &targetError{err: err}
	}
	p := filepath.Join(abs, lockmgr.ControlName(kind))
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &targetError{err: fmt.Errorf("open %s: %w", p, err)}
	}
	return &mountLocker{path: p, fd: fd}, nil
}

func (m *mountLocker) name() string { return m.path }

// acquire flocks the control file. A blocking flock(2) cannot be
// interrupted from Go (its signal handlers restart it), so it runs on its
// own goroutine and acquire returns when ctx ends; the flock is then ended
// by the process's exit, which lockfs lock does next (see abandonWait).
func (m *mountLocker) acquire(ctx context.Context, mode lockmgr.Mode, wait bool) (heldLock, error) {
	how := unix.LOCK_EX
	if mode == lockmgr.Shared {
		how = unix.LOCK_SH
	}
	if !wait {
		how |= unix.LOCK_NB
	}
	done := make(chan error, 1)
	go func() { done <- flockRetry(m.fd, how) }()
	select {
	case err := <-done:
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("%s: %w", m.path, lockmgr.ErrWouldBlock)
		}
		if err != nil {
			return nil, fmt.Errorf("flock %s: %w", m.path, err)
		}
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	st, err := m.status()
	if err != nil {
		return nil, fmt.Errorf("reading the status of %s: %w", m.path, err)
	}
	tok, lost, ok := youLine(st)
	if !ok {
		return nil, fmt.Errorf("%s: the status read through the locked descriptor does not name it as a holder", m.path)
	}
	if tok == 0 && !lost {
		// The mount issues a token at its first reading and could not
		// (a backing file it may not write, or one another program kept
		// locked): a second reading tries again, once.
		if st, err = m.status(); err == nil {
			tok, lost, _ = youLine(st)
		}
		if tok == 0 && !lost {
			_ = flockRetry(m.fd, unix.LOCK_UN)
			return nil, fmt.Errorf("%s: the mount issued no fencing token for this lock (the daemon's log says why; locks work, tokens do not)", m.path)
		}
	}
	h := &mountHold{m: m, tok: tok, onceLost: newOnceLost(), stop: make(chan struct{})}
	if lost {
		h.lose(errors.New("the mount reports the lock lost"))
	}
	h.wg.Add(1)
	go h.watch()
	return h, nil
}

// flockRetry is flock(2), retried on EINTR.
func flockRetry(fd, how int) error {
	for {
		err := unix.Flock(fd, how)
		if err != unix.EINTR {
			return err
		}
	}
}

// status reads the control file's status through the descriptor.
func (m *mountLocker) status() ([]byte, error) {
	buf := make([]byte, 64<<10)
	n, err := unix.Pread(m.fd, buf, 0)
	if err != nil {
		return nil, err
	}
	return buf[:n], nil
}

// holders renders the status's holder lines for -v.
func (m *mountLocker) holders() string {
	st, err := m.status()
	if err != nil {
		return fmt.Sprintf("(status unreadable: %v)", err)
	}
	return describeHolders(st, time.Now())
}

func (m *mountLocker) close() error { return unix.Close(m.fd) }

// youLine finds the "you holder token=N [lost]" line of a status.
func youLine(st []byte) (token uint64, lost, ok bool) {
	sc := bufio.NewScanner(bytes.NewReader(st))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 || f[0] != "you" || f[1] != "holder" {
			continue
		}
		for _, kv := range f[2:] {
			if v, ok := strings.CutPrefix(kv, "token="); ok {
				token, _ = strconv.ParseUint(v, 10, 64)
			}
			if kv == "lost" {
				lost = true
			}
		}
		return token, lost, true
	}
	return 0, false, false
}

// describeHolders renders the holder lines of a control file's status:
// host, pid, the process's command line when it runs on this machine, mode,
// and for how long.
func describeHolders(st []byte, now time.Time) string {
	var out []string
	sc := bufio.NewScanner(bytes.NewReader(st))
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "holder ") {
			continue
		}
		kv := map[string]string{}
		for _, f := range strings.Fields(line)[1:] {
			k, v, _ := strings.Cut(f, "=")
			kv[k] = v
		}
		if _, hidden := kv["hidden"]; hidden {
			out = append(out, fmt.Sprintf("held %s by a process of another user", kv["mode"]))
			continue
		}
		d := fmt.Sprintf("held %s by host %s pid %s", kv["mode"], kv["host"], kv["pid"])
		if pid, err := strconv.Atoi(kv["pid"]); err == nil && isThisHost(kv["host"]) {
			if c := procinfo.Describe("", pid); c.Name != "" {
				d += " (" + c.String() + ")"
			}
		}
		if since, err := time.Parse(time.RFC3339, kv["since"]); err == nil {
			d += fmt.Sprintf(" for %v", now.Sub(since).Round(time.Second))
		}
		if _, explicit := kv["explicit"]; !explicit {
			d += " on behalf of a lock below"
		}
		out = append(out, d)
	}
	for _, c := range claimLines(st) {
		out = append(out, describeClaim(c, now)...)
	}
	if len(out) == 0 {
		return "no holder on this host's mount (held by another host, or by a process outside lockfs)"
	}
	return strings.Join(out, "; ")
}

// claimLines returns the gcs backend's claim records of a status (its
// "claim host=... mode=..." lines).
func claimLines(st []byte) []lockmgr.ClaimRecord {
	var out []lockmgr.ClaimRecord
	sc := bufio.NewScanner(bytes.NewReader(st))
	for sc.Scan() {
		if c, ok := strings.CutPrefix(sc.Text(), "claim "); ok {
			out = append(out, lockmgr.ParseClaimRecord(c))
		}
	}
	return out
}

// describeClaim renders one gcs claim record of another host for -v:
// "claimed exclusive by host H for 2m3s (session live)". This host's own
// records (use held or warm) and dead sessions' records past their
// lock-delay block nobody and give nothing.
func describeClaim(c lockmgr.ClaimRecord, now time.Time) []string {
	if c.Use == "held" || c.Use == "warm" || (c.State == "dead" && c.DelayUntil.IsZero()) {
		return nil
	}
	if c.State == "dead" {
		return []string{fmt.Sprintf("claimed %s by host %s, whose session is dead: kept for its lock-delay until %s",
			c.Mode, c.Host, c.DelayUntil.Local().Format(time.TimeOnly))}
	}
	d := fmt.Sprintf("claimed %s by host %s", c.Mode, c.Host)
	if !c.Since.IsZero() {
		d += fmt.Sprintf(" for %v", now.Sub(c.Since).Round(time.Second))
	}
	return []string{d + fmt.Sprintf(" (session %s)", c.State)}
}

// isThisHost reports whether a status's host names this machine (a gcs
// host ID is the hostname and a suffix).
func isThisHost(host string) bool {
	h, err := os.Hostname()
	return err == nil && (host == h || strings.HasPrefix(host, h+"-"))
}

// mountHold is a lock held through a mount. It watches the descriptor's
// status every second: the mount marks a lost or broken lock "lost", and a
// mount that went away cannot be read.
type mountHold struct {
	m   *mountLocker
	tok uint64
	*onceLost
	stop     chan struct{}
	stopOnce sync.Once
	wg       sync.WaitGroup
}

// mountCheckInterval is how often a held lock's status is read.
const mountCheckInterval = time.Second

func (h *mountHold) token() uint64 { return h.tok }

func (h *mountHold) watch() {
	defer h.wg.Done()
	t := time.NewTicker(mountCheckInterval)
	defer t.Stop()
	for {
		select {
		case <-h.stop:
			return
		case <-h.lost():
			return
		case <-t.C:
			h.check()
		}
	}
}

func (h *mountHold) check() {
	st, err := h.m.status()
	if err != nil {
		h.lose(fmt.Errorf("the mount no longer answers (%v): its lock is gone", err))
		return
	}
	if _, lost, ok := youLine(st); !ok || lost {
		h.lose(errors.New("the mount reports the lock lost (lease lost or broken by an operator)"))
	}
}

func (h *mountHold) release() error {
	h.stopOnce.Do(func() { close(h.stop) })
	h.wg.Wait()
	return flockRetry(h.m.fd, unix.LOCK_UN)
}
