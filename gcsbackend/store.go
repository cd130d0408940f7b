package gcsbackend

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"net/http"
	"time"

	"cloud.google.com/go/storage"
	"google.golang.org/api/googleapi"
	"google.golang.org/api/iterator"
)

// The requests the backend makes: a read of an object's content (which
// carries its generation); a conditional upload of a new version,
// DoesNotExist for the first version and GenerationMatch after that, with
// the custom metadata that summarises the record; a listing of a prefix
// with metadata (the claims below a directory, the wants addressed to this
// session); and a conditional delete, of session and want objects only
// (lock objects are never deleted). No PATCH, no metadata update. The
// client library's own retries are off, so that every request is counted,
// bounded and resolved here.

// snapshot is one version of a lock object as read or written.
type snapshot struct {
	// gen is the object's generation; 0 if it does not exist.
	gen int64
	// rec is its content; nil iff gen is 0.
	rec *record
}

// outcome classifies a failed request.
type outcome int

const (
	outcomeOK outcome = iota
	// outcomePrecondition: 412, the generation did not match. Definite.
	outcomePrecondition
	// outcomeTransient: 429, 5xx, no answer, or our per-request deadline.
	// For a write the fate is unknown.
	outcomeTransient
	// outcomeCanceled: the caller's context ended.
	outcomeCanceled
	// outcomePermanent: any other error; retrying will not help.
	outcomePermanent
)

// read fetches a lock object's content and generation.
func (b *Backend) read(ctx context.Context, name string) (snapshot, outcome, error) {
	gen, body, oc, err := b.readRaw(ctx, name)
	if oc != outcomeOK || gen == 0 {
		return snapshot{}, oc, err
	}
	rec, err := decodeRecord(name, body)
	if err != nil {
		b.stats.otherErrors.Add(1)
		b.layoutProblem(name, err)
		return snapshot{}, outcomePermanent, err
	}
	return snapshot{gen: gen, rec: rec}, outcomeOK, nil
}

// readRaw fetches an object's content and generation; gen 0 if it does not
// exist.
func (b *Backend) readRaw(ctx context.Context, name string) (gen int64, body []byte, oc outcome, err error) {
	b.stats.reads.Add(1)
	r, err := b.bucket.Object(name).NewReader(ctx)
	if errors.Is(err, storage.ErrObjectNotExist) {
		b.stats.readsNotFound.Add(1)
		return 0, nil, outcomeOK, nil
	}
	if err != nil {
		return 0, nil, b.classify(ctx, err), err
	}
	defer r.Close()
	body, err = io.ReadAll(io.LimitReader(r, 1<<20))
	if err != nil {
		return 0, nil, b.classify(ctx, err), err
	}
	if r.Attrs.Generation == 0 {
		b.stats.otherErrors.Add(1)
		return 0, nil, outcomePermanent, fmt.Errorf("object %s: read returned no generation", name)
	}
	return r.Attrs.Generation, body, outcomeOK, nil
}

// generation fetches an object's metadata only (a metadata GET, as cheap
// as a read and carrying no content) and returns its generation, 0 if it
// does not exist.
func (b *Backend) generation(ctx context.Context, name string) (int64, outcome, error) {
	b.stats.reads.Add(1)
	a, err := b.bucket.Object(name).Attrs(ctx)
	if errors.Is(err, storage.ErrObjectNotExist) {
		b.stats.readsNotFound.Add(1)
		return 0, outcomeOK, nil
	}
	if err != nil {
		return 0, b.classify(ctx, err), err
	}
	return a.Generation, outcomeOK, nil
}

// write uploads payload with metadata meta as the object's next version, on
// condition that its generation is still gen (0: that it does not exist),
// and returns the new generation.
func (b *Backend) write(ctx context.Context, name string, gen int64, payload []byte, meta map[string]string) (int64, outcome, error) {
	b.stats.writes.Add(1)
	w := b.upload(ctx, name, gen, payload)
	w.CacheControl = "no-store"
	w.Metadata = meta
	if _, err := w.Write(payload); err != nil {
		w.Close()
		return 0, b.classify(ctx, err), err
	}
	if err := w.Close(); err != nil {
		return 0, b.classify(ctx, err), err
	}
	b.stats.writesOK.Add(1)
	return w.Attrs().Generation, outcomeOK, nil
}

