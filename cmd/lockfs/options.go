package main

import (
	"strings"

	"github.com/spf13/pflag"
)

// Mount options (-o): "lockfs mount -o" and the mount(8) helper for
// /etc/fstab take the same options, and both take them from one table: the
// flags of "lockfs mount" itself. An option is a flag's name, spelled with
// - or _; a flag that takes a value takes it as name=value, a boolean flag
// takes none. Options that concern mount(8), systemd or the kernel's
// generic flags are accepted and ignored; anything else is refused, so that
// a typo in /etc/fstab fails loudly instead of being ignored.

// genericOptions are mount(8) options that concern mount(8), systemd or
// the kernel's generic flags, not lockfs: accepted and ignored.
var genericOptions = map[string]bool{
	"rw": true, "defaults": true, "auto": true, "noauto": true, "user": true, "nouser": true, "users": true,
	"_netdev": true, "nofail": true, "dev": true, "nodev": true, "suid": true, "nosuid": true, "exec": true,
	"noexec": true, "atime": true, "noatime": true, "relatime": true, "norelatime": true, "async": true,
	"owner": true, "group": true, "comment": true,
}

// notOptions are flags of "lockfs mount" that are no mount options.
var notOptions = map[string]bool{"options": true, "help": true}

// logFileOption is the one option that is not a flag: where the mount
// helper's daemon logs.
const logFileOption = "log-file"

// mountOption is one lockfs option of an -o string.
type mountOption struct {
	name  string // the flag's name
	value string // "" for a boolean
	bool  bool
}

// flag renders the option as a "lockfs mount" argument.
func (o mountOption) flag() string {
	if o.bool {
		return "--" + o.name
	}
	return "--" + o.name + "=" + o.value
}

// parseMountOptions checks the comma-separated options of opts against
// flags (the flag set of "lockfs mount") and sets each on it, which also
// checks its value. It returns the options in order, and the value of
// log-file. Options named by skip are checked but not set.
func parseMountOptions(opts string, flags *pflag.FlagSet, skip func(name string) bool) (set []mountOption, logFile string, err error) {
	for _, o := range strings.Split(opts, ",") {
		if o == "" {
			continue
		}
		key, val, hasVal := strings.Cut(o, "=")
		if genericOptions[key] || strings.HasPrefix(key, "x-") {
			continue
		}
		if key == "ro" {
			return nil, "", usagef("option ro: lockfs mounts are read-write (locks need it)")
		}
		name := strings.ReplaceAll(key, "_", "-")
		if name == logFileOption {
			if !hasVal || val == "" {
				return nil, "", usagef("option %s needs a value", key)
			}
			logFile = val
			continue
		}
		f := flags.Lookup(name)
		if f == nil || notOptions[name] {
			return nil, "", usagef("unknown mount option %q", key)
		}
		isBool := f.NoOptDefVal != ""
		switch {
		case !isBool && !hasVal:
			return nil, "", usagef("option %s needs a value (%s=...)", key, key)
		case isBool && hasVal:
			return nil, "", usagef("option %s takes no value", key)
		}
		opt := mountOption{name: name, value: val, bool: isBool}
		if isBool {
			val = "true"
		}
		if skip == nil || !skip(name) {
			if err := flags.Set(name, val); err != nil {
				return nil, "", usagef("option %s: %v", key, err)
			}
		}
		set = append(set, opt)
	}
	return set, logFile, nil
}
