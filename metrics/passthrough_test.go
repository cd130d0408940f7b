package metrics

import (
	"io"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
)

// TestPassthroughGauge: lockfs_passthrough follows the state it reads at
// each scrape.
func TestPassthroughGauge(t *testing.T) {
	var on atomic.Bool
	on.Store(true)
	m := New(nil)
	m.RegisterPassthrough(on.Load)
	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	scrape := func() string {
		resp, err := srv.Client().Get(srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return string(body)
	}
	for _, c := range []struct {
		on        bool
		yes, zero string
	}{{true, "on", "off"}, {false, "off", "on"}} {
		on.Store(c.on)
		text := scrape()
		for _, want := range []string{`lockfs_passthrough{state="` + c.yes + `"} 1`, `lockfs_passthrough{state="` + c.zero + `"} 0`} {
			if !strings.Contains(text, want) {
				t.Errorf("on=%v: exposition lacks %s", c.on, want)
			}
		}
	}
}
