package lockmgr

import "strconv"

// QuoteName returns s as status output shows a name that came from users (a
// lock's path, a note, a command): unchanged if it holds nothing that
// strconv.Quote would escape, Go-quoted otherwise. A name with a newline,
// another control character, a quote, a backslash or invalid UTF-8 thus
// cannot forge a line or a field, and a plain value never starts with '"'.
func QuoteName(s string) string {
	q := strconv.Quote(s)
	if len(q) == len(s)+2 {
		return s
	}
	return q
}
