// Package faultproxy is a loopback HTTP reverse proxy that injects the
// failures a GCS client meets in the wild, at seeded rates, between a client
// and a GCS emulator: 429 and 503 answers (the request is not forwarded),
// added latency, connection resets (not forwarded), and lost replies (the
// request is forwarded and takes effect, then the connection is reset
// instead of answered). It can also black-hole every request, as a network
// partition or a frozen peer would.
//
// It can also behave like GCS where the emulator does not (see Limits):
// enforce GCS's write rate per object name with 429 answers, and add a fixed
// latency to every request, as a remote service has. And it counts what it
// receives by kind of request (read, metadata, list, write) and by object,
// with the most writes any one object received within a second (see
// Traffic). It is for tests and the benchmark.
package faultproxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand"
	"net"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"time"
)

// Faults are the rates, each a probability in [0, 1], at which the proxy
// injects each failure into a request. They are drawn in the order
// RateLimited, Unavailable, Reset, LostReply, Forbidden, so at most one of
// them applies to a request; latency applies on top.
type Faults struct {
	// RateLimited answers 429 Too Many Requests without forwarding.
	RateLimited float64
	// Unavailable answers 503 Service Unavailable without forwarding.
	Unavailable float64
	// Forbidden answers 403 Forbidden without forwarding, as GCS answers
	// an identity that lacks a permission (with WritesOnly: a bucket that
	// can be read but not written).
	Forbidden float64
	// Reset resets the client's connection without forwarding.
	Reset float64
	// LostReply forwards the request (so a write takes effect), then resets
	// the client's connection instead of answering.
	LostReply float64
	// LatencyRate is the share of requests delayed by a uniform random
	// duration in [0, Latency] before they are handled.
	LatencyRate float64
	Latency     time.Duration
	// WritesOnly limits the faults to requests other than GET and HEAD.
	WritesOnly bool
}

// Stats counts what the proxy did.
type Stats struct {
	Requests    int64 // requests received
	Forwarded   int64 // requests forwarded to the target (lost replies included)
	RateLimited int64 // 429 answers injected
	Unavailable int64 // 503 answers injected
	Forbidden   int64 // 403 answers injected
	Resets      int64 // connections reset without forwarding
	LostReplies int64 // requests forwarded whose reply was dropped
	Delayed     int64 // requests delayed (by Faults.Latency or Limits.Latency)
	Blackholed  int64 // requests held by the black hole
}

// Proxy is a running fault-injecting proxy.
type Proxy struct {
	// URL is the proxy's base URL, "http://127.0.0.1:PORT"; use it where the
	// target's base URL would go.
	URL string

	target    *url.URL
	transport *http.Transport
	srv       *http.Server
	ln        net.Listener
	served    chan struct{}

	mu     sync.Mutex
	rnd    *rand.Rand    // GUARDED_BY(mu)
	faults Faults        // GUARDED_BY(mu)
	hole   chan struct{} // non-nil while black-holing; closed to end it. GUARDED_BY(mu)

	traffic *traffic // counts and limits, with a lock of its own

	requests, forwarded, rateLimited, unavailable, forbidden, resets, lostReplies, delayed, blackholed atomic.Int64
}