// upload returns a writer of payload as the object's next version, on
// condition that its generation is still gen (0: that it does not exist),
// in one request (no resumable session), sending payload's CRC32C so that
// GCS checks what it stores (as GCS recommends; the client then checks the
// CRC32C GCS reports against it).
func (b *Backend) upload(ctx context.Context, name string, gen int64, payload []byte) *storage.Writer {
	cond := storage.Conditions{DoesNotExist: true}
	if gen != 0 {
		cond = storage.Conditions{GenerationMatch: gen}
	}
	w := b.bucket.Object(name).If(cond).NewWriter(ctx)
	w.ChunkSize = 0
	w.ContentType = "application/json"
	w.CRC32C = crc32.Checksum(payload, castagnoli)
	w.SendCRC32C = true
	return w
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// remove deletes an object on condition that its generation is gen. A
// missing object is success.
func (b *Backend) remove(ctx context.Context, name string, gen int64) (outcome, error) {
	b.stats.deletes.Add(1)
	err := b.bucket.Object(name).If(storage.Conditions{GenerationMatch: gen}).Delete(ctx)
	if err == nil || errors.Is(err, storage.ErrObjectNotExist) {
		return outcomeOK, nil
	}
	return b.classify(ctx, err), err
}

// listed is one object of a listing.
type listed struct {
	name string
	gen  int64
	meta map[string]string
}

// listPage is the number of objects a listing asks for per request (GCS's
// maximum).
const listPage = 1000

// list returns every object whose name starts with prefix, with its
// generation and metadata, in as many requests as pages; each page counts
// as one listing in Stats.
func (b *Backend) list(ctx context.Context, prefix string) ([]listed, outcome, error) {
	q := &storage.Query{Prefix: prefix}
	if err := q.SetAttrSelection([]string{"Name", "Generation", "Metadata"}); err != nil {
		return nil, outcomePermanent, err
	}
	pager := iterator.NewPager(b.bucket.Objects(ctx, q), listPage, "")
	var out []listed
	for {
		var page []*storage.ObjectAttrs
		b.stats.lists.Add(1)
		next, err := pager.NextPage(&page)
		if err != nil {
			return nil, b.classify(ctx, err), err
		}
		for _, a := range page {
			out = append(out, listed{name: a.Name, gen: a.Generation, meta: a.Metadata})
		}
		if next == "" {
			return out, outcomeOK, nil
		}
	}
}

// classify counts a failed request and says what it means.
func (b *Backend) classify(ctx context.Context, err error) outcome {
	var ge *googleapi.Error
	switch {
	case errors.As(err, &ge) && ge.Code == http.StatusPreconditionFailed:
		b.stats.preconditionFailed.Add(1)
		return outcomePrecondition
	case errors.As(err, &ge) && ge.Code == http.StatusTooManyRequests:
		b.stats.rateLimited.Add(1)
		return outcomeTransient
	case errors.As(err, &ge) && (ge.Code >= 500 || ge.Code == http.StatusRequestTimeout):
		b.stats.serverErrors.Add(1)
		return outcomeTransient
	case errors.As(err, &ge):
		b.stats.otherErrors.Add(1)
		return outcomePermanent
	}
	b.stats.networkErrors.Add(1)
	if ctx.Err() != nil && context.Cause(ctx) != errRequestTimeout {
		return outcomeCanceled
	}
	// No HTTP answer: a reset, a refused connection, a timeout of ours.
	return outcomeTransient
}

// errRequestTimeout is the cause of a request context that ran out of its
// own time, as opposed to its caller's.
var errRequestTimeout = errors.New("gcs request timed out")

// requestCtx bounds one request by RequestTimeout and, if until is not 0, by
// the monotonic instant until.
func (b *Backend) requestCtx(ctx context.Context, until time.Duration) (context.Context, context.CancelFunc) {
	d := b.cfg.RequestTimeout
	if until != 0 {
		if left := until - b.clock.Now(); left < d {
			d = left
		}
	}
	return context.WithTimeoutCause(ctx, d, errRequestTimeout)
}
