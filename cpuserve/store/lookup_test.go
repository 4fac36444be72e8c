package store

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// refPool is the plain Go reference: rows straight from the Arrow
// table's data, pooled as TableLookup documents.
func refPool(tt *testTable, r TableLookup) []float32 {
	dim := tt.dim
	row := func(id int64) []float32 { return tt.data[id*int64(dim) : (id+1)*int64(dim)] }
	w := func(j int) float32 {
		if r.Weights == nil {
			return 1
		}
		return r.Weights[j]
	}
	bags := bagsOf(r)
	if r.Pooling == PoolNone {
		out := make([]float32, 0, len(r.IDs)*dim)
		for j, id := range r.IDs {
			for _, x := range row(id) {
				out = append(out, w(j)*x)
			}
		}
		return out
	}
	out := make([]float32, 0, len(bags)*dim)
	for _, b := range bags {
		acc := make([]float32, dim)
		for n, j := range b {
			for k, x := range row(r.IDs[j]) {
				switch {
				case r.Pooling == PoolMax && n == 0:
					acc[k] = w(j) * x
				case r.Pooling == PoolMax:
					acc[k] = max(acc[k], w(j)*x)
				default:
					acc[k] += w(j) * x
				}
			}
		}
		if r.Pooling == PoolMean && len(b) > 0 {
			for k := range acc {
				acc[k] /= float32(len(b))
			}
		}
		out = append(out, acc...)
	}
	return out
}

// bagsOf lists each sample's id positions.
func bagsOf(r TableLookup) [][]int {
	var bags [][]int
	if r.Offsets != nil {
		for s := 0; s+1 < len(r.Offsets); s++ {
			var b []int
			for j := r.Offsets[s]; j < r.Offsets[s+1]; j++ {
				b = append(b, int(j))
			}
			bags = append(bags, b)
		}
		return bags
	}
	bag := max(r.Bag, 1)
	for s := 0; s < len(r.IDs)/bag; s++ {
		var b []int
		for j := s * bag; j < (s+1)*bag; j++ {
			b = append(b, j)
		}
		bags = append(bags, b)
	}
	return bags
}

// quantBound is the documented per-value error bound of dtype for a
// value x in a row whose largest |value| is rowMax.
func quantBound(dt DType, x, rowMax float32) float64 {
	switch dt {
	case Float16:
		return math.Max(math.Abs(float64(x))*math.Pow(2, -11), math.Pow(2, -25))
	case Int8:
		return float64(rowMax) / 254
	}
	return 0
}

// tolerance bounds |got - ref| per output float: the quantization error
// of every contributing value (times |w|), plus float32 rounding.
func tolerance(tt *testTable, dt DType, r TableLookup) []float64 {
	dim := tt.dim
	rowErr := func(id int64, k int) (float64, float64) {
		row := tt.data[id*int64(dim) : (id+1)*int64(dim)]
		var m float32
		for _, x := range row {
			m = max(m, float32(math.Abs(float64(x))))
		}
		return quantBound(dt, row[k], m), math.Abs(float64(row[k]))
	}
	w := func(j int) float64 {
		if r.Weights == nil {
			return 1
		}
		return math.Abs(float64(r.Weights[j]))
	}
	var out []float64
	if r.Pooling == PoolNone {
		for j, id := range r.IDs {
			for k := range dim {
				e, _ := rowErr(id, k)
				out = append(out, w(j)*e*1.0001+1e-12)
			}
		}
		return out
	}
	for _, b := range bagsOf(r) {
		for k := range dim {
			var e, mag float64
			for _, j := range b {
				ej, mj := rowErr(r.IDs[j], k)
				e += w(j) * ej
				mag += w(j) * mj
			}
			if r.Pooling == PoolMean && len(b) > 0 {
				e /= float64(len(b))
				mag /= float64(len(b))
			}
			out = append(out, e*1.0001+mag*1e-6+1e-12)
		}
	}
	return out
}

