package gcsbackend_test

import (
	"context"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockfs/lockfs/gcsbackend"
	"github.com/lockfs/lockfs/gcsbackend/gcstest"
	"github.com/lockfs/lockfs/internal/testutil"
	"github.com/lockfs/lockfs/lockmgr"
)

// TestCloseLeavesNoConnections: a closed backend leaves no connection
// open at GCS. The control is a storage client of the library's own
// making, closed the same way: its idle connections stay open (for 90 s),
// which is what a thousand hosts closing at once ran the emulator out of
// descriptors with.
func TestCloseLeavesNoConnections(t *testing.T) {
	emu := gcstest.Start(t)

	ctl := newCountingForwarder(t, emu.URL)
	c := emu.Client(t, gcstest.Endpoint(ctl.url))
	if _, err := c.Bucket(emu.Bucket).Attrs(context.Background()); err != nil {
		t.Fatal(err)
	}
	c.Close()
	time.Sleep(2 * time.Second)
	if n := ctl.open.Load(); n == 0 {
		t.Fatal("control: a closed storage client left no idle connection, so the count below proves nothing")
	}

	fw := newCountingForwarder(t, emu.URL)
	b := newBackend(t, emu, func(c *gcsbackend.Config) { c.Endpoint = gcstest.Endpoint(fw.url) })
	var wg sync.WaitGroup
	for _, p := range []string{"a", "b", "c", "d"} {
		wg.Go(func() {
			l, err := b.Claim(ctxT(t, 30*time.Second), dirLock(p), lockmgr.Exclusive, false)
			if err != nil {
				t.Errorf("claim %s: %v", p, err)
				return
			}
			if err := l.Release(ctxT(t, 30*time.Second)); err != nil {
				t.Errorf("release %s: %v", p, err)
			}
		})
	}
	wg.Wait()
	if fw.accepted.Load() == 0 {
		t.Fatal("the backend's requests did not go through the forwarder")
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if !testutil.Poll(10*time.Second, func() bool { return fw.open.Load() == 0 }) {
		t.Fatalf("%d of %d connections still open 10 s after Close", fw.open.Load(), fw.accepted.Load())
	}
}

// countingForwarder passes TCP connections on to a target and counts
// those open.
type countingForwarder struct {
	url            string
	open, accepted atomic.Int64
}

func newCountingForwarder(t *testing.T, target string) *countingForwarder {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &countingForwarder{url: "http://" + ln.Addr().String()}
	addr := strings.TrimPrefix(target, "http://")
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns []net.Conn
	)
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", addr)
			if err != nil {
				in.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, in, out)
			mu.Unlock()
			f.accepted.Add(1)
			f.open.Add(1)
			wg.Go(func() {
				defer f.open.Add(-1)
				done := make(chan struct{}, 2)
				pipe := func(dst, src net.Conn) {
					io.Copy(dst, src)
					done <- struct{}{}
				}
				go pipe(out, in)
				go pipe(in, out)
				<-done // either side closed: close both
				in.Close()
				out.Close()
				<-done
			})
		}
	})
	return f
}
