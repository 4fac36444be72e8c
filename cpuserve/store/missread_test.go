package store

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"github.com/cockroachdb/pebble/v2"

	"github.com/prism-serve/prism/plan"
)

// missMode is a way of reading misses that must give what the others give.
type missMode struct {
	name     string
	mode     MissReads
	parallel int
}

var missModes = []missMode{
	{"point", MissPoint, 1},
	{"sorted", MissSorted, 1},
	{"sorted-par4", MissSorted, 4},
	{"sorted-par64", MissSorted, 64},
}

// missModel is the reference of the miss-path tests: each table's rows
// as ingested, with upserts applied.
type missModel struct {
	tables map[string]*testTable
	rows   map[string][]float32
}

func newMissModel(tabs []*testTable) *missModel {
	m := &missModel{tables: map[string]*testTable{}, rows: map[string][]float32{}}
	for _, tt := range tabs {
		m.tables[tt.name] = tt
		m.rows[tt.name] = slices.Clone(tt.data)
	}
	return m
}

// want is req pooled from the reference rows, the table's unknown-id
// rule applied (UnknownZero: a zero row).
func (m *missModel) want(req TableLookup) []float32 {
	tt := m.tables[req.Table]
	data := append(slices.Clone(m.rows[tt.name]), make([]float32, tt.dim)...)
	r := req
	r.IDs = slices.Clone(req.IDs)
	for i, id := range r.IDs {
		if id >= tt.rows {
			switch tt.unknown {
			case plan.UnknownHash:
				r.IDs[i] = id % tt.rows
			case plan.UnknownZero:
				r.IDs[i] = tt.rows
			}
		}
	}
	return refPool(&testTable{name: tt.name, rows: tt.rows + 1, dim: tt.dim, data: data}, r)
}

// runModes looks batch up once per mode (each on fresh outputs) and
// checks that every mode gives the same floats, bit for bit, or the same
// error; it returns the outputs and the error.
func runModes(t *testing.T, s *Store, batch []TableLookup) ([][]float32, error) {
	t.Helper()
	var first [][]float32
	var firstErr error
	for i, mm := range missModes {
		if err := s.SetMissReads(mm.mode, mm.parallel); err != nil {
			t.Fatal(err)
		}
		b := slices.Clone(batch)
		for k := range b {
			b[k].Out = make([]float32, len(batch[k].Out))
			for x := range b[k].Out {
				b[k].Out[x] = float32(math.NaN())
			}
		}
		err := s.Lookup("m", b)
		outs := make([][]float32, len(b))
		for k := range b {
			outs[k] = b[k].Out
		}
		if i == 0 {
			first, firstErr = outs, err
			continue
		}
		if (err == nil) != (firstErr == nil) || (err != nil && !sameKind(err, firstErr)) {
			t.Fatalf("%s: error %v, %s: %v", mm.name, err, missModes[0].name, firstErr)
		}
		if err != nil {
			continue
		}
		for k := range outs {
			for x := range outs[k] {
				if math.Float32bits(outs[k][x]) != math.Float32bits(first[k][x]) {
					t.Fatalf("%s: table %s out[%d] = %v, %s gives %v", mm.name, b[k].Table, x, outs[k][x], missModes[0].name, first[k][x])
				}
			}
		}
	}
	return first, firstErr
}

func sameKind(a, b error) bool {
	for _, e := range []error{ErrCorrupt, ErrIDOutOfRange, ErrNegativeID, ErrBadRequest} {
		if errors.Is(a, e) != errors.Is(b, e) {
			return false
		}
	}
	return true
}

func checkWant(t *testing.T, m *missModel, batch []TableLookup, outs [][]float32, what string) {
	t.Helper()
	for k, req := range batch {
		want := m.want(req)
		if len(want) != len(outs[k]) {
			t.Fatalf("%s: table %s: %d floats, want %d", what, req.Table, len(outs[k]), len(want))
		}
		for x := range want {
			if d := math.Abs(float64(outs[k][x] - want[x])); !(d <= 1e-5*(1+math.Abs(float64(want[x])))) {
				t.Fatalf("%s: table %s: out[%d] = %v, want %v", what, req.Table, x, outs[k][x], want[x])
			}
		}
	}
}

