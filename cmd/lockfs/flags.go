package main

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// durationValue is a pflag.Value for durations that also accepts bare
// seconds, as flock(1) users type them: "30" is 30s, "1.5" is 1.5s, and
// "30s", "2m", "1h30m" are Go durations.
type durationValue time.Duration

func newDurationValue(p *time.Duration, def time.Duration) *durationValue {
	*p = def
	return (*durationValue)(p)
}

func (d *durationValue) Set(s string) error {
	v, err := parseDuration(s)
	if err != nil {
		return err
	}
	*d = durationValue(v)
	return nil
}

func (d *durationValue) Type() string { return "duration" }

// String is the duration as Go writes it, but 0 as "0", which pflag's help
// takes for a zero default and leaves out: a flag whose 0 means something
// (-w 0) says so in its usage instead.
func (d *durationValue) String() string {
	if *d == 0 {
		return "0"
	}
	return time.Duration(*d).String()
}

// parseDuration parses a duration or a number of seconds; negative values
// are refused.
func parseDuration(s string) (time.Duration, error) {
	var v time.Duration
	if secs, err := strconv.ParseFloat(s, 64); err == nil {
		v = time.Duration(secs * float64(time.Second))
	} else if v, err = time.ParseDuration(s); err != nil {
		return 0, fmt.Errorf("want seconds (30, 1.5) or a duration with a unit (30s, 2m, 1h30m)")
	}
	if v < 0 {
		return 0, fmt.Errorf("want a duration of 0 or more")
	}
	return v, nil
}

// durationVarP declares a duration flag that accepts bare seconds.
func durationVarP(fs *pflag.FlagSet, p *time.Duration, name, short string, def time.Duration, usage string) {
	fs.VarP(newDurationValue(p, def), name, short, usage)
}

// unknownFlag matches pflag's errors for a flag it does not know.
var unknownFlag = regexp.MustCompile(`^unknown (?:shorthand )?flag: (?:'(.)' in -.*|--?([^=\s]+))`)

// flagError turns pflag's parse errors into usage errors, with a "did you
// mean" for a mistyped flag.
func flagError(cmd *cobra.Command, err error) error {
	msg := err.Error()
	if m := unknownFlag.FindStringSubmatch(msg); m != nil && m[2] != "" {
		if s := suggestFlag(cmd, m[2]); s != "" {
			msg += fmt.Sprintf("; did you mean --%s?", s)
		}
	}
	return usagef("%s", msg)
}

// suggestFlag returns the flag of cmd closest to name (a prefix of it, or
// within two edits), or "".
func suggestFlag(cmd *cobra.Command, name string) string {
	best, bestDist := "", 3
	cmd.Flags().VisitAll(func(f *pflag.Flag) {
		if f.Hidden {
			return
		}
		d := editDistance(name, f.Name)
		if strings.HasPrefix(f.Name, name) && len(name) >= 3 {
			d = 1
		}
		if d < bestDist {
			best, bestDist = f.Name, d
		}
	})
	return best
}

// editDistance is the Levenshtein distance between a and b.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
