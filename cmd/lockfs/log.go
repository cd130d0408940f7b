package main

import (
	"io"
	"strings"

	"github.com/sirupsen/logrus"
)

// newLogger returns the daemon's logger, writing to w at level in format
// ("text" or "json").
func newLogger(w io.Writer, level, format string) (*logrus.Logger, error) {
	l := logrus.New()
	l.SetOutput(w)
	lvl, err := logrus.ParseLevel(level)
	if err != nil {
		return nil, usagef("--log-level %q: want one of panic, fatal, error, warn, info, debug, trace", level)
	}
	l.SetLevel(lvl)
	switch strings.ToLower(format) {
	case "text":
		l.SetFormatter(&logrus.TextFormatter{FullTimestamp: true})
	case "json":
		l.SetFormatter(&logrus.JSONFormatter{})
	default:
		return nil, usagef("--log-format %q: want text or json", format)
	}
	return l, nil
}
