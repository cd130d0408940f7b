package fs_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"bazil.org/fuse"
	"bazil.org/fuse/fs"
	"golang.org/x/sys/unix"
)

// plusFS is a root directory of n regular files whose names differ in
// length (so that READDIRPLUS replies end at varied places) and whose
// sizes are their indexes. It counts what the server asks of it and which
// file nodes the kernel may still hold (handed out by Lookup or
// LookupDirent, not yet forgotten).
type plusFS struct {
	files []*plusFile
	// plus: the root's handles implement fs.HandleReadDirPlusAller;
	// otherwise only fs.HandleReadDirAller.
	plus bool

	mu sync.Mutex
	// lookups and direntLookups count Lookup and LookupDirent calls;
	// dirents counts LookupDirent calls per name.
	lookups, direntLookups int
	dirents                map[string]int
	// live holds the file nodes handed out and not yet forgotten;
	// forgets counts Forget calls.
	live    map[*plusFile]bool
	forgets int
	// onList, if set, is called at every listing (ReadDirAll).
	onList func(ctx context.Context)
}

func newPlusFS(n int, plus bool) *plusFS {
	p := &plusFS{plus: plus, dirents: map[string]int{}, live: map[*plusFile]bool{}}
	for i := 0; i < n; i++ {
		name := fmt.Sprintf("f%04d-%s", i, strings.Repeat("x", i*7%61))
		p.files = append(p.files, &plusFile{fs: p, name: name, ino: uint64(100 + i), size: uint64(i)})
	}
	return p
}

func (p *plusFS) Root() (fs.Node, error) { return plusDir{p}, nil }

// counts returns the Lookup and LookupDirent calls so far and the nodes
// the kernel may still hold.
func (p *plusFS) counts() (lookups, direntLookups, live int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.lookups, p.direntLookups, len(p.live)
}

func (p *plusFS) file(name string) *plusFile {
	for _, f := range p.files {
		if f.name == name {
			return f
		}
	}
	return nil
}

type plusDir struct{ fs *plusFS }

func (d plusDir) Attr(ctx context.Context, a *fuse.Attr) error {
	a.Inode = 1
	a.Mode = os.ModeDir | 0o755
	return nil
}

func (d plusDir) Lookup(ctx context.Context, name string) (fs.Node, error) {
	f := d.fs.file(name)
	d.fs.mu.Lock()
	defer d.fs.mu.Unlock()
	d.fs.lookups++
	if f == nil {
		return nil, syscall.ENOENT
	}
	d.fs.live[f] = true
	return f, nil
}

func (d plusDir) Open(ctx context.Context, req *fuse.OpenRequest, resp *fuse.OpenResponse) (fs.Handle, error) {
	if d.fs.plus {
		return plusHandle{plainHandle{d.fs}}, nil
	}
	return plainHandle{d.fs}, nil
}

// plainHandle lists the directory: ".", "..", then the files.
type plainHandle struct{ fs *plusFS }

func (h plainHandle) ReadDirAll(ctx context.Context) ([]fuse.Dirent, error) {
	if h.fs.onList != nil {
		h.fs.onList(ctx)
	}
	out := []fuse.Dirent{{Inode: 1, Type: fuse.DT_Dir, Name: "."}, {Inode: 1, Type: fuse.DT_Dir, Name: ".."}}
	for _, f := range h.fs.files {
		out = append(out, fuse.Dirent{Inode: f.ino, Type: fuse.DT_File, Name: f.name})
	}
	return out, nil
}

// plusHandle answers READDIRPLUS too.
type plusHandle struct{ plainHandle }

func (h plusHandle) LookupDirent(ctx context.Context, ent fuse.Dirent, resp *fuse.LookupResponse) (fs.Node, error) {
	f := h.fs.file(ent.Name)
	h.fs.mu.Lock()
	defer h.fs.mu.Unlock()
	h.fs.direntLookups++
	h.fs.dirents[ent.Name]++
	if f == nil {
		return nil, syscall.ENOENT
	}
	h.fs.live[f] = true
	return f, nil
}

