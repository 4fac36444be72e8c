package store

import (
	"context"
	"math/rand/v2"
	"sync"
	"testing"
)

// lookupAll looks up n random ids of every table and checks them
// against the tables' data (float32: exact).
func lookupAll(t *testing.T, s *Store, tabs []*testTable, r *rand.Rand, n int) {
	t.Helper()
	for _, tt := range tabs {
		ids := make([]int64, n)
		for i := range ids {
			ids[i] = r.Int64N(tt.rows)
		}
		req := TableLookup{Table: tt.name, IDs: ids, Pooling: PoolNone, Out: make([]float32, n*tt.dim)}
		if err := s.Lookup("m", []TableLookup{req}); err != nil {
			t.Fatal(err)
		}
		for i, id := range ids {
			for k := range tt.dim {
				if got, want := req.Out[i*tt.dim+k], tt.data[id*int64(tt.dim)+int64(k)]; got != want {
					t.Fatalf("table %s row %d [%d] = %v, want %v", tt.name, id, k, got, want)
				}
			}
		}
	}
}

func TestPreloadAllHits(t *testing.T) {
	ctx := context.Background()
	tabs := []*testTable{{name: "a", rows: 40000, dim: 4, seed: 1}, {name: "b", rows: 3000, dim: 16, seed: 2}}
	plan := writePlan(t, "m", tabs)
	s, fs := openMem(t, nil)
	if _, err := s.Ingest(ctx, plan, IngestOptions{}); err != nil {
		t.Fatal(err)
	}
	rep := s.Preloaded()
	if !rep.Complete || rep.Rows != 43000 || rep.Tables != 2 || rep.Bytes != 40000*16+3000*64 {
		t.Fatalf("preload report %+v, want 2 tables, 43000 rows, complete", rep)
	}
	r := rand.New(rand.NewPCG(1, 2))
	lookupAll(t, s, tabs, r, 500)
	if m := s.Metrics(); m.HotMisses != 0 || m.PebbleReads != 0 || m.HotUsed != 43000 {
		t.Fatalf("after preload: %d misses, %d Pebble reads, %d resident; want 0, 0, 43000", m.HotMisses, m.PebbleReads, m.HotUsed)
	}
	// Upserts update the resident rows: visible at once, still hits.
	row := []float32{9, 8, 7, 6}
	for _, id := range []int64{0, 17, 39999} {
		if err := s.Upsert("m", "a", []int64{id}, row); err != nil {
			t.Fatal(err)
		}
		copy(tabs[0].data[id*4:], row)
		if got := lookupRow(t, s, "m", "a", id, 4); got[0] != 9 || got[3] != 6 {
			t.Fatalf("row %d after upsert reads %v", id, got)
		}
	}
	lookupAll(t, s, tabs, r, 500)
	if m := s.Metrics(); m.HotMisses != 0 || m.PebbleReads != 0 {
		t.Fatalf("after upserts: %d misses, %d Pebble reads", m.HotMisses, m.PebbleReads)
	}
	// Reopened, the store preloads at Open, upserted rows included.
	s.Close()
	s2, err := Open("db", &Options{FS: fs})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if rep := s2.Preloaded(); rep.Rows != 43000 || !rep.Complete {
		t.Fatalf("preload at Open: %+v", rep)
	}
	lookupAll(t, s2, tabs, r, 500)
	if m := s2.Metrics(); m.HotMisses != 0 || m.PebbleReads != 0 {
		t.Fatalf("after reopen: %d misses, %d Pebble reads", m.HotMisses, m.PebbleReads)
	}
	// A new version is preloaded on activation (the tier is rebuilt for
	// its tables).
	v2 := []*testTable{{name: "a", rows: 40000, dim: 4, seed: 5}, {name: "b", rows: 3000, dim: 16, seed: 2}}
	if _, err := s2.Ingest(ctx, writePlan(t, "m", v2), IngestOptions{}); err != nil {
		t.Fatal(err)
	}
	before := s2.Metrics()
	lookupAll(t, s2, v2, r, 500)
	if m := s2.Metrics(); m.HotMisses != before.HotMisses || m.PebbleReads != before.PebbleReads {
		t.Fatalf("after activating v2: %d misses", m.HotMisses-before.HotMisses)
	}
}

