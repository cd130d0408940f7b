// Package stopctx derives a context that also ends when another one does:
// each call of a network backend (gcsbackend, etcdbackend) ends when the
// backend's Close begins. lazyctx is the same merge made only on first use,
// for the engine's claims, most of which never look at their context.
package stopctx

import "context"

// With returns a child of ctx, also cancelled when stop is done, and the
// function that cancels it and ends the watch of stop.
func With(ctx, stop context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	unwatch := context.AfterFunc(stop, cancel)
	return ctx, func() { unwatch(); cancel() }
}
