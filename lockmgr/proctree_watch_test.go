package lockmgr

import (
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

func procID(t *testing.T, tree *ProcTree, pid int) ProcID {
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
	tree, err := NewProcTree(ProcTreeConfig{})
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
	tree, err := NewProcTree(ProcTreeConfig{})
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
	found, err := tree.Descriptors([]uint64{st.Ino, st.Ino + 1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	groups := found[st.Ino]
	var got [][]int
	for _, g := range groups {
		var pids []int
		for _, p := range g {
			pids = append(pids, p.PID)
		}
		slices.Sort(pids)
		got = append(got, pids)
	}
	slices.SortFunc(got, func(a, b []int) int { return len(b) - len(a) })
	want := [][]int{{c1.Process.Pid, c2.Process.Pid}, {c3.Process.Pid}}
	slices.Sort(want[0])
	if len(got) != 2 || !slices.Equal(got[0], want[0]) || !slices.Equal(got[1], want[1]) {
		t.Fatalf("groups %v, want %v", got, want)
	}
	if g := found[st.Ino+1]; len(g) != 0 {
		t.Fatalf("another inode: %v", g)
	}
}
