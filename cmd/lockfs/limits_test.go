package main

import "testing"

func TestMaxOpenPerUID(t *testing.T) {
	for _, c := range []struct {
		flag   int
		nofile uint64
		want   int
	}{
		{-1, 1 << 20, 1 << 18}, // a quarter of the limit
		{-1, 100, minOpenPerUID},
		{0, 1 << 20, 0}, // no cap
		{500, 1 << 20, 500},
	} {
		if got := maxOpenPerUID(c.flag, c.nofile); got != c.want {
			t.Errorf("maxOpenPerUID(%d, %d) = %d, want %d", c.flag, c.nofile, got, c.want)
		}
	}
}
