package integration

import (
	"fmt"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lockfs/lockfs/internal/testutil"
)

// manyDescriptorsPy opens a control file N times (raising its soft
// RLIMIT_NOFILE to the hard limit first), takes the lock exclusively
// through the first description, forks a child that keeps all N and
// sleeps, prints "child PID" and exits: the holder dies with N
// descriptions of its control file open in its child.
const manyDescriptorsPy = `
import fcntl, os, resource, sys, time
path, n = sys.argv[1], int(sys.argv[2])
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
fds = [os.open(path, os.O_RDONLY) for _ in range(n)]
fcntl.flock(fds[0], fcntl.LOCK_EX)
pid = os.fork()
if pid == 0:
    null = os.open('/dev/null', os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    time.sleep(1000)
    os._exit(0)
print('child %d' % pid, flush=True)
`

// TestHeirOfHolderWithManyDescriptors: a holder dies with 10,000
// descriptions of its control file open, all of them in its child. The
// lock passes to the child (whichever description is the lock's, the
// child holds it), strangers stay out, and once the child is gone the
// lock is free and `lockfs unmount` stops the daemon at once. Before,
// the scan for heirs compared the 10,000 descriptions pairwise (kcmp,
// about 50 million calls: minutes), named nobody for 10,000 candidates,
// and held the daemon's exit hostage meanwhile. The kcmp counts and the
// cancelled scan have their controls in lockmgr
// (TestGroupDescriptorsSortsByDescription, TestCloseStopsScanForHeirs).
func TestHeirOfHolderWithManyDescriptors(t *testing.T) {
	const n = 10_000
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	if lim.Max < n+100 {
		testutil.Missing(t, "RLIMIT_NOFILE hard limit %d: cannot open %d descriptors", lim.Max, n)
	}
	m := mount(t)
	p := startPython(t, manyDescriptorsPy, m.path("a/.lock"), strconv.Itoa(n))
	line, ok := p.nextLine(60 * time.Second)
	child, err := strconv.Atoi(strings.TrimPrefix(line, "child "))
	if !ok || err != nil {
		t.Fatalf("holder: %q (%v); stderr: %s", line, err, p.stderr)
	}
	t.Cleanup(func() { syscall.Kill(child, syscall.SIGKILL) })
	if code, ok := p.wait(30 * time.Second); !ok || code != 0 {
		t.Fatalf("holder exited %d (%v)", code, ok)
	}

	start := time.Now()
	const want = "holder host="
	pidField := fmt.Sprintf(" pid=%d ", child)
	testutil.EventuallyWithin(t, 60*time.Second, "the child to inherit the lock", func() bool {
		st := run(t, 10*time.Second, "cat", m.path("a/.lock")).stdout
		for _, l := range strings.Split(st, "\n") {
			if strings.HasPrefix(l, want) && strings.Contains(l, pidField) {
				return true
			}
		}
		return false
	})
	t.Logf("the lock passed to the child %v after the holder's exit", time.Since(start).Round(time.Millisecond))
	expectCode(t, "a stranger's flock -n -x a/.lock while the child holds it", flockN(t, m.path("a/.lock"), "-x"), 1)

	syscall.Kill(child, syscall.SIGKILL)
	testutil.EventuallyWithin(t, 60*time.Second, "the lock to be free once the child is gone", func() bool {
		return flockN(t, m.path("a/.lock"), "-x").code == 0
	})
	start = time.Now()
	if r := lockfs(t, 30*time.Second, "unmount", m.Mnt); r.code != 0 {
		t.Fatalf("lockfs unmount: %v", r)
	}
	code, exited := m.waitExit(10 * time.Second)
	if !exited || code != 0 {
		t.Fatalf("daemon after lockfs unmount: exited=%v code=%d; want a clean exit within 10 s", exited, code)
	}
	t.Logf("the daemon stopped %v after lockfs unmount", time.Since(start).Round(time.Millisecond))
}
