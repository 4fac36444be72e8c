package store

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/prism-serve/prism/internal/crashfs"
)

// TestCrashDuringSwitchAndCopy crashes the store (a crash clone of a
// crashable in-memory FS: exactly the synced bytes, or those plus a random
// part of the unsynced ones) in the middle of every step of a run of
// sequenced updates, shared-table copies and version switches, and after
// each acknowledged one. Each clone, reopened, must serve one state that
// a prefix of the run gives: AppliedSeq = k and the active version v serve
// v's rows with updates 1..k on top, never a mix; at least every
// acknowledged update; no half-made copy left (nor its rows); and the
// other model sharing the tables never sees this model's updates. It runs
// with switches carried in one batch, and in many small ones (crashing
// between them too).
func TestCrashDuringSwitchAndCopy(t *testing.T) {
	t.Run("carry=one-batch", func(t *testing.T) { crashSwitchAndCopy(t, 0) })
	t.Run("carry=bounded", func(t *testing.T) { crashSwitchAndCopy(t, 1) })
}

// crashSwitchAndCopy runs TestCrashDuringSwitchAndCopy with carry batches
// of carryBytes (0: the default).
func crashSwitchAndCopy(t *testing.T, carryBytes int) {
	ctx := context.Background()
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 3))
	// c is m's alone: its first carry writes a table no update made
	// mutated yet (the others were copied or updated before).
	v1 := []*testTable{{name: "a", rows: 300, dim: 4, seed: 1}, {name: "b", rows: 200, dim: 8, seed: 2}, {name: "c", rows: 100, dim: 4, seed: 3}}
	v2 := []*testTable{{name: "a", rows: 300, dim: 4, seed: 11}, {name: "b", rows: 200, dim: 8, seed: 2}, {name: "c", rows: 100, dim: 4, seed: 13}}
	base := map[int][]*testTable{1: v1, 2: v2}
	p1, p2 := writePlan(t, "m", v1), writePlan(t, "m", v2)
	po := writePlan(t, "o", v2[:2])

	// acked: updates acknowledged when a clone was taken; active: the
	// active version then (or the one being left).
	type state struct {
		acked  int64
		active int
	}
	cut := crashfs.New[state](true, seed)
	s, err := Open("db", &Options{FS: cut.FS(), HotBytesAutoMax: 16 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if carryBytes > 0 {
		s.carryBatchBytes = carryBytes
	}
	if _, err := s.Ingest(ctx, p1, IngestOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Ingest(ctx, p2, IngestOptions{NoActivate: true}); err != nil {
		t.Fatal(err)
	}
	// Model o shares v2's tables: m's first update of b copies b, and
	// the first switch to v2 copies v2's a before carrying into it.
	if _, err := s.Ingest(ctx, po, IngestOptions{Model: "o"}); err != nil {
		t.Fatal(err)
	}

	type update struct {
		table string
		id    int64
		row   []float32
	}
	var updates []update // updates[k-1] is seq k
	acked, active := int64(0), 1
	take := func(point string) {
		if point == "carry-batch" || point == "activate-batch" {
			// The live store, mid-switch (catMu held): the rows of the
			// batches before are in, and the tables they went to must be
			// marked mutated already.
			checkUnmutatedTablesLocked(t, s, base, "live at "+point)
		}
		cut.Set(func(st *state) { st.acked, st.active = acked, active })
		cut.Take(point)
	}
	s.testHook = take

	for step := range 40 {
		switch {
		case step%10 == 9:
			n := 3 - active
			if err := s.Activate("m", n); err != nil {
				t.Fatal(err)
			}
			active = n
			take(fmt.Sprintf("after activate %d", n))
		default:
			u := update{table: "a", id: int64(r.IntN(300))}
			switch r.IntN(4) {
			case 0:
				u.table, u.id = "b", int64(r.IntN(200))
			case 1:
				u.table, u.id = "c", int64(r.IntN(100))
			}
			u.row = fill(map[string]int{"a": 4, "b": 8, "c": 4}[u.table], float32(len(updates)+1))
			if _, err := s.UpsertSeq("m", u.table, []int64{u.id}, u.row, int64(len(updates)+1)); err != nil {
				t.Fatal(err)
			}
			updates = append(updates, u)
			acked++
			take(fmt.Sprintf("after update %d", acked))
		}
	}
	s.testHook = nil

	points := map[string]bool{}
	clones := cut.Clones()
	for _, c := range clones {
		points[c.Point] = true
		func() {
			cs, err := Open("db", &Options{FS: c.FS, HotBytesAutoMax: 16 << 20})
			if err != nil {
				t.Fatalf("%s: reopen: %v", c.Point, err)
			}
			defer cs.Close()
			k, err := cs.AppliedSeq("m")
			if err != nil {
				t.Fatal(err)
			}
			if k < c.State.acked || k > c.State.acked+1 {
				t.Fatalf("%s: AppliedSeq %d, %d updates acknowledged", c.Point, k, c.State.acked)
			}
			vs, err := cs.Versions("m")
			if err != nil {
				t.Fatal(err)
			}
			v := 0
			for _, vi := range vs {
				if vi.Active {
					v = vi.N
				}
			}
			want := map[string][]float32{}
			for _, tt := range base[v] {
				want[tt.name] = append([]float32(nil), tt.data...)
			}
			for _, u := range updates[:k] {
				copy(want[u.table][u.id*int64(len(u.row)):], u.row)
			}
			for _, tt := range base[v] {
				checkAllRows(t, cs, "m", tt.name, tt.dim, want[tt.name], fmt.Sprintf("%s: version %d, AppliedSeq %d", c.Point, v, k))
			}
			checkAllRows(t, cs, "o", "a", 4, v2[0].data, c.Point+": model o")
			checkAllRows(t, cs, "o", "b", 8, v2[1].data, c.Point+": model o")
			checkNoStrayTables(t, cs, c.Point)
			checkUnmutatedTables(t, cs, base, c.Point)
		}()
	}
	want := []string{"cow-registered", "cow-copied", "activate-batch"}
	if carryBytes > 0 {
		want = append(want, "carry-batch")
	}
	for _, p := range want {
		if !points[p] {
			t.Errorf("no crash at %s", p)
		}
	}
	t.Logf("%d crash clones checked, %d updates, %d table copies", len(clones), len(updates), s.Metrics().TableCopies)
}

func checkAllRows(t *testing.T, s *Store, model, table string, dim int, want []float32, what string) {
	t.Helper()
	n := len(want) / dim
	ids := make([]int64, n)
	for i := range ids {
		ids[i] = int64(i)
	}
	r := TableLookup{Table: table, IDs: ids, Pooling: PoolNone, Out: make([]float32, len(want))}
	if err := s.Lookup(model, []TableLookup{r}); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	for i := range n {
		if !slicesEqual(r.Out[i*dim:(i+1)*dim], want[i*dim:(i+1)*dim]) {
			t.Fatalf("%s: table %s row %d reads %v, want %v", what, table, i, r.Out[i*dim:i*dim+2], want[i*dim:i*dim+2])
		}
	}
}

// checkNoStrayTables: every physical table is ready, and every row key
// belongs to a table of the catalog (no copy or its rows left behind).
func checkNoStrayTables(t *testing.T, s *Store, what string) {
	t.Helper()
	s.catMu.Lock()
	defer s.catMu.Unlock()
	for id, pt := range s.cat.Tables {
		if pt.State != stateReady {
			t.Fatalf("%s: table %d left in state %s", what, id, pt.State)
		}
	}
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: []byte{0, 0, 0, 1}})
	if err != nil {
		t.Fatal(err)
	}
	defer it.Close()
	for ok := it.First(); ok; ok = it.Next() {
		id := binary.BigEndian.Uint32(it.Key())
		if s.cat.Tables[id] == nil {
			t.Fatalf("%s: rows of table %d, which the catalog does not have", what, id)
		}
	}
}