type plusFile struct {
	fs        *plusFS
	name      string
	ino, size uint64
}

func (f *plusFile) Attr(ctx context.Context, a *fuse.Attr) error {
	a.Inode = f.ino
	a.Mode = 0o644
	a.Size = f.size
	return nil
}

func (f *plusFile) Forget() {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	f.fs.forgets++
	delete(f.fs.live, f)
}

// reqCounter counts the requests the server receives, by operation name,
// from its debug messages.
type reqCounter struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *reqCounter) config() *fs.Config {
	c.n = map[string]int{}
	return &fs.Config{Debug: func(msg interface{}) {
		s := fmt.Sprint(msg)
		if !strings.HasPrefix(s, "<- ") {
			return
		}
		op, _, _ := strings.Cut(strings.TrimPrefix(s, "<- "), " ")
		c.mu.Lock()
		c.n[op]++
		c.mu.Unlock()
	}}
}

func (c *reqCounter) get(op string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[op]
}

// walkPlus lists dir and lstats every entry, as ls -l does, checking that
// the listing is p's files, each once, with its size.
func walkPlus(t *testing.T, p *plusFS, dir string) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) != len(p.files) {
		t.Fatalf("listed %d entries, want %d", len(ents), len(p.files))
	}
	for i, e := range ents {
		f := p.files[i]
		if e.Name() != f.name {
			t.Fatalf("entry %d is %q, want %q", i, e.Name(), f.name)
		}
		var st unix.Stat_t
		if err := unix.Lstat(filepath.Join(dir, e.Name()), &st); err != nil {
			t.Fatal(err)
		}
		if st.Ino != f.ino || uint64(st.Size) != f.size || st.Mode != unix.S_IFREG|0o644 {
			t.Fatalf("%s: ino %d size %d mode %o; want %d, %d, %o", f.name, st.Ino, st.Size, st.Mode, f.ino, f.size, unix.S_IFREG|0o644)
		}
	}
}

const plusFiles = 1000

// TestReadDirPlusNoLookups: with ReadDirPlus a listing of 1000 names and
// an lstat of each cost no LOOKUP: the kernel sends READDIRPLUS, the
// handle looks up each entry once, "." and ".." never, and the attributes
// that lstat returns are the handle's. Controls: the same walk without
// the mount option (plain READDIR) costs one LOOKUP per name, and with the
// option but a handle that only lists (HandleReadDirAller) the entries go
// out without nodes, so the kernel again looks up every name.
func TestReadDirPlusNoLookups(t *testing.T) {
	p := newPlusFS(plusFiles, true)
	var rc reqCounter
	conn, dir := mountRecConfig(t, p, rc.config(), fuse.ReadDirPlus(false))
	if conn.Features()&fuse.InitDoReaddirplus == 0 {
		t.Fatalf("InitDoReaddirplus not negotiated: %v", conn.Features())
	}
	if conn.Features()&fuse.InitReaddirplusAuto != 0 {
		t.Errorf("InitReaddirplusAuto negotiated though not asked for: %v", conn.Features())
	}
	walkPlus(t, p, dir)
	lookups, direntLookups, _ := p.counts()
	t.Logf("READDIRPLUS requests: %d, READDIR: %d, LOOKUP: %d", rc.get("ReadDirPlus"), rc.get("Read"), rc.get("Lookup"))
	if lookups != 0 || rc.get("Lookup") != 0 {
		t.Errorf("%d Lookup calls, %d LOOKUP requests with READDIRPLUS; want 0", lookups, rc.get("Lookup"))
	}
	if direntLookups != plusFiles {
		t.Errorf("%d LookupDirent calls, want %d", direntLookups, plusFiles)
	}
	if rc.get("ReadDirPlus") < 2 {
		t.Errorf("%d READDIRPLUS requests: the listing should take several", rc.get("ReadDirPlus"))
	}
	p.mu.Lock()
	for name, n := range p.dirents {
		if n != 1 || name == "." || name == ".." {
			t.Errorf("LookupDirent(%q) called %d times, want once (never for . and ..)", name, n)
		}
	}
	p.mu.Unlock()

	plain := newPlusFS(plusFiles, true)
	_, pdir := mountRec(t, plain)
	walkPlus(t, plain, pdir)
	if lookups, direntLookups, _ := plain.counts(); lookups != plusFiles || direntLookups != 0 {
		t.Errorf("control without ReadDirPlus: %d lookups, %d dirent lookups; want %d, 0", lookups, direntLookups, plusFiles)
	}

	listOnly := newPlusFS(plusFiles, false)
	_, ldir := mountRec(t, listOnly, fuse.ReadDirPlus(false))
	walkPlus(t, listOnly, ldir)
	if lookups, _, _ := listOnly.counts(); lookups != plusFiles {
		t.Errorf("control with a handle that only lists: %d lookups, want %d", lookups, plusFiles)
	}
}

