package gcsbackend

import (
	"bytes"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/lockfs/lockfs/lockmgr"
)

// TestKeptVersionRebuilds: a version holding the record's own claim alone
// is kept as four fields and rebuilt byte for byte (the payload a write of
// it would send, write id aside); every other version is kept whole.
func TestKeptVersionRebuilds(t *testing.T) {
	b := &Backend{cfg: Config{HostID: "host1"}}
	id := lockmgr.LockID{Path: "a/b", Kind: lockmgr.KindDir}
	since := time.UnixMilli(1796000000123).UTC()
	own := func() *record {
		return &record{Version: layoutVersion, Lock: id.String(), Epoch: 7, Write: "w1",
			Claims: []claimRec{{Session: "s1", Host: "host1", Mode: "exclusive", Epoch: 7, Since: since}}}
	}
	// decoded is how a read gives the same content back.
	decoded, err := decodeRecord("x", own().encode())
	if err != nil {
		t.Fatal(err)
	}
	for _, rec := range []*record{own(), decoded} {
		r := &ownRec{id: id, sess: &session{id: "s1"}}
		b.setSnapLocked(r, snapshot{gen: 42, rec: rec})
		if r.rec != nil {
			t.Fatal("the claim alone was kept whole")
		}
		got := b.snapOfLocked(r)
		if got.gen != 42 || got.rec == nil {
			t.Fatalf("rebuilt %+v", got)
		}
		got.rec.Write = rec.Write
		if !bytes.Equal(got.rec.encode(), rec.encode()) {
			t.Fatalf("rebuilt\n%s\nwant\n%s", got.rec.encode(), rec.encode())
		}
	}

	whole := map[string]func(*record){
		"another host's claim too": func(r *record) {
			r.Claims = append(r.Claims, claimRec{Session: "s2", Host: "host2", Mode: "shared", Epoch: 6, Since: since})
		},
		"another session":       func(r *record) { r.Claims[0].Session = "s0" },
		"another host":          func(r *record) { r.Claims[0].Host = "host0" },
		"a turn":                func(r *record) { r.Next = &turn{Session: "s2"} },
		"an unknown mode":       func(r *record) { r.Claims[0].Mode = "both" },
		"an older claim epoch":  func(r *record) { r.Claims[0].Epoch = 6 },
		"another lock's name":   func(r *record) { r.Lock = "a/.lock" },
		"another layout":        func(r *record) { r.Version = layoutVersion + 1 },
		"no claim":              func(r *record) { r.Claims = nil },
		"a time past UnixNano":  func(r *record) { r.Claims[0].Since = time.Date(2300, 1, 1, 0, 0, 0, 0, time.UTC) },
		"a time in a time zone": func(r *record) { r.Claims[0].Since = since.In(time.FixedZone("X", 3600)) },
	}
	for name, change := range whole {
		rec := own()
		change(rec)
		r := &ownRec{id: id, sess: &session{id: "s1"}}
		b.setSnapLocked(r, snapshot{gen: 42, rec: rec})
		if got := b.snapOfLocked(r); got.rec != rec || got.gen != 42 {
			t.Errorf("%s: kept %+v, want the version itself", name, got)
		}
	}

	r := &ownRec{id: id, sess: &session{id: "s1"}}
	b.setSnapLocked(r, snapshot{})
	if got := b.snapOfLocked(r); got.gen != 0 || got.rec != nil {
		t.Errorf("no object: kept %+v", got)
	}
}

// TestKeptVersionKnowsEveryField: the rebuild (ownOnly) and its check
// (same) name every field of a record and a claim; a field added to
// either must be added to both, or a rebuilt version would drop it.
func TestKeptVersionKnowsEveryField(t *testing.T) {
	for typ, want := range map[reflect.Type][]string{
		reflect.TypeFor[record]():   {"Version", "Lock", "Epoch", "Claims", "Write", "Next"},
		reflect.TypeFor[claimRec](): {"Session", "Host", "Mode", "Epoch", "Since"},
	} {
		var got []string
		for f := range typ.Fields() {
			got = append(got, f.Name)
		}
		if !slices.Equal(got, want) {
			t.Errorf("%v has fields %v; ownOnly and same know %v", typ, got, want)
		}
	}
}
