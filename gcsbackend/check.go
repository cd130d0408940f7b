package gcsbackend

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"syscall"
	"time"

	"cloud.google.com/go/storage"
	"github.com/lockfs/lockfs/internal/backoff"
	"google.golang.org/api/googleapi"
)

// ErrBucketUnusable is wrapped by every error of Check: the bucket cannot
// hold locks as configured. The error's text names the bucket or the
// endpoint and says what to fix.
var ErrBucketUnusable = errors.New("gcs bucket unusable")

// Check proves that the bucket can serve as the lock store before anything
// relies on it, so that a daemon refuses to start instead of failing its
// first lock: it reads a probe object (PREFIX/probe/HOST), writes it
// conditionally, reads it back and deletes it. It gives up after
// UnavailableAfter if GCS keeps failing (no answer, 429, 5xx), retrying
// with jittered backoff meanwhile. Its error wraps ErrBucketUnusable and
// says what is wrong and what to fix: a bucket that does not exist, missing
// permissions, an endpoint that is not a GCS JSON API, an endpoint that
// cannot be reached. A probe left behind by a crash is overwritten.
func (b *Backend) Check(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, b.cfg.UnavailableAfter)
	defer cancel()
	var sb strings.Builder
	sb.WriteString(b.cfg.Prefix + "probe/")
	escapeElement(&sb, b.cfg.HostID)
	name := sb.String()
	payload := []byte(fmt.Sprintf(`{"probe":%q,"at":%q}`+"\n", b.cfg.HostID, b.wallNow().Format(time.RFC3339Nano)))

	var gen int64
	if err := b.retryCheck(ctx, "read", name, func(ctx context.Context) error {
		var err error
		gen, err = b.probeGeneration(ctx, name)
		return err
	}); err != nil {
		return err
	}
	if err := b.retryCheck(ctx, "conditional write", name, func(ctx context.Context) error {
		g, err := b.probeWrite(ctx, name, gen, payload)
		var ge *googleapi.Error
		if errors.As(err, &ge) && ge.Code == http.StatusPreconditionFailed {
			// Another daemon with this host id probed at the same moment;
			// or a write of ours landed before its answer was lost.
			if g2, err2 := b.probeGeneration(ctx, name); err2 == nil {
				gen = g2
			}
			return errRetryCheck
		}
		gen = g
		return err
	}); err != nil {
		return err
	}
	if err := b.retryCheck(ctx, "read back", name, func(ctx context.Context) error {
		rctx, cancel := b.requestCtx(ctx, 0)
		defer cancel()
		// The read every claim makes (download).
		gotGen, got, err := b.download(rctx, name)
		switch {
		case errors.Is(err, errNoGeneration):
			gotGen, got = 0, nil // answered, but with no generation: reported below
		case err != nil:
			return err
		case gotGen == 0:
			return fmt.Errorf("%w: endpoint %s accepted a write of gs://%s/%s but does not find it: "+
				"it is not a GCS JSON API endpoint; name one ending in /storage/v1/", ErrBucketUnusable, b.endpointName(), b.cfg.Bucket, name)
		}
		if !bytes.Equal(got, payload) || gotGen != gen {
			return fmt.Errorf("%w: endpoint %s returned other content or generation (%d, want %d) for gs://%s/%s than was just written",
				ErrBucketUnusable, b.endpointName(), gotGen, gen, b.cfg.Bucket, name)
		}
		return nil
	}); err != nil {
		return err
	}
	return b.retryCheck(ctx, "delete", name, func(ctx context.Context) error {
		rctx, cancel := b.requestCtx(ctx, 0)
		defer cancel()
		err := b.bucket.Object(name).If(storage.Conditions{GenerationMatch: gen}).Delete(rctx)
		if errors.Is(err, storage.ErrObjectNotExist) {
			return nil // an earlier attempt landed
		}
		return err
	})
}

// errRetryCheck makes retryCheck try again after a backoff.
var errRetryCheck = errors.New("retry")

// retryCheck runs one step of Check until it succeeds, fails for good, or
// ctx ends, backing off with jitter after a transient failure, and turns
// its last error into one that says what to fix.
func (b *Backend) retryCheck(ctx context.Context, step, name string, f func(context.Context) error) error {
	bo := backoff.New(retryMin, retryMax)
	var last error
	for {
		err := f(ctx)
		if err == nil || errors.Is(err, ErrBucketUnusable) {
			return err
		}
		if !errors.Is(err, errRetryCheck) {
			last = err
			if !transientCheck(err) {
				return b.explain(step, name, err)
			}
		}
		if err := b.sleep(ctx, bo.Next()); err != nil || ctx.Err() != nil {
			if last == nil {
				last = ctx.Err()
			}
			return fmt.Errorf("%w: endpoint %s kept failing the %s of gs://%s/%s for %v (last: %v); "+
				"check the address, and that GCS (or the emulator) is running and reachable from here",
				ErrBucketUnusable, b.endpointName(), step, b.cfg.Bucket, name, b.cfg.UnavailableAfter, last)
		}
	}
}