// dropCaches makes the kernel forget the dentries and inodes it can
// (those not in use), sending FORGET for each.
func dropCaches(t *testing.T) {
	t.Helper()
	unix.Sync()
	if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("2"), 0); err != nil {
		t.Fatalf("drop_caches (needs root): %v", err)
	}
}

// waitLive waits until p's nodes the kernel may hold number want, and
// returns the last count.
func waitLive(p *plusFS, want int) int {
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, _, live := p.counts()
		if live == want || time.Now().After(deadline) {
			return live
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestReadDirPlusForget: every node that READDIRPLUS entries handed to
// the kernel is forgotten when the kernel drops its caches, each exactly
// once, after two walks (the second links entries the kernel already
// holds: one more lookup reference each). A miscount (a reference taken
// for an entry that did not fit in a reply, or for "." or "..") would
// leave nodes that are never forgotten. Control: a file held open keeps
// its node through drop_caches, so the count does see a kept reference;
// once closed, it goes too.
func TestReadDirPlusForget(t *testing.T) {
	p := newPlusFS(plusFiles, true)
	_, dir := mountRec(t, p, fuse.ReadDirPlus(false))
	walkPlus(t, p, dir)
	walkPlus(t, p, dir)
	if _, _, live := p.counts(); live != plusFiles {
		t.Fatalf("%d nodes live after the walks, want %d", live, plusFiles)
	}
	// A raw descriptor, not os.Open: the Go runtime registers every file
	// os.Open returns with epoll, and the kernel turns that epoll_ctl
	// into a FUSE POLL request to this very process, made on a thread
	// that keeps its P; a garbage collection stopping the world then
	// waits for that P while the readers that would answer the POLL wait
	// for the world: a deadlock (CI at 2185943 hung here for 8 minutes).
	heldFd, err := unix.Open(filepath.Join(dir, p.files[7].name), unix.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	closeHeld := func() {
		if !closed {
			closed = true
			unix.Close(heldFd)
		}
	}
	// Closed before the unmount whatever happens: a descriptor left open
	// would be closed at exit, its FLUSH answered by nobody.
	t.Cleanup(closeHeld)
	dropCaches(t)
	if live := waitLive(p, 1); live != 1 {
		t.Fatalf("%d nodes live after drop_caches with one file open, want 1", live)
	}
	p.mu.Lock()
	kept := p.live[p.files[7]]
	p.mu.Unlock()
	if !kept {
		t.Fatalf("the open file's node was forgotten")
	}
	closeHeld()
	// The kernel sends the RELEASE of a closed file in the background: a
	// drop_caches before it is answered finds the inode still open, so
	// drop them again until the node goes (or 30 s pass).
	live := -1
	for deadline := time.Now().Add(30 * time.Second); live != 0 && time.Now().Before(deadline); {
		dropCaches(t)
		for wait := time.Now().Add(time.Second); time.Now().Before(wait); time.Sleep(20 * time.Millisecond) {
			if _, _, live = p.counts(); live == 0 {
				break
			}
		}
	}
	if live != 0 {
		t.Fatalf("%d nodes never forgotten after drop_caches", live)
	}
	p.mu.Lock()
	forgets := p.forgets
	p.mu.Unlock()
	if forgets != plusFiles {
		t.Errorf("%d Forget calls, want %d (one per node)", forgets, plusFiles)
	}
}

// TestNodeRefShrinksAfterForget: once the kernel has forgotten a walk's
// 3000 nodes, the server's map from nodes to IDs is made anew at a small
// size (a Go map keeps its peak's buckets; this one held 3001 entries).
func TestNodeRefShrinksAfterForget(t *testing.T) {
	const files = 3000
	p := newPlusFS(files, true)
	srv, _, dir := mountRecServer(t, p, nil, fuse.ReadDirPlus(false))
	walkPlus(t, p, dir)
	if n, peak := fs.NodeRefSizes(srv); n != files+1 || peak != files+1 {
		t.Fatalf("after the walk: %d nodes, peak %d; want %d", n, peak, files+1)
	}
	dropCaches(t)
	if live := waitLive(p, 0); live != 0 {
		t.Fatalf("%d nodes never forgotten", live)
	}
	if n, peak := fs.NodeRefSizes(srv); n != 1 || peak >= files/4 {
		t.Errorf("after drop_caches: %d nodes, peak %d; want the root alone in a map made anew (peak below %d)", n, peak, files/4)
	}
}

// TestReadDirPlusInterruptedListsAll: a signal to a process reading a
// directory (here SIGURG, which Go's runtime sends its own threads all the
// time) makes the kernel send an INTERRUPT for the READDIRPLUS; the reply
// must still list the directory, as getdents(2) on a local file system is
// never cut short by a signal. Before the fix the server answered EINTR
// when the interrupt came before the first entry (lockfs CI: posixtest
// DirSeek failed with "interrupted system call"). Control: the listing saw
// its context cancelled, so the interrupt did reach it.
func TestReadDirPlusInterruptedListsAll(t *testing.T) {
	p := newPlusFS(20, true)
	started := make(chan struct{})
	var once sync.Once
	cancelled := make(chan bool, 1)
	p.onList = func(ctx context.Context) {
		first := false
		once.Do(func() { first = true })
		if !first {
			return
		}
		close(started)
		select {
		case <-ctx.Done():
			cancelled <- true
		case <-time.After(10 * time.Second):
			cancelled <- false
		}
	}
	_, dir := mountRec(t, p, fuse.ReadDirPlus(false))
	// getdents on a thread of its own, which is then signalled.
	type result struct {
		names int
		err   error
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		tid := unix.Gettid()
		fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
		if err != nil {
			done <- result{err: err}
			return
		}
		defer unix.Close(fd)
		go func() {
			<-started
			unix.Tgkill(os.Getpid(), tid, unix.SIGURG)
		}()
		buf := make([]byte, 64<<10)
		names := 0
		for {
			n, err := unix.ReadDirent(fd, buf)
			if err != nil {
				done <- result{names, err}
				return
			}
			if n == 0 {
				done <- result{names, nil}
				return
			}
			_, c, _ := unix.ParseDirent(buf[:n], -1, nil)
			names += c
		}
	}()
	var r result
	select {
	case r = <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("getdents did not return")
	}
	if !<-cancelled {
		t.Fatal("control: the listing's context was not cancelled: the signal sent no INTERRUPT")
	}
	if r.err != nil || r.names != 20 {
		t.Fatalf("getdents after an interrupt: %d names, %v; want all 20 and no error", r.names, r.err)
	}
}
