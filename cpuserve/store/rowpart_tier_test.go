package store

import (
	"context"
	"errors"
	"runtime"
	"testing"

	"github.com/prism-serve/prism/cpuserve/store/hot"
	"github.com/prism-serve/prism/plan"
	"github.com/prism-serve/prism/sharding"
)

// shardPlan writes a plan of tables sharded over shards and returns its
// folder; it fails unless table rowWise is placed row-wise.
func shardPlan(t *testing.T, tables []*testTable, shards int, shardBytes int64, rowWise string) (string, *plan.Plan) {
	t.Helper()
	dir := writePlan(t, "m", tables)
	p, err := plan.Read(dir)
	if err != nil {
		t.Fatal(err)
	}
	r, err := sharding.Plan(sharding.Tables(p, nil), sharding.Options{Shards: shards, ShardBytes: shardBytes})
	if err != nil {
		t.Fatal(err)
	}
	if p.Sharding, err = sharding.Section(p, r, "uniform"); err != nil {
		t.Fatal(err)
	}
	if pl := p.Sharding.Placement(rowWise); pl.Placement != plan.RowWise {
		t.Fatalf("%s placed %+v, want row-wise", rowWise, pl)
	}
	if err := plan.Write(dir, p); err != nil {
		t.Fatal(err)
	}
	return dir, p
}

// A store holding one shard of a row-wise table builds a hot tier sized
// for the rows it holds: its memory is what hot.FullBytes says for them,
// not a slot map over every row of the whole table.
func TestShardTierMemory(t *testing.T) {
	const rows, dim = 1 << 20, 4
	dir, p := shardPlan(t, []*testTable{{name: "big", rows: rows, dim: dim, seed: 1}}, 8, 3<<20, "big")
	mod, _, _ := p.Sharding.Placement("big").Part(0)
	k := 0
	s, _ := openMem(t, &Options{Preload: PreloadOff})
	if _, err := s.Ingest(context.Background(), dir, IngestOptions{Shard: &k}); err != nil {
		t.Fatal(err)
	}
	held := plan.PartRows(rows, mod, 0)
	want := hot.FullBytes(map[int]int64{dim: held * dim * 4})

	var m0, m1 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&m0)
	s.catMu.Lock()
	s.opts.HotBytes = 512 << 20 // another budget: a new tier
	s.publish(s.cat)
	s.catMu.Unlock()
	runtime.ReadMemStats(&m1)
	if !s.view.Load().tier.Complete() {
		t.Fatal("tier not complete")
	}
	got := int64(m1.TotalAlloc - m0.TotalAlloc)
	t.Logf("mod %d: held %d rows; tier allocated %d bytes, FullBytes %d", mod, held, got, want)
	if got > want*5/4 {
		t.Fatalf("the hot tier of a shard holding %d of %d rows allocated %d bytes, its budget (FullBytes) is %d", held, rows, got, want)
	}
}

// A shard's partial lookups read the rows it holds, right, from a
// complete tier and from a direct tier smaller than its rows.
func TestShardTierRows(t *testing.T) {
	const rows, dim = 4096, 8
	tt := &testTable{name: "big", rows: rows, dim: dim, seed: 2}
	dir, p := shardPlan(t, []*testTable{tt}, 4, 40<<10, "big")
	pl := p.Sharding.Placement("big")
	for _, hotBytes := range []int64{0, 48 << 10} {
		for k := range 4 {
			s, _ := openMem(t, &Options{HotBytes: hotBytes, Preload: PreloadOn})
			if _, err := s.Ingest(context.Background(), dir, IngestOptions{Shard: &k}); err != nil {
				t.Fatal(err)
			}
			for pass := range 2 {
				ids := make([]int64, rows)
				for i := range ids {
					ids[i] = int64((i * 7919) % rows)
				}
				out := make([]float32, rows*dim)
				if err := s.Lookup("m", []TableLookup{{Table: "big", IDs: ids, Bag: 1, Pooling: PoolSum, Out: out, Partial: true}}); err != nil {
					t.Fatal(err)
				}
				for i, id := range ids {
					got := out[i*dim : (i+1)*dim]
					want := make([]float32, dim)
					if pl.ShardOf(id) == k {
						want = tt.data[id*dim : (id+1)*dim]
					}
					for x := range dim {
						if got[x] != want[x] {
							t.Fatalf("hot %d shard %d pass %d: row %d = %v, want %v", hotBytes, k, pass, id, got, want)
						}
					}
				}
			}
			if m := s.Metrics(); m.HotHits == 0 {
				t.Fatalf("hot %d shard %d: no hits (%+v)", hotBytes, k, m)
			}
		}
	}
}

// A version switch carries an update only into a table that holds its
// row: a shard re-ingested for another sharding does not get the rows
// its new part leaves to other shards.
func TestCarryKeepsPart(t *testing.T) {
	const rows, dim = 4096, 8
	mk := func(shards int) string {
		dir, p := shardPlan(t, []*testTable{{name: "big", rows: rows, dim: dim, seed: 3}}, shards, 40<<10*4/int64(shards), "big")
		if n := len(p.Sharding.Placement("big").Shards); n != shards {
			t.Fatalf("big on %d shards, want %d", n, shards)
		}
		return dir
	}
	dir2, dir4 := mk(2), mk(4)
	s, _ := openMem(t, nil)
	k := 0
	if _, err := s.Ingest(context.Background(), dir2, IngestOptions{Shard: &k}); err != nil {
		t.Fatal(err)
	}
	tabs, _ := s.Tables("m")
	part := tabs[0].Part
	var ids []int64
	for id := int64(0); id < 16; id++ {
		if part.holds(id) {
			ids = append(ids, id)
		}
	}
	if _, err := s.UpsertSeq("m", "big", ids, make([]float32, len(ids)*dim), 1); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Ingest(context.Background(), dir4, IngestOptions{Shard: &k}); err != nil {
		t.Fatal(err)
	}
	tabs, _ = s.Tables("m")
	part = tabs[0].Part
	stored := storedRows(t, s, "m", "big")
	for id := range stored {
		if !part.holds(id) {
			t.Fatalf("the new version's table (rows %s) holds row %d", part, id)
		}
	}
	if int64(len(stored)) != part.count(rows) {
		t.Fatalf("the new version's table holds %d rows, its part %d", len(stored), part.count(rows))
	}
}

