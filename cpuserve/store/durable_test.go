package store

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// hotModes are the hot tier setups the durability tests run under: none,
// a small sampled tier kept across version switches, and a complete
// preloaded one (rebuilt when the active tables change).
var hotModes = []struct {
	name string
	opts Options
}{
	{"hot=off", Options{HotBytes: -1}},
	{"hot=small", Options{HotBytes: 64 << 10, Preload: PreloadOff}},
	{"hot=complete", Options{HotBytesAutoMax: 64 << 20}},
}

func fill(dim int, v float32) []float32 {
	row := make([]float32, dim)
	for k := range row {
		row[k] = v + float32(k)/8
	}
	return row
}

func wantRow(t *testing.T, s *Store, model, table string, id int64, want []float32, what string) {
	t.Helper()
	got := lookupRow(t, s, model, table, id, len(want))
	if !slicesEqual(got, want) {
		t.Fatalf("%s: model %s table %s row %d reads %v, want %v", what, model, table, id, got[:2], want[:2])
	}
}

// TestVersionSwitchCarriesUpdates (defect 1): activating another version
// or rolling back keeps serving every update AppliedSeq claims, also for
// tables the versions do not share, with no stale hot-tier row.
func TestVersionSwitchCarriesUpdates(t *testing.T) {
	ctx := context.Background()
	for _, hm := range hotModes {
		t.Run(hm.name, func(t *testing.T) {
			v1 := []*testTable{{name: "a", rows: 50, dim: 4, seed: 1}, {name: "b", rows: 60, dim: 8, seed: 2}}
			v2 := []*testTable{{name: "a", rows: 50, dim: 4, seed: 11}, {name: "b", rows: 60, dim: 8, seed: 2}}
			o := hm.opts
			s, fs := openMem(t, &o)
			if _, err := s.Ingest(ctx, writePlan(t, "m", v1), IngestOptions{}); err != nil {
				t.Fatal(err)
			}
			if _, err := s.Ingest(ctx, writePlan(t, "m", v2), IngestOptions{NoActivate: true}); err != nil {
				t.Fatal(err)
			}
			seq := int64(0)
			up := func(table string, id int64, v float32) []float32 {
				t.Helper()
				seq++
				row := fill(map[string]int{"a": 4, "b": 8}[table], v)
				if _, err := s.UpsertSeq("m", table, []int64{id}, row, seq); err != nil {
					t.Fatal(err)
				}
				return row
			}
			r7 := up("a", 7, 70)  // unshared table, on v1
			rb3 := up("b", 3, 30) // shared table
			orig9 := v2[0].data[9*4 : 10*4]
			if err := s.Activate("m", 2); err != nil {
				t.Fatal(err)
			}
			wantRow(t, s, "m", "a", 7, r7, "after activate 2")
			wantRow(t, s, "m", "b", 3, rb3, "after activate 2")
			wantRow(t, s, "m", "a", 9, orig9, "v2 row never updated") // makes it hot
			r8 := up("a", 8, 80)
			if err := s.Rollback("m"); err != nil {
				t.Fatal(err)
			}
			wantRow(t, s, "m", "a", 7, r7, "after rollback")
			wantRow(t, s, "m", "a", 8, r8, "after rollback")
			wantRow(t, s, "m", "a", 1, v1[0].data[4:8], "v1 row never updated")
			r9 := up("a", 9, 90) // v2's a row 9 is resident in a kept tier
			if err := s.Activate("m", 2); err != nil {
				t.Fatal(err)
			}
			for id, row := range map[int64][]float32{7: r7, 8: r8, 9: r9} {
				wantRow(t, s, "m", "a", id, row, "after activate 2 again")
			}
			if got, _ := s.AppliedSeq("m"); got != seq {
				t.Fatalf("AppliedSeq %d, want %d", got, seq)
			}
			s2 := reopen(t, s, hm.opts, fs)
			for id, row := range map[int64][]float32{7: r7, 8: r8, 9: r9} {
				wantRow(t, s2, "m", "a", id, row, "after reopen")
			}
			wantRow(t, s2, "m", "b", 3, rb3, "after reopen")
			if err := s2.Rollback("m"); err != nil {
				t.Fatal(err)
			}
			for id, row := range map[int64][]float32{7: r7, 8: r8, 9: r9} {
				wantRow(t, s2, "m", "a", id, row, "after reopen and rollback")
			}
		})
	}
}

