package main

import "testing"

func TestMaxOpenPerUID(t *testing.T) {
	for _, c := range []struct {
		flag       int
		nofile     uint64
		allowOther bool
		want       int
	}{
		{-1, 1 << 20, true, 1 << 18},        // shared: a quarter of the limit
		{-1, 1 << 20, false, 1<<20 - 1<<17}, // the mounting user alone: seven eighths
		{-1, 20000, false, 17500},           // the limit of issue 31: more than 5,000
		{-1, 100, true, minOpenPerUID},      // at least 64
		{0, 1 << 20, false, 0},              // no cap
		{500, 1 << 20, true, 500},           // as given
		{-1, 1 << 40, false, 1 << 30},       // at most 2^30
	} {
		if got := maxOpenPerUID(c.flag, c.nofile, c.allowOther); got != c.want {
			t.Errorf("maxOpenPerUID(%d, %d, %v) = %d, want %d", c.flag, c.nofile, c.allowOther, got, c.want)
		}
	}
}
