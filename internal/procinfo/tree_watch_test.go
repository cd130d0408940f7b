package procinfo

import (
	"cmp"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lockfs/lockfs/internal/testutil"

	"github.com/lockfs/lockfs/lockmgr"
)

// startSleeper runs sleep in a session of its own with files as its
// descriptors 3, 4...; cleanup kills it.
func startSleeper(t *testing.T, files ...*os.File) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("sleep", "600")
	cmd.ExtraFiles = files
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	return cmd
}

func procID(t *testing.T, tree *Tree, pid int) lockmgr.ProcID {
	t.Helper()
	l, err := tree.Lineage(pid)
	if err != nil {
		t.Fatal(err)
	}
	return l.Self()
}

// TestWaitExit: the pidfd watch returns when the process exits, and when
// its context ends (control: it does not return while the process lives).
func TestWaitExit(t *testing.T) {
	testutil.CheckGoroutines(t)
	tree, err := NewTree(TreeConfig{})
	if err != nil {
		t.Fatal(err)
	}
	cmd := startSleeper(t)
	p := procID(t, tree, cmd.Process.Pid)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- tree.WaitExit(ctx, p) }()
	select {
	case err := <-done:
		t.Fatalf("WaitExit returned while the process lives: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled WaitExit: %v", err)
		}
	case <-time.After(testutil.DefaultWait):
		t.Fatal("a cancelled WaitExit did not return")
	}

	go func() { done <- tree.WaitExit(context.Background(), p) }()
	cmd.Process.Kill()
	cmd.Wait()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("WaitExit after the exit: %v", err)
		}
	case <-time.After(testutil.DefaultWait):
		t.Fatal("WaitExit did not see the exit")
	}
	// A process that is already gone (its pid not reused with this start
	// time) returns at once.
	if err := tree.WaitExit(context.Background(), p); err != nil {
		t.Fatal(err)
	}
}

// TestDescriptors: processes that share one open file description of a
// control file form one group; a process that opened the file itself forms
// another. (kcmp needs ptrace access: the test runs the helpers as its own
// user.)
func TestDescriptors(t *testing.T) {
	tree, err := NewTree(TreeConfig{})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), ".lock")
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	shared, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	own, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	c1 := startSleeper(t, shared)
	c2 := startSleeper(t, shared)
	c3 := startSleeper(t, own)
	// This process's own descriptors count too (it is not the daemon):
	// close them, so that only the helpers hold the file.
	shared.Close()
	own.Close()

	// Control in the same scan: another inode has no holders.
	found, err := tree.Descriptors(context.Background(), []uint64{st.Ino, st.Ino + 1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	got := canonGroups(found[st.Ino])
	pair := []int{c1.Process.Pid, c2.Process.Pid}
	slices.Sort(pair)
	want := canonGroups([][]lockmgr.ProcID{{{PID: pair[0]}, {PID: pair[1]}}, {{PID: c3.Process.Pid}}})
	if !slices.EqualFunc(got, want, slices.Equal) {
		t.Fatalf("groups %v, want %v", got, want)
	}
	if g := found[st.Ino+1]; len(g) != 0 {
		t.Fatalf("another inode: %v", g)
	}
}

// TestGroupDescriptorsSortsByDescription: a process that outlived the
// holder keeps 10,000 descriptors of a control file, each its own open
// file description (fd numbers stand for descriptions here, as after a
// fork), and its child shares one of them. The groups are found with
// O(n log n) comparisons. Control: the grouping before (each descriptor
// compared with every group found so far) needs about n²/2 on the same
// descriptors and finds the same groups. A descriptor that cannot be
// compared (its process gone) is a group of its own.
func TestGroupDescriptorsSortsByDescription(t *testing.T) {
	const n = 10_000
	heir, child := lockmgr.ProcID{PID: 100, Start: 1}, lockmgr.ProcID{PID: 200, Start: 1}
	var cands []fdRef
	for fd := 3; fd < 3+n; fd++ {
		cands = append(cands, fdRef{p: heir, fd: fd})
	}
	cands = append(cands, fdRef{p: child, fd: 3})
	// Shuffled, so that neither order of the scan favours one grouping.
	for i := range cands {
		j := (i*7919 + 13) % len(cands)
		cands[i], cands[j] = cands[j], cands[i]
	}
	calls := 0
	byFD := func(a, b fdRef) (int, error) {
		calls++
		return cmp.Compare(a.fd, b.fd), nil
	}
	never := func(int) bool { return false }

	got := groupDescriptors(slices.Clone(cands), never, byFD)
	sorted := calls
	logN := 0
	for m := len(cands); m > 1; m >>= 1 {
		logN++
	}
	bound := 2*len(cands)*(logN+1) + 2*len(cands)
	if sorted > bound {
		t.Errorf("%d comparisons for %d descriptors, want at most %d (O(n log n))", sorted, len(cands), bound)
	}
	calls = 0
	old := groupPairwise(slices.Clone(cands), never, func(a, b fdRef) bool { r, _ := byFD(a, b); return r == 0 })
	t.Logf("comparisons: sorted %d, pairwise (before) %d", sorted, calls)
	if calls <= bound {
		t.Errorf("control: the pairwise grouping made %d comparisons, within the bound %d: the test cannot tell", calls, bound)
	}
	if a, b := canonGroups(got), canonGroups(old); !slices.EqualFunc(a, b, slices.Equal) {
		t.Fatalf("groups differ from the pairwise grouping's: %d vs %d groups", len(a), len(b))
	}
	if len(got) != n {
		t.Fatalf("%d groups, want %d", len(got), n)
	}

	// A descriptor whose process is gone cannot be compared: a group of
	// its own; the others are grouped as before.
	gone := lockmgr.ProcID{PID: 300, Start: 1}
	failing := func(a, b fdRef) (int, error) {
		if a.p == gone || b.p == gone {
			return 0, unix.ESRCH
		}
		return cmp.Compare(a.fd, b.fd), nil
	}
	mixed := []fdRef{{heir, 3}, {gone, 3}, {child, 3}, {heir, 4}}
	want := [][]int{{100}, {100, 200}, {300}}
	if g := canonGroups(groupDescriptors(mixed, never, failing)); !slices.EqualFunc(g, want, slices.Equal) {
		t.Errorf("groups with a process gone: %v, want %v", g, want)
	}
}

// groupPairwise is the grouping before sorting, kept for the control:
// each descriptor compared with the first of every group found so far.
func groupPairwise(cands []fdRef, alone func(pid int) bool, same func(a, b fdRef) bool) [][]lockmgr.ProcID {
	var out [][]lockmgr.ProcID
	var groups [][]fdRef
	for _, c := range cands {
		if alone(c.p.PID) {
			out = append(out, []lockmgr.ProcID{c.p})
			continue
		}
		placed := false
		for i, g := range groups {
			if same(g[0], c) {
				groups[i] = append(g, c)
				placed = true
				break
			}
		}
		if !placed {
			groups = append(groups, []fdRef{c})
		}
	}
	for _, g := range groups {
		var procs []lockmgr.ProcID
		for _, r := range g {
			if !slices.Contains(procs, r.p) {
				procs = append(procs, r.p)
			}
		}
		out = append(out, procs)
	}
	return out
}

// canonGroups returns groups as sorted pid lists, sorted.
func canonGroups(groups [][]lockmgr.ProcID) [][]int {
	var out [][]int
	for _, g := range groups {
		var pids []int
		for _, p := range g {
			pids = append(pids, p.PID)
		}
		slices.Sort(pids)
		out = append(out, pids)
	}
	slices.SortFunc(out, slices.Compare)
	return out
}
