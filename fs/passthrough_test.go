package fs

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lockfs/lockfs/internal/testutil"
	"github.com/lockfs/lockfs/lockmgr"
)

// ptListed returns the sorted names readdir lists in dir.
func ptListed(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
		if _, ok := controlKind(e.Name()); ok && !e.Type().IsRegular() {
			t.Errorf("%s/%s listed as %v, want a regular file", dir, e.Name(), e.Type())
		}
	}
	sort.Strings(names)
	return names
}

// TestPTControlFilesListedOnRequest: with ListControlFiles, readdir lists
// the three control files of every directory, with the inode numbers stat
// gives them; the backing names stay hidden.
func TestPTControlFilesListedOnRequest(t *testing.T) {
	src, mnt := t.TempDir(), t.TempDir()
	m := newPTMountAt(t, src, mnt, func(c *Config) { c.ListControlFiles = true })
	if err := os.Mkdir(m.s("d"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(m.s("d/..LOCK"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{"", "d"} {
		want := []string{".lock", ".lock_newdir", ".lock_usage"}
		if dir == "" {
			want = append(want, "d")
		}
		sort.Strings(want)
		if got := ptListed(t, filepath.Join(m.mnt, dir)); strings.Join(got, " ") != strings.Join(want, " ") {
			t.Errorf("readdir %q = %q, want %q", dir, got, want)
		}
	}
	// readdir and stat give a control file the same inode number.
	dfd, err := unix.Open(m.m("d"), unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 8192)
	n, err := unix.ReadDirent(dfd, buf)
	unix.Close(dfd)
	if err != nil {
		t.Fatal(err)
	}
	seen := 0
	for off := 0; off < n; {
		ino := binary.NativeEndian.Uint64(buf[off:])
		reclen := int(binary.NativeEndian.Uint16(buf[off+16:]))
		name := strings.TrimRight(string(buf[off+19:off+reclen]), "\x00")
		off += reclen
		if _, ok := controlKind(name); !ok {
			continue
		}
		seen++
		if st := lstat(t, m.m("d/"+name)); st.Ino != ino {
			t.Errorf("%s: readdir inode %d, stat inode %d", name, ino, st.Ino)
		}
	}
	if seen != 3 {
		t.Errorf("readdir listed %d control files, want 3", seen)
	}
}

func TestPTReservedNames(t *testing.T) {
	m := newPTMount(t)
	if err := os.Mkdir(m.s("d"), 0o755); err != nil {
		t.Fatal(err)
	}
	// A backing file of the local backend, as the lock engine would make.
	if err := os.WriteFile(m.s("d/..LOCK"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	// By default readdir lists neither the control files nor the backing
	// files (SPEC §1), while stat finds the control files by name.
	if got := ptListed(t, m.mnt); strings.Join(got, " ") != "d" {
		t.Errorf("readdir of the root = %q, want [d]", got)
	}
	if got := ptListed(t, m.m("d")); len(got) != 0 {
		t.Errorf("readdir of d = %q, want nothing", got)
	}
	for _, name := range []string{".lock", ".lock_newdir", ".lock_usage"} {
		if st := lstat(t, m.m("d/"+name)); st.Mode&unix.S_IFMT != unix.S_IFREG {
			t.Errorf("stat d/%s: mode %#o, want a regular file", name, st.Mode)
		}
	}
	if _, err := os.Lstat(m.m("d/..LOCK")); !errors.Is(err, syscall.ENOENT) {
		t.Errorf("lstat of a backing name: %v, want ENOENT", err)
	}

	expect := func(what string, err error, want syscall.Errno) {
		t.Helper()
		if !errors.Is(err, want) {
			t.Errorf("%s: %v, want %v", what, err, want)
		}
	}
	if err := os.WriteFile(m.m("f"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{".lock", ".lock_newdir", ".lock_usage", "..LOCK", "..LOCK_NEWDIR", "..LOCK_USAGE"} {
		p := m.m("d/" + name)
		expect("mkdir "+name, os.Mkdir(p, 0o755), syscall.EEXIST)
		expect("symlink "+name, os.Symlink("f", p), syscall.EEXIST)
		_, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
		expect("O_EXCL create "+name, err, syscall.EEXIST)
		expect("rename onto "+name, os.Rename(m.m("f"), p), syscall.EPERM)
		expect("mknod "+name, unix.Mkfifo(p, 0o644), syscall.EEXIST)
		if _, ok := controlKind(name); ok {
			expect("unlink "+name, os.Remove(p), syscall.EPERM)
			expect("rename of "+name, os.Rename(p, m.m("d/x")), syscall.EPERM)
			expect("link of "+name, os.Link(p, m.m("d/x")), syscall.EPERM)
			// The name exists, and link(2) never replaces: the kernel
			// answers EEXIST without asking.
			expect("link to "+name, os.Link(m.m("f"), p), syscall.EEXIST)
		} else {
			expect("link to "+name, os.Link(m.m("f"), p), syscall.EPERM)
			_, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY, 0o644)
			expect("create "+name, err, syscall.EPERM)
		}
	}
	if _, err := os.Stat(m.s("d/..LOCK_NEWDIR")); err == nil {
		t.Error("a backing name was created in SOURCE")
	}
	// O_CREAT without O_EXCL on a control file opens it (flock(1) does this).
	f, err := os.OpenFile(m.m("d/.lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Errorf("O_CREAT open of a control file: %v", err)
	} else {
		f.Close()
	}
	if _, err := os.Stat(m.s("d/.lock")); err == nil {
		t.Error("opening a control file created it in SOURCE")
	}
}

// runAs runs a shell command as uid:gid with umask 0, in dir.
func runAs(t *testing.T, uid, gid uint32, script string) {
	t.Helper()
	cmd := exec.Command("sh", "-c", "umask 0; "+script)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: gid}}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%q as %d:%d: %v: %s", script, uid, gid, err, out)
	}
}

// keyAt returns the inode key of path p (not following a symlink).
func keyAt(t testing.TB, p string) inodeKey {
	t.Helper()
	var st inodeStat
	if err := lstatAt(unix.AT_FDCWD, p, &st); err != nil {
		t.Fatal(err)
	}
	return keyOf(&st)
}

func lstat(t testing.TB, p string) *unix.Stat_t {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		t.Fatal(err)
	}
	return &st
}

func TestPTNewFilesBelongToTheirCreator(t *testing.T) {
	testutil.RequireRoot(t, "the daemon gives new files away only as root")
	m := newPTMount(t)
	const nobody = 65534
	if err := os.Chmod(m.s(""), 0o777); err != nil {
		t.Fatal(err)
	}
	runAs(t, nobody, nobody, "cd "+m.mnt+" && echo hi > f && chmod 640 f && mkdir -m 750 d && ln -s f l && mkfifo -m 600 p && touch -d @1000000000 f && mkdir -m 2775 g")
	for _, c := range []struct {
		name string
		mode uint32
	}{
		{"f", unix.S_IFREG | 0o640},
		{"d", unix.S_IFDIR | 0o750},
		{"l", unix.S_IFLNK | 0o777},
		{"p", unix.S_IFIFO | 0o600},
		{"g", unix.S_IFDIR | 0o2775},
	} {
		st := lstat(t, m.s(c.name))
		if st.Uid != nobody || st.Gid != nobody {
			t.Errorf("%s in SOURCE owned by %d:%d, want %d:%d", c.name, st.Uid, st.Gid, nobody, nobody)
		}
		if st.Mode != c.mode {
			t.Errorf("%s in SOURCE has mode %o, want %o (the daemon's umask must not apply)", c.name, st.Mode, c.mode)
		}
		mst := lstat(t, m.m(c.name))
		if mst.Uid != st.Uid || mst.Ino != st.Ino || mst.Size != st.Size {
			t.Errorf("%s: mount shows uid %d ino %d size %d, SOURCE %d %d %d", c.name, mst.Uid, mst.Ino, mst.Size, st.Uid, st.Ino, st.Size)
		}
	}
	if st := lstat(t, m.s("f")); st.Mtim.Sec != 1000000000 {
		t.Errorf("touch -d: mtime %d", st.Mtim.Sec)
	}

	// A setgid directory gives new entries its group, and new
	// directories its setgid bit.
	if err := os.Mkdir(m.s("shared"), 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(m.s("shared"), 0, 4242); err != nil {
		t.Fatal(err)
	}
	if err := unix.Chmod(m.s("shared"), 0o2777); err != nil {
		t.Fatal(err)
	}
	runAs(t, nobody, nobody, "cd "+m.mnt+"/shared && touch f && mkdir d")
	if st := lstat(t, m.s("shared/f")); st.Uid != nobody || st.Gid != 4242 {
		t.Errorf("file in setgid dir: %d:%d, want %d:4242", st.Uid, st.Gid, nobody)
	}
	if st := lstat(t, m.s("shared/d")); st.Gid != 4242 || st.Mode&unix.S_ISGID == 0 {
		t.Errorf("dir in setgid dir: gid %d mode %o, want gid 4242 and setgid", st.Gid, st.Mode)
	}
}

func TestPTStickyDirectory(t *testing.T) {
	testutil.RequireRoot(t, "to act as two users")
	m := newPTMount(t)
	if err := os.Mkdir(m.s("tmp"), 0o777); err != nil {
		t.Fatal(err)
	}
	if err := unix.Chmod(m.s("tmp"), 0o1777); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(m.s("tmp/mine"), nil, 0o666); err != nil {
		t.Fatal(err)
	}
	// Owned by root; nobody may not remove or rename it.
	for _, script := range []string{"rm -f " + m.m("tmp/mine"), "mv " + m.m("tmp/mine") + " " + m.m("tmp/x")} {
		cmd := exec.Command("sh", "-c", script)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		if out, err := cmd.CombinedOutput(); err == nil {
			t.Errorf("%q as nobody in a sticky directory succeeded: %s", script, out)
		}
	}
	if _, err := os.Stat(m.s("tmp/mine")); err != nil {
		t.Errorf("the file is gone: %v", err)
	}
	// Its own files it may.
	runAs(t, 65534, 65534, "touch "+m.m("tmp/own")+" && mv "+m.m("tmp/own")+" "+m.m("tmp/own2")+" && rm "+m.m("tmp/own2"))
}

func TestPTHardLinksAreOneNode(t *testing.T) {
	m := newPTMount(t)
	if err := os.Mkdir(m.m("d"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(m.m("a"), []byte("one"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(m.m("a"), m.m("d/b")); err != nil {
		t.Fatal(err)
	}
	sa, sb := lstat(t, m.m("a")), lstat(t, m.m("d/b"))
	if sa.Ino != sb.Ino || sa.Nlink != 2 || sa.Ino != lstat(t, m.s("a")).Ino {
		t.Errorf("links: ino %d and %d (SOURCE %d), nlink %d", sa.Ino, sb.Ino, lstat(t, m.s("a")).Ino, sa.Nlink)
	}
	if n := m.fs.lookupNode(keyAt(t, m.s("a"))); n == nil {
		t.Error("no node for the inode")
	}
	// Remove the name the node was last found by: the other still works
	// (stat, open, chmod).
	if err := os.Remove(m.m("d/b")); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(m.m("a"), 0o600); err != nil {
		t.Errorf("chmod through the remaining name: %v", err)
	}
	if b, err := os.ReadFile(m.m("a")); err != nil || string(b) != "one" {
		t.Errorf("read through the remaining name: %q %v", b, err)
	}
	// A POSIX lock through one name conflicts with one through the other.
	if err := os.Link(m.m("a"), m.m("c")); err != nil {
		t.Fatal(err)
	}
	p := ptStartPy(t, pyHoldLock, m.m("a"), "w")
	defer p.stop()
	if out, err := exec.Command("python3", "-c", pyTryLock, m.m("c"), "r").CombinedOutput(); err == nil {
		t.Errorf("a read lock through the other name was granted: %s", out)
	}
}

func TestPTRenameKeepsPaths(t *testing.T) {
	m := newPTMount(t)
	if err := os.MkdirAll(m.m("a/b/c"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(m.m("a/b/c/f"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(m.m("a/b/c/f"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := os.Rename(m.m("a"), m.m("z")); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(m.m("z/b"), m.m("y")); err != nil {
		t.Fatal(err)
	}
	n, ok := m.fs.lookupNode(keyAt(t, m.s("y/c"))).(*Dir)
	if !ok {
		t.Fatal("no directory node for y/c")
	}
	if got := n.relPath(); got != "y/c" {
		t.Errorf("relPath after renames = %q, want y/c", got)
	}
	if got := m.fs.root.relPath(); got != "." {
		t.Errorf("root relPath = %q", got)
	}
	// relPath is the control files' lock path as it is (Dir.LockPath):
	// the engine's clean form, whatever the names. Control: a name the
	// engine would clean ("x/.") is not.
	odd := filepath.Join("y", "..d", "d..", ".h", "a b", "-")
	if err := os.MkdirAll(m.m(odd), 0o755); err != nil {
		t.Fatal(err)
	}
	o, ok := m.fs.lookupNode(keyAt(t, m.s(odd))).(*Dir)
	if !ok {
		t.Fatal("no directory node for", odd)
	}
	for _, p := range []string{o.relPath(), o.LockPath()} {
		if c, err := lockmgr.CleanPath(p); err != nil || c != p || p != odd {
			t.Errorf("path %q of %s: the engine's form is %q (%v)", p, odd, c, err)
		}
	}
	if c, _ := lockmgr.CleanPath(odd + "/."); c == odd+"/." {
		t.Errorf("control: CleanPath left %q as it was", c)
	}
	if _, err := f.WriteAt([]byte("yz"), 1); err != nil {
		t.Errorf("write through a descriptor opened before the renames: %v", err)
	}
	if err := f.Chmod(0o600); err != nil {
		t.Errorf("fchmod after the renames: %v", err)
	}
	if b, _ := os.ReadFile(m.s("y/c/f")); string(b) != "xyz" {
		t.Errorf("SOURCE has %q", b)
	}
	if err := os.WriteFile(m.m("y/c/g"), nil, 0o644); err != nil {
		t.Errorf("create under the renamed directory: %v", err)
	}
}

func TestPTSeesChangesInSource(t *testing.T) {
	m := newPTMount(t)
	if err := os.WriteFile(m.m("f"), []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(m.m("f")); string(b) != "old" {
		t.Fatalf("read %q", b)
	}
	// Appended in SOURCE: the next stat and open see it at once.
	fa, err := os.OpenFile(m.s("f"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	fa.WriteString(" and more")
	fa.Close()
	if st := lstat(t, m.m("f")); st.Size != int64(len("old and more")) {
		t.Errorf("size after an append in SOURCE: %d", st.Size)
	}
	if b, _ := os.ReadFile(m.m("f")); string(b) != "old and more" {
		t.Errorf("read after an append in SOURCE: %q", b)
	}
	// Replaced in SOURCE by rename (atomic save): the new content, at once.
	if err := os.WriteFile(m.s("f.tmp"), []byte("new"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(m.s("f.tmp"), m.s("f")); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(m.m("f")); err != nil || string(b) != "new" {
		t.Errorf("read after a replace in SOURCE: %q, %v", b, err)
	}
	// Removed in SOURCE: gone at once; created in SOURCE: there at once.
	// (Once the handles of the reads above are released: Release is
	// asynchronous, and a node with an open handle answers from it.)
	m.waitReleased("f")
	if err := os.Remove(m.s("f")); err != nil {
		t.Fatal(err)
	}
	// The stat reaches the daemon, which answers ENOENT, unless the
	// kernel still holds the name and the attributes it got with the
	// last read (entryValid, fileAttrValid: 1 s each; doc.go "Caching"):
	// CI once saw the stat answered from them. Within those, ENOENT.
	var statErr error
	if !testutil.Poll(3*time.Second, func() bool {
		_, statErr = os.Stat(m.m("f"))
		return errors.Is(statErr, syscall.ENOENT)
	}) {
		t.Errorf("stat after a remove in SOURCE: %v, want ENOENT within the kernel's 1 s caches", statErr)
	}
	if err := os.WriteFile(m.s("g"), []byte("g"), 0o644); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(m.m("g")); err != nil || string(b) != "g" {
		t.Errorf("read of a file created in SOURCE: %q %v", b, err)
	}
	// A directory replaced in SOURCE: its new contents.
	if err := os.Mkdir(m.s("d"), 0o755); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(m.s("d/one"), nil, 0o644)
	if _, err := os.Stat(m.m("d/one")); err != nil {
		t.Fatal(err)
	}
	os.Rename(m.s("d"), m.s("d.old"))
	os.Mkdir(m.s("d"), 0o755)
	os.WriteFile(m.s("d/two"), nil, 0o644)
	if _, err := os.Stat(m.m("d/two")); err != nil {
		t.Errorf("stat in a directory replaced in SOURCE: %v", err)
	}
	if _, err := os.Stat(m.m("d/one")); !errors.Is(err, syscall.ENOENT) {
		t.Errorf("stat of a name of the old directory: %v, want ENOENT", err)
	}
}

func TestPTTimesAndTruncate(t *testing.T) {
	m := newPTMount(t)
	if err := os.WriteFile(m.m("f"), []byte("hello world"), 0o644); err != nil {
		t.Fatal(err)
	}
	old := time.Unix(1000000000, 5000)
	if err := os.Chtimes(m.m("f"), old, old); err != nil {
		t.Fatal(err)
	}
	if st := lstat(t, m.s("f")); st.Mtim.Sec != old.Unix() || st.Mtim.Nsec != 5000 || st.Atim.Sec != old.Unix() {
		t.Errorf("explicit times: %v %v", st.Mtim, st.Atim)
	}
	before := time.Now().Add(-time.Second)
	// UTIME_NOW for both (touch).
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, m.m("f"), []unix.Timespec{{Nsec: unix.UTIME_NOW}, {Nsec: unix.UTIME_OMIT}}, 0); err != nil {
		t.Fatal(err)
	}
	st := lstat(t, m.s("f"))
	if time.Unix(st.Atim.Unix()).Before(before) || st.Mtim.Sec != old.Unix() {
		t.Errorf("UTIME_NOW atime / UTIME_OMIT mtime: atime %v mtime %v", st.Atim, st.Mtim)
	}
	if err := os.Truncate(m.m("f"), 5); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(m.s("f")); string(b) != "hello" {
		t.Errorf("after truncate: %q", b)
	}
	var sfs unix.Statfs_t
	if err := unix.Statfs(m.mnt, &sfs); err != nil || sfs.Blocks == 0 {
		t.Errorf("statfs: %v %+v", err, sfs)
	}
}

// waitReleased waits until the file rel in SOURCE has no open handle
// through the mount (the kernel sends Release after close(2) returns).
func (m *ptMount) waitReleased(rel string) {
	m.t.Helper()
	key := keyAt(m.t, m.s(rel))
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		n := m.fs.lookupNode(key)
		if n == nil {
			return
		}
		b := n.base()
		b.mu.Lock()
		open := len(b.open)
		b.mu.Unlock()
		if open == 0 {
			return
		}
		time.Sleep(time.Millisecond)
	}
	m.t.Fatalf("%s still has open handles", rel)
}

// TestPTReadsFileReplacedOftenInSource: a file that another program
// replaces in SOURCE every 20 ms (write a temporary file, rename it over)
// can be read through the mount all the while, every read whole. (Under
// heavy load a read can lose the race twice, the kernel's retry included,
// and see ENOENT; rarely, and never for long: an ENOENT must not stick.)
func TestPTReadsFileReplacedOftenInSource(t *testing.T) {
	m := newPTMount(t)
	if err := os.WriteFile(m.s("status"), []byte("0000"), 0o644); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 1; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			tmp := m.s("status.tmp")
			if err := os.WriteFile(tmp, []byte(fmt.Sprintf("%04d", i%10000)), 0o644); err != nil {
				t.Error(err)
				return
			}
			if err := os.Rename(tmp, m.s("status")); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	deadline := time.Now().Add(1500 * time.Millisecond)
	reads, fails, inRow := 0, 0, 0
	for time.Now().Before(deadline) {
		b, err := os.ReadFile(m.m("status"))
		reads++
		if err == nil {
			_, err = os.Stat(m.m("status"))
		}
		switch {
		case err == nil && len(b) == 4:
			inRow = 0
		case errors.Is(err, syscall.ENOENT):
			fails++
			if inRow++; inRow > 3 {
				t.Errorf("read %d: ENOENT %d times in a row", reads, inRow)
			}
		default:
			t.Errorf("read %d: %q %v", reads, b, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	close(stop)
	<-done
	t.Logf("%d reads, %d lost the race twice", reads, fails)
	if fails*10 > reads {
		t.Errorf("%d of %d reads failed", fails, reads)
	}
}

// TestPTRenameFlags: mv -n (coreutils, renameat2 RENAME_NOREPLACE) keeps
// an existing target and moves onto a free name, and rename(2) replaces,
// as on SOURCE. The flags themselves: TestRenameat2Flags.
func TestPTRenameFlags(t *testing.T) {
	m := newPTMount(t)
	for _, n := range []string{"a", "b"} {
		if err := os.WriteFile(m.m(n), []byte(n), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if out, err := exec.Command("mv", "-n", m.m("a"), m.m("b")).CombinedOutput(); err != nil {
		t.Logf("mv -n: %v %s", err, out) // coreutils 9.2+ exits 1 when it skips
	}
	if b, _ := os.ReadFile(m.s("b")); string(b) != "b" {
		t.Errorf("mv -n replaced b: %q", b)
	}
	if b, _ := os.ReadFile(m.s("a")); string(b) != "a" {
		t.Errorf("mv -n onto an existing b moved a: %q", b)
	}
	if out, err := exec.Command("mv", "-n", m.m("a"), m.m("c")).CombinedOutput(); err != nil {
		t.Errorf("mv -n to a new name: %v %s", err, out)
	}
	if err := os.Rename(m.m("c"), m.m("b")); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(m.s("b")); string(b) != "a" {
		t.Errorf("rename did not replace b: %q", b)
	}
}
