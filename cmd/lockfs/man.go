package main

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// newManCmd is the hidden command "make man" runs: it writes one man page
// per command (lockfs.1, lockfs-mount.1, ...) from the command tree, so the
// pages say what the help says.
func newManCmd() *cobra.Command {
	return &cobra.Command{
		Use:    "gen-man DIR",
		Short:  "Write the man pages into DIR",
		Hidden: true,
		Args:   exactArgs(1, "one argument, the directory to write the man pages to"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := os.MkdirAll(args[0], 0o755); err != nil {
				return err
			}
			return writeManTree(cmd.Root(), args[0])
		},
	}
}

// The man pages are written as roff here rather than through cobra/doc:
// its pages are all titled by the root command, it runs the help text
// through Markdown (which reflows the indented blocks, such as lockfs
// lock's TARGET table, into one paragraph), shows booleans as
// --help[=false], and has no EXIT STATUS, ENVIRONMENT, FILES or SEE ALSO
// sections.

// manExtra is what a command's page says beyond its help.
type manExtra struct {
	env     []manItem // ENVIRONMENT
	files   []manItem // FILES
	seeAlso []string  // SEE ALSO, besides lockfs(1) and the command's relatives
}

// manItem is one tagged paragraph: a name and what it is.
type manItem struct{ name, text string }

var (
	adminSocketFile = manItem{"/run/lockfs/MOUNTPOINT.sock",
		"a mount's admin socket (--admin-dir), MOUNTPOINT escaped as systemd-escape --path does; lockfs status and lockfs break use it"}
	mountinfoFile = manItem{"/proc/self/mountinfo", "where the lockfs mounts (type fuse.lockfs) are found"}
	backingFiles  = manItem{"SOURCE/DIR/..LOCK, ..LOCK_NEWDIR, ..LOCK_USAGE",
		"the local backend's lock files: each granted lock holds a kernel flock on one, so programs that lock them directly and every mount over SOURCE exclude each other"}
	credentialsEnv = manItem{"GOOGLE_APPLICATION_CREDENTIALS",
		"gcs backend: the service account key file of Application Default Credentials (else the metadata server, or gcloud's user credentials)"}
	fuseFiles = []manItem{{"/dev/fuse", "the FUSE device"},
		{"/etc/fuse.conf", "user_allow_other there lets a user other than root mount with --allow-other"}}
)

// manExtras are the extra sections, by command path with "-" between names.
var manExtras = map[string]manExtra{
	"lockfs": {
		env:     []manItem{credentialsEnv, {"LOCKFS_TOKEN, LOCKFS_LOCK", "set by lockfs lock for COMMAND: the grant's fencing token and the lock"}},
		files:   append([]manItem{adminSocketFile, backingFiles, mountinfoFile}, fuseFiles...),
		seeAlso: []string{"flock(1)", "flock(2)", "fcntl(2)", "fusermount3(1)", "mount(8)", "fstab(5)"},
	},
	"lockfs-mount": {
		env: []manItem{credentialsEnv,
			{"NOTIFY_SOCKET", "set by systemd for a Type=notify unit (lockfs@.service): the daemon says READY=1 once the mount answers"}},
		files: append([]manItem{adminSocketFile, backingFiles,
			{"/var/log/lockfs/MOUNTPOINT.log", "the log of a daemon started by mount(8) through mount.fuse.lockfs (an /etc/fstab line)"}}, fuseFiles...),
		seeAlso: []string{"flock(1)", "fusermount3(1)", "mount(8)", "fstab(5)", "systemd.service(5)"},
	},
	"lockfs-lock": {
		env: []manItem{{"LOCKFS_TOKEN", "set for COMMAND: the grant's fencing token"},
			{"LOCKFS_LOCK", "set for COMMAND: the lock (the control file through a mount, else a/b/.lock)"},
			credentialsEnv},
		files: []manItem{{"DIR/.lock, DIR/.lock_newdir, DIR/.lock_usage", "the control files of a directory of a lockfs mount"},
			backingFiles, mountinfoFile},
		seeAlso: []string{"flock(1)", "flock(2)", "sh(1)"},
	},
	"lockfs-status":  {files: []manItem{adminSocketFile, mountinfoFile}, seeAlso: []string{"lslocks(8)"}},
	"lockfs-break":   {files: []manItem{adminSocketFile, mountinfoFile}},
	"lockfs-unmount": {files: []manItem{mountinfoFile}, seeAlso: []string{"fusermount3(1)", "umount(8)"}},
	"lockfs-doctor": {env: []manItem{credentialsEnv}, files: append([]manItem{adminSocketFile}, fuseFiles...),
		seeAlso: []string{"fusermount3(1)"}},
}

