package bench

import (
	"math"
	"testing"
)

func TestSummarize(t *testing.T) {
	s := summarize([]float64{5, 1, 3, 2, 4})
	if s != (summary{1, 3, 5}) {
		t.Errorf("summarize odd = %+v", s)
	}
	s = summarize([]float64{4, 1, 3, 2})
	if s != (summary{1, 2.5, 4}) {
		t.Errorf("summarize even = %+v", s)
	}
	if s := summarize(nil); !math.IsNaN(s.Med) {
		t.Errorf("summarize(nil) = %+v", s)
	}
}

func TestPercentile(t *testing.T) {
	xs := make([]float64, 100)
	for i := range xs {
		xs[i] = float64(100 - i) // 100..1
	}
	for _, c := range []struct{ p, want float64 }{{50, 50}, {99, 99}, {100, 100}, {1, 1}, {0, 1}} {
		if got := percentile(xs, c.p); got != c.want {
			t.Errorf("percentile(1..100, %v) = %v, want %v", c.p, got, c.want)
		}
	}
	if got := percentile([]float64{7, 3}, 99); got != 7 {
		t.Errorf("p99 of two = %v, want the larger", got)
	}
}

func TestRatiosPairwise(t *testing.T) {
	got := ratios([]float64{2, 9, 4}, []float64{1, 3, 8})
	want := []float64{2, 3, 0.5}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("ratios = %v, want %v", got, want)
		}
	}
}

func TestResultsJSONNullAndRounding(t *testing.T) {
	r := newResults()
	r.set("a", 1.23456789)
	r.set("nan", math.NaN())
	r.setNull("b")
	b, err := r.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(b), `{"a":1.235,"b":null,"nan":null}`; got != want {
		t.Errorf("JSON = %s, want %s", got, want)
	}
}
