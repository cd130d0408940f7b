package gcsbackend

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"net/http"
	"strconv"
	"time"

	"cloud.google.com/go/storage"
	"google.golang.org/api/googleapi"
	raw "google.golang.org/api/storage/v1"
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
	gen, body, err = b.download(ctx, name)
	switch {
	case errors.Is(err, errNoGeneration):
		b.stats.otherErrors.Add(1)
		return 0, nil, outcomePermanent, err
	case err != nil:
		return 0, nil, b.classify(ctx, err), err
	case gen == 0:
		b.stats.readsNotFound.Add(1)
	}
	return gen, body, outcomeOK, nil
}

// download fetches an object's content and generation (0, nil, nil if it
// does not exist) through the JSON API's generated client, the media of
// objects.get with the generation in X-Goog-Generation, as the storage
// client's JSON reads take it: about 9 KB allocated per read where the
// storage client's reader allocates 13 (10 against 15 for an object that
// does not exist).
func (b *Backend) download(ctx context.Context, name string) (int64, []byte, error) {
	resp, err := b.objects.Get(b.cfg.Bucket, name).Context(ctx).Download()
	if notFound(err) {
		return 0, nil, nil
	}
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return 0, nil, err
	}
	h := resp.Header.Get("X-Goog-Generation")
	gen, err := strconv.ParseInt(h, 10, 64)
	if err != nil || gen == 0 {
		return 0, nil, fmt.Errorf("object %s: X-Goog-Generation %q: %w", name, h, errNoGeneration)
	}
	return gen, body, nil
}

// errNoGeneration: the answer to a read or an upload carried no
// generation.
var errNoGeneration = errors.New("read returned no generation")

// notFound reports whether err is the JSON API's 404.
func notFound(err error) bool {
	var ge *googleapi.Error
	return errors.As(err, &ge) && ge.Code == http.StatusNotFound
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
	gen, err := b.upload(ctx, name, gen, payload, meta)
	if errors.Is(err, errNoGeneration) {
		b.stats.otherErrors.Add(1)
		return 0, outcomePermanent, err
	}
	if err != nil {
		return 0, b.classify(ctx, err), err
	}
	b.stats.writesOK.Add(1)
	return gen, outcomeOK, nil
}

// upload sends payload with metadata meta as the object's next version, on
// condition that its generation is still gen (ifGenerationMatch; 0: that it
// does not exist), and returns the new generation. One request (a
// multipart upload, no resumable session) through the JSON API's generated
// client, whose upload of a bytes.Reader copies through no buffer: about 18
// KB allocated per upload where the storage client's Writer allocates 56
// (a pipe to its uploading goroutine, a 32 KiB copy buffer). It sends
// payload's CRC32C, so that GCS checks what it stores, as GCS recommends.
func (b *Backend) upload(ctx context.Context, name string, gen int64, payload []byte, meta map[string]string) (int64, error) {
	var sum [4]byte
	binary.BigEndian.PutUint32(sum[:], crc32.Checksum(payload, castagnoli))
	obj := &raw.Object{Name: name, Metadata: meta, CacheControl: "no-store", ContentType: "application/json",
		Crc32c: base64.StdEncoding.EncodeToString(sum[:])}
	o, err := b.objects.Insert(b.cfg.Bucket, obj).IfGenerationMatch(gen).Context(ctx).
		Media(bytes.NewReader(payload), googleapi.ChunkSize(0), googleapi.ContentType("application/json")).
		Fields("generation").Do()
	if err != nil {
		return 0, err
	}
	if o.Generation == 0 {
		return 0, fmt.Errorf("object %s: upload: %w", name, errNoGeneration)
	}
	return o.Generation, nil
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
// as one listing in Stats. Like reads and uploads, it goes through the JSON
// API's generated client (objects.list with a field selection, the
// selection the storage client's SetAttrSelection asks for): about a third
// less garbage per page than the storage client's iterator.
func (b *Backend) list(ctx context.Context, prefix string) ([]listed, outcome, error) {
	var out []listed
	token := ""
	for {
		b.stats.lists.Add(1)
		page, err := b.objects.List(b.cfg.Bucket).Prefix(prefix).MaxResults(listPage).PageToken(token).
			Fields("items(name,generation,metadata)", "nextPageToken").Context(ctx).Do()
		if err != nil {
			return nil, b.classify(ctx, err), err
		}
		for _, o := range page.Items {
			out = append(out, listed{name: o.Name, gen: o.Generation, meta: o.Metadata})
		}
		if page.NextPageToken == "" {
			return out, outcomeOK, nil
		}
		token = page.NextPageToken
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
