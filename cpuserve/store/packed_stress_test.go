package store

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestStressPackedRowsExact: lookups of float16, int8 and float32 tables
// of odd widths through a small (packed, evicting) hot tier race upserts
// of rows of varied values and version switches; every row read is
// exactly what the store holds for one of the values acknowledged
// between the lookup's start and its end (never torn, never older), and
// pooled sums over rows never updated equal the reference exactly.
func TestStressPackedRowsExact(t *testing.T) {
	for _, hb := range []int64{6 << 10, 64 << 10, 8 << 20} {
		t.Run(fmt.Sprint(hb), func(t *testing.T) { stressPackedExact(t, hb) })
	}
}

func stressPackedExact(t *testing.T, hotBytes int64) {
	ctx := context.Background()
	const rows = 600
	tabs := []*testTable{{name: "h", rows: rows, dim: 7, seed: 1}, {name: "q", rows: rows, dim: 9, seed: 2}, {name: "f", rows: rows, dim: 16, seed: 3}}
	dts := map[string]DType{"h": Float16, "q": Int8, "f": Float32}
	p1 := writePlan(t, "m", tabs)
	// Version 2 differs in the last row of each table only (never read
	// here): other tables, so a switch carries the updates.
	var tabs2 []*testTable
	for _, tt := range tabs {
		t2 := *tt
		t2.data = slices.Clone(tt.data)
		t2.data[len(t2.data)-1] += 1
		tabs2 = append(tabs2, &t2)
	}
	p2 := writePlan(t, "m", tabs2)
	s, _ := openMem(t, &Options{HotBytes: hotBytes, Preload: PreloadOff})
	s.opts.NoSync = true
	for _, p := range []string{p1, p2} {
		if _, err := s.Ingest(ctx, p, IngestOptions{TableDTypes: dts}); err != nil {
			t.Fatal(err)
		}
	}
	s.SetMissReads(MissSorted, 4)
	stor := func(dt DType, row []float32) []float32 {
		out := make([]float32, len(row))
		if !dt.decode(out, dt.encode(nil, row)) {
			t.Fatal("decode")
		}
		return out
	}
	// value v of row id of a table: varied values, v 0 is the ingested row.
	rowOf := func(tt *testTable, id, v int64) []float32 {
		if v == 0 {
			return stor(dts[tt.name], tt.data[id*int64(tt.dim):(id+1)*int64(tt.dim)])
		}
		r := make([]float32, tt.dim)
		for k := range r {
			r[k] = float32(v) * (float32(k) - 3.5) / float32(1+id%5)
		}
		return stor(dts[tt.name], r)
	}
	const hotIDs = 40 // ids < hotIDs are upserted; the others never
	// acked: the last value of each row acknowledged; sent: the last
	// sent (an upsert in flight may be read before its ack).
	var acked, sent [3][hotIDs]atomic.Int64
	var stop atomic.Bool
	var wg sync.WaitGroup
	for ti := range tabs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(ti), 3))
			tt := tabs[ti]
			for v := int64(1); !stop.Load(); v++ {
				id := r.Int64N(hotIDs)
				row := make([]float32, tt.dim)
				for k := range row {
					row[k] = float32(v) * (float32(k) - 3.5) / float32(1+id%5)
				}
				sent[ti][id].Store(v)
				if err := s.Upsert("m", tt.name, []int64{id}, row); err != nil {
					t.Error(err)
					return
				}
				acked[ti][id].Store(v)
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; !stop.Load(); i++ {
			var err error
			if i%2 == 0 {
				err = s.Activate("m", 1)
			} else {
				err = s.Rollback("m")
			}
			if err != nil {
				t.Error(err)
				return
			}
			time.Sleep(time.Millisecond)
		}
	}()
	var fail atomic.Bool
	errorf := func(format string, a ...any) {
		if fail.CompareAndSwap(false, true) {
			t.Errorf(format, a...)
		}
		stop.Store(true)
	}
	for rd := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(rd), 17))
			for !stop.Load() {
				var reqs []TableLookup
				var lo [3][]int64
				for ti, tt := range tabs {
					n := 1 + r.IntN(30)
					ids := make([]int64, n)
					lo[ti] = make([]int64, n)
					for i := range ids {
						if r.IntN(2) == 0 {
							ids[i] = r.Int64N(hotIDs)
							lo[ti][i] = acked[ti][ids[i]].Load()
						} else {
							ids[i] = hotIDs + r.Int64N(rows-1-hotIDs)
						}
					}
					reqs = append(reqs, TableLookup{Table: tt.name, IDs: ids, Pooling: PoolNone, Out: make([]float32, n*tt.dim)})
					// A weighted sum over rows never updated, bags of 3.
					cold := make([]int64, 3*(1+r.IntN(8)))
					w := make([]float32, len(cold))
					for i := range cold {
						cold[i] = hotIDs + r.Int64N(rows-1-hotIDs)
						w[i] = float32(r.NormFloat64())
					}
					reqs = append(reqs, TableLookup{Table: tt.name, IDs: cold, Bag: 3, Weights: w, Pooling: PoolSum, Out: make([]float32, len(cold)/3*tt.dim)})
				}
				if err := s.Lookup("m", reqs); err != nil {
					errorf("lookup: %v", err)
					return
				}
				for ti, tt := range tabs {
					req := reqs[2*ti]
					for i, id := range req.IDs {
						got := req.Out[i*tt.dim : (i+1)*tt.dim]
						if id >= hotIDs {
							if want := rowOf(tt, id, 0); !slices.Equal(got, want) {
								errorf("table %s row %d: %v, want %v", tt.name, id, got, want)
								return
							}
							continue
						}
						hi := sent[ti][id].Load()
						ok := false
						for v := lo[ti][i]; v <= hi && !ok; v++ {
							ok = slices.Equal(got, rowOf(tt, id, v))
						}
						if !ok {
							errorf("table %s row %d: %v is no value acked from %d to sent %d", tt.name, id, got, lo[ti][i], hi)
							return
						}
					}
					sum := reqs[2*ti+1]
					for smp := range len(sum.IDs) / 3 {
						want := make([]float32, tt.dim)
						for j := 3 * smp; j < 3*smp+3; j++ {
							for k, x := range rowOf(tt, sum.IDs[j], 0) {
								want[k] += sum.Weights[j] * x
							}
						}
						got := sum.Out[smp*tt.dim : (smp+1)*tt.dim]
						for k := range want {
							if math.Float32bits(got[k]) != math.Float32bits(want[k]) {
								errorf("table %s weighted sum of %v: %v, want %v", tt.name, sum.IDs[3*smp:3*smp+3], got, want)
								return
							}
						}
					}
				}
			}
		}()
	}
	time.Sleep(stressDur)
	stop.Store(true)
	wg.Wait()
	m := s.Metrics()
	t.Logf("hits %d misses %d evictions %d upserts %d carried %d", m.HotHits, m.HotMisses, m.HotEvictions, m.Upserts, m.CarriedRows)
}