// TestVersionSwitchShapeChange: updated rows that do not fit the new
// version's table (another dim, fewer rows, no such table) are not
// carried, as a replay of those updates would be refused there; the rest
// are, with the new table's dtype.
func TestVersionSwitchShapeChange(t *testing.T) {
	ctx := context.Background()
	v1 := []*testTable{{name: "a", rows: 50, dim: 4, seed: 1}, {name: "b", rows: 60, dim: 8, seed: 2}, {name: "c", rows: 10, dim: 4, seed: 3}}
	v2 := []*testTable{{name: "a", rows: 20, dim: 4, seed: 11}, {name: "b", rows: 60, dim: 16, seed: 12}}
	s, _ := openMem(t, nil)
	if _, err := s.Ingest(ctx, writePlan(t, "m", v1), IngestOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Ingest(ctx, writePlan(t, "m", v2), IngestOptions{NoActivate: true, DType: Int8}); err != nil {
		t.Fatal(err)
	}
	for i, u := range []struct {
		table string
		id    int64
		dim   int
	}{{"a", 3, 4}, {"a", 40, 4}, {"b", 5, 8}, {"c", 1, 4}} {
		if _, err := s.UpsertSeq("m", u.table, []int64{u.id}, fill(u.dim, 1), int64(i+1)); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Activate("m", 2); err != nil {
		t.Fatal(err)
	}
	got := lookupRow(t, s, "m", "a", 3, 4)
	for k, w := range fill(4, 1) {
		if d := got[k] - w; d > 0.02 || d < -0.02 {
			t.Fatalf("a row 3 reads %v, want about %v", got, fill(4, 1))
		}
	}
	if got := lookupRow(t, s, "m", "b", 5, 16); got[0] == 1 {
		t.Fatalf("a dim-8 update was written into a dim-16 table: %v", got)
	}
}

// TestSharedTableCopyOnWrite (defect 2): two models reading one physical
// table do not see each other's updates; the updated model gets its own
// copy, the other keeps the original, and neither reads a stale hot row.
func TestSharedTableCopyOnWrite(t *testing.T) {
	ctx := context.Background()
	for _, hm := range hotModes {
		t.Run(hm.name, func(t *testing.T) {
			tabs := []*testTable{{name: "a", rows: 3000, dim: 4, seed: 1}, {name: "b", rows: 60, dim: 8, seed: 2}}
			p := writePlan(t, "m", tabs)
			o := hm.opts
			s, fs := openMem(t, &o)
			if _, err := s.Ingest(ctx, p, IngestOptions{}); err != nil {
				t.Fatal(err)
			}
			if rep, err := s.Ingest(ctx, p, IngestOptions{Model: "o"}); err != nil || !rep.Tables[0].Shared {
				t.Fatalf("second model does not share: %+v %v", rep, err)
			}
			orig := func(id int64) []float32 { return tabs[0].data[id*4 : (id+1)*4] }
			wantRow(t, s, "o", "a", 7, orig(7), "before") // resident in the tier
			wantRow(t, s, "m", "a", 7, orig(7), "before")
			// Readers of o run through the copy and must never see m's rows.
			var stop atomic.Bool
			var wg sync.WaitGroup
			wg.Add(1)
			go func() {
				defer wg.Done()
				for !stop.Load() {
					r := TableLookup{Table: "a", IDs: []int64{7, 8, 2999}, Pooling: PoolNone, Out: make([]float32, 12)}
					if err := s.Lookup("o", []TableLookup{r}); err != nil {
						t.Error(err)
						return
					}
					if !slicesEqual(r.Out[:4], orig(7)) || !slicesEqual(r.Out[8:], orig(2999)) {
						t.Errorf("model o reads %v: another model's update", r.Out)
						return
					}
				}
			}()
			r7 := fill(4, 70)
			if _, err := s.UpsertSeq("m", "a", []int64{7}, r7, 1); err != nil {
				t.Fatal(err)
			}
			stop.Store(true)
			wg.Wait()
			wantRow(t, s, "m", "a", 7, r7, "updated model")
			wantRow(t, s, "o", "a", 7, orig(7), "other model")
			wantRow(t, s, "m", "a", 2999, orig(2999), "updated model, copied row")
			physOf := func(model, table string) uint32 {
				infos, err := s.Tables(model)
				if err != nil {
					t.Fatal(err)
				}
				for _, ti := range infos {
					if ti.Name == table {
						return ti.Phys
					}
				}
				t.Fatalf("no table %s", table)
				return 0
			}
			if physOf("m", "a") == physOf("o", "a") {
				t.Fatalf("models still share table a after an update")
			}
			if physOf("m", "b") != physOf("o", "b") {
				t.Fatalf("table b copied without an update")
			}
			// o's update now writes its own (original) table in place.
			before := physOf("o", "a")
			r8 := fill(4, 80)
			if err := s.Upsert("o", "a", []int64{8}, r8); err != nil {
				t.Fatal(err)
			}
			if physOf("o", "a") != before {
				t.Fatalf("the sole owner's update copied the table")
			}
			wantRow(t, s, "o", "a", 8, r8, "other model's own update")
			wantRow(t, s, "m", "a", 8, orig(8), "updated model after the other's update")
			// A third ingest of the content shares neither mutated copy.
			rep, err := s.Ingest(ctx, p, IngestOptions{Model: "n"})
			if err != nil {
				t.Fatal(err)
			}
			if rep.Tables[0].Shared {
				t.Fatalf("a mutated table was shared with a new model: %+v", rep.Tables[0])
			}
			wantRow(t, s, "n", "a", 7, orig(7), "new model")
			wantRow(t, s, "n", "a", 8, orig(8), "new model")
			s2 := reopen(t, s, hm.opts, fs)
			wantRow(t, s2, "m", "a", 7, r7, "after reopen")
			wantRow(t, s2, "o", "a", 7, orig(7), "after reopen")
			wantRow(t, s2, "o", "a", 8, r8, "after reopen")
			wantRow(t, s2, "m", "a", 8, orig(8), "after reopen")
		})
	}
}

// TestSharedTableWithinModel: two tables of one model with the same
// content (here v2's a and b, both v1's a) share a physical table until
// one of them is updated.
func TestSharedTableWithinModel(t *testing.T) {
	ctx := context.Background()
	v1 := []*testTable{{name: "a", rows: 40, dim: 4, seed: 1}}
	v2 := []*testTable{{name: "a", rows: 40, dim: 4, seed: 1}, {name: "b", rows: 40, dim: 4, seed: 1}}
	s, _ := openMem(t, nil)
	if _, err := s.Ingest(ctx, writePlan(t, "m", v1), IngestOptions{}); err != nil {
		t.Fatal(err)
	}
	var lastDone, lastTotal int64 = -1, -1
	rep, err := s.Ingest(ctx, writePlan(t, "m", v2), IngestOptions{Progress: func(done, total int64) { lastDone, lastTotal = done, total }})
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Tables[0].Shared || !rep.Tables[1].Shared {
		t.Fatalf("tables not shared: %+v", rep.Tables)
	}
	// Nothing written, nothing counted: a shared table's bytes read as
	// an ingest at tens of GiB/s.
	if lastDone > 0 || lastTotal > 0 {
		t.Fatalf("progress %d of %d bytes for an ingest that wrote none", lastDone, lastTotal)
	}
	r := fill(4, 5)
	if err := s.Upsert("m", "a", []int64{3}, r); err != nil {
		t.Fatal(err)
	}
	wantRow(t, s, "m", "a", 3, r, "updated table")
	wantRow(t, s, "m", "b", 3, v2[1].data[12:16], "the same content under another name")
	if err := s.Rollback("m"); err != nil {
		t.Fatal(err)
	}
	wantRow(t, s, "m", "a", 3, r, "updated table after rollback")
}

// BenchmarkCopyOnWrite measures the first update of a shared 1M x 16
// float32 table (64 MiB): the copy, its commit and the update, on disk.
// Each iteration shares the original content with a new model and
// updates it once. Run:
//
//	go test -run '^$' -bench CopyOnWrite -benchtime 5x ./cpuserve/store/
func BenchmarkCopyOnWrite(b *testing.B) {
	for _, hm := range []struct {
		name string
		opts Options
	}{{"hot=off", Options{HotBytes: -1}}, {"hot=default", Options{}}} {
		b.Run(hm.name, func(b *testing.B) {
			tabs := []*testTable{{name: "a", rows: 1 << 20, dim: 16, seed: 1}}
			p := writePlan(b, "m", tabs)
			o := hm.opts
			o.FS = vfs.Default
			s, err := Open(b.TempDir(), &o)
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			if _, err := s.Ingest(context.Background(), p, IngestOptions{Model: "base"}); err != nil {
				b.Fatal(err)
			}
			row := fill(16, 1)
			b.ResetTimer()
			for i := range b.N {
				b.StopTimer()
				model := fmt.Sprintf("m%d", i)
				if _, err := s.Ingest(context.Background(), p, IngestOptions{Model: model}); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				if err := s.Upsert(model, "a", []int64{5}, row); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(64<<20)*float64(b.N)/b.Elapsed().Seconds()/(1<<20), "MiB/s")
		})
	}
}

// reopen closes s and opens its folder "db" on fs again with opts; the
// reopened store is closed when the test ends.
func reopen(t *testing.T, s *Store, opts Options, fs vfs.FS) *Store {
	t.Helper()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	opts.FS = fs
	s2, err := Open("db", &opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s2.Close() })
	return s2
}
