package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/lockfs/lockfs/daemon"
	"github.com/lockfs/lockfs/internal/procinfo"
	"github.com/lockfs/lockfs/localbackend"
	"github.com/lockfs/lockfs/lockmgr"
)

// engineLocker takes a lock with no mount: the protocol engine and a
// backend (local or gcs) run in this process, as they do in a daemon, so
// the lock is one of the same namespace. This process is the only one the
// engine serves.
type engineLocker struct {
	daemon *daemon.Daemon // without a mount
	engine *lockmgr.Engine
	id     lockmgr.LockID
	source string // local: SOURCE; "" for gcs
	where  string // the backend, for messages
	lost   *onceLost
}

// engineOwner is the one owner of an engine locker's engine.
var engineOwner = lockmgr.Owner{Class: lockmgr.OwnerFile, ID: 1}

// engineCloseTimeout bounds releasing the lock and closing the backend.
const engineCloseTimeout = 30 * time.Second

func newEngineLocker(mf mountFlags, source, dir string, kind lockmgr.Kind) (*engineLocker, error) {
	e := &engineLocker{lost: newOnceLost()}
	var err error
	if mf.backend == "local" {
		if source, err = existingDir("SOURCE", source); err != nil {
			return nil, &targetError{err: err}
		}
		if filepath.IsAbs(dir) {
			real, err := filepath.EvalSymlinks(dir)
			if err != nil {
				return nil, targetErrorf("DIR %s: %w", dir, err)
			}
			if !within(real, source) {
				return nil, targetErrorf("DIR %s is not inside SOURCE %s", dir, source)
			}
			if dir, err = filepath.Rel(source, real); err != nil {
				return nil, &targetError{err: err}
			}
		}
		e.source, e.where = source, "SOURCE "+source
	} else {
		e.where = describeBackend(mf, "")
		e.where = strings.TrimSuffix(e.where, " host=")
	}
	p, err := lockmgr.CleanPath(filepath.ToSlash(dir))
	if err != nil {
		return nil, targetErrorf("DIR %q: %w", dir, err)
	}
	e.id = lockmgr.LockID{Path: p, Kind: kind}

	// The backend's and the engine's errors go to stderr, which COMMAND
	// shares: warnings (retried requests) would drown its output.
	log := logrus.New()
	log.SetOutput(os.Stderr)
	log.SetLevel(logrus.ErrorLevel)
	cfg, err := daemonConfig(mf, source, log)
	if err != nil {
		return nil, err
	}
	cfg.OnLoss = func(l lockmgr.LostHold) { e.lost.lose(l.Err) }
	cfg.KeepContended = keepContended(log)
	if e.daemon, err = daemon.Start(cfg); err != nil {
		return nil, err
	}
	e.engine = e.daemon.Engine()
	return e, nil
}

func (e *engineLocker) name() string { return e.id.String() }

func (e *engineLocker) acquire(ctx context.Context, mode lockmgr.Mode, wait bool) (heldLock, error) {
	g, err := e.engine.Acquire(ctx, lockmgr.Request{
		Lock: e.id, Mode: mode, Owner: engineOwner,
		TID: unix.Gettid(), UID: uint32(os.Getuid()), Wait: wait,
	})
	if err != nil {
		return nil, fmt.Errorf("%s (%s): %w", e.id, e.where, err)
	}
	return &engineHold{e: e, tok: g.Token}, nil
}

// holders says who holds the lock, for -v. For the local backend the
// kernel knows: /proc/locks lists the flocks on the backing files of the
// lock and of its ancestors (a mount's holds on locks below take the
// ancestors' files shared). The gcs backend lists every host's claim on
// the lock from one read of its object; a claim above or below it that
// blocks is not in that object.
func (e *engineLocker) holders() string {
	if e.source != "" {
		return describeFlockHolders(e.source, e.id)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	claims, err := e.engine.Claims(ctx, e.id)
	if err != nil {
		return fmt.Sprintf("(claims unreadable: %v)", err)
	}
	var out []string
	for _, c := range claims {
		out = append(out, describeClaim(c, time.Now())...)
	}
	if len(out) == 0 {
		return "no other host claims this lock itself: a claim of another host above or below it blocks"
	}
	return strings.Join(out, "; ")
}

func (e *engineLocker) close() error { return e.daemon.Close() }

// engineHold is a lock held by an engineLocker's engine.
type engineHold struct {
	e   *engineLocker
	tok uint64
}

func (h *engineHold) token() uint64         { return h.tok }
func (h *engineHold) lost() <-chan struct{} { return h.e.lost.lost() }
func (h *engineHold) lostErr() error        { return h.e.lost.lostErr() }

// check has nothing to do: the engine reports a loss through OnLoss.
func (h *engineHold) check() {}

func (h *engineHold) release() error {
	ctx, cancel := context.WithTimeout(context.Background(), engineCloseTimeout)
	defer cancel()
	return h.e.engine.Release(ctx, h.e.id, engineOwner)
}

// describeFlockHolders lists the processes that flock the backing files
// of id and of its ancestors in SOURCE, from /proc/locks.
func describeFlockHolders(source string, id lockmgr.LockID) string {
	files := map[uint64]string{} // inode -> backing file, relative to SOURCE
	var dev uint64
	add := func(dir string, k lockmgr.Kind) {
		rel := path.Join(dir, localbackend.BackingName(k))
		var st unix.Stat_t
		if unix.Stat(filepath.Join(source, rel), &st) == nil {
			files[st.Ino] = rel
			dev = st.Dev
		}
	}
	add(id.Path, id.Kind)
	if id.Kind != lockmgr.KindDir {
		add(id.Path, lockmgr.KindDir)
	}
	for d := id.Path; d != "."; {
		d = path.Dir(d)
		add(d, lockmgr.KindDir)
	}
	f, err := os.Open("/proc/locks")
	if err != nil {
		return ""
	}
	defer f.Close()
	self := os.Getpid()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// 1: FLOCK  ADVISORY  WRITE 1234 00:2a:5678 0 EOF
		fl := strings.Fields(sc.Text())
		if len(fl) < 6 || fl[1] != "FLOCK" {
			continue
		}
		var maj, min uint32
		var ino uint64
		if _, err := fmt.Sscanf(fl[5], "%x:%x:%d", &maj, &min, &ino); err != nil {
			continue
		}
		rel, ok := files[ino]
		if !ok || unix.Mkdev(maj, min) != dev {
			continue
		}
		var pid int
		fmt.Sscanf(fl[4], "%d", &pid)
		if pid == self {
			continue
		}
		mode := "exclusive"
		if fl[3] == "READ" {
			mode = "shared"
		}
		d := fmt.Sprintf("%s held %s by pid %d", rel, mode, pid)
		if c := procinfo.Describe("", pid); c.Name != "" {
			d += " (" + c.String() + ")"
		}
		out = append(out, d)
	}
	if len(out) == 0 {
		return ""
	}
	return strings.Join(out, "; ")
}
