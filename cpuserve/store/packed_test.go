package store

import (
	"context"
	"math/rand/v2"
	"slices"
	"testing"
)

// TestPackedTier: a float16 or int8 table whose rows do not all fit the
// hot tier as float32 is held in its stored form (hot.HalfWidth,
// hot.Int8Width): lookups answered by the tier give exactly what the
// store's rows decode to, before and after an update, the tier holds more
// rows than a float32 table's in the same bytes, and a warm restart
// restores it. A tier that holds every row as float32 keeps float32 (a
// hit is a copy).
func TestPackedTier(t *testing.T) {
	for _, dt := range []DType{Float16, Int8} {
		t.Run(string(dt), func(t *testing.T) { testPackedTier(t, dt) })
	}
}

func testPackedTier(t *testing.T, packed DType) {
	ctx := context.Background()
	tabs := []*testTable{{name: "a", rows: 20000, dim: 64, seed: 9}}
	plan := writePlan(t, "m", tabs)
	// What the store's rows decode to.
	stored := func(dst, x []float32) {
		if !packed.decode(dst, packed.encode(nil, x)) {
			t.Fatal("decode")
		}
	}
	want := make([]float32, len(tabs[0].data))
	for i := 0; i < len(want); i += 64 {
		stored(want[i:i+64], tabs[0].data[i:i+64])
	}
	lookup := func(s *Store, ids []int64) []float32 {
		t.Helper()
		req := TableLookup{Table: "a", IDs: ids, Pooling: PoolNone, Out: make([]float32, len(ids)*64)}
		if err := s.Lookup("m", []TableLookup{req}); err != nil {
			t.Fatal(err)
		}
		return req.Out
	}
	check := func(s *Store, what string) {
		t.Helper()
		r := rand.New(rand.NewPCG(4, 4))
		for range 4 { // the second and later passes are mostly hits
			ids := make([]int64, 2000)
			for i := range ids {
				ids[i] = r.Int64N(3000)
			}
			got := lookup(s, ids)
			for i, id := range ids {
				if !slices.Equal(got[i*64:(i+1)*64], want[id*64:(id+1)*64]) {
					t.Fatalf("%s: row %d differs from the store's", what, id)
				}
			}
		}
	}
	slots := map[DType]int64{}
	for _, dt := range []DType{Float32, packed} {
		s, _ := openMem(t, &Options{HotBytes: 1 << 20, Preload: PreloadOff})
		if _, err := s.Ingest(ctx, plan, IngestOptions{DType: dt}); err != nil {
			t.Fatal(err)
		}
		if got := s.view.Load().packed; got != (dt == packed) {
			t.Fatalf("%s table in a tier that does not hold it: packed %v", dt, got)
		}
		slots[dt] = s.Metrics().HotSlots
		if dt == Float32 {
			continue
		}
		check(s, string(packed)+" table")
		if m := s.Metrics(); m.HotHits == 0 {
			t.Fatal("no lookup hit the tier")
		}
		// An update: the tier holds the row as the store does.
		row := make([]float32, 64)
		for i := range row {
			row[i] = float32(i) * 0.1
		}
		if err := s.Upsert("m", "a", []int64{5}, row); err != nil {
			t.Fatal(err)
		}
		stored(want[5*64:6*64], row)
		check(s, "after an update")
		o := s.opts
		s.Close()
		o.WarmRestart = true
		s2, err := Open("db", &o)
		if err != nil {
			t.Fatal(err)
		}
		check(s2, "reopened")
		s2.Close()
		s3, err := Open("db", &o) // s2 saved its snapshot
		if err != nil {
			t.Fatal(err)
		}
		if rep := waitWarm(t, s3); rep.Rows == 0 || rep.Err != nil || rep.Sketches != 1 {
			t.Fatalf("warm restart of a %s tier: %+v", packed, rep)
		}
		check(s3, "restarted warm")
		s3.Close()
	}
	if float64(slots[packed]) < 1.5*float64(slots[Float32]) {
		t.Fatalf("1 MiB tier: %d rows of the %s table, %d of a float32 one", slots[packed], packed, slots[Float32])
	}
	t.Logf("1 MiB tier: %d rows of the %s table, %d of a float32 one", slots[packed], packed, slots[Float32])
	// Room for every row as float32: not packed (a fresh store: row 5 as
	// ingested).
	stored(want[5*64:6*64], tabs[0].data[5*64:6*64])
	s, _ := openMem(t, &Options{HotBytes: 64 << 20})
	if _, err := s.Ingest(ctx, plan, IngestOptions{DType: packed}); err != nil {
		t.Fatal(err)
	}
	if v := s.view.Load(); v.packed || !v.tier.Complete() {
		t.Fatalf("a tier with room for every row as float32: packed %v, complete %v", v.packed, v.tier.Complete())
	}
	check(s, "complete float32 tier")
}
