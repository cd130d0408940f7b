package main

import (
	"strings"

	"github.com/spf13/cobra"
)

// newHelpCmd is "lockfs help [COMMAND]": cobra's, except that a topic it
// does not know is a usage error (cobra prints the main help and exits 0).
func newHelpCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "help [COMMAND]",
		Short: "Help about any command",
		Long:  `Help prints the help of COMMAND (lockfs help lock), or of lockfs.`,
		ValidArgsFunction: func(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
			var out []cobra.Completion
			for _, c := range cmd.Root().Commands() {
				if c.IsAvailableCommand() && strings.HasPrefix(c.Name(), toComplete) {
					out = append(out, cobra.CompletionWithDesc(c.Name(), c.Short))
				}
			}
			return out, cobra.ShellCompDirectiveNoFileComp
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			target, rest, err := cmd.Root().Find(args)
			if err != nil || target == nil || len(rest) > 0 {
				msg := "unknown help topic " + strings.Join(args, " ")
				if len(args) > 0 {
					if s := cmd.Root().SuggestionsFor(args[0]); len(s) > 0 {
						msg += "; did you mean " + s[0] + "?"
					}
				}
				return usagef("%s (lockfs help lists the commands)", msg)
			}
			target.InitDefaultHelpFlag()
			target.InitDefaultVersionFlag()
			return target.Help()
		},
	}
}

// shells are the shells "lockfs completion" writes scripts for.
var shells = []string{"bash", "zsh", "fish"}

// newCompletionCmd is "lockfs completion SHELL", in place of cobra's
// default: a shell is required (cobra's printed help and exited 0), and
// there is no powershell script, lockfs being Linux only.
func newCompletionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "completion bash|zsh|fish",
		Short: "Print the shell completion script for bash, zsh or fish",
		Long: `Print the shell completion script for SHELL on stdout. Load it with
  source <(lockfs completion bash)        # bash, this shell only
  lockfs completion zsh >"${fpath[1]}/_lockfs"
  lockfs completion fish >~/.config/fish/completions/lockfs.fish
The Debian package and "make install" install all three.`,
		ValidArgs: shells,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 || !contains(shells, args[0]) {
				return usagef("want one shell: %s", strings.Join(shells, ", "))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			root, out := cmd.Root(), cmd.OutOrStdout()
			switch args[0] {
			case "bash":
				return root.GenBashCompletionV2(out, true)
			case "zsh":
				return root.GenZshCompletion(out)
			default:
				return root.GenFishCompletion(out, true)
			}
		},
	}
}

// completeValues offers a flag's values to shell completion.
func completeValues(cmd *cobra.Command, flag string, values ...string) {
	_ = cmd.RegisterFlagCompletionFunc(flag, cobra.FixedCompletions(values, cobra.ShellCompDirectiveNoFileComp))
}

// kinds are the values --kind accepts.
var kinds = []string{"dir", "newdir", "usage"}

// completeMountFlags offers the values of the flags of "lockfs mount" (and
// of "lockfs doctor", which takes them too).
func completeMountFlags(cmd *cobra.Command) {
	completeValues(cmd, "backend", backends...)
	completeValues(cmd, "log-format", "text", "json")
	completeValues(cmd, "log-level", "error", "warn", "info", "debug", "trace")
	completeValues(cmd, "passthrough", "auto", "off")
	completeValues(cmd, "splice-reads", "on", "off")
	completeValues(cmd, "readdirplus", "on", "off")
	completeValues(cmd, "on-lease-loss", "SIGTERM", "SIGINT", "SIGHUP", "SIGUSR1", "SIGUSR2", "SIGKILL", "none")
}
