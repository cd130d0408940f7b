package control_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/lockfs/lockfs/fs/internal/fstest"
	"github.com/lockfs/lockfs/internal/testutil"
)

// TestControlFileNoteAppend: a note is a small file of its own open file
// description. Before the fix, after a 20-byte note written through one
// descriptor, `echo pid >&9` on an O_APPEND descriptor stored 20 NUL bytes
// before the pid (the kernel's append offset is the size any handle
// reached), and after a 1 KiB note it failed with EFBIG.
func TestControlFileNoteAppend(t *testing.T) {
	m := newCtlMount(t)
	m.Mkdir("a", "b")
	for _, first := range []int{20, 1024} {
		p := fstest.StartPy(t, 0, 0)
		p.Must("ok", "open f %s", m.Path("a/.lock"))
		p.Must(fmt.Sprintf("wrote %d", first), `write f "%s"`, strings.Repeat("n", first))
		// O_APPEND without O_CREAT: an O_CREAT open refreshes the
		// kernel's idea of the size, which hides the bug.
		q := fstest.StartPy(t, 0, 0)
		q.Must("ok", "opena g %s", m.Path("a/.lock"))
		q.Must("ok", "flock g ex")
		pid := strconv.Itoa(100 + first)
		q.Must(fmt.Sprintf("wrote %d", len(pid)+1), `write g "%s\n"`, pid)
		if want := fmt.Sprintf(" note=%q\n", pid); !strings.Contains(m.Status("a/.lock"), want) {
			t.Errorf("after a %d-byte note through another descriptor, status lacks%s%s", first, want, m.Status("a/.lock"))
		}
		q.Kill()
		p.Kill()
		testutil.Eventually(t, "a/.lock to be free", func() bool { return fstest.FlockNB(t, "-x", m.Path("a/.lock")) })
	}
	// Writes at offsets behave as in a small file: a pwrite past the end
	// fills the gap with zeros, and the limit is on the end offset.
	p := fstest.StartPy(t, 0, 0)
	p.Must("ok", "open f %s", m.Path("b/.lock"))
	p.Must("ok", "flock f ex")
	p.Must("wrote 2", `write f "ab"`)
	p.Must("wrote 1", `pwrite f 4 "c"`)
	if st := m.Status("b/.lock"); !strings.Contains(st, ` note="ab\x00\x00c"`) {
		t.Errorf("note after a write and a pwrite past its end:\n%s", st)
	}
	p.Must("err EFBIG", `pwrite f 1024 "d"`)
	p.Must("wrote 1", `pwrite f 1023 "d"`)
}

// TestStatusEscapesNames: a directory name with newlines cannot forge
// status lines. Before the fix, the lock line printed the name raw, so a
// name like "x\nmode none\nholder host=evil" put a fake mode and holder
// ahead of the real ones.
func TestStatusEscapesNames(t *testing.T) {
	m := newCtlMount(t)
	name := "x\nmode none\nholder host=evil"
	if err := os.Mkdir(filepath.Join(m.Src, name), 0o755); err != nil {
		t.Fatal(err)
	}
	fstest.FlockHold(t, m.Path(name+"/.lock"), "-x")
	st := m.Status(name + "/.lock")
	lines := strings.Split(strings.TrimSuffix(st, "\n"), "\n")
	if want := "lock " + strconv.Quote(name+"/.lock"); lines[0] != want {
		t.Errorf("first line %q, want %q", lines[0], want)
	}
	for _, l := range lines {
		if l == "mode none" || strings.HasPrefix(l, "holder host=evil") {
			t.Errorf("forged line %q in:\n%s", l, st)
		}
	}
	if !strings.Contains(st, "\nmode exclusive\n") {
		t.Errorf("status lacks the real mode:\n%s", st)
	}
	// Control: a plain name is shown as it is.
	m.Mkdir("plain")
	if st := m.Status("plain/.lock"); !strings.HasPrefix(st, "lock plain/.lock\n") {
		t.Errorf("plain name: %q", st)
	}
}