func TestPreloadModes(t *testing.T) {
	ctx := context.Background()
	tabs := []*testTable{{name: "a", rows: 20000, dim: 16, seed: 1}} // 1.25 MiB
	plan := writePlan(t, "m", tabs)
	for _, c := range []struct {
		name     string
		o        Options
		wantRows int64 // -1: some, not all
		complete bool
	}{
		{"off", Options{HotBytes: 8 << 20, Preload: PreloadOff}, 0, true},
		{"auto-no-fit", Options{HotBytes: 512 << 10}, 0, false},
		{"on-no-fit", Options{HotBytes: 512 << 10, Preload: PreloadOn}, -1, false},
		{"auto-max", Options{HotBytesAutoMax: 4 << 20}, 20000, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			o := c.o
			s, _ := openMem(t, &o)
			// The recorded size (256 KiB) holds a fifth of the rows;
			// auto-max overrides it.
			if _, err := s.Ingest(ctx, plan, IngestOptions{HotBytes: 256 << 10}); err != nil {
				t.Fatal(err)
			}
			rep := s.Preloaded()
			if rep.Complete != c.complete || (c.wantRows >= 0 && rep.Rows != c.wantRows) || (c.wantRows < 0 && (rep.Rows == 0 || rep.Rows >= 20000)) {
				t.Fatalf("preload report %+v, want rows %d complete %v", rep, c.wantRows, c.complete)
			}
			lookupAll(t, s, tabs, rand.New(rand.NewPCG(3, 4)), 300)
		})
	}
}

// TestPreloadRacesUpserts: rows upserted while a preload scans the table
// are never shadowed by the older rows the scan read.
func TestPreloadRacesUpserts(t *testing.T) {
	ctx := context.Background()
	tabs := []*testTable{{name: "a", rows: 200000, dim: 4, seed: 1}}
	s, _ := openMem(t, &Options{Preload: PreloadOff})
	s.opts.NoSync = true
	if _, err := s.Ingest(ctx, writePlan(t, "m", tabs), IngestOptions{}); err != nil {
		t.Fatal(err)
	}
	s.opts.Preload = PreloadOn
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := s.Preload(ctx); err != nil {
			t.Error(err)
		}
	}()
	r := rand.New(rand.NewPCG(5, 6))
	written := map[int64]float32{}
	for i := range 400 {
		id := r.Int64N(200000)
		v := float32(i + 1000)
		if err := s.Upsert("m", "a", []int64{id}, []float32{v, v, v, v}); err != nil {
			t.Fatal(err)
		}
		written[id] = v
	}
	wg.Wait()
	if rep := s.Preloaded(); rep.Rows != 200000 {
		t.Fatalf("preload report %+v", rep)
	}
	before := s.Metrics()
	for id, v := range written {
		if got := lookupRow(t, s, "m", "a", id, 4); got[0] != v {
			t.Fatalf("row %d reads %v after upsert of %v", id, got, v)
		}
	}
	if m := s.Metrics(); m.HotMisses != before.HotMisses {
		t.Fatalf("%d misses after preload", m.HotMisses-before.HotMisses)
	}
}

// TestChunkRows: a preload chunk reads 65,536 rows of dim 64 (16 MiB),
// fewer of wider rows, and never more than the table has.
func TestChunkRows(t *testing.T) {
	for _, c := range []struct {
		dim  int
		rows int64
		want int
	}{
		{64, 1 << 30, 1 << 16}, {16, 1 << 30, 1 << 16}, {128, 1 << 30, 1 << 15},
		{1 << 20, 1 << 30, 4}, {1 << 23, 10, 1}, {64, 10, 10},
	} {
		if got := chunkRows(&tableView{dim: c.dim, rows: c.rows}); got != c.want {
			t.Errorf("dim %d, %d rows: %d rows a chunk, want %d", c.dim, c.rows, got, c.want)
		}
	}
}
