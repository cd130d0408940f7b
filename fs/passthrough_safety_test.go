package fs

import (
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// flipper swaps SOURCE/x between a real directory and a symlink that leads
// out of SOURCE ("../outside"), atomically (RENAME_EXCHANGE), until stopped.
type flipper struct {
	stop  chan struct{}
	done  chan struct{}
	flips atomic.Int64
}

func startFlipper(t *testing.T, src string) *flipper {
	t.Helper()
	if err := os.Mkdir(filepath.Join(src, "x"), 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../outside", filepath.Join(src, "y")); err != nil {
		t.Fatal(err)
	}
	f := &flipper{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(f.done)
		x, y := filepath.Join(src, "x"), filepath.Join(src, "y")
		for {
			select {
			case <-f.stop:
				return
			default:
			}
			if err := unix.Renameat2(unix.AT_FDCWD, x, unix.AT_FDCWD, y, unix.RENAME_EXCHANGE); err != nil {
				t.Errorf("flip: %v", err)
				return
			}
			f.flips.Add(1)
			// Stay a little in each state, so that operations get
			// through sometimes and races happen at every stage.
			if n := rand.IntN(100); n > 0 {
				time.Sleep(time.Duration(n) * time.Microsecond)
			}
		}
	}()
	t.Cleanup(f.halt)
	return f
}

func (f *flipper) halt() {
	select {
	case <-f.stop:
	default:
		close(f.stop)
	}
	<-f.done
}

// outsideSnapshot describes the outside directory: its entries, and the
// victim file's mode, size, content, times and xattrs.
func outsideSnapshot(t *testing.T, dir string) string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	s := ""
	for _, e := range ents {
		s += e.Name() + " "
	}
	var st unix.Stat_t
	if err := unix.Lstat(filepath.Join(dir, "victim"), &st); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(filepath.Join(dir, "victim"))
	sz, _ := unix.Listxattr(filepath.Join(dir, "victim"), make([]byte, 1024))
	var dst unix.Stat_t
	unix.Lstat(dir, &dst)
	return s + "|" + string(b) + "|" + time.Unix(st.Mtim.Unix()).String() + "|" +
		string(rune(st.Mode)) + string(rune(st.Uid)) + string(rune(sz)) + "|" + time.Unix(dst.Mtim.Unix()).String()
}

// TestPTSymlinkSwapRaceStaysBeneath: while SOURCE/x flips between a real
// directory and a symlink to a directory outside SOURCE, processes create,
// write, truncate, chmod, chown, set xattrs, rename, link and remove
// through MNT/x for two seconds. Nothing outside SOURCE may change. The
// symlink is relative ("../outside") and the mount point has no
// "../outside", so the kernel's own resolution of MNT/x can never reach
// the outside directory: only lockfs could.
func TestPTSymlinkSwapRaceStaysBeneath(t *testing.T) {
	// base/src is SOURCE, base/outside is outside it, and the mount point
	// base/m/mnt is one level deeper, so that "../outside" from it names
	// base/m/outside, which does not exist.
	base := t.TempDir()
	outside := filepath.Join(base, "outside")
	for _, d := range []string{filepath.Join(base, "src"), outside, filepath.Join(base, "m", "mnt")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	m := newPTMountAt(t, filepath.Join(base, "src"), filepath.Join(base, "m", "mnt"))
	if err := os.WriteFile(filepath.Join(outside, "victim"), []byte("precious"), 0o600); err != nil {
		t.Fatal(err)
	}
	old := time.Unix(1000000000, 0)
	os.Chtimes(filepath.Join(outside, "victim"), old, old)
	os.Chtimes(outside, old, old)
	if _, err := os.Stat(filepath.Join(filepath.Dir(m.mnt), "outside")); err == nil {
		t.Fatal("the mount point's parent has an outside directory too")
	}
	before := outsideSnapshot(t, outside)

	fl := startFlipper(t, m.src)
	var ok atomic.Int64
	var errMu sync.Mutex
	errs := map[string]int{}
	deadline := time.Now().Add(2 * time.Second)
	var wg sync.WaitGroup
	ops := []func(i int) error{
		func(i int) error { return os.WriteFile(m.m("x/victim"), []byte("overwritten"), 0o666) },
		func(i int) error { return os.WriteFile(m.m("x/new"), []byte("new"), 0o666) },
		func(i int) error { return os.Truncate(m.m("x/victim"), 0) },
		func(i int) error { return os.Chmod(m.m("x/victim"), 0o777) },
		func(i int) error { return os.Chown(m.m("x/victim"), 4242, 4242) },
		func(i int) error { return unix.Setxattr(m.m("x/victim"), "user.evil", []byte("1"), 0) },
		func(i int) error { return os.Chtimes(m.m("x/victim"), time.Now(), time.Now()) },
		func(i int) error { return os.Mkdir(m.m("x/newdir"), 0o777) },
		func(i int) error { return os.Symlink("/", m.m("x/newlink")) },
		func(i int) error { return os.Link(m.m("x/victim"), m.m("x/hard")) },
		func(i int) error { return os.Rename(m.m("x/victim"), m.m("x/moved")) },
		func(i int) error { return os.Remove(m.m("x/victim")) },
		func(i int) error {
			f, err := os.OpenFile(m.m("x/victim"), os.O_RDWR, 0)
			if err != nil {
				return err
			}
			defer f.Close()
			_, err = f.WriteAt([]byte("XX"), 0)
			return err
		},
		func(i int) error { return unix.Mkfifo(m.m("x/fifo"), 0o666) },
	}
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; time.Now().Before(deadline); i++ {
				if err := ops[i%len(ops)](i); err == nil {
					ok.Add(1)
				} else {
					var en unix.Errno
					errors.As(err, &en)
					errMu.Lock()
					errs[unix.ErrnoName(en)]++
					errMu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	fl.halt()
	after := outsideSnapshot(t, outside)
	if before != after {
		t.Errorf("the directory outside SOURCE changed:\nbefore %q\nafter  %q", before, after)
	}
	t.Logf("%d flips, %d operations succeeded (on the real directory), failures: %v", fl.flips.Load(), ok.Load(), errs)
	refused := m.msgs.count("symlink in backing path refused")
	t.Logf("lockfs met the symlink in a backing path %d times", refused)
	if fl.flips.Load() < 100 || ok.Load() == 0 || refused == 0 {
		t.Errorf("the race did not run: %d flips, %d successful operations, %d symlinks met", fl.flips.Load(), ok.Load(), refused)
	}
}

// TestPTSymlinkSwapRaceControl shows that the race is real: the same
// flipping defeats a program that joins paths under SOURCE and opens them.
func TestPTSymlinkSwapRaceControl(t *testing.T) {
	base := t.TempDir()
	src := filepath.Join(base, "src")
	outside := filepath.Join(base, "outside")
	for _, d := range []string{src, outside} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	fl := startFlipper(t, src)
	deadline := time.Now().Add(5 * time.Second)
	escaped := false
	for !escaped && time.Now().Before(deadline) {
		f, err := os.OpenFile(filepath.Join(src, "x/file"), os.O_CREATE|os.O_WRONLY, 0o644)
		if err == nil {
			f.Close()
		}
		_, err = os.Stat(filepath.Join(outside, "file"))
		escaped = err == nil
	}
	fl.halt()
	if !escaped {
		t.Fatal("the naive open never reached outside SOURCE: the safety test proves nothing")
	}
	t.Logf("naive open escaped after %d flips", fl.flips.Load())
}
