package fs

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/hanwen/go-fuse/v2/posixtest"
)

// TestPosix runs go-fuse's POSIX conformance tests, each against a fresh
// mount. Every test it does not skip by itself must pass, except those
// listed in posixDeviations, which check something lockfs deliberately
// does differently or check less than lockfs wants; each is run in an
// adapted form instead (see there).
func TestPosix(t *testing.T) {
	names := make([]string, 0, len(posixtest.All))
	for name := range posixtest.All {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			m := newPTMount(t)
			if dev, ok := posixDeviations[name]; ok {
				t.Logf("deviation: %s; running the adapted test", dev.why)
				dev.test(t, m)
				return
			}
			posixtest.All[name](t, m.mnt)
		})
	}
}

// posixDeviation is a posixtest test that checks something lockfs
// deliberately does differently, or less strictly than lockfs wants, and
// the test that replaces it.
type posixDeviation struct {
	why  string
	test func(t *testing.T, m *ptMount)
}

var posixDeviations = map[string]posixDeviation{
	"ReadDirBasic": {
		why:  "upstream counts the entries in a map, so a name listed twice passes; the control files are not listed (SPEC §1)",
		test: ptReadDirBasic,
	},
	"FcntlFlockLocksFile": {
		why: "it expects a process's F_SETLK read lock to conflict with the same process's write lock " +
			"through another descriptor; POSIX (and ext4: TestPosixOnLocalDisk) converts the lock instead",
		test: ptFcntlLocksFile,
	},
}

// ptReadDirBasic is posixtest.ReadDirBasic that also fails when a name is
// listed twice; the control files are not listed (SPEC §1).
func ptReadDirBasic(t *testing.T, m *ptMount) {
	want := map[string]bool{}
	for i := 0; i < 110; i++ {
		nm := fmt.Sprintf("file%036x", i)
		want[nm] = true
		if err := os.WriteFile(filepath.Join(m.mnt, nm), []byte("hello"), 0o644); err != nil {
			t.Fatalf("WriteFile %q: %v", nm, err)
		}
		f, err := os.Open(m.mnt)
		if err != nil {
			t.Fatal(err)
		}
		names, err := f.Readdirnames(-1)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]bool{}
		for _, n := range names {
			if got[n] {
				t.Errorf("entry %q listed twice", n)
			}
			got[n] = true
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("after %d files: got %d entries, want %d", i+1, len(got), len(want))
		}
	}
}

// ptFcntlLocksFile checks POSIX record-lock semantics: within one process
// a second lock through another descriptor converts the first; another
// process conflicts; OFD locks of two descriptors conflict even in one
// process.
func ptFcntlLocksFile(t *testing.T, m *ptMount) {
	fn := m.m("test")
	f1, err := os.Create(fn)
	if err != nil {
		t.Fatal(err)
	}
	defer f1.Close()
	wlk := syscall.Flock_t{Type: syscall.F_WRLCK}
	if err := syscall.FcntlFlock(f1.Fd(), syscall.F_SETLK, &wlk); err != nil {
		t.Fatalf("F_SETLK write: %v", err)
	}
	f2, err := os.OpenFile(fn, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f2.Close()
	if out, err := exec.Command("python3", "-c", pyTryLock, fn, "w").CombinedOutput(); err == nil || !strings.Contains(string(out), "EAGAIN") {
		t.Errorf("another process got a write lock while this one holds one: %v %s", err, out)
	}
	rlk := syscall.Flock_t{Type: syscall.F_RDLCK}
	if err := syscall.FcntlFlock(f2.Fd(), syscall.F_SETLK, &rlk); err != nil {
		t.Errorf("same process, second descriptor: F_SETLK read = %v, want success (conversion)", err)
	}
	if out, err := exec.Command("python3", "-c", pyTryLock, fn, "r").CombinedOutput(); err != nil {
		t.Errorf("another process was refused a read lock after the conversion to read: %v %s", err, out)
	}

	g1, err := os.OpenFile(m.m("ofd"), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer g1.Close()
	g2, err := os.OpenFile(m.m("ofd"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer g2.Close()
	if err := syscall.FcntlFlock(g1.Fd(), unix.F_OFD_SETLK, &syscall.Flock_t{Type: syscall.F_WRLCK}); err != nil {
		t.Fatalf("F_OFD_SETLK: %v", err)
	}
	if err := syscall.FcntlFlock(g2.Fd(), unix.F_OFD_SETLK, &syscall.Flock_t{Type: syscall.F_RDLCK}); err != syscall.EAGAIN {
		t.Errorf("OFD lock through a second description: %v, want EAGAIN", err)
	}
}

// pyTryLock tries a non-blocking lockf on argv[1] ("r" shared, "w"
// exclusive) and prints EAGAIN and exits 1 on a conflict.
const pyTryLock = `
import errno, fcntl, os, sys
f = open(sys.argv[1], "r+")
try:
    if sys.argv[2] == "w":
        fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    else:
        fcntl.lockf(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
except OSError as e:
    print(errno.errorcode[e.errno])
    sys.exit(1)
print("locked")
`

// TestPosixOnLocalDisk runs the same tests on a plain directory, as the
// reference for what "behaves as a local file system" means here.
func TestPosixOnLocalDisk(t *testing.T) {
	if os.Getenv("LOCKFS_POSIX_REFERENCE") == "" {
		t.Skip("set LOCKFS_POSIX_REFERENCE=1 to run the reference on local disk")
	}
	names := make([]string, 0, len(posixtest.All))
	for name := range posixtest.All {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			posixtest.All[name](t, filepath.Clean(t.TempDir()))
		})
	}
}
