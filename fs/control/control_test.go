package control_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lockfs/lockfs/fs/internal/fsmount"
	"github.com/lockfs/lockfs/fs/internal/fstest"
	"github.com/lockfs/lockfs/internal/testutil"
	"github.com/lockfs/lockfs/lockmgr"
)

// The control-file tests mount a real lockfs in process (package fs over a
// real engine and the local backend: fstest) and drive it with real
// processes: flock(1), and a small Python program (fstest.Py) that makes
// the exact calls a test needs and reports each errno.

// ctlMount is a mounted lockfs for one test, with its file system.
type ctlMount struct{ *fsmount.Mount }

// newCtlMount mounts a fresh SOURCE, with allow_other so that tests can
// run processes as nobody. Everything is undone in t.Cleanup.
func newCtlMount(t *testing.T) *ctlMount {
	t.Helper()
	return newCtlMountAt(t, t.TempDir())
}

// newCtlMountAt is newCtlMount over an existing SOURCE, which several
// mounts (daemons) may share.
func newCtlMountAt(t *testing.T, src string) *ctlMount {
	t.Helper()
	return &ctlMount{fsmount.New(t, src)}
}

// controlKinds are the control files' names and the locks they take.
var controlKinds = map[string]lockmgr.Kind{
	".lock":        lockmgr.KindDir,
	".lock_newdir": lockmgr.KindNewDir,
	".lock_usage":  lockmgr.KindUsage,
}

// openHandles returns the number of open file descriptions of the control
// file rel (as "a/.lock") that the daemon has not yet seen released.
func (m *ctlMount) openHandles(rel string) int {
	dir, name := filepath.Split(rel)
	kind, ok := controlKinds[name]
	if !ok {
		m.T.Fatalf("%s is no control file", rel)
	}
	path, err := lockmgr.CleanPath(dir)
	if err != nil {
		m.T.Fatal(err)
	}
	return m.FS.Control().OpenHandles(lockmgr.LockID{Path: path, Kind: kind})
}

func TestControlFilesAppearEverywhere(t *testing.T) {
	m := newCtlMount(t)
	m.Mkdir("a/b")
	for _, d := range []string{"", "a", "a/b"} {
		ents, err := os.ReadDir(m.Path(d))
		if err != nil {
			t.Fatal(err)
		}
		// Hidden from readdir (SPEC §1), found by name.
		for _, e := range ents {
			if _, ok := controlKinds[e.Name()]; ok {
				t.Errorf("%q lists %s", d, e.Name())
			}
		}
		for _, n := range []string{".lock", ".lock_newdir", ".lock_usage"} {
			fi, err := os.Stat(m.Path(filepath.Join(d, n)))
			if err != nil {
				t.Fatal(err)
			}
			if !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o666 || fi.Size() != 0 {
				t.Errorf("%s/%s: mode %v size %d, want a regular empty 0666 file", d, n, fi.Mode(), fi.Size())
			}
		}
	}
	// The owner is the directory's owner; the inode is stable and differs
	// per kind and directory.
	if err := os.Chown(filepath.Join(m.Src, "a"), 65534, 65534); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "the owner of a/.lock to follow a's", func() bool {
		fi, err := os.Stat(m.Path("a/.lock"))
		return err == nil && fi.Sys().(*syscall.Stat_t).Uid == 65534
	})
	ino := func(rel string) uint64 {
		fi, err := os.Stat(m.Path(rel))
		if err != nil {
			t.Fatal(err)
		}
		return fi.Sys().(*syscall.Stat_t).Ino
	}
	if ino("a/.lock") != ino("a/.lock") || ino("a/.lock") == ino("a/.lock_usage") || ino("a/.lock") == ino("a/b/.lock") {
		t.Errorf("inodes: a/.lock %d, a/.lock_usage %d, a/b/.lock %d", ino("a/.lock"), ino("a/.lock_usage"), ino("a/b/.lock"))
	}
}