// defaultExitStatus is the EXIT STATUS of a command whose help has no
// "Exit status:" paragraph.
const defaultExitStatus = "0 on success, 1 on failure, 64 for a bad command line (EX_USAGE of sysexits.h, as flock(1))."

// writeManTree writes a page for root and for each command under it that
// a user can run.
func writeManTree(root *cobra.Command, dir string) error {
	var cmds []*cobra.Command
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		cmds = append(cmds, c)
		for _, sub := range c.Commands() {
			if sub.IsAvailableCommand() && sub.Name() != "help" {
				walk(sub)
			}
		}
	}
	walk(root)
	for _, c := range cmds {
		var b bytes.Buffer
		writeManPage(&b, c, cmds)
		if err := os.WriteFile(filepath.Join(dir, manName(c)+".1"), b.Bytes(), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// manName is a command's page name: "lockfs", "lockfs-lock".
func manName(c *cobra.Command) string { return strings.ReplaceAll(c.CommandPath(), " ", "-") }

// writeManPage writes c's page, naming its relatives among all.
func writeManPage(w io.Writer, c *cobra.Command, all []*cobra.Command) {
	name := manName(c)
	extra := manExtras[name]
	fmt.Fprintf(w, ".TH %s 1 \"\" %s \"lockfs manual\"\n", roffQuote(strings.ToUpper(name)), roffQuote("lockfs "+Version()))
	fmt.Fprintf(w, ".SH NAME\n%s \\- %s\n", roffText(name), roffText(c.Short))

	fmt.Fprintln(w, ".SH SYNOPSIS")
	use := c.Use
	if c.HasAvailableSubCommands() {
		use = c.Name() + " COMMAND [flags] [ARGS...]"
	}
	path, rest, _ := strings.Cut(use, " ")
	if c.HasParent() {
		path = c.Parent().CommandPath() + " " + path
	}
	fmt.Fprintf(w, ".B %s\n%s\n", roffText(path), roffText(rest))

	long, exit := splitExitStatus(c.Long)
	fmt.Fprintln(w, ".SH DESCRIPTION")
	writeRoffBlocks(w, long)

	if c.HasAvailableSubCommands() {
		fmt.Fprintln(w, ".SH COMMANDS")
		for _, sub := range c.Commands() {
			if sub.IsAvailableCommand() {
				fmt.Fprintf(w, ".TP\n.BR %s (1)\n%s\n", manName(sub), roffText(sub.Short))
			}
		}
	}

	if flags := visibleFlags(c); len(flags) > 0 {
		fmt.Fprintln(w, ".SH OPTIONS")
		for _, f := range flags {
			writeManFlag(w, f)
		}
	}
	if c.Example != "" {
		fmt.Fprintln(w, ".SH EXAMPLES")
		writeRoffVerbatim(w, c.Example)
	}
	if exit == "" {
		exit = defaultExitStatus
	}
	fmt.Fprintln(w, ".SH EXIT STATUS")
	writeRoffBlocks(w, exit)
	writeManItems(w, "ENVIRONMENT", extra.env)
	writeManItems(w, "FILES", extra.files)

	var see []string
	for _, o := range all {
		if o != c && (o == c.Root() || o.Parent() == c || (c.HasParent() && o.Parent() == c.Parent() && o.Parent() != c.Root())) {
			see = append(see, manName(o)+"(1)")
		}
	}
	see = append(see, extra.seeAlso...)
	if len(see) > 0 {
		fmt.Fprintln(w, ".SH SEE ALSO")
		for i, s := range see {
			page, sect, _ := strings.Cut(strings.TrimSuffix(s, ")"), "(")
			sep := ","
			if i == len(see)-1 {
				sep = ""
			}
			fmt.Fprintf(w, ".BR %s (%s)%s\n", roffText(page), sect, sep)
		}
	}
}

// splitExitStatus takes a final "Exit status: ..." paragraph off a
// command's long help, for the EXIT STATUS section.
func splitExitStatus(long string) (rest, exit string) {
	i := strings.LastIndex(long, "\n\nExit status: ")
	if i < 0 {
		return long, ""
	}
	exit = strings.TrimPrefix(long[i+2:], "Exit status: ")
	return long[:i], strings.ToUpper(exit[:1]) + exit[1:]
}

// visibleFlags are c's flags and the ones it inherits, as its help shows
// them, sorted by name.
func visibleFlags(c *cobra.Command) []*pflag.Flag {
	var out []*pflag.Flag
	seen := map[string]bool{}
	add := func(f *pflag.Flag) {
		if !f.Hidden && !seen[f.Name] {
			seen[f.Name] = true
			out = append(out, f)
		}
	}
	c.InitDefaultHelpFlag()
	c.NonInheritedFlags().VisitAll(add)
	c.InheritedFlags().VisitAll(add)
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// writeManFlag writes one option: "-w, --timeout=duration", then what it
// does and its default (none shown for false, 0 or empty).
func writeManFlag(w io.Writer, f *pflag.Flag) {
	varName, usage := pflag.UnquoteUsage(f)
	head := "\\fB\\-\\-" + roffText(f.Name) + "\\fR"
	if f.Shorthand != "" {
		head = "\\fB\\-" + roffText(f.Shorthand) + "\\fR, " + head
	}
	if varName != "" && f.NoOptDefVal == "" {
		head += "=\\fI" + roffText(varName) + "\\fR"
	}
	switch f.DefValue {
	case "", "0", "false", "[]":
	default:
		if f.NoOptDefVal == "" {
			usage += " (default " + f.DefValue + ")"
		}
	}
	fmt.Fprintf(w, ".TP\n%s\n%s\n", head, roffText(usage))
}

// writeManItems writes a section of tagged paragraphs, if there are any.
func writeManItems(w io.Writer, section string, items []manItem) {
	if len(items) == 0 {
		return
	}
	fmt.Fprintf(w, ".SH %s\n", section)
	for _, it := range items {
		fmt.Fprintf(w, ".TP\n.I %s\n%s\n", roffQuote(it.name), roffText(it.text))
	}
}

// writeRoffBlocks writes help text: paragraphs separated by blank lines
// are filled, but a paragraph with an indented line (a table, an example)
// is kept line for line, as the help prints it.
func writeRoffBlocks(w io.Writer, text string) {
	for _, para := range strings.Split(strings.TrimSpace(text), "\n\n") {
		lines := strings.Split(para, "\n")
		indented := false
		for _, l := range lines {
			indented = indented || strings.HasPrefix(l, " ")
		}
		if !indented {
			fmt.Fprintf(w, ".PP\n%s\n", roffText(strings.Join(lines, "\n")))
			continue
		}
		// A lead-in line ("TARGET is one of:") stays a line of its own.
		fmt.Fprintln(w, ".PP")
		writeRoffVerbatim(w, para)
	}
}

// writeRoffVerbatim writes text line for line, unfilled.
func writeRoffVerbatim(w io.Writer, text string) {
	fmt.Fprintln(w, ".nf")
	for _, l := range strings.Split(strings.TrimRight(text, "\n"), "\n") {
		fmt.Fprintln(w, roffText(l))
	}
	fmt.Fprintln(w, ".fi")
}

// roffText escapes text for roff: backslashes, hyphens (a plain "-" may be
// typeset as a hyphen that cannot be pasted into a shell), and a leading
// "." or "'", which would start a request.
func roffText(s string) string {
	s = strings.ReplaceAll(s, `\`, `\e`)
	s = strings.ReplaceAll(s, "-", `\-`)
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		if strings.HasPrefix(l, ".") || strings.HasPrefix(l, "'") {
			lines[i] = `\&` + l
		}
	}
	return strings.Join(lines, "\n")
}

// roffQuote is roffText as one quoted macro argument.
func roffQuote(s string) string {
	return `"` + strings.ReplaceAll(roffText(s), `"`, `\(dq`) + `"`
}
