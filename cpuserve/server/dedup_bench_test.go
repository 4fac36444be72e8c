package server

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/prism-serve/prism/internal/arrowframe"
	"github.com/prism-serve/prism/internal/threadcpu"
	"github.com/prism-serve/prism/models"
	"github.com/prism-serve/prism/plan"
)

// kaggleRowsBench are dlrm-kaggle's 26 table sizes (models' preset).
var kaggleRowsBench = []int64{1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194, 27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572}

// zipfColumns draws batches of n ids per table, Zipf 1.05 over each
// table's rows, the ranks scattered over the table as the load
// generator's synthetic source does (popular ids are not the low ones).
func zipfColumns(b testing.TB, rows []int64, n, batches int) [][][]int64 {
	r := rand.New(rand.NewPCG(7, 11))
	out := make([][][]int64, batches)
	zs := make([]*models.Zipf, len(rows))
	for t, k := range rows {
		z, err := models.NewZipf(r, 1.05, k)
		if err != nil {
			b.Fatal(err)
		}
		zs[t] = z
	}
	for i := range out {
		out[i] = make([][]int64, len(rows))
		for t, k := range rows {
			ids := make([]int64, n)
			for s := range ids {
				ids[s] = int64((uint64(zs[t].Rank())*0x9E3779B1 + 12345) % uint64(k))
			}
			out[i][t] = ids
		}
	}
	return out
}

// BenchmarkDistinctKaggle: finding the distinct ids of one 270-sample
// micro-batch's 26 columns (dlrm-kaggle's tables), hashing every column
// against direct indexing for the tables of at most bound rows, both in
// the same loop, alternating per micro-batch, so that the machine's
// load weighs on both alike: hash-ns/op and direct-ns/op are each
// one micro-batch's thread CPU time.
func BenchmarkDistinctKaggle(b *testing.B) {
	const n, batches = 270, 64
	cols := zipfColumns(b, kaggleRowsBench, n, batches)
	uniq := make([]int64, 0, n)
	index := make([]int32, n)
	// cold: the caches flushed before each micro-batch's pair of passes
	// (a 16 MiB sweep, not timed), as a worker's lookups from a
	// gigabytes-large hot tier leave them between micro-batches.
	var sweep []int64
	for _, c := range []struct {
		cold  bool
		bound int64
	}{{false, 1 << 8}, {false, 1 << 10}, {false, 1 << 12}, {false, 1 << 14}, {false, 1 << 16},
		{true, 1 << 8}, {true, 1 << 10}, {true, 1 << 12}, {true, 1 << 14}, {true, 1 << 16}} {
		cold, bound := c.cold, c.bound
		if cold && sweep == nil {
			sweep = make([]int64, 2<<20)
		}
		b.Run(fmt.Sprintf("cold=%v/direct<=%d", cold, bound), func(b *testing.B) {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			t := new(idTable)
			ds := make([]*directIndex, len(kaggleRowsBench))
			for k, rows := range kaggleRowsBench {
				if rows <= bound {
					ds[k] = newDirectIndex(rows)
				}
			}
			var hash, direct time.Duration
			b.ResetTimer()
			for i := range b.N {
				c := cols[i%batches]
				if cold {
					for j := range sweep {
						sweep[j]++
					}
				}
				t0 := threadcpu.Now()
				for _, ids := range c {
					t.distinct(ids, uniq[:0], index)
				}
				t1 := threadcpu.Now()
				t1b := t1
				if cold {
					for j := range sweep {
						sweep[j]++
					}
					t1b = threadcpu.Now()
				}
				for k, ids := range c {
					if ds[k] != nil {
						if _, ok := ds[k].distinct(ids, uniq[:0], index); ok {
							continue
						}
					}
					t.distinct(ids, uniq[:0], index)
				}
				t2 := threadcpu.Now()
				hash, direct = hash+t1-t0, direct+t2-t1b
			}
			b.ReportMetric(float64(hash)/float64(b.N), "hash-ns/op")
			b.ReportMetric(float64(direct)/float64(b.N), "direct-ns/op")
			b.ReportMetric(float64(direct)/float64(hash), "direct/hash")
		})
	}
}

