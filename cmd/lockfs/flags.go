package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
)

// errHelp reports that -h was given and the usage was printed.
var errHelp = errors.New("help requested")

// command is a subcommand's flag set and usage text.
type command struct {
	name  string
	usage string // first lines of the help: synopsis and description
	flags *flag.FlagSet
}

func newCommand(name, usage string) *command {
	fs := flag.NewFlagSet("lockfs "+name, flag.ContinueOnError)
	fs.SetOutput(io.Discard) // errors are reported by run, help by printHelp
	return &command{name: name, usage: usage, flags: fs}
}

// printHelp writes the usage text and the flag defaults.
func (c *command) printHelp(w io.Writer) {
	fmt.Fprint(w, c.usage)
	has := false
	c.flags.VisitAll(func(*flag.Flag) { has = true })
	if !has {
		return
	}
	fmt.Fprintln(w, "\nFlags:")
	c.flags.SetOutput(w)
	c.flags.PrintDefaults()
	c.flags.SetOutput(io.Discard)
}

// parse parses args, allowing flags before, between and after the positional
// arguments ("lockfs mount SRC MNT --allow-other" works); "--" ends the flags.
// It returns the positional arguments. On -h it prints the help to w and
// returns errHelp.
func (c *command) parse(args []string, w io.Writer) ([]string, error) {
	var pos []string
	for {
		err := c.flags.Parse(args)
		if errors.Is(err, flag.ErrHelp) {
			c.printHelp(w)
			return nil, errHelp
		}
		if err != nil {
			return nil, usagef("%v", err)
		}
		rest := c.flags.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		// Parse stops at the first positional argument, or after "--".
		if len(args) > len(rest) && args[len(args)-len(rest)-1] == "--" {
			return append(pos, rest...), nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}