// New starts a proxy on a free loopback port in front of target (a base URL
// such as "http://127.0.0.1:4443"), injecting faults with a random source
// seeded with seed.
func New(target string, seed int64, f Faults) (*Proxy, error) {
	u, err := url.Parse(target)
	if err != nil {
		return nil, fmt.Errorf("faultproxy: target: %w", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{
		URL:       "http://" + ln.Addr().String(),
		target:    u,
		transport: &http.Transport{MaxIdleConnsPerHost: 256, MaxConnsPerHost: 1024, IdleConnTimeout: 30 * time.Second},
		ln:        ln,
		served:    make(chan struct{}),
		rnd:       rand.New(rand.NewSource(seed)),
		faults:    f,
		traffic:   newTraffic(),
	}
	p.SetLimits(Limits{})
	p.srv = &http.Server{Handler: http.HandlerFunc(p.serve), ReadHeaderTimeout: 10 * time.Second}
	go func() {
		defer close(p.served)
		p.srv.Serve(ln)
	}()
	return p, nil
}

// SetFaults changes the fault rates for later requests.
func (p *Proxy) SetFaults(f Faults) {
	p.mu.Lock()
	p.faults = f
	p.mu.Unlock()
}

// SetBlackhole starts (true) or ends (false) black-holing: while on, every
// request is held unanswered until the client gives up, or until it ends,
// when held requests get their connection reset without being forwarded.
func (p *Proxy) SetBlackhole(on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case on && p.hole == nil:
		p.hole = make(chan struct{})
	case !on && p.hole != nil:
		close(p.hole)
		p.hole = nil
	}
}

// Stats returns the counts so far.
func (p *Proxy) Stats() Stats {
	return Stats{
		Requests: p.requests.Load(), Forwarded: p.forwarded.Load(),
		RateLimited: p.rateLimited.Load(), Unavailable: p.unavailable.Load(), Forbidden: p.forbidden.Load(),
		Resets: p.resets.Load(), LostReplies: p.lostReplies.Load(),
		Delayed: p.delayed.Load(), Blackholed: p.blackholed.Load(),
	}
}

// Close stops the proxy, resetting held requests, and waits for it.
func (p *Proxy) Close() error {
	p.SetBlackhole(false)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := p.srv.Shutdown(ctx)
	if err != nil {
		p.srv.Close()
	}
	<-p.served
	p.transport.CloseIdleConnections()
	if errors.Is(err, context.DeadlineExceeded) {
		err = nil // handlers still running were closed forcibly
	}
	return err
}

type action int

const (
	forward action = iota
	answer429
	answer429Limit // the write limit of Limits, not an injected fault
	answer503
	answer403
	reset
	lostReply
)

// draw decides what to do with one request.
func (p *Proxy) draw(method string) (act action, delay time.Duration, hole chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	f := p.faults
	if f.WritesOnly && (method == http.MethodGet || method == http.MethodHead) {
		return forward, 0, p.hole
	}
	x := p.rnd.Float64()
	switch {
	case x < f.RateLimited:
		act = answer429
	case x < f.RateLimited+f.Unavailable:
		act = answer503
	case x < f.RateLimited+f.Unavailable+f.Reset:
		act = reset
	case x < f.RateLimited+f.Unavailable+f.Reset+f.LostReply:
		act = lostReply
	case x < f.RateLimited+f.Unavailable+f.Reset+f.LostReply+f.Forbidden:
		act = answer403
	}
	if f.Latency > 0 && p.rnd.Float64() < f.LatencyRate {
		delay = time.Duration(p.rnd.Int63n(int64(f.Latency) + 1))
	}
	return act, delay, p.hole
}

func (p *Proxy) serve(w http.ResponseWriter, r *http.Request) {
	p.requests.Add(1)
	body, err := io.ReadAll(r.Body)
	if err != nil {
		resetConn(w)
		return
	}
	kind, object := classify(r, body)
	admitted, latency := p.traffic.admit(kind, object, time.Now())
	act, delay, hole := p.draw(r.Method)
	delay += latency
	if !admitted && act != reset {
		act = answer429Limit
	}
	if hole != nil {
		p.blackholed.Add(1)
		select {
		case <-hole:
		case <-r.Context().Done():
		}
		resetConn(w)
		return
	}
	if delay > 0 {
		p.delayed.Add(1)
		select {
		case <-time.After(delay):
		case <-r.Context().Done():
			return
		}
	}
	switch act {
	case answer429Limit:
		gcsErrorReason(w, http.StatusTooManyRequests, "rateLimitExceeded", "The rate of change requests to the object "+
			object+" exceeds the rate limit. Please reduce the rate of create, update, and delete requests.")
		return
	case answer429:
		p.rateLimited.Add(1)
		gcsError(w, http.StatusTooManyRequests, "injected: rate limit exceeded")
		return
	case answer503:
		p.unavailable.Add(1)
		gcsError(w, http.StatusServiceUnavailable, "injected: backend unavailable")
		return
	case answer403:
		p.forbidden.Add(1)
		gcsErrorReason(w, http.StatusForbidden, "forbidden", "injected: the caller does not have storage.objects.create access to the object.")
		return
	case reset:
		p.resets.Add(1)
		resetConn(w)
		return
	}
	resp, err := p.roundTrip(r, body)
	if err != nil {
		gcsError(w, http.StatusBadGateway, "proxy: "+err.Error())
		return
	}
	defer resp.Body.Close()
	rbody, err := io.ReadAll(resp.Body)
	if err != nil {
		resetConn(w)
		return
	}
	if kind == KindWrite && object != "" && resp.StatusCode/100 == 2 {
		p.traffic.landed(object, time.Now())
	}
	if act == lostReply {
		p.lostReplies.Add(1)
		resetConn(w)
		return
	}
	for k, vs := range resp.Header {
		for _, v := range vs {
			w.Header().Add(k, v)
		}
	}
	w.WriteHeader(resp.StatusCode)
	w.Write(rbody)
}

// roundTrip forwards r, with its body already read, to the target.
func (p *Proxy) roundTrip(r *http.Request, body []byte) (*http.Response, error) {
	p.forwarded.Add(1)
	u := *r.URL
	u.Scheme, u.Host = p.target.Scheme, p.target.Host
	out, err := http.NewRequestWithContext(context.WithoutCancel(r.Context()), r.Method, u.String(), bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	out.Header = r.Header.Clone()
	out.ContentLength = int64(len(body))
	ctx, cancel := context.WithTimeout(out.Context(), 30*time.Second)
	defer cancel()
	resp, err := p.transport.RoundTrip(out.WithContext(ctx))
	if err != nil {
		return nil, err
	}
	// Read the body before ctx is cancelled.
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return nil, err
	}
	resp.Body = io.NopCloser(bytes.NewReader(b))
	return resp, nil
}

// gcsError answers with a JSON error body as GCS writes it.
func gcsError(w http.ResponseWriter, code int, msg string) {
	gcsErrorReason(w, code, "injected", msg)
}

// gcsErrorReason is gcsError with the reason GCS would give.
func gcsErrorReason(w http.ResponseWriter, code int, reason, msg string) {
	w.Header().Set("Content-Type", "application/json; charset=UTF-8")
	w.WriteHeader(code)
	fmt.Fprintf(w, `{"error":{"code":%d,"message":%q,"errors":[{"message":%q,"reason":%q}]}}`, code, msg, msg, reason)
}

// resetConn closes the client's connection with a TCP reset.
func resetConn(w http.ResponseWriter) {
	hj, ok := w.(http.Hijacker)
	if !ok {
		panic("faultproxy: connection cannot be hijacked")
	}
	conn, _, err := hj.Hijack()
	if err != nil {
		return
	}
	if tc, ok := conn.(*net.TCPConn); ok {
		tc.SetLinger(0)
	}
	conn.Close()
}
