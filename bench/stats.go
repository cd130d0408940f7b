package bench

import (
	"math"
	"sort"
)

// summary is the minimum, median and maximum of a series.
type summary struct{ Min, Med, Max float64 }

// summarize returns the summary of xs (NaNs if empty).
func summarize(xs []float64) summary {
	if len(xs) == 0 {
		return summary{math.NaN(), math.NaN(), math.NaN()}
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	return summary{Min: s[0], Med: median(s), Max: s[len(s)-1]}
}

// median of sorted xs.
func median(sorted []float64) float64 {
	n := len(sorted)
	if n%2 == 1 {
		return sorted[n/2]
	}
	return (sorted[n/2-1] + sorted[n/2]) / 2
}

// percentile returns the p-th percentile (0..100) of xs by the
// nearest-rank method: the smallest value with at least p% of the values
// at or below it.
func percentile(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	rank := int(math.Ceil(p / 100 * float64(len(s))))
	rank = max(rank, 1)
	return s[rank-1]
}

// ratios returns a[i]/b[i] for each repetition i.
func ratios(a, b []float64) []float64 {
	out := make([]float64, 0, len(a))
	for i := range a {
		if i < len(b) {
			out = append(out, a[i]/b[i])
		}
	}
	return out
}
