package faultproxy

import (
	"bytes"
	"encoding/json"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// GCS's documented limits, the defaults of Limits.
const (
	// ObjectWriteRate is GCS's sustained write rate to one object name,
	// in writes per second.
	ObjectWriteRate = 1
	// ObjectWriteBurst is the burst GCS tolerates above that rate.
	ObjectWriteBurst = 5
)

// Limits make the proxy behave like GCS rather than like the emulator:
// the per-object write rate and the round trip of a remote service.
type Limits struct {
	// ObjectWrites enforces a token bucket per object name: every write
	// (an upload, a delete, a metadata update, a compose or copy into it)
	// takes a token, and a write that finds none is answered 429 without
	// being forwarded, as GCS answers writes to one object beyond about
	// one per second.
	ObjectWrites bool
	// Rate and Burst are the bucket's refill rate (writes per second) and
	// size. Zero: ObjectWriteRate and ObjectWriteBurst.
	Rate  float64
	Burst int
	// Latency is added to every request before it is handled.
	Latency time.Duration
}

// Kind is what a request does, as GCS bills and limits it.
type Kind string

// The kinds of request.
const (
	// KindRead reads an object's content.
	KindRead Kind = "read"
	// KindMetadata reads an object's or a bucket's metadata.
	KindMetadata Kind = "metadata"
	// KindList lists the objects of a bucket.
	KindList Kind = "list"
	// KindWrite changes an object or a bucket: uploads, deletes, metadata
	// updates, composes, copies, bucket creation.
	KindWrite Kind = "write"
	// KindOther is anything else (the emulator's own endpoints).
	KindOther Kind = "other"
)

// ObjectTraffic is what one object received.
type ObjectTraffic struct {
	// Reads counts content and metadata reads of the object.
	Reads int64
	// Writes counts the write requests that reached the proxy for the
	// object, Limited those of them the write limit answered with 429.
	Writes, Limited int64
	// PeakWrites is the most write requests (429s included) the object
	// received within any one second.
	PeakWrites int
	// LastWrite is when the emulator last answered a write to the object
	// with success (zero if it never did since counting began): the
	// moment the write landed, as observers can see it.
	LastWrite time.Time
}

// Traffic is what the proxy has received since it started or since
// ResetTraffic, by kind of request and by object ("bucket/name").
type Traffic struct {
	Kinds map[Kind]int64
	// Limited counts the 429 answers of the write limit.
	Limited int64
	Objects map[string]ObjectTraffic
	// Since is when the counting began.
	Since time.Time
}

// Busiest returns the object that received the most writes within one
// second, and that number.
func (t Traffic) Busiest() (name string, peak int) {
	for n, o := range t.Objects {
		if o.PeakWrites > peak || (o.PeakWrites == peak && n < name) {
			name, peak = n, o.PeakWrites
		}
	}
	return name, peak
}

// MostWritten returns the object that received the most writes in all,
// and that number.
func (t Traffic) MostWritten() (name string, writes int64) {
	for n, o := range t.Objects {
		if o.Writes > writes || (o.Writes == writes && n < name) {
			name, writes = n, o.Writes
		}
	}
	return name, writes
}

// objectState is the proxy's record of one object.
type objectState struct {
	ObjectTraffic
	limiter *rate.Limiter // nil until the first write under a limit
	recent  []time.Time   // times of the writes within the last second
}

// traffic is the proxy's counting and limiting state.
type traffic struct {
	mu      sync.Mutex
	limits  Limits                  // GUARDED_BY(mu)
	kinds   map[Kind]int64          // GUARDED_BY(mu)
	limited int64                   // GUARDED_BY(mu)
	objects map[string]*objectState // GUARDED_BY(mu)
	since   time.Time               // GUARDED_BY(mu)
}

func newTraffic() *traffic {
	return &traffic{kinds: make(map[Kind]int64), objects: make(map[string]*objectState), since: time.Now()}
}

// SetLimits changes the limits for later requests. Token buckets already
// filled keep their tokens.
func (p *Proxy) SetLimits(l Limits) {
	if l.Rate == 0 {
		l.Rate = ObjectWriteRate
	}
	if l.Burst == 0 {
		l.Burst = ObjectWriteBurst
	}
	t := p.traffic
	t.mu.Lock()
	defer t.mu.Unlock()
	if l.Rate != t.limits.Rate || l.Burst != t.limits.Burst {
		for _, o := range t.objects {
			o.limiter = nil
		}
	}
	t.limits = l
}

// Traffic returns a copy of the counts so far.
func (p *Proxy) Traffic() Traffic {
	t := p.traffic
	t.mu.Lock()
	defer t.mu.Unlock()
	out := Traffic{Kinds: make(map[Kind]int64, len(t.kinds)), Limited: t.limited,
		Objects: make(map[string]ObjectTraffic, len(t.objects)), Since: t.since}
	for k, n := range t.kinds {
		out.Kinds[k] = n
	}
	for name, o := range t.objects {
		out.Objects[name] = o.ObjectTraffic
	}
	return out
}

// Kinds returns the request counts by kind so far: Traffic without the
// objects, cheap enough to poll.
func (p *Proxy) Kinds() map[Kind]int64 {
	t := p.traffic
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make(map[Kind]int64, len(t.kinds))
	for k, n := range t.kinds {
		out[k] = n
	}
	return out
}

// ResetTraffic starts the counts afresh (the limits' token buckets stay).
func (p *Proxy) ResetTraffic() {
	t := p.traffic
	t.mu.Lock()
	defer t.mu.Unlock()
	t.kinds, t.limited, t.since = make(map[Kind]int64), 0, time.Now()
	for _, o := range t.objects {
		o.ObjectTraffic = ObjectTraffic{}
		o.recent = o.recent[:0]
	}
}

// LastWrite returns when a write to object ("bucket/name") last landed:
// when the emulator answered it with success. ok is false if none has
// since counting began.
func (p *Proxy) LastWrite(object string) (at time.Time, ok bool) {
	t := p.traffic
	t.mu.Lock()
	defer t.mu.Unlock()
	if o := t.objects[object]; o != nil && !o.LastWrite.IsZero() {
		return o.LastWrite, true
	}
	return time.Time{}, false
}

// landed records that a write to object was answered with success.
func (t *traffic) landed(object string, now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if o := t.objects[object]; o != nil {
		o.LastWrite = now
	}
}

// admit counts a request of kind k on object (may be "") and reports
// whether the write limit lets it through, and the latency to add.
func (t *traffic) admit(k Kind, object string, now time.Time) (ok bool, latency time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.kinds[k]++
	if object == "" {
		return true, t.limits.Latency
	}
	o := t.objects[object]
	if o == nil {
		o = &objectState{}
		t.objects[object] = o
	}
	if k != KindWrite {
		o.Reads++
		return true, t.limits.Latency
	}
	o.Writes++
	n := 0
	for _, at := range o.recent {
		if now.Sub(at) < time.Second {
			o.recent[n] = at
			n++
		}
	}
	o.recent = append(o.recent[:n], now)
	o.PeakWrites = max(o.PeakWrites, len(o.recent))
	if !t.limits.ObjectWrites {
		return true, t.limits.Latency
	}
	if o.limiter == nil {
		o.limiter = rate.NewLimiter(rate.Limit(t.limits.Rate), t.limits.Burst)
	}
	if !o.limiter.AllowN(now, 1) {
		o.Limited++
		t.limited++
		return false, t.limits.Latency
	}
	return true, t.limits.Latency
}

// classify returns what a request to the GCS JSON API does and the object
// ("bucket/name") it does it to, "" for none. It understands the paths the
// Go client uses, with or without the "/storage/v1" prefix:
//
//	GET    .../b/B/o/NAME?alt=media   read
//	GET    .../b/B/o/NAME             metadata
//	GET    .../b/B                    metadata (of the bucket)
//	GET    .../b/B/o                  list
//	POST   /upload/.../b/B/o?name=... write (name in the query, or in the
//	                                  JSON metadata of a multipart or
//	                                  resumable upload)
//	PUT    /upload/...?upload_id=...  write (a resumable upload's data; its
//	                                  object is not known here)
//	PATCH, PUT, DELETE .../b/B/o/NAME write
//	POST   .../b/B/o/NAME/compose     write (to NAME)
//	POST   .../o/SRC/copyTo|rewriteTo/b/B2/o/DST  write (to B2/DST)
//	POST   .../b                      write (bucket creation)
func classify(r *http.Request, body []byte) (Kind, string) {
	segs := strings.Split(strings.Trim(r.URL.EscapedPath(), "/"), "/")
	for i := range segs {
		if s, err := url.PathUnescape(segs[i]); err == nil {
			segs[i] = s
		}
	}
	// Find ".../b/BUCKET[/o[/NAME[/VERB/b/B2/o/DST]]]".
	bi := -1
	for i, s := range segs {
		if s == "b" {
			bi = i
			break
		}
	}
	read := r.Method == http.MethodGet || r.Method == http.MethodHead
	if bi < 0 {
		if read {
			return KindOther, ""
		}
		return KindWrite, "" // a resumable upload's data, or unknown
	}
	rest := segs[bi+1:]
	if len(rest) == 0 { // .../b: list buckets or create one
		if read {
			return KindList, ""
		}
		return KindWrite, ""
	}
	bucket := rest[0]
	if len(rest) == 1 { // .../b/B
		if read {
			return KindMetadata, ""
		}
		return KindWrite, ""
	}
	if rest[1] != "o" {
		if read {
			return KindMetadata, "" // ACLs, IAM, notifications...
		}
		return KindWrite, ""
	}
	if len(rest) == 2 { // .../b/B/o: list, or an upload
		if read {
			return KindList, ""
		}
		if name := uploadName(r, body); name != "" {
			return KindWrite, bucket + "/" + name
		}
		return KindWrite, ""
	}
	name := rest[2]
	verb := rest[3:]
	switch {
	case read && r.URL.Query().Get("alt") == "media":
		return KindRead, bucket + "/" + name
	case read:
		return KindMetadata, bucket + "/" + name
	case len(verb) == 0:
		return KindWrite, bucket + "/" + name
	case verb[0] == "compose":
		return KindWrite, bucket + "/" + name
	case (verb[0] == "copyTo" || verb[0] == "rewriteTo") && len(verb) >= 5:
		return KindWrite, verb[2] + "/" + verb[4]
	}
	return KindWrite, ""
}

// uploadName returns the name of the object an upload creates: from the
// query, or from the JSON metadata that opens a multipart upload or makes
// up a resumable upload's first request.
func uploadName(r *http.Request, body []byte) string {
	if n := r.URL.Query().Get("name"); n != "" {
		return n
	}
	var meta struct {
		Name string `json:"name"`
	}
	mt, params, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil {
		return ""
	}
	switch {
	case strings.HasPrefix(mt, "multipart/"):
		part, err := multipart.NewReader(bytes.NewReader(body), params["boundary"]).NextPart()
		if err != nil {
			return ""
		}
		if json.NewDecoder(io.LimitReader(part, 1<<20)).Decode(&meta) != nil {
			return ""
		}
	case mt == "application/json":
		if json.Unmarshal(body, &meta) != nil {
			return ""
		}
	}
	return meta.Name
}
