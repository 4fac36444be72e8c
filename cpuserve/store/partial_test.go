package store

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/prism-serve/prism/plan"
	"github.com/prism-serve/prism/sharding"
)

// wholePool is the whole table's answer in float64: w·row per id pooled
// by p over each bag (offsets), the unknown-id rule applied.
func wholePool(tt *testTable, ids []int64, offsets []int64, w []float32, p Pooling) []float64 {
	dim := tt.dim
	row := func(i int) []float64 {
		out := make([]float64, dim)
		id := ids[i]
		if id >= tt.rows {
			if tt.unknown == plan.UnknownZero {
				return out
			}
			id %= tt.rows
		}
		wt := 1.0
		if w != nil {
			wt = float64(w[i])
		}
		for k := range dim {
			out[k] = wt * float64(tt.data[id*int64(dim)+int64(k)])
		}
		return out
	}
	if p == PoolNone {
		var out []float64
		for i := range ids {
			out = append(out, row(i)...)
		}
		return out
	}
	var out []float64
	for s := range len(offsets) - 1 {
		lo, hi := int(offsets[s]), int(offsets[s+1])
		acc := make([]float64, dim)
		for j := lo; j < hi; j++ {
			r := row(j)
			for k := range dim {
				switch {
				case p != PoolMax:
					acc[k] += r[k]
				case j == lo:
					acc[k] = r[k]
				default:
					acc[k] = math.Max(acc[k], r[k])
				}
			}
		}
		if p == PoolMean && hi > lo {
			for k := range acc {
				acc[k] /= float64(hi - lo)
			}
		}
		out = append(out, acc...)
	}
	return out
}

// combineParts is the dense side's combine (plan.Combine) of the shards'
// partial outputs, in float64.
func combineParts(c plan.Combine, parts, counts [][]float32, dim int) []float64 {
	out := make([]float64, len(parts[0]))
	if c == plan.CombineSum {
		for _, p := range parts {
			for i, x := range p {
				out[i] += float64(x)
			}
		}
		return out
	}
	for s := range len(out) / dim {
		var total float64
		for k, p := range parts {
			n := float64(counts[k][s])
			if n == 0 && c == plan.CombineMaxCount {
				continue
			}
			for d := range dim {
				x := float64(p[s*dim+d])
				switch {
				case c == plan.CombineSumCount:
					out[s*dim+d] += x
				case total == 0:
					out[s*dim+d] = x
				default:
					out[s*dim+d] = math.Max(out[s*dim+d], x)
				}
			}
			total += n
		}
		if c == plan.CombineSumCount && total > 0 {
			for d := range dim {
				out[s*dim+d] /= total
			}
		}
	}
	return out
}