// probeGeneration returns the probe's generation, 0 if it does not exist
// or its read carried none (the read back below reports that), by the read
// every claim makes.
func (b *Backend) probeGeneration(ctx context.Context, name string) (int64, error) {
	rctx, cancel := b.requestCtx(ctx, 0)
	defer cancel()
	gen, _, err := b.download(rctx, name)
	if errors.Is(err, errNoGeneration) {
		return 0, nil
	}
	return gen, err
}

// probeWrite uploads the probe on condition that its generation is gen, by
// the upload every claim makes.
func (b *Backend) probeWrite(ctx context.Context, name string, gen int64, payload []byte) (int64, error) {
	rctx, cancel := b.requestCtx(ctx, 0)
	defer cancel()
	return b.upload(rctx, name, gen, payload, nil)
}

// transientCheck reports whether a failed request of Check is worth
// retrying: 429, 5xx, 408, and no answer at all. A refused connection is
// an answer: nothing listens at the endpoint's port, and waiting out
// UnavailableAfter would only delay the same message.
func transientCheck(err error) bool {
	var ge *googleapi.Error
	if errors.As(err, &ge) {
		return ge.Code == http.StatusTooManyRequests || ge.Code == http.StatusRequestTimeout || ge.Code >= 500
	}
	return !errors.Is(err, syscall.ECONNREFUSED)
}

// explain turns a definite failure of a step of Check into an error that
// says what to fix.
func (b *Backend) explain(step, name string, err error) error {
	var ge *googleapi.Error
	if errors.Is(err, syscall.ECONNREFUSED) {
		return fmt.Errorf("%w: nothing listens at endpoint %s (connection refused): check the address, and that GCS "+
			"(or the emulator) is running; the %s of gs://%s/%s failed: %v", ErrBucketUnusable, b.endpointName(), step, b.cfg.Bucket, name, err)
	}
	if !errors.As(err, &ge) {
		return fmt.Errorf("%w: the %s of gs://%s/%s at endpoint %s failed: %v", ErrBucketUnusable, step, b.cfg.Bucket, name, b.endpointName(), err)
	}
	var fix string
	switch {
	case ge.Code == http.StatusNotFound && ge.Message == "" && len(ge.Errors) == 0:
		// GCS answers a missing bucket with a JSON error; a bare 404 comes
		// from a server that does not speak the JSON API at that path.
		fix = fmt.Sprintf("endpoint %s answers 404 without a GCS error: it is not a GCS JSON API endpoint "+
			"(wrong path?); an emulator's endpoint ends in /storage/v1/", b.endpointName())
	case ge.Code == http.StatusNotFound:
		fix = fmt.Sprintf("bucket %q does not exist at %s: create it (gcloud storage buckets create gs://%s) or check the bucket name",
			b.cfg.Bucket, b.endpointName(), b.cfg.Bucket)
	case ge.Code == http.StatusUnauthorized:
		fix = fmt.Sprintf("GCS rejected the credentials for bucket %q: run `gcloud auth application-default login`, "+
			"or set GOOGLE_APPLICATION_CREDENTIALS to a service account key", b.cfg.Bucket)
	case ge.Code == http.StatusForbidden:
		fix = fmt.Sprintf("permission denied on bucket %q: the daemon's identity needs roles/storage.objectUser on it "+
			"(or a custom role with storage.objects.get, list, create and delete: docs/OPERATIONS.md, IAM)", b.cfg.Bucket)
	default:
		fix = fmt.Sprintf("endpoint %s answered %d", b.endpointName(), ge.Code)
	}
	msg := strings.TrimSpace(ge.Message)
	if msg == "" {
		msg = strings.TrimSpace(ge.Body)
	}
	if len(msg) > 200 {
		msg = msg[:200] + "..."
	}
	return fmt.Errorf("%w: %s (the %s of gs://%s/%s answered %d %q)", ErrBucketUnusable, fix, step, b.cfg.Bucket, name, ge.Code, msg)
}

// endpointName is the endpoint as messages name it.
func (b *Backend) endpointName() string {
	if b.cfg.Endpoint == "" {
		return "storage.googleapis.com"
	}
	return b.cfg.Endpoint
}