// checkUnmutatedTables: every table not marked mutated holds exactly its
// content (base's tables, by version and name of model m), as a later
// ingest of that content would share it.
func checkUnmutatedTables(t *testing.T, s *Store, base map[int][]*testTable, what string) {
	t.Helper()
	s.catMu.Lock()
	defer s.catMu.Unlock()
	checkUnmutatedTablesLocked(t, s, base, what)
}

// checkUnmutatedTablesLocked is checkUnmutatedTables with catMu held.
func checkUnmutatedTablesLocked(t *testing.T, s *Store, base map[int][]*testTable, what string) {
	t.Helper()
	content := map[string]*testTable{}
	for v, tabs := range base {
		for _, tt := range tabs {
			if vt := s.cat.Models["m"].Versions[v].Tables[tt.name]; vt != nil {
				if pt := s.cat.Tables[vt.Phys]; pt != nil {
					content[pt.SHA256] = tt
				}
			}
		}
	}
	for id, pt := range s.cat.Tables {
		tt := content[pt.SHA256]
		if pt.Mutated || tt == nil || pt.DType != Float32 {
			continue
		}
		lo, hi := tableBounds(id)
		it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
		if err != nil {
			t.Fatal(err)
		}
		row := make([]float32, tt.dim)
		for ok := it.First(); ok; ok = it.Next() {
			r := keyRow(it.Key())
			Float32.decode(row, it.Value())
			if !slicesEqual(row, tt.data[r*int64(tt.dim):(r+1)*int64(tt.dim)]) {
				it.Close()
				t.Fatalf("%s: table %d (%s) is not marked mutated, but its row %d reads %v, not its content", what, id, tt.name, r, row[:2])
			}
		}
		if err := it.Close(); err != nil {
			t.Fatal(err)
		}
	}
}
