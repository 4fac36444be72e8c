package store

import (
	"context"
	"maps"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// TestDivergedMarkDurable: the mark a router sets when it finds the
// store's copy of a model diverged (issue 14) is written synced before
// MarkDiverged returns, so it survives a crash (every unsynced write
// lost) and a reopen, and the worker announces it to every router from
// then on. The first mark is kept; a mark past the update the store
// holds (an answer that came after the number was reset) is not taken.
func TestDivergedMarkDurable(t *testing.T) {
	tabs := []*testTable{{name: "a", rows: 10, dim: 2, seed: 1}}
	mem := vfs.NewCrashableMem()
	s, err := Open("db", &Options{FS: mem})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Ingest(context.Background(), writePlan(t, "m", tabs), IngestOptions{}); err != nil {
		t.Fatal(err)
	}
	for seq := int64(1); seq <= 3; seq++ {
		if _, err := s.UpsertSeq("m", "a", []int64{1}, []float32{float32(seq), 0}, seq); err != nil {
			t.Fatal(err)
		}
	}
	want := func(s *Store, marks map[string]int64, what string) {
		t.Helper()
		got, err := s.Diverged()
		if err != nil || !maps.Equal(got, marks) {
			t.Fatalf("%s: Diverged %v, %v; want %v", what, got, err, marks)
		}
	}
	want(s, nil, "a store never marked")
	steps := []struct {
		model  string
		seq    int64
		marked bool
	}{
		{"m", 5, false}, // past what it holds (3)
		{"x", 1, false}, // a model it does not hold holds no update
		{"m", 2, true},
		{"m", 3, false}, // marked already: the first mark stays
	}
	for _, st := range steps {
		if marked, err := s.MarkDiverged(st.model, st.seq); err != nil || marked != st.marked {
			t.Fatalf("MarkDiverged(%q, %d): %v, %v; want %v", st.model, st.seq, marked, err, st.marked)
		}
	}
	want(s, map[string]int64{"m": 2}, "marked")

	crashed, err := Open("db", &Options{FS: mem.CrashClone(vfs.CrashCloneCfg{})})
	if err != nil {
		t.Fatal(err)
	}
	want(crashed, map[string]int64{"m": 2}, "after a crash")
	crashed.Close()
	s = reopen(t, s, Options{}, mem)
	want(s, map[string]int64{"m": 2}, "reopened")
	if marked, err := s.MarkDiverged("m", 1); err != nil || marked {
		t.Fatalf("reopened, MarkDiverged(m, 1): %v, %v; want the mark kept as it was", marked, err)
	}
	want(s, map[string]int64{"m": 2}, "reopened, marked again")
	var b strings.Builder
	WriteDiverged(&b, "m", 2) // prism store versions' line
	if got := b.String(); !strings.HasPrefix(got, "diverged at update 2: ") || !strings.Contains(got, "copy of an up-to-date worker's store") {
		t.Fatalf("prism store versions says %q", got)
	}
}
