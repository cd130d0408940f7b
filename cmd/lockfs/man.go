package main

import (
	"os"

	"github.com/spf13/cobra"
	"github.com/spf13/cobra/doc"
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
			root := cmd.Root()
			root.DisableAutoGenTag = true
			return doc.GenManTree(root, &doc.GenManHeader{Title: "LOCKFS", Section: "1", Source: "lockfs " + Version()}, args[0])
		},
	}
}