// BenchmarkDistinctPerTable: one column of 270 ids, hashing against
// direct indexing per table size, alternating as BenchmarkDistinctKaggle
// does; the figures are per column.
func BenchmarkDistinctPerTable(b *testing.B) {
	const n, batches = 270, 64
	sizes := []int64{24, 633, 1460, 5683, 14992, 1 << 16}
	cols := zipfColumns(b, sizes, n, batches)
	uniq := make([]int64, 0, n)
	index := make([]int32, n)
	for k, rows := range sizes {
		b.Run(fmt.Sprintf("rows=%d", rows), func(b *testing.B) {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			t := new(idTable)
			d := newDirectIndex(rows)
			var hash, direct time.Duration
			b.ResetTimer()
			for i := range b.N {
				ids := cols[i%batches][k]
				t0 := threadcpu.Now()
				for range 8 {
					t.distinct(ids, uniq[:0], index)
				}
				t1 := threadcpu.Now()
				for range 8 {
					d.distinct(ids, uniq[:0], index)
				}
				t2 := threadcpu.Now()
				hash, direct = hash+t1-t0, direct+t2-t1
			}
			b.ReportMetric(float64(hash)/8/float64(b.N), "hash-ns/op")
			b.ReportMetric(float64(direct)/8/float64(b.N), "direct-ns/op")
			b.ReportMetric(float64(direct)/float64(hash), "direct/hash")
		})
	}
}

// dedupForBefore is dedupFor as it was before direct indexing and the
// reused buffers (kept as the benchmark's baseline): every column
// hashed, the buffers and the dedup allocated per micro-batch.
func dedupForBefore(m *model, vals map[string]*value, n int, cols []arrowframe.Column, t *idTable) *dedup {
	var d *dedup
	var idsBuf []int64
	var indexBuf []int32
	for i, j := range m.dedup {
		v := vals[m.lookups[j].l.Input]
		if idsBuf == nil {
			idsBuf, indexBuf = make([]int64, 0, n*len(m.dedup)), make([]int32, 0, n*len(m.dedup))
		}
		index := indexBuf[len(indexBuf) : len(indexBuf)+n]
		ids := t.distinct(v.i64, idsBuf[len(idsBuf):len(idsBuf):len(idsBuf)+n], index)
		idsBuf, indexBuf = idsBuf[:len(idsBuf)+len(ids)], indexBuf[:len(indexBuf)+n]
		if d == nil {
			d = &dedup{ids: make([][]int64, len(cols)), index: make([][]int32, len(cols)), byLookup: make([][]int64, len(m.lookups))}
		}
		d.ids[i], d.index[i], d.byLookup[j] = ids, index, ids
		cols[i].Rows = len(ids)
	}
	return d
}

// BenchmarkDedupForKaggle: a 270-sample micro-batch of dlrm-kaggle's 26
// lookups through dedupFor, against dedupForBefore, alternating in the
// same loop; thread CPU ns per micro-batch (the allocations' share of
// the garbage collector's work elsewhere is not in it).
func BenchmarkDedupForKaggle(b *testing.B) {
	const n, batches = 270, 64
	cols := zipfColumns(b, kaggleRowsBench, n, batches)
	m := &model{}
	layout := make([]arrowframe.Column, len(kaggleRowsBench))
	for k, rows := range kaggleRowsBench {
		name := fmt.Sprintf("cat_%d", k)
		m.lookups = append(m.lookups, lookupSpec{table: name, dim: 16, rows: rows, l: plan.Lookup{Input: name, Output: "e_" + name, Bag: 1}})
		m.dedup = append(m.dedup, k)
		layout[k] = arrowframe.Column{Name: "e_" + name, Width: 16}
	}
	vals := make([]map[string]*value, batches)
	for i := range vals {
		vals[i] = map[string]*value{}
		for k := range kaggleRowsBench {
			vals[i][fmt.Sprintf("cat_%d", k)] = &value{width: 1, i64: cols[i][k]}
		}
	}
	t := new(idTable)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var before, after time.Duration
	b.ResetTimer()
	for i := range b.N {
		v := vals[i%batches]
		c := slices.Clone(layout)
		t0 := threadcpu.Now()
		dedupForBefore(m, v, n, c, t)
		t1 := threadcpu.Now()
		dedupFor(m, v, n, c, nil).release()
		t2 := threadcpu.Now()
		before, after = before+t1-t0, after+t2-t1
	}
	b.ReportMetric(float64(before)/float64(b.N), "before-ns/op")
	b.ReportMetric(float64(after)/float64(b.N), "after-ns/op")
	b.ReportMetric(float64(after)/float64(before), "after/before")
}
