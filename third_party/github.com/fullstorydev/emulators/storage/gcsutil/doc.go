// Package gcsutil contains some generic utilities to support gcsemu.
// TODO(dragonsinth): consider open sourcing these separately, or finding open source replacements.
package gcsutil