func missTables() []*testTable {
	return []*testTable{
		{name: "a", rows: 3000, dim: 8, seed: 11},
		{name: "h", rows: 500, dim: 16, seed: 12, unknown: plan.UnknownHash},
		{name: "z", rows: 700, dim: 4, seed: 13, unknown: plan.UnknownZero},
	}
}

// deleteRow removes a row's key from Pebble: a store that lost a row.
func deleteRow(t *testing.T, s *Store, table string, id int64) {
	t.Helper()
	infos, err := s.Tables("m")
	if err != nil {
		t.Fatal(err)
	}
	for _, ti := range infos {
		if ti.Name == table {
			var k [keyLen]byte
			if err := s.db.Delete(rowKey(k[:], ti.Phys, id), pebble.Sync); err != nil {
				t.Fatal(err)
			}
			return
		}
	}
	t.Fatalf("no table %q", table)
}

func reversed(ids []int64) []int64 {
	slices.Reverse(ids)
	return ids
}

func seq(lo, hi int64) []int64 {
	var ids []int64
	for id := lo; id < hi; id++ {
		ids = append(ids, id)
	}
	return ids
}

// TestMissReadsCases checks the sorted, batched miss path against point
// reads and the reference, case by case, with no hot tier (every id a miss).
func TestMissReadsCases(t *testing.T) {
	tabs := missTables()
	dir := writePlan(t, "m", tabs)
	s, _ := openMem(t, &Options{HotBytes: -1})
	if _, err := s.Ingest(context.Background(), dir, IngestOptions{}); err != nil {
		t.Fatal(err)
	}
	ref := newMissModel(tabs)
	r := rand.New(rand.NewPCG(1, 2))
	shuffled := func(ids []int64) []int64 {
		ids = slices.Clone(ids)
		r.Shuffle(len(ids), func(i, j int) { ids[i], ids[j] = ids[j], ids[i] })
		return ids
	}
	twice := append(seq(0, 64), seq(0, 64)...)
	upd := []int64{5, 6, 7, 2999, 1500}
	cases := []struct {
		name   string
		table  string
		ids    []int64
		pool   Pooling
		bag    int
		before func()
		want   error
	}{
		{name: "sparse", table: "a", ids: []int64{5, 900, 17, 400}},
		{name: "first and last rows", table: "a", ids: []int64{2999, 0}},
		{name: "adjacent run (Next)", table: "a", ids: shuffled(seq(100, 300))},
		{name: "adjacent runs with gaps", table: "a", ids: shuffled(append(append(seq(10, 40), seq(41, 80)...), seq(2900, 3000)...))},
		{name: "duplicates", table: "a", ids: []int64{7, 7, 7, 3, 3, 999, 7}},
		{name: "duplicates across task cuts", table: "a", ids: shuffled(twice)},
		{name: "reverse order", table: "a", ids: reversed(seq(1000, 1100))},
		{name: "sum pooled bags of 4", table: "a", ids: shuffled(append(seq(0, 100), seq(50, 150)...)), pool: PoolSum, bag: 4},
		{name: "max pooled, duplicates", table: "a", ids: []int64{1, 1, 2, 2, 3, 3}, pool: PoolMax, bag: 3},
		{name: "unknown hash, folded onto duplicates", table: "h", ids: []int64{3, 503, 1003, 499, 999, 0, 500}},
		{name: "unknown hash, many", table: "h", ids: shuffled(seq(400, 700))},
		{name: "unknown zero", table: "z", ids: []int64{699, 700, 5, 100000, 5, 701}},
		{name: "unknown zero, all unknown", table: "z", ids: []int64{700, 800}},
		{name: "unknown zero, many", table: "z", ids: shuffled(seq(600, 800))},
		{name: "unknown error", table: "a", ids: []int64{1, 3000}, want: ErrIDOutOfRange},
		{name: "empty", table: "a", ids: nil},
		{name: "updated rows", table: "a", ids: shuffled(append(seq(0, 40), upd...)), before: func() {
			rows := make([]float32, len(upd)*8)
			for i := range rows {
				rows[i] = float32(i) + 0.5
			}
			if err := s.Upsert("m", "a", upd, rows); err != nil {
				t.Fatal(err)
			}
			for i, id := range upd {
				copy(ref.rows["a"][id*8:(id+1)*8], rows[i*8:(i+1)*8])
			}
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.before != nil {
				c.before()
			}
			dim := ref.tables[c.table].dim
			req := TableLookup{Table: c.table, IDs: c.ids, Pooling: c.pool, Bag: c.bag}
			outRows := len(c.ids) / max(c.bag, 1)
			if c.pool == "" || c.pool == PoolNone {
				req.Pooling, outRows = PoolNone, len(c.ids)
			}
			req.Out = make([]float32, outRows*dim)
			// Another table in the batch: the misses of both are read together.
			other := TableLookup{Table: "h", IDs: shuffled(seq(0, 50)), Pooling: PoolNone, Out: make([]float32, 50*16)}
			batch := []TableLookup{req, other}
			outs, err := runModes(t, s, batch)
			if c.want != nil {
				if !errors.Is(err, c.want) {
					t.Fatalf("got %v, want %v", err, c.want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			checkWant(t, ref, batch, outs, c.name)
		})
	}

	// A store that lost rows: every mode reports it, never a wrong row.
	deleteRow(t, s, "a", 50)
	deleteRow(t, s, "a", 2999)
	for _, c := range []struct {
		name string
		ids  []int64
	}{
		{"lost row, sought", []int64{50}},
		{"lost row after its neighbour (Next)", []int64{49, 50, 51}},
		{"lost row in a large set", shuffled(seq(0, 200))},
		{"lost last row", []int64{2998, 2999}},
	} {
		t.Run(c.name, func(t *testing.T) {
			batch := []TableLookup{{Table: "a", IDs: c.ids, Pooling: PoolNone, Out: make([]float32, len(c.ids)*8)}}
			if _, err := runModes(t, s, batch); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("got %v, want %v", err, ErrCorrupt)
			}
		})
	}
	// Rows beside the lost ones still read.
	batch := []TableLookup{{Table: "a", IDs: []int64{49, 51, 2998}, Pooling: PoolNone, Out: make([]float32, 3*8)}}
	outs, err := runModes(t, s, batch)
	if err != nil {
		t.Fatal(err)
	}
	checkWant(t, ref, batch, outs, "beside the lost rows")
}

// TestMissReadsDifferential draws random batches (Zipf-ish ids with
// duplicates, unknown ids under each table's rule, every pooling),
// upserts between them and, without a hot tier, lost rows; every mode
// must give the same floats as point reads, and the reference.
func TestMissReadsDifferential(t *testing.T) {
	for _, hotBytes := range []int64{-1, 32 << 10} {
		t.Run(fmt.Sprintf("hot=%d", hotBytes), func(t *testing.T) {
			tabs := missTables()
			dir := writePlan(t, "m", tabs)
			s, _ := openMem(t, &Options{HotBytes: hotBytes, Preload: PreloadOff})
			if _, err := s.Ingest(context.Background(), dir, IngestOptions{}); err != nil {
				t.Fatal(err)
			}
			ref := newMissModel(tabs)
			r := rand.New(rand.NewPCG(uint64(hotBytes), 3))
			lost := map[string]map[int64]bool{}
			poolings := []Pooling{PoolNone, PoolSum, PoolMean, PoolMax}
			for round := range 80 {
				if round%5 == 4 {
					tt := tabs[r.IntN(len(tabs))]
					n := 1 + r.IntN(40)
					var ids []int64
					rows := make([]float32, 0, n*tt.dim)
					for range n {
						id := r.Int64N(tt.rows)
						ids = append(ids, id)
						for range tt.dim {
							rows = append(rows, float32(r.NormFloat64()))
						}
					}
					if err := s.Upsert("m", tt.name, ids, rows); err != nil {
						t.Fatal(err)
					}
					for i, id := range ids { // the last write of an id wins
						copy(ref.rows[tt.name][id*int64(tt.dim):(id+1)*int64(tt.dim)], rows[i*tt.dim:(i+1)*tt.dim])
					}
				}
				if hotBytes < 0 && round == 60 {
					for _, tt := range tabs {
						id := r.Int64N(tt.rows)
						deleteRow(t, s, tt.name, id)
						lost[tt.name] = map[int64]bool{id: true}
					}
				}
				var batch []TableLookup
				touchesLost := false
				for _, tt := range tabs {
					req := TableLookup{Table: tt.name, Pooling: poolings[r.IntN(len(poolings))], Bag: 1 + r.IntN(3)}
					n := req.Bag * (1 + r.IntN(150))
					for range n {
						var id int64
						switch r.IntN(4) {
						case 0:
							id = r.Int64N(10) // a hot head: duplicates
						case 1:
							id = r.Int64N(tt.rows * 3 / 2) // unknown ids past the table
						default:
							id = r.Int64N(tt.rows)
						}
						if tt.unknown == "" && id >= tt.rows {
							id %= tt.rows // the error rule is a case of its own
						}
						req.IDs = append(req.IDs, id)
						eff := id
						if id >= tt.rows && tt.unknown == plan.UnknownHash {
							eff = id % tt.rows
						}
						if lost[tt.name][eff] && (id < tt.rows || tt.unknown == plan.UnknownHash) {
							touchesLost = true
						}
					}
					outRows := n / req.Bag
					if req.Pooling == PoolNone {
						outRows = n
					}
					req.Out = make([]float32, outRows*tt.dim)
					batch = append(batch, req)
				}
				outs, err := runModes(t, s, batch)
				if touchesLost {
					if !errors.Is(err, ErrCorrupt) {
						t.Fatalf("round %d: a lost row read gave %v, want %v", round, err, ErrCorrupt)
					}
					continue
				}
				if err != nil {
					t.Fatalf("round %d: %v", round, err)
				}
				checkWant(t, ref, batch, outs, fmt.Sprintf("round %d", round))
			}
			if m := s.Metrics(); m.PebbleReads == 0 || (hotBytes > 0 && m.HotHits == 0) {
				t.Fatalf("the test did not exercise both tiers: %+v", m)
			}
		})
	}
}

// TestIndexBytesRacesClose: IndexBytes while the store closes answers
// ErrClosed or its figures, never reads a closed Pebble. A store of
// many small SSTs makes each call long (milliseconds), so Close lands
// inside one: before the fix the reader panicked in Pebble's file cache.
func TestIndexBytesRacesClose(t *testing.T) {
	ctx := context.Background()
	p := writePlan(t, "m", []*testTable{{name: "a", rows: 20000, dim: 8, seed: 1}})
	for range 3 {
		s, _ := openMem(t, &Options{Preload: PreloadOff})
		if _, err := s.Ingest(ctx, p, IngestOptions{SSTBytes: 4 << 10}); err != nil {
			t.Fatal(err)
		}
		called := make(chan struct{})
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				_, _, err := s.IndexBytes()
				if i == 0 {
					close(called)
				}
				if err != nil {
					if !errors.Is(err, ErrClosed) {
						t.Errorf("IndexBytes during Close: %v, want ErrClosed", err)
					}
					return
				}
			}
		}()
		<-called // the loop runs: Close comes during one of its calls
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
	}
}
