package gcsemu

import (
	"context"
	"fmt"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	"google.golang.org/api/storage/v1"
)

// lockfs patch 1: a listing walks from its prefix (or its page cursor), not
// from the bucket's first object, so its cost does not grow with the
// objects stored before the prefix. The control walks from "" and visits
// them all.
func TestWalkStartsAtPrefix(t *testing.T) {
	ms := NewMemStore()
	const before, inside, after = 10000, 5, 100
	for i := 0; i < before; i++ {
		if err := ms.Add("b", fmt.Sprintf("a/%05d", i), nil, &storage.Object{}); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < inside; i++ {
		ms.Add("b", fmt.Sprintf("p/%d", i), nil, &storage.Object{})
	}
	for i := 0; i < after; i++ {
		ms.Add("b", fmt.Sprintf("z/%d", i), nil, &storage.Object{})
	}
	visits := func(from string) (n int) {
		ms.Walk(context.Background(), "b", from, func(_ context.Context, name string, _ os.FileInfo) error {
			n++
			if name > "p0" {
				return os.ErrClosed // stop, as the listing does past its prefix
			}
			return nil
		})
		return n
	}
	if n := visits("p/"); n != inside+1 {
		t.Errorf("walk from p/ visited %d objects, want %d", n, inside+1)
	}
	if n := visits(""); n != before+inside+1 {
		t.Errorf("control: walk from the start visited %d, want %d", n, before+inside+1)
	}

	// Through the HTTP handler: the listing of p/ returns its 5 objects
	// and nothing else, and a page cursor within it resumes after it.
	g := NewGcsEmu(Options{Store: ms})
	list := func(query string) string {
		rec := httptest.NewRecorder()
		g.Handler(rec, httptest.NewRequest("GET", "/storage/v1/b/b/o?"+query, nil))
		return rec.Body.String()
	}
	body := list("prefix=p/")
	if got := strings.Count(body, `"name"`); got != inside || strings.Contains(body, `"a/`) || strings.Contains(body, `"z/`) {
		t.Errorf("listing p/: %d names, want %d of p/ only: %s", got, inside, body)
	}
	body = list("prefix=p/&maxResults=2")
	if got := strings.Count(body, `"name"`); got != 2 || !strings.Contains(body, "nextPageToken") {
		t.Errorf("first page of 2: %s", body)
	}
}
