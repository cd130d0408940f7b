package fs_test

import (
	"context"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"

	"bazil.org/fuse"
	"bazil.org/fuse/fs"
)

type finishKey struct{}

// TestFinishOncePerRequest: Config.Finish is called once for every request
// WithContext saw, on the same goroutine, with the context WithContext
// returned, still live. Control: the counts are of real requests (100
// stats that the daemon answers: getattrs reached it).
func TestFinishOncePerRequest(t *testing.T) {
	var mu sync.Mutex
	started := map[fuse.RequestID]int{} // request -> goroutine of WithContext
	finished := map[fuse.RequestID]int{}
	var problems []string
	cfg := &fs.Config{
		WithContext: func(ctx context.Context, req fuse.Request) context.Context {
			mu.Lock()
			started[req.Hdr().ID] = goid()
			mu.Unlock()
			return context.WithValue(ctx, finishKey{}, req.Hdr().ID)
		},
		Finish: func(ctx context.Context, req fuse.Request) {
			mu.Lock()
			defer mu.Unlock()
			id := req.Hdr().ID
			switch {
			case ctx.Value(finishKey{}) != id:
				problems = append(problems, "Finish got another context than WithContext returned")
			case ctx.Err() != nil:
				problems = append(problems, "Finish got a cancelled context")
			case started[id] != goid():
				problems = append(problems, "Finish ran on another goroutine than WithContext")
			}
			finished[id]++
		},
	}
	f := &gidFile{servedOn: map[int]int{}}
	dir := t.TempDir()
	conn, err := fuse.Mount(dir)
	if err != nil {
		t.Fatalf("mount (needs root and /dev/fuse): %v", err)
	}
	served := make(chan error, 1)
	go func() { served <- fs.New(conn, cfg).Serve(&recFS{node: f}) }()
	for i := 0; i < 100; i++ {
		if _, err := os.Stat(dir + "/f"); err != nil {
			t.Fatal(err)
		}
	}
	if err := fuse.Unmount(dir); err != nil {
		exec.Command("fusermount3", "-uz", dir).Run()
	}
	select {
	case err := <-served:
		if err != nil {
			t.Errorf("serve: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("Serve did not return after unmount")
	}
	conn.Close()
	if f.getattrs() < 100 {
		t.Fatalf("control: %d getattrs reached the daemon, want 100", f.getattrs())
	}
	mu.Lock()
	defer mu.Unlock()
	for _, p := range problems {
		t.Error(p)
	}
	for id := range started {
		if finished[id] != 1 {
			t.Errorf("request %d: Finish called %d times, want 1", id, finished[id])
		}
	}
	if len(finished) != len(started) {
		t.Errorf("Finish for %d requests, WithContext for %d", len(finished), len(started))
	}
}
