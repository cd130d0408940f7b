package stopctx

import (
	"context"
	"testing"
	"time"
)

func done(c context.Context) bool {
	select {
	case <-c.Done():
		return true
	default:
		return false
	}
}

// TestWith: the child ends when stop ends, when its parent ends, and when
// it is cancelled; the control, a child of live contexts, has not ended.
func TestWith(t *testing.T) {
	stop, stopNow := context.WithCancel(context.Background())
	ctx, cancel := With(context.Background(), stop)
	defer cancel()
	if done(ctx) {
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
	if !done(ctx) {
		t.Fatal("the child did not end with its parent")
	}

	ctx, cancel = With(context.Background(), context.Background())
	cancel()
	if !done(ctx) || ctx.Err() != context.Canceled {
		t.Fatalf("cancelled: done %v, err %v", done(ctx), ctx.Err())
	}
}
