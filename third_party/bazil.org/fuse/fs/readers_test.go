package fs_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"bazil.org/fuse"
	"bazil.org/fuse/fs"
)

// goid returns the id of the calling goroutine, from its stack header
// ("goroutine 42 [running]:").
func goid() int {
	var buf [64]byte
	b := buf[:runtime.Stack(buf[:], false)]
	b = bytes.TrimPrefix(b, []byte("goroutine "))
	id, _ := strconv.Atoi(string(b[:bytes.IndexByte(b, ' ')]))
	return id
}

// gidFile is "f": its Getattr records which goroutine served it, and its
// reads block until their request is interrupted.
type gidFile struct {
	mu       sync.Mutex
	servedOn map[int]int // goroutine id -> Getattr requests it served
	blocked  int         // reads waiting now
	ended    int         // reads that saw their context end
}

func (f *gidFile) Attr(ctx context.Context, a *fuse.Attr) error {
	a.Inode = 2
	a.Mode = 0o666
	a.Size = 1
	a.Valid = 0 // every stat asks again
	return nil
}

func (f *gidFile) Getattr(ctx context.Context, req *fuse.GetattrRequest, resp *fuse.GetattrResponse) error {
	f.mu.Lock()
	f.servedOn[goid()]++
	f.mu.Unlock()
	resp.Attr = fuse.Attr{Inode: 2, Mode: 0o666, Size: 1, Valid: 0}
	return nil
}

func (f *gidFile) Open(ctx context.Context, req *fuse.OpenRequest, resp *fuse.OpenResponse) (fs.Handle, error) {
	resp.Flags |= fuse.OpenDirectIO
	return f, nil
}

func (f *gidFile) Read(ctx context.Context, req *fuse.ReadRequest, resp *fuse.ReadResponse) error {
	f.mu.Lock()
	f.blocked++
	f.mu.Unlock()
	<-ctx.Done()
	f.mu.Lock()
	f.blocked--
	f.ended++
	f.mu.Unlock()
	return syscall.EINTR
}

// getattrs counts the Getattr requests served.
func (f *gidFile) getattrs() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, c := range f.servedOn {
		n += c
	}
	return n
}

func (f *gidFile) state() (goroutines, blocked, ended int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.servedOn), f.blocked, f.ended
}

// mountGid mounts a gidFile; perRequest selects upstream's goroutine per
// request. Cleanup unmounts and waits for Serve.
func mountGid(t *testing.T, perRequest bool) (*gidFile, string) {
	t.Helper()
	f := &gidFile{servedOn: map[int]int{}}
	dir := t.TempDir()
	conn, err := fuse.Mount(dir)
	if err != nil {
		t.Fatalf("mount (needs root and /dev/fuse): %v", err)
	}
	srv := fs.New(conn, nil)
	if perRequest {
		fs.SetPerRequest(srv)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(&recFS{node: f}) }()
	t.Cleanup(func() {
		if err := fuse.Unmount(dir); err != nil {
			if out, err := exec.Command("fusermount3", "-uz", dir).CombinedOutput(); err != nil {
				t.Errorf("fusermount3 -uz %s: %v: %s", dir, err, out)
			}
		}
		select {
		case err := <-served:
			if err != nil {
				t.Errorf("serve: %v", err)
			}
		case <-time.After(15 * time.Second):
			t.Errorf("Serve did not return after unmount")
		}
		conn.Close()
	})
	return f, dir
}

// TestReadersServeWhatTheyRead: 200 stats one after another are served on
// a few goroutines (a reader serves the request it read and reads again).
// Control: upstream's goroutine per request serves them on 200.
func TestReadersServeWhatTheyRead(t *testing.T) {
	stats := func(t *testing.T, perRequest bool) int {
		f, dir := mountGid(t, perRequest)
		for i := 0; i < 200; i++ {
			if _, err := os.Stat(dir + "/f"); err != nil {
				t.Fatal(err)
			}
		}
		n, _, _ := f.state()
		if f.getattrs() < 200 {
			t.Fatalf("%d getattrs reached the daemon, want 200 (one per stat)", f.getattrs())
		}
		return n
	}
	if n := stats(t, false); n > 8 {
		t.Errorf("200 sequential getattrs were served on %d goroutines, want a few (readers)", n)
	}
	if n := stats(t, true); n < 150 {
		t.Errorf("control: with a goroutine per request, 200 getattrs were served on only %d goroutines", n)
	}
}

// TestReadersBlockedRequests: eight reads that block in their handler (more
// than maxIdleReaders) do not keep other requests from being served, each
// is cancelled by its interrupt (SIGINT to its process), and Serve returns
// at unmount with no reader left.
func TestReadersBlockedRequests(t *testing.T) {
	f, dir := mountGid(t, false)
	var cmds []*exec.Cmd
	for i := 0; i < 8; i++ {
		c := exec.Command("dd", "if="+dir+"/f", "of=/dev/null", "bs=1", "count=1", "status=none")
		c.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		cmds = append(cmds, c)
	}
	t.Cleanup(func() {
		for _, c := range cmds {
			c.Process.Kill()
			c.Wait()
		}
	})
	deadline := time.Now().Add(20 * time.Second)
	for {
		if _, blocked, _ := f.state(); blocked == 8 {
			break
		}
		if time.Now().After(deadline) {
			_, blocked, _ := f.state()
			t.Fatalf("%d of 8 reads reached the handler", blocked)
		}
		time.Sleep(5 * time.Millisecond)
	}
	for i := 0; i < 20; i++ { // served while eight requests block
		if _, err := os.Stat(dir + "/f"); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range cmds {
		c.Process.Signal(syscall.SIGINT)
	}
	for _, c := range cmds {
		c.Wait()
	}
	if _, blocked, ended := f.state(); blocked != 0 || ended != 8 {
		t.Errorf("after SIGINT: %d reads still blocked, %d cancelled; want 0 and 8", blocked, ended)
	}
}