// An upsert of a row-wise shard's table takes only the rows its part
// holds: an id another shard holds is bad input (its seq still taken),
// never a row written where no lookup reads it, which also cut a later
// preload short at that row (a class holds only the part's rows).
func TestUpsertOutsidePart(t *testing.T) {
	const rows, dim = 4096, 8
	dir, _ := shardPlan(t, []*testTable{{name: "big", rows: rows, dim: dim, seed: 4}}, 2, 80<<10, "big")
	opts := Options{Preload: PreloadOn}
	s, fs := openMem(t, &opts)
	k := 0
	if _, err := s.Ingest(context.Background(), dir, IngestOptions{Shard: &k}); err != nil {
		t.Fatal(err)
	}
	tabs, _ := s.Tables("m")
	part := tabs[0].Part
	if part == nil {
		t.Fatal("no part")
	}
	var in, out int64 = -1, -1
	for id := int64(0); in < 0 || out < 0; id++ {
		if part.holds(id) {
			in = id
		} else {
			out = id
		}
	}
	row := fill(dim, 7)
	_, err := s.UpsertSeq("m", "big", []int64{in, out}, append(append([]float32(nil), row...), row...), 1)
	if !errors.Is(err, ErrIDOutOfRange) {
		t.Errorf("upsert of row %d, which part %v does not hold: %v, want ErrIDOutOfRange", out, part, err)
	}
	if seq, err := s.AppliedSeq("m"); err != nil || seq != 1 {
		t.Errorf("AppliedSeq %d %v after update 1, want 1", seq, err)
	}
	if applied, err := s.UpsertSeq("m", "big", []int64{in}, row, 2); err != nil || !applied {
		t.Fatalf("upsert of held row %d: %v %v", in, applied, err)
	}
	for id := range storedRows(t, s, "m", "big") {
		if !part.holds(id) {
			t.Errorf("table of part %v holds row %d", part, id)
		}
	}
	s = reopen(t, s, opts, fs)
	if got, want := s.Preloaded().Rows, part.count(rows); got != want {
		t.Errorf("preload after reopen loaded %d rows, the part holds %d", got, want)
	}
}

// A lookup that is not Partial, of a store holding a part of a row-wise
// table, of an id another shard holds is bad input found before any read
// (an *IDError, ErrIDOutOfRange), never a row "missing from the store"
// (ErrCorrupt: the catalog promises no such row), whichever way the
// misses are read and whether the hot tier holds the part's rows.
func TestLookupOutsidePart(t *testing.T) {
	const rows, dim = 4096, 8
	dir, _ := shardPlan(t, []*testTable{{name: "big", rows: rows, dim: dim, seed: 5}}, 2, 80<<10, "big")
	for _, hb := range []int64{-1, 16 << 10, 0} {
		for _, mode := range []MissReads{MissSorted, MissPoint} {
			s, _ := openMem(t, &Options{HotBytes: hb, Preload: PreloadOn, MissReads: mode})
			k := 1
			if _, err := s.Ingest(context.Background(), dir, IngestOptions{Shard: &k}); err != nil {
				t.Fatal(err)
			}
			tabs, _ := s.Tables("m")
			part := tabs[0].Part
			if part == nil {
				t.Fatal("no part")
			}
			var in, out int64 = -1, -1
			for id := int64(0); in < 0 || out < 0; id++ {
				if part.holds(id) {
					in = id
				} else if out < 0 {
					out = id
				}
			}
			ids := []int64{in, out}
			err := s.Lookup("m", []TableLookup{{Table: "big", IDs: ids, Pooling: PoolSum, Bag: 2, Out: make([]float32, dim)}})
			var ie *IDError
			if !errors.As(err, &ie) || !errors.Is(err, ErrIDOutOfRange) || errors.Is(err, ErrCorrupt) || ie.Index != 1 || ie.ID != out {
				t.Errorf("hot %d, %s: lookup of row %d, which part %v does not hold: %v, want an *IDError at ids[1], ErrIDOutOfRange", hb, mode, out, part, err)
			}
			// The part's own rows, and the same ids as a partial lookup, read.
			if err := s.Lookup("m", []TableLookup{{Table: "big", IDs: []int64{in}, Pooling: PoolSum, Out: make([]float32, dim)}}); err != nil {
				t.Errorf("hot %d, %s: lookup of held row %d: %v", hb, mode, in, err)
			}
			if err := s.Lookup("m", []TableLookup{{Table: "big", IDs: ids, Pooling: PoolSum, Bag: 2, Out: make([]float32, dim), Partial: true}}); err != nil {
				t.Errorf("hot %d, %s: partial lookup: %v", hb, mode, err)
			}
		}
	}
}
