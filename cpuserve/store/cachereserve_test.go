package store

import (
	"context"
	"testing"
)

// TestBlockCacheBesideFullMemtable: a memtable grown to its full size
// (Pebble reserves it against the block cache) leaves the block cache its
// CacheBytes: lookups that read the same blocks twice find them the
// second time. With the cache sized CacheBytes alone, a 4 MiB memtable
// left a 1 MiB cache nothing to hold.
func TestBlockCacheBesideFullMemtable(t *testing.T) {
	ctx := context.Background()
	tabs := []*testTable{{name: "a", rows: 20000, dim: 16, seed: 3}}
	s, _ := openMem(t, &Options{HotBytes: -1, CacheBytes: 1 << 20, MemTableBytes: 4 << 20, Preload: PreloadOff})
	s.opts.NoSync = true
	if _, err := s.Ingest(ctx, writePlan(t, "m", tabs), IngestOptions{}); err != nil {
		t.Fatal(err)
	}
	// Upserts grow the memtable through its sizes to 4 MiB.
	row := make([]float32, 16*500)
	ids := make([]int64, 500)
	for round := range 40 {
		for i := range ids {
			ids[i] = int64(round*500 + i)
		}
		if err := s.Upsert("m", "a", ids, row); err != nil {
			t.Fatal(err)
		}
	}
	ids = make([]int64, 200)
	for i := range ids {
		ids[i] = int64(i * 97)
	}
	read := func() {
		l := TableLookup{Table: "a", IDs: ids, Pooling: PoolNone, Out: make([]float32, len(ids)*16)}
		if err := s.Lookup("m", []TableLookup{l}); err != nil {
			t.Fatal(err)
		}
	}
	read()
	before := s.Metrics()
	read()
	m := s.Metrics()
	if hits := m.BlockCacheHits - before.BlockCacheHits; hits == 0 {
		t.Fatalf("second read of the same %d rows: no block cache hit (%d misses, cache holds %d bytes)", len(ids), m.BlockCacheMisses-before.BlockCacheMisses, m.BlockCacheBytes)
	}
}
