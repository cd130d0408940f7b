package lockmgr

import "testing"

// ControlKind inverts ControlName for every kind; names that are not
// control files (the control) take no lock.
func TestControlKind(t *testing.T) {
	for _, k := range []Kind{KindDir, KindNewDir, KindUsage} {
		if got, ok := ControlKind(ControlName(k)); !ok || got != k {
			t.Errorf("ControlKind(%q) = %v, %v; want %v, true", ControlName(k), got, ok, k)
		}
	}
	for _, name := range []string{"", "lock", ".lock_", ".LOCK", ".lock_dir", "a/.lock"} {
		if k, ok := ControlKind(name); ok {
			t.Errorf("ControlKind(%q) = %v, true; want false", name, k)
		}
	}
}