func TestControlFileStatusRead(t *testing.T) {
	m := newCtlMount(t)
	m.Mkdir("a/b")
	got := m.Status("a/b/.lock_newdir")
	want := "lock a/b/.lock_newdir\nkind newdir\nmode none\nimplicit 0\nwaiters 0\nlease none\n"
	if got != want {
		t.Errorf("status of a free lock:\n%s\nwant:\n%s", got, want)
	}
	// cat reads through the page-cache bypass despite size 0.
	code, out := fstest.RunExit(t, 10*time.Second, "cat", m.Path(".lock"))
	if code != 0 || !strings.HasPrefix(out, "lock .lock\nkind dir\n") {
		t.Errorf("cat .lock: exit %d, %q", code, out)
	}

	holder := fstest.StartPy(t, 0, 0)
	holder.Must("ok", "open f %s", m.Path("a/b/.lock"))
	holder.Must("ok", "flock f ex")
	holder.Must("wrote 14", `write f "deploying v1.2"`)

	st := m.Status("a/b/.lock")
	wantHolder := fmt.Sprintf("holder host=testhost pid=%d uid=0 mode=exclusive ", holder.PID)
	if !strings.Contains(st, "\nmode exclusive\n") || !strings.Contains(st, wantHolder) ||
		!strings.Contains(st, ` explicit note="deploying v1.2"`) || !strings.HasSuffix(st, "\nlease exclusive\n") {
		t.Errorf("status while held:\n%s", st)
	}
	if strings.Contains(st, "you holder") {
		t.Errorf("a reader through another descriptor is told it holds the lock:\n%s", st)
	}
	// Ancestors are held implicitly.
	if st := m.Status("a/.lock"); !strings.Contains(st, "\nmode shared\n") || !strings.Contains(st, "\nimplicit 1\n") {
		t.Errorf("status of the parent:\n%s", st)
	}

	// Through the holding descriptor, the reader's token comes first.
	r := holder.Do("read f")
	if !strings.HasPrefix(r, `read "you holder token=`) || !strings.Contains(r, " explicit you note=") {
		t.Errorf("status through the holder's descriptor: %s", r)
	}

	// Identities are hidden from other users, and shown to the holder's uid.
	other := fstest.StartPy(t, 65534, 65534)
	other.Must("ok", "open f %s", m.Path("a/b/.lock"))
	r = other.Do("read f")
	if !strings.Contains(r, `holder mode=exclusive explicit hidden\n`) || strings.Contains(r, "deploying") || strings.Contains(r, "pid=") {
		t.Errorf("status as another user: %s", r)
	}
}

func TestControlFileNote(t *testing.T) {
	m := newCtlMount(t)
	m.Mkdir("a", "b")
	// The shell idiom: a descriptor on the lock file, flock on it, then
	// the pid written to it. exec 9> opens with O_TRUNC.
	sh := fstest.StartLine(t, "ready", "bash", "-c",
		fmt.Sprintf(`exec 9>%s && flock -x 9 && echo $$ >&9 && echo x >&9 && echo ready && exec sleep 60`, m.Path("a/.lock")))
	st := m.Status("a/.lock")
	if want := fmt.Sprintf(`note="%d\nx"`, sh.Process.Pid); !strings.Contains(st, want) {
		t.Errorf("status lacks %s:\n%s", want, st)
	}
	// Control: another directory's status has no holder and no note.
	if st := m.Status("b/.lock"); strings.Contains(st, "note=") || strings.Contains(st, "holder") {
		t.Errorf("b/.lock shows a holder:\n%s", st)
	}

	// 1 KiB is the limit, per open file description.
	p := fstest.StartPy(t, 0, 0)
	p.Must("ok", "open f %s", m.Path("b/.lock"))
	p.Must("wrote 1024", `write f "%s"`, strings.Repeat("y", 1024))
	p.Must("err EFBIG", `write f "z"`)
	p.Must("ok", "open g %s", m.Path("b/.lock"))
	p.Must("err EFBIG", `write g "%s"`, strings.Repeat("y", 1025))
	p.Must("wrote 10", `write g "%s"`, strings.Repeat("y", 10))
}

func TestControlFileMetadataRefused(t *testing.T) {
	m := newCtlMount(t)
	m.Mkdir("a")
	f := m.Path("a/.lock")
	// Accepted and without effect: touch, O_TRUNC, O_CREAT.
	for _, c := range [][]string{{"touch", f}, {"bash", "-c", ": > " + f}, {"flock", "-n", f, "true"}} {
		if code, out := fstest.RunExit(t, 10*time.Second, c[0], c[1:]...); code != 0 {
			t.Errorf("%v: exit %d: %s", c, code, out)
		}
	}
	if err := os.Chmod(f, 0o600); !errors.Is(err, syscall.EPERM) {
		t.Errorf("chmod: %v, want EPERM", err)
	}
	if err := os.Chown(f, 65534, 65534); !errors.Is(err, syscall.EPERM) {
		t.Errorf("chown: %v, want EPERM", err)
	}
	// truncate(f, 0) is indistinguishable from O_TRUNC: accepted, a no-op.
	if err := os.Truncate(f, 0); err != nil {
		t.Errorf("truncate to 0: %v", err)
	}
	if err := os.Truncate(f, 10); !errors.Is(err, syscall.EPERM) {
		t.Errorf("truncate to 10: %v, want EPERM", err)
	}
	if err := os.Remove(f); !errors.Is(err, syscall.EPERM) {
		t.Errorf("unlink: %v, want EPERM", err)
	}
	if err := os.Mkdir(m.Path("a/.lock_usage"), 0o755); !errors.Is(err, syscall.EEXIST) {
		t.Errorf("mkdir .lock_usage: %v, want EEXIST", err)
	}
	fi, err := os.Stat(f)
	if err != nil || fi.Mode().Perm() != 0o666 || fi.Size() != 0 {
		t.Errorf("after the refused changes: %v %v", fi.Mode(), err)
	}
	// Control: mkdir of an unreserved name works.
	if err := os.Mkdir(m.Path("a/sub"), 0o755); err != nil {
		t.Errorf("mkdir a/sub: %v", err)
	}
}
