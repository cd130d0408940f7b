package etcdbackend

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/lockfs/lockfs/internal/backoff"
	"github.com/lockfs/lockfs/internal/stopctx"
	"github.com/lockfs/lockfs/lockmgr"
)

// retry runs one etcd request, each try bounded by RequestTimeout, and
// retries failures that may pass (no answer, no leader, a member going
// away) with jittered backoff until they have gone on for giveUp: then it
// returns an error wrapping lockmgr.ErrUnavailable. An error that will not
// pass by retrying (permission denied, bad credentials) is returned at once,
// wrapping lockmgr.ErrUnavailable too; the end of ctx returns ctx.Err().
func (b *Backend) retry(ctx context.Context, giveUp time.Duration, what string, f func(ctx context.Context) error) error {
	bo := backoff.New(20*time.Millisecond, time.Second)
	start := time.Now()
	for {
		// Without a leader a member answers at once (ErrNoLeader), which is
		// retried, instead of holding the request until the deadline.
		rctx, cancel := context.WithTimeout(clientv3.WithRequireLeader(ctx), b.cfg.RequestTimeout)
		err := f(rctx)
		cancel()
		b.stats.requests.Add(1)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if !transient(err) {
			return fmt.Errorf("%s: %w: %w", what, lockmgr.ErrUnavailable, err)
		}
		b.stats.failures.Add(1)
		if time.Since(start) >= giveUp {
			return fmt.Errorf("%s: %w: etcd failed for %v: %w", what, lockmgr.ErrUnavailable, giveUp.Round(time.Millisecond), err)
		}
		if err := backoff.Sleep(ctx, nil, min(bo.Next(), giveUp-time.Since(start)+time.Millisecond), nil); err != nil {
			return err
		}
	}
}

// transient reports whether a failed request may succeed if retried.
func transient(err error) bool {
	switch {
	case errors.Is(err, rpctypes.ErrPermissionDenied), errors.Is(err, rpctypes.ErrAuthFailed),
		errors.Is(err, rpctypes.ErrAuthNotEnabled), errors.Is(err, rpctypes.ErrUserEmpty),
		errors.Is(err, rpctypes.ErrLeaseNotFound), errors.Is(err, rpctypes.ErrRequestTooLarge),
		errors.Is(err, rpctypes.ErrTooManyOps), errors.Is(err, rpctypes.ErrKeyNotFound):
		return false
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	switch status.Code(err) {
	case codes.PermissionDenied, codes.Unauthenticated, codes.InvalidArgument, codes.FailedPrecondition:
		return false
	}
	return true
}

// bound returns ctx bounded as a call with or without wait is: also ended
// by Close, and without wait by noWaitGiveUp; and how long etcd may fail
// before the call gives up.
func (b *Backend) bound(ctx context.Context, wait bool) (context.Context, context.CancelFunc, time.Duration) {
	ctx, cancel := stopctx.With(ctx, b.closeCtx)
	if wait {
		return ctx, cancel, b.cfg.UnavailableAfter
	}
	ctx, cancel2 := context.WithTimeout(ctx, noWaitGiveUp)
	return ctx, func() { cancel2(); cancel() }, min(b.cfg.UnavailableAfter, noWaitGiveUp)
}

// ctxErr maps an error of a call bounded by bound: the caller's own end
// as ctx.Err(), the bound's as lockmgr.ErrUnavailable, Close's as
// lockmgr.ErrClosed.
func (b *Backend) ctxErr(caller context.Context, err error) error {
	switch {
	case caller.Err() != nil:
		return caller.Err()
	case b.closeCtx.Err() != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)):
		return errBackendClosed
	case errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, lockmgr.ErrUnavailable):
		return fmt.Errorf("%w: no answer from etcd within %v: %w", lockmgr.ErrUnavailable, noWaitGiveUp, err)
	}
	return err
}
