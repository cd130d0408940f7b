package stopctx

import (
	"context"
	"testing"
	"time"

	"github.com/lockfs/lockfs/internal/testutil"
)

// TestWith: the child ends when stop ends, when its parent ends, and when
// it is cancelled; the control, a child of live contexts, has not ended.
func TestWith(t *testing.T) {
	stop, stopNow := context.WithCancel(context.Background())
	ctx, cancel := With(context.Background(), stop)
	defer cancel()
	if testutil.Done(ctx) {
		t.Fatal("control: the child ended while its parent and stop live")
	}
	stopNow()
	select {
	case <-ctx.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the child did not end 10 s after stop ended")
	}

	parent, parentNow := context.WithCancel(context.Background())
	ctx, cancel = With(parent, context.Background())
	defer cancel()
	parentNow()
	if !testutil.Done(ctx) {
		t.Fatal("the child did not end with its parent")
	}

	ctx, cancel = With(context.Background(), context.Background())
	cancel()
	if !testutil.Done(ctx) || ctx.Err() != context.Canceled {
		t.Fatalf("cancelled: done %v, err %v", testutil.Done(ctx), ctx.Err())
	}
}
