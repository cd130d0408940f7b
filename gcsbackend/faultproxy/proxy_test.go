package faultproxy

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// Each fault does what it says: answered faults and resets never reach the
// target, a lost reply reaches it and is not answered, and the black hole
// holds a request until the client gives up.
func TestFaults(t *testing.T) {
	var hits atomic.Int64
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		io.Copy(io.Discard, r.Body)
		io.WriteString(w, "ok")
	}))
	defer target.Close()
	p, err := New(target.URL, 1, Faults{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	post := func() (int, error) {
		resp, err := client.Post(p.URL+"/upload", "text/plain", strings.NewReader("x"))
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		io.Copy(io.Discard, resp.Body)
		return resp.StatusCode, nil
	}
	for _, c := range []struct {
		name     string
		f        Faults
		wantCode int // 0: a transport error
		wantHit  bool
	}{
		{"none", Faults{}, 200, true},
		{"429", Faults{RateLimited: 1}, 429, false},
		{"503", Faults{Unavailable: 1}, 503, false},
		{"403", Faults{Forbidden: 1}, 403, false},
		{"reset", Faults{Reset: 1}, 0, false},
		{"lost reply", Faults{LostReply: 1}, 0, true},
		{"latency", Faults{LatencyRate: 1, Latency: 50 * time.Millisecond}, 200, true},
	} {
		p.SetFaults(c.f)
		before := hits.Load()
		code, err := post()
		if (c.wantCode == 0) != (err != nil) || code != c.wantCode {
			t.Errorf("%s: code %d, error %v; want code %d", c.name, code, err, c.wantCode)
		}
		if hit := hits.Load() > before; hit != c.wantHit {
			t.Errorf("%s: reached the target: %v, want %v", c.name, hit, c.wantHit)
		}
	}
	p.SetFaults(Faults{})
	p.SetBlackhole(true)
	start := time.Now()
	if _, err := post(); err == nil || time.Since(start) < time.Second {
		t.Errorf("black hole: %v after %v; want the client's timeout", err, time.Since(start))
	}
	p.SetBlackhole(false)
	if code, err := post(); err != nil || code != 200 {
		t.Errorf("after the black hole: %d, %v", code, err)
	}
	s := p.Stats()
	if s.RateLimited != 1 || s.Unavailable != 1 || s.Forbidden != 1 || s.Resets != 1 || s.LostReplies != 1 || s.Delayed != 1 || s.Blackholed != 1 {
		t.Errorf("stats %+v", s)
	}
}

// The token bucket and the one-second peak, on a clock of the test's own:
// a burst of 5 passes and the 6th write is limited, one more passes after
// a second; the peak counts every write (429s included) within any second.
// Control: the same writes with the limit off all pass.
func TestPeakWrites(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	for _, limit := range []bool{false, true} {
		tr := newTraffic()
		tr.limits = Limits{ObjectWrites: limit, Rate: ObjectWriteRate, Burst: ObjectWriteBurst}
		var passed []int
		for _, ms := range []int{0, 1, 2, 3, 4, 5, 1005, 1006, 1500, 2400} {
			if ok, _ := tr.admit(KindWrite, "b/o", at(ms)); ok {
				passed = append(passed, ms)
			}
		}
		want := []int{0, 1, 2, 3, 4, 5, 1005, 1006, 1500, 2400}
		if limit {
			// 5 tokens at 0; 1 refilled by 1005 (and 0.005 more); none at
			// 1006; by 1500 0.5+; by 2400 1.4: one.
			want = []int{0, 1, 2, 3, 4, 1005, 2400}
		}
		if fmt.Sprint(passed) != fmt.Sprint(want) {
			t.Errorf("limit %v: passed %v, want %v", limit, passed, want)
		}
		o := tr.objects["b/o"]
		// Within [5, 1005): 6 writes (0..5); within [1005, 2005): 1005,
		// 1006, 1500: 3; the peak is 6.
		if o.PeakWrites != 6 || o.Writes != 10 {
			t.Errorf("limit %v: %+v; want 10 writes, peak 6", limit, o.ObjectTraffic)
		}
	}
}
