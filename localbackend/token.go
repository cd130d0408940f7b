package localbackend

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/lockfs/lockfs/internal/backoff"
	"github.com/lockfs/lockfs/lockmgr"
)

// Fencing tokens.
//
// The token counter of a lock is the first line of its backing file, in
// decimal ("41\n"); an empty file counts as 0, so the first token is 1.
// Because the file outlives daemons, tokens keep increasing across restarts
// and between every daemon working on one SOURCE.
//
// Holders of a shared claim may call NextToken at the same time from several
// daemons, so the read-increment-write is done under an open file
// description (OFD) write lock on the whole file. On Linux OFD locks and
// flock(2) locks are independent, so this lock neither needs nor disturbs
// the claim, and two descriptors of one process exclude each other (unlike
// POSIX record locks). The lock is held for one pread, pwrite and
// ftruncate. It is taken with F_OFD_SETLK and polled with backoff while
// busy, never with F_OFD_SETLKW, so that a stuck holder (any program taking
// an fcntl lock on the backing file) cannot trap a thread in an
// uncancellable wait: NextToken honours ctx.
//
// An exclusive claim takes the OFD lock too. It used to skip it, since
// while it holds LOCK_EX nobody else holds a claim on the file; but the
// claim may be downgraded while NextToken runs (a holder's token is issued
// when first read, lockmgr/tokens.go, possibly while the holder converts),
// and a shared claim of another daemon could then bump the counter between
// this call's read and write, so that both got the same token
// (TestTokenOfDowngradedClaim). Calls on the one lease also exclude each
// other (tokenBusy).

// testHookTokenRead, if set, runs in bumpToken between the read of the
// counter and the write of the next value (tests).
var testHookTokenRead func()

// tokenReadMax bounds the first line: 20 digits of a uint64, CR, LF.
const tokenReadMax = 22

// NextToken returns the lock's next fencing token, strictly greater than
// every token any daemon got for this lock before.
func (l *lease) NextToken(ctx context.Context) (uint64, error) {
	if err := l.b.enter(); err != nil {
		return 0, l.errorf("next token", err)
	}
	defer l.b.inflight.Done()

	l.mu.Lock()
	lostErr, released := l.lostErr, l.released
	l.mu.Unlock()
	switch {
	case lostErr != nil:
		return 0, lostErr
	case released:
		return 0, l.errorf("next token", lockmgr.ErrNotHeld)
	case !l.writable:
		return 0, l.errorf("next token", errors.New("the backing file is read-only to this daemon"))
	}

	bo := backoff.New(tokenPollMin, tokenPollMax)
	for {
		var (
			tok    uint64
			locked bool
		)
		err := fdDo(l.file, func(fd int) error {
			if !l.tokenBusy.CompareAndSwap(false, true) {
				return nil // another call on this lease: poll
			}
			defer l.tokenBusy.Store(false)
			err := ofdLock(fd, unix.F_WRLCK)
			if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EACCES) {
				return nil // busy: poll
			}
			if err != nil {
				return fmt.Errorf("OFD lock: %w", err)
			}
			locked = true
			tok, err = bumpToken(fd, l.b.syncToken)
			if uerr := ofdLock(fd, unix.F_UNLCK); err == nil && uerr != nil {
				err = fmt.Errorf("OFD unlock: %w", uerr)
			}
			return err
		})
		if err != nil {
			return 0, l.errorf("next token", err)
		}
		if locked {
			return tok, nil
		}
		if err := pollSleep(ctx, bo, l.b.closeCtx.Done()); err != nil {
			return 0, l.errorf("next token", err)
		}
	}
}

// ofdLock sets (F_WRLCK) or clears (F_UNLCK) an OFD lock on the whole file
// without waiting.
func ofdLock(fd int, typ int16) error {
	lk := unix.Flock_t{Type: typ, Whence: 0, Start: 0, Len: 0}
	return ignoringEINTR(func() error { return unix.FcntlFlock(uintptr(fd), unix.F_OFD_SETLK, &lk) })
}

// bumpToken reads the counter at the start of fd, writes it back plus one as
// the file's only line, and returns the new value.
func bumpToken(fd int, sync bool) (uint64, error) {
	var buf [tokenReadMax]byte
	var n int
	err := ignoringEINTR(func() (err error) { n, err = unix.Pread(fd, buf[:], 0); return err })
	if err != nil {
		return 0, fmt.Errorf("read: %w", err)
	}
	if testHookTokenRead != nil {
		testHookTokenRead()
	}
	cur, err := parseToken(buf[:n])
	if err != nil {
		return 0, err
	}
	if cur == math.MaxUint64 {
		return 0, errors.New("token counter exhausted")
	}
	next := cur + 1
	out := append(strconv.AppendUint(buf[:0], next, 10), '\n')
	var w int
	err = ignoringEINTR(func() (err error) { w, err = unix.Pwrite(fd, out, 0); return err })
	if err == nil && w != len(out) {
		err = fmt.Errorf("short write (%d of %d bytes)", w, len(out))
	}
	if err != nil {
		return 0, fmt.Errorf("write: %w", err)
	}
	// The new text ends with a newline, so a crash between the write and
	// the truncation still leaves the new value as the first line. The
	// truncation is needed only when the file was longer than the new text
	// (a counter only grows, so that is rare, and ftruncate(2) costs a
	// journalled metadata update on every call otherwise).
	if n > len(out) {
		if err := ignoringEINTR(func() error { return unix.Ftruncate(fd, int64(len(out))) }); err != nil {
			return 0, fmt.Errorf("truncate: %w", err)
		}
	}
	if sync {
		if err := ignoringEINTR(func() error { return unix.Fdatasync(fd) }); err != nil {
			return 0, fmt.Errorf("fdatasync: %w", err)
		}
	}
	return next, nil
}

// parseToken parses the first line of a backing file: decimal digits,
// optionally surrounded by white space; empty means 0.
func parseToken(b []byte) (uint64, error) {
	line, _, found := bytes.Cut(b, []byte{'\n'})
	if !found && len(b) == tokenReadMax {
		return 0, fmt.Errorf("token line longer than %d bytes: %q...", tokenReadMax, b)
	}
	line = bytes.TrimSpace(line)
	if len(line) == 0 {
		return 0, nil
	}
	v, err := strconv.ParseUint(string(line), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("first line %q is not a decimal token; fix or empty the file", line)
	}
	return v, nil
}