// randomLookup draws a request: Zipf-ish ids (so the hot tier both hits
// and misses), a bag shape and optional weights.
func randomLookup(r *rand.Rand, tt *testTable, pooling Pooling, shape string, weighted bool, samples int) TableLookup {
	req := TableLookup{Table: tt.name, Pooling: pooling}
	switch shape {
	case "bag1":
		req.Bag = 1
	case "bag3":
		req.Bag = 3
	case "offsets":
		req.Offsets = []int64{0}
	}
	id := func() int64 {
		if r.IntN(2) == 0 {
			return r.Int64N(min(tt.rows, 20)) // a hot head
		}
		return r.Int64N(tt.rows)
	}
	for range samples {
		n := max(req.Bag, 1)
		if req.Offsets != nil {
			n = r.IntN(5) // 0..4, empty bags included
		}
		for range n {
			req.IDs = append(req.IDs, id())
		}
		if req.Offsets != nil {
			req.Offsets = append(req.Offsets, int64(len(req.IDs)))
		}
	}
	if weighted {
		req.Weights = make([]float32, len(req.IDs))
		for i := range req.Weights {
			req.Weights[i] = float32(r.NormFloat64())
		}
	}
	outRows := len(bagsOf(req))
	if pooling == PoolNone {
		outRows = len(req.IDs)
	}
	req.Out = make([]float32, outRows*tt.dim)
	for i := range req.Out {
		req.Out[i] = float32(math.NaN()) // Lookup must write every float
	}
	return req
}

func TestLookupMatchesReference(t *testing.T) {
	tables := []*testTable{
		{name: "t16", rows: 1000, dim: 16, seed: 1},
		{name: "t64", rows: 300, dim: 64, seed: 2},
		{name: "t8", rows: 5000, dim: 8, seed: 3},
	}
	plan := writePlan(t, "m", tables)
	for _, dt := range []DType{Float32, Float16, Int8} {
		for _, hotBytes := range []int64{-1, 16 << 10, 64 << 20} {
			t.Run(fmt.Sprintf("%s/hot=%d", dt, hotBytes), func(t *testing.T) {
				s, _ := openMem(t, &Options{HotBytes: hotBytes})
				rep, err := s.Ingest(context.Background(), plan, IngestOptions{DType: dt})
				if err != nil {
					t.Fatal(err)
				}
				for _, tr := range rep.Tables {
					if (dt == Float32) != (tr.Loss == nil) {
						t.Fatalf("table %s: loss report %v for dtype %s", tr.Name, tr.Loss, dt)
					}
				}
				r := rand.New(rand.NewPCG(uint64(len(dt)), uint64(hotBytes)))
				for _, pooling := range []Pooling{PoolNone, PoolSum, PoolMean, PoolMax} {
					for _, shape := range []string{"bag1", "bag3", "offsets"} {
						for _, weighted := range []bool{false, true} {
							for round := range 3 {
								var batch []TableLookup
								for _, tt := range tables {
									batch = append(batch, randomLookup(r, tt, pooling, shape, weighted, 40))
								}
								if err := s.Lookup("m", batch); err != nil {
									t.Fatal(err)
								}
								for i, req := range batch {
									tt := tables[i]
									want := refPool(tt, req)
									tol := tolerance(tt, dt, req)
									for k := range want {
										if d := math.Abs(float64(req.Out[k] - want[k])); !(d <= tol[k]) {
											t.Fatalf("%s %s weighted=%v round %d table %s: out[%d] = %v, reference %v (|diff| %g > bound %g)",
												pooling, shape, weighted, round, tt.name, k, req.Out[k], want[k], d, tol[k])
										}
									}
								}
							}
						}
					}
				}
				m := s.Metrics()
				if hotBytes > 0 && m.HotHits == 0 {
					t.Errorf("hot tier of %d bytes never hit: %+v", hotBytes, m)
				}
				if hotBytes == 16<<10 && m.HotEvictions+m.HotRejections == 0 {
					t.Errorf("small hot tier neither evicted nor rejected: %+v", m)
				}
			})
		}
	}
}
