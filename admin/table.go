package admin

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/lockfs/lockfs/internal/procinfo"
	"github.com/lockfs/lockfs/lockmgr"
)

// WriteTable prints a status reply for people, one row per holder and per
// waiter, in aligned columns like lslocks(8).
// A reply with no lock and no claim prints one line, "no locks".
func WriteTable(w io.Writer, r Reply, now time.Time) error {
	if len(r.Locks) == 0 && len(r.Claims) == 0 && r.ClaimsError == "" {
		_, err := fmt.Fprintln(w, "no locks (none held or waited for)")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "PATH\tKIND\tROLE\tMODE\tHOST\tPID\tUID\tCOMMAND\tAGE\tTOKEN\tLEASE\tNOTE")
	for _, l := range r.Locks {
		path := lockmgr.QuoteName(l.Path)
		if path == "." {
			path = "/"
		}
		lease := l.Lease
		if lease == "" {
			lease = "-"
		}
		for _, h := range l.Holders {
			role := "held"
			if !h.Explicit {
				role = fmt.Sprintf("implicit(%d)", h.Implicit)
			} else if h.Implicit > 0 {
				role = fmt.Sprintf("held+implicit(%d)", h.Implicit)
			}
			if h.Lost != "" {
				role += ",LOST"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", path, l.Kind, role, h.Mode,
				orDash(h.Host), num(h.PID), uid(h.UID, h.Hidden), orDash(command(h.Command, h.Cmdline, h.Runs)), age(now, h.Since),
				token(h.Token), lease, orDash(lockmgr.QuoteName(h.Note)))
		}
		for _, wt := range l.Waiters {
			// A waiter queued here for a lock below (it needs this one
			// shared first) says which lock it asked for.
			note := "-"
			if wt.Implicit && wt.Wants != "" {
				note = "for " + lockmgr.QuoteName(wt.Wants) + " " + wt.WantsMode
			}
			if wt.Blocker != "" {
				note = strings.TrimPrefix(strings.TrimPrefix(note, "-")+"; ", "; ") + "blocked by " + wt.Blocker
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", path, l.Kind, "waiting", wt.Mode,
				"-", num(wt.PID), uid(wt.UID, wt.Hidden), orDash(command(wt.Command, wt.Cmdline, wt.Runs)), age(now, wt.Since), "-", lease, note)
		}
	}
	// Every host's claims in the backend's shared store (gcs), this
	// host's own included: ROLE claim(held|warm|claimed), LEASE the
	// claiming session's state.
	for _, c := range r.Claims {
		path := lockmgr.QuoteName(c.Path)
		if path == "." {
			path = "/"
		}
		lease := "session " + c.State
		if !c.LockDelayUntil.IsZero() {
			lease += ", lock-delay until " + c.LockDelayUntil.Local().Format(time.TimeOnly)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", path, c.Kind, "claim("+c.Use+")", c.Mode,
			orDash(c.Host), "-", "-", "-", age(now, c.Since), "-", lease, "-")
	}
	if r.ClaimsError != "" {
		if err := tw.Flush(); err != nil {
			return err
		}
		fmt.Fprintf(w, "(the backend's claims could not be read: %s)\n", r.ClaimsError)
		return nil
	}
	return tw.Flush()
}

// tableCommand is how wide a command line may grow in the table; --json
// has it whole.
const tableCommand = 60

// command renders a process for the COMMAND column: its command line, or
// for a lock wrapper the command it runs, with that command's pid and the
// wrapper's name ("make deploy [4312 under flock]"). procinfo has escaped
// the control characters of command lines and names already.
func command(name, line string, runs *procinfo.Command) string {
	if runs != nil && runs.String() != "" {
		return fmt.Sprintf("%s [%d under %s]", cut(runs.String()), runs.PID, name)
	}
	if line != "" {
		return cut(line)
	}
	return name
}

func cut(s string) string {
	if r := []rune(s); len(r) > tableCommand {
		return string(r[:tableCommand-3]) + "..."
	}
	return s
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func num(n int) string {
	if n <= 0 {
		return "-"
	}
	return strconv.Itoa(n)
}

func uid(u *uint32, hidden bool) string {
	if hidden {
		return "hidden"
	}
	if u == nil {
		return "-"
	}
	return strconv.FormatUint(uint64(*u), 10)
}

func token(t uint64) string {
	if t == 0 {
		return "-"
	}
	return strconv.FormatUint(t, 10)
}

func age(now, since time.Time) string {
	if since.IsZero() {
		return "-"
	}
	return now.Sub(since).Truncate(100 * time.Millisecond).String()
}