// Partial lookups on the shards of row-wise tables, combined as the
// dense side does, give the whole table's pooling: ids spread over the
// shards, duplicates, unknown ids (zero and hash rules), per-id weights,
// empty bags, bags of one; and the counts add up to the bag sizes.
func TestPartialLookup(t *testing.T) {
	tables := []*testTable{
		{name: "z", rows: 300, dim: 8, seed: 1, unknown: plan.UnknownZero},
		{name: "h", rows: 250, dim: 4, seed: 2, unknown: plan.UnknownHash},
	}
	dir := writePlan(t, "m", tables)
	p, err := plan.Read(dir)
	if err != nil {
		t.Fatal(err)
	}
	const shards = 3
	r, err := sharding.Plan(sharding.Tables(p, nil), sharding.Options{Shards: shards, ShardBytes: 5000})
	if err != nil {
		t.Fatal(err)
	}
	if p.Sharding, err = sharding.Section(p, r, "uniform"); err != nil {
		t.Fatal(err)
	}
	for _, tt := range tables {
		if pl := p.Sharding.Placement(tt.name); pl.Placement != plan.RowWise || len(pl.Shards) < 2 {
			t.Fatalf("%s placed %+v, want row-wise", tt.name, pl)
		}
	}
	if err := plan.Write(dir, p); err != nil {
		t.Fatal(err)
	}
	stores := make([]*Store, shards)
	for k := range shards {
		stores[k], _ = openMem(t, nil)
		if _, err := stores[k].Ingest(context.Background(), dir, IngestOptions{Shard: &k}); err != nil {
			t.Fatal(err)
		}
	}
	whole, _ := openMem(t, nil)
	if _, err := whole.Ingest(context.Background(), dir, IngestOptions{}); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(11, 12))
	type bags struct {
		name    string
		ids     []int64
		offsets []int64 // nil: Bag
		bag     int
	}
	mkBags := func(tt *testTable) []bags {
		// Offsets with empty bags, duplicates and unknown ids.
		var ids, offs []int64
		offs = append(offs, 0)
		for s := range 9 {
			size := rng.IntN(6)
			if s%4 == 1 {
				size = 0
			}
			for range size {
				var id int64
				switch rng.IntN(5) {
				case 0:
					id = tt.rows + rng.Int64N(40) // unknown
				case 1:
					id = 7 // a duplicate across and within bags
				default:
					id = rng.Int64N(tt.rows)
				}
				ids = append(ids, id)
			}
			offs = append(offs, int64(len(ids)))
		}
		fixed := make([]int64, 12)
		for i := range fixed {
			fixed[i] = rng.Int64N(tt.rows + 20)
		}
		single := []int64{0, 1, 2, 3, tt.rows + 3, 5}
		return []bags{
			{"offsets", ids, offs, 0},
			{"bag3", fixed, nil, 3},
			{"bag1", single, nil, 1},
			{"empty", nil, []int64{0, 0, 0}, 0},
		}
	}
	for _, tt := range tables {
		pl := p.Sharding.Placement(tt.name)
		for _, b := range mkBags(tt) {
			offs := b.offsets
			if offs == nil {
				for i := 0; i <= len(b.ids); i += b.bag {
					offs = append(offs, int64(i))
				}
			}
			samples := len(offs) - 1
			for _, pooling := range []Pooling{PoolSum, PoolMean, PoolMax, PoolNone} {
				if pooling == PoolNone && b.offsets != nil {
					continue
				}
				for _, weighted := range []bool{false, true} {
					name := fmt.Sprintf("%s/%s/%s/w=%v", tt.name, b.name, pooling, weighted)
					var w []float32
					if weighted {
						w = make([]float32, len(b.ids))
						for i := range w {
							w[i] = rng.Float32()*3 - 1
						}
					}
					size := samples * tt.dim
					if pooling == PoolNone {
						size = len(b.ids) * tt.dim
					}
					comb := plan.CombineOf(pooling)
					var parts, counts [][]float32
					total := make([]float32, samples)
					for k := range shards {
						out := make([]float32, size)
						var cnt []float32
						if comb != plan.CombineSum {
							cnt = make([]float32, samples)
						}
						tl := TableLookup{Table: tt.name, IDs: b.ids, Offsets: b.offsets, Bag: b.bag, Weights: w, Pooling: pooling, Out: out, Partial: true, Counts: cnt}
						err := stores[k].Lookup("m", []TableLookup{tl})
						if _, _, holds := pl.Part(k); !holds {
							if err == nil {
								t.Fatalf("%s: shard %d holds none of the table, looked up without error", name, k)
							}
							continue
						}
						if err != nil {
							t.Fatalf("%s: shard %d: %v", name, k, err)
						}
						parts, counts = append(parts, out), append(counts, cnt)
						for s := range cnt {
							total[s] += cnt[s]
						}
					}
					if comb != plan.CombineSum {
						for s := range samples {
							if want := float32(offs[s+1] - offs[s]); total[s] != want {
								t.Fatalf("%s: sample %d: counts add up to %v, bag of %v", name, s, total[s], want)
							}
						}
					}
					got := combineParts(comb, parts, counts, tt.dim)
					want := wholePool(tt, b.ids, offs, w, pooling)
					if len(got) != len(want) {
						t.Fatalf("%s: %d floats, want %d", name, len(got), len(want))
					}
					for i := range want {
						if math.Abs(got[i]-want[i]) > 1e-5*(1+math.Abs(want[i])) {
							t.Fatalf("%s: [%d] = %v, want %v", name, i, got[i], want[i])
						}
					}
					// The whole store's Partial lookup is the whole lookup.
					out := make([]float32, size)
					full := make([]float32, size)
					var cnt []float32
					if comb != plan.CombineSum {
						cnt = make([]float32, samples)
					}
					if err := whole.Lookup("m", []TableLookup{
						{Table: tt.name, IDs: b.ids, Offsets: b.offsets, Bag: b.bag, Weights: w, Pooling: pooling, Out: out, Partial: true, Counts: cnt},
						{Table: tt.name, IDs: b.ids, Offsets: b.offsets, Bag: b.bag, Weights: w, Pooling: pooling, Out: full},
					}); err != nil {
						t.Fatalf("%s: whole store: %v", name, err)
					}
					got = combineParts(comb, [][]float32{out}, [][]float32{cnt}, tt.dim)
					for i := range full {
						if math.Abs(got[i]-float64(full[i])) > 1e-5*(1+math.Abs(float64(full[i]))) {
							t.Fatalf("%s: whole store partial [%d] = %v, lookup %v", name, i, got[i], full[i])
						}
					}
				}
			}
		}
	}
}

// Counts are for partial pooled lookups only, one per sample.
func TestPartialLookupCountsChecked(t *testing.T) {
	dir := writePlan(t, "m", []*testTable{{name: "a", rows: 10, dim: 4, seed: 1}})
	s, _ := openMem(t, nil)
	if _, err := s.Ingest(context.Background(), dir, IngestOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, tl := range []TableLookup{
		{Table: "a", IDs: []int64{1, 2}, Bag: 1, Pooling: PoolSum, Out: make([]float32, 8), Counts: make([]float32, 2)},
		{Table: "a", IDs: []int64{1, 2}, Bag: 1, Pooling: PoolNone, Out: make([]float32, 8), Partial: true, Counts: make([]float32, 2)},
		{Table: "a", IDs: []int64{1, 2}, Bag: 1, Pooling: PoolMean, Out: make([]float32, 8), Partial: true, Counts: make([]float32, 3)},
	} {
		if err := s.Lookup("m", []TableLookup{tl}); !IsInputError(err) {
			t.Errorf("%+v: %v, want an input error", tl, err)
		}
	}
}
