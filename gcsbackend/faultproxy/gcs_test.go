package faultproxy_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"cloud.google.com/go/storage"
	"google.golang.org/api/googleapi"
	"google.golang.org/api/iterator"

	"github.com/lockfs/lockfs/gcsbackend/faultproxy"
	"github.com/lockfs/lockfs/gcsbackend/gcstest"
)

// newProxy starts a proxy in front of a fresh emulator and returns it with a
// storage client that goes through it, its retries off so that every
// request the test makes is one request.
func newProxy(t *testing.T) (*faultproxy.Proxy, *storage.BucketHandle) {
	t.Helper()
	emu := gcstest.Start(t)
	p, err := faultproxy.New(emu.URL, 1, faultproxy.Faults{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	c := emu.Client(t, gcstest.Endpoint(p.URL))
	c.SetRetry(storage.WithPolicy(storage.RetryNever))
	return p, c.Bucket(emu.Bucket)
}

// put uploads data to name with the given condition, as the gcs backend
// does (one multipart request).
func put(ctx context.Context, b *storage.BucketHandle, name string, cond *storage.Conditions, data string) (*storage.ObjectAttrs, error) {
	o := b.Object(name)
	if cond != nil {
		o = o.If(*cond)
	}
	w := o.NewWriter(ctx)
	w.ChunkSize = 0
	gcstest.SendCRC32C(w, []byte(data))
	if _, err := w.Write([]byte(data)); err != nil {
		w.Close()
		return nil, err
	}
	if err := w.Close(); err != nil {
		return nil, err
	}
	return w.Attrs(), nil
}

func is429(err error) bool {
	var ge *googleapi.Error
	return errors.As(err, &ge) && ge.Code == http.StatusTooManyRequests
}

// The write limit lets a burst of ObjectWriteBurst writes to one object
// through and answers the next one 429, as GCS does; writes to another
// object, and reads, are not limited; after a second one more write passes.
// Control: with the limit off the same burst passes whole, so the 429s come
// from the limit and not from the emulator.
func TestObjectWriteLimit(t *testing.T) {
	ctx := context.Background()
	p, b := newProxy(t)
	burst := func(name string, n int) (ok, limited int) {
		t.Helper()
		for i := 0; i < n; i++ {
			_, err := put(ctx, b, name, nil, fmt.Sprint(i))
			switch {
			case err == nil:
				ok++
			case is429(err):
				limited++
			default:
				t.Fatalf("write %d to %s: %v", i, name, err)
			}
		}
		return ok, limited
	}

	// Control: no limit.
	if ok, limited := burst("control", 10); ok != 10 || limited != 0 {
		t.Fatalf("limit off: %d written, %d limited; want 10, 0", ok, limited)
	}

	p.SetLimits(faultproxy.Limits{ObjectWrites: true})
	// The test's own writes take well under a second each on loopback;
	// allow for one refill in case this machine is slow.
	ok, limited := burst("hot", 10)
	if ok < faultproxy.ObjectWriteBurst || ok > faultproxy.ObjectWriteBurst+1 || limited != 10-ok {
		t.Fatalf("limit on: %d written, %d limited; want %d (+1) and the rest 429", ok, limited, faultproxy.ObjectWriteBurst)
	}
	// A 429 from the limit must not have reached the emulator: the object
	// holds the last write that was let through.
	r, err := b.Object("hot").NewReader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	r.Close()
	// Another object has a bucket of its own.
	if ok, limited := burst("cold", 3); ok != 3 || limited != 0 {
		t.Fatalf("another object: %d written, %d limited; want 3, 0", ok, limited)
	}
	// A delete and a metadata update count as writes too.
	if err := b.Object("hot").Delete(ctx); !is429(err) {
		t.Errorf("delete of a rate-limited object: %v, want 429", err)
	}
	if _, err := b.Object("hot").Update(ctx, storage.ObjectAttrsToUpdate{ContentType: "text/plain"}); !is429(err) {
		t.Errorf("metadata update of a rate-limited object: %v, want 429", err)
	}
	time.Sleep(1100 * time.Millisecond)
	if err := b.Object("hot").Delete(ctx); err != nil {
		t.Errorf("delete a second later: %v, want it let through", err)
	}

	tr := p.Traffic()
	hot := tr.Objects[gcstest.DefaultBucket+"/hot"]
	if hot.Writes != 13 || hot.Limited != hot.Writes-int64(ok)-1 {
		t.Errorf("hot object: %+v; want 13 writes, %d limited", hot, 13-ok-1)
	}
	// The peak depends on this machine's speed (TestPeakWrites pins it
	// down with a clock of its own); it is at least one, at most all.
	if name, peak := tr.Busiest(); peak < 1 || int64(peak) > tr.Objects[name].Writes {
		t.Errorf("busiest object %q with %d writes in a second of %d", name, peak, tr.Objects[name].Writes)
	}
	if name, n := tr.MostWritten(); name != gcstest.DefaultBucket+"/hot" || n != 13 {
		t.Errorf("most written %q with %d writes; want %q with 13", name, n, gcstest.DefaultBucket+"/hot")
	}
	if tr.Limited != hot.Limited {
		t.Errorf("limited %d in all, %d on the hot object", tr.Limited, hot.Limited)
	}
}

// A conditional write that the limit answers 429 is retried by the caller
// as it would be against GCS: after the refill it lands, once.
func TestObjectWriteLimitConditional(t *testing.T) {
	ctx := context.Background()
	p, b := newProxy(t)
	p.SetLimits(faultproxy.Limits{ObjectWrites: true, Rate: 2, Burst: 1})
	a, err := put(ctx, b, "x", &storage.Conditions{DoesNotExist: true}, "1")
	if err != nil {
		t.Fatal(err)
	}
	_, err = put(ctx, b, "x", &storage.Conditions{GenerationMatch: a.Generation}, "2")
	if !is429(err) {
		t.Fatalf("second write at once: %v, want 429", err)
	}
	time.Sleep(600 * time.Millisecond)
	if _, err := put(ctx, b, "x", &storage.Conditions{GenerationMatch: a.Generation}, "2"); err != nil {
		t.Fatalf("the same write after a refill: %v (the 429 must not have taken effect)", err)
	}
}

// Every request is counted by kind and object, and Latency delays each.
func TestTrafficAndLatency(t *testing.T) {
	ctx := context.Background()
	p, b := newProxy(t)
	if _, err := put(ctx, b, "dir/obj", nil, "x"); err != nil {
		t.Fatal(err)
	}
	p.ResetTraffic()
	const latency = 30 * time.Millisecond
	p.SetLimits(faultproxy.Limits{Latency: latency})
	start := time.Now()
	r, err := b.Object("dir/obj").NewReader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	r.Close()
	if _, err := b.Object("dir/obj").Attrs(ctx); err != nil {
		t.Fatal(err)
	}
	it := b.Objects(ctx, &storage.Query{Prefix: "dir/"})
	for {
		if _, err := it.Next(); err == iterator.Done {
			break
		} else if err != nil {
			t.Fatal(err)
		}
	}
	if _, err := put(ctx, b, "dir/obj", nil, "y"); err != nil {
		t.Fatal(err)
	}
	if err := b.Object("dir/obj").Delete(ctx); err != nil {
		t.Fatal(err)
	}
	// A lower bound only: the proxy must have waited; slowness adds.
	if d := time.Since(start); d < 5*latency {
		t.Errorf("5 requests took %v, under 5 × %v", d, latency)
	}
	tr := p.Traffic()
	want := map[faultproxy.Kind]int64{faultproxy.KindRead: 1, faultproxy.KindMetadata: 1, faultproxy.KindList: 1, faultproxy.KindWrite: 2}
	for k, n := range want {
		if tr.Kinds[k] != n {
			t.Errorf("%s requests: %d, want %d (all: %v)", k, tr.Kinds[k], n, tr.Kinds)
		}
	}
	o := tr.Objects[gcstest.DefaultBucket+"/dir/obj"]
	if o.Reads != 2 || o.Writes != 2 || o.PeakWrites < 1 {
		t.Errorf("dir/obj: %+v; want 2 reads, 2 writes", o)
	}
	if s := p.Stats(); s.Delayed != 5 {
		t.Errorf("delayed %d requests, want 5", s.Delayed)
	}
}

// LastWrite is when a write to the object last landed: it moves with each
// successful write, stays put over reads and over writes that did not land
// (a failed precondition, a 429 of the write limit), and is per object.
// Controls: the failed writes would move it if it were stamped on arrival.
func TestLastWrite(t *testing.T) {
	ctx := context.Background()
	p, b := newProxy(t)
	obj := gcstest.DefaultBucket + "/s/x"
	if _, ok := p.LastWrite(obj); ok {
		t.Fatal("a last write before any write")
	}
	before := time.Now()
	a, err := put(ctx, b, "s/x", &storage.Conditions{DoesNotExist: true}, "1")
	if err != nil {
		t.Fatal(err)
	}
	first, ok := p.LastWrite(obj)
	if !ok || first.Before(before) || first.After(time.Now()) {
		t.Fatalf("after the first write: %v %v, want within [%v, now]", first, ok, before)
	}
	if _, err := b.Object("s/x").Attrs(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := put(ctx, b, "s/x", &storage.Conditions{DoesNotExist: true}, "2"); err == nil {
		t.Fatal("a second create succeeded")
	}
	p.SetLimits(faultproxy.Limits{ObjectWrites: true, Rate: 0.001, Burst: 1})
	if _, err := put(ctx, b, "s/x", &storage.Conditions{GenerationMatch: a.Generation}, "3"); err != nil {
		t.Fatal(err) // takes the only token
	}
	second, _ := p.LastWrite(obj)
	if !second.After(first) {
		t.Fatalf("after the second landed write: %v, not after %v", second, first)
	}
	if _, err := put(ctx, b, "s/x", nil, "4"); !is429(err) {
		t.Fatalf("write beyond the limit: %v, want 429", err)
	}
	if got, _ := p.LastWrite(obj); !got.Equal(second) {
		t.Errorf("a read, a failed precondition and a 429 moved the last write from %v to %v", second, got)
	}
	if _, ok := p.LastWrite(gcstest.DefaultBucket + "/s/y"); ok {
		t.Error("a last write for an object never written")
	}
	if got := p.Traffic().Objects[obj].LastWrite; !got.Equal(second) {
		t.Errorf("Traffic's LastWrite %v, want %v", got, second)
	}
}
