package gcsbackend_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/storage"
	"google.golang.org/api/googleapi"

	"github.com/lockfs/lockfs/gcsbackend/gcstest"
)

// The backend's safety rests on two kinds of conditional upload:
// DoesNotExist for a lock object's first version and GenerationMatch for
// every later one, and on reads returning the generation. This test proves
// that the emulator enforces both, atomically, so that no other test can
// pass against an emulator that ignores a check. The control is the same
// upload without its condition, which must succeed where the conditional one
// fails: the 412s come from the conditions and nothing else. It runs against
// every emulator the tests use.
func TestEmulatorEnforcesPreconditions(t *testing.T) {
	for _, k := range gcstest.Kinds {
		t.Run(string(k), func(t *testing.T) { testPreconditions(t, gcstest.StartKind(t, k)) })
	}
}

func testPreconditions(t *testing.T, emu *gcstest.Emulator) {
	c := emu.Client(t)
	c.SetRetry(storage.WithPolicy(storage.RetryNever))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	obj := c.Bucket(emu.Bucket).Object("conformance/locks/.lock")

	put := func(cond *storage.Conditions, body string) (int64, error) {
		o := obj
		if cond != nil {
			o = o.If(*cond)
		}
		w := o.NewWriter(ctx)
		w.ChunkSize = 0
		w.ContentType = "application/json"
		gcstest.SendCRC32C(w, []byte(body))
		if _, err := io.WriteString(w, body); err != nil {
			w.Close()
			return 0, err
		}
		if err := w.Close(); err != nil {
			return 0, err
		}
		return w.Attrs().Generation, nil
	}
	get := func() (int64, string) {
		r, err := obj.NewReader(ctx)
		if err != nil {
			t.Fatalf("read: %v", err)
		}
		defer r.Close()
		b, err := io.ReadAll(r)
		if err != nil {
			t.Fatal(err)
		}
		return r.Attrs.Generation, string(b)
	}
	is412 := func(err error) bool {
		var ge *googleapi.Error
		return errors.As(err, &ge) && ge.Code == http.StatusPreconditionFailed
	}

	g1, err := put(&storage.Conditions{DoesNotExist: true}, "v1")
	if err != nil || g1 == 0 {
		t.Fatalf("first conditional create: gen %d, %v", g1, err)
	}
	if g, body := get(); g != g1 || body != "v1" {
		t.Fatalf("read after create: gen %d %q, want %d v1", g, body, g1)
	}
	if _, err := put(&storage.Conditions{DoesNotExist: true}, "v1-again"); !is412(err) {
		t.Fatalf("create over an existing object: %v, want 412", err)
	}
	g2, err := put(&storage.Conditions{GenerationMatch: g1}, "v2")
	if err != nil || g2 == g1 {
		t.Fatalf("write on the current generation: gen %d (was %d), %v", g2, g1, err)
	}
	if _, err := put(&storage.Conditions{GenerationMatch: g1}, "stale"); !is412(err) {
		t.Fatalf("write on a stale generation: %v, want 412", err)
	}
	if _, err := put(&storage.Conditions{GenerationMatch: g2 + 1234567}, "bogus"); !is412(err) {
		t.Fatalf("write on a generation that never was: %v, want 412", err)
	}
	if g, body := get(); g != g2 || body != "v2" {
		t.Fatalf("after refused writes: gen %d %q, want %d v2", g, body, g2)
	}

	// Atomicity: of 16 concurrent writes conditional on one generation,
	// exactly one lands.
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		won  []int64
		errs []error
	)
	for i := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			g, err := put(&storage.Conditions{GenerationMatch: g2}, "racer"+string(rune('a'+i)))
			mu.Lock()
			defer mu.Unlock()
			if err == nil {
				won = append(won, g)
			} else if !is412(err) {
				errs = append(errs, err)
			}
		}()
	}
	wg.Wait()
	if len(won) != 1 || len(errs) > 0 {
		t.Fatalf("16 racing conditional writes: %d landed (want 1), unexpected errors %v", len(won), errs)
	}
	if g, _ := get(); g != won[0] {
		t.Fatalf("object generation %d, want the winner's %d", g, won[0])
	}

	// Control: without the condition the same stale write lands, so the
	// refusals above were the conditions at work.
	if _, err := put(nil, "unconditional"); err != nil {
		t.Fatalf("control: unconditional write: %v", err)
	}
	if _, body := get(); !bytes.Equal([]byte(body), []byte("unconditional")) {
		t.Fatalf("control: body %q", body)
	}
}
