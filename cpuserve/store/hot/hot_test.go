package hot

import (
	"math/rand/v2"
	"testing"
)

// TestIndexAgainstMap drives a class of each index form with random
// admissions, updates and deletions and checks every resident row, and
// Gather, against a map model.
func TestIndexAgainstMap(t *testing.T) {
	const dim = 4
	t.Run("hashed", func(t *testing.T) {
		c := NewClass(dim, 200*(dim*4+slotOverhead))
		if c.Direct() {
			t.Fatal("NewClass made a direct class")
		}
		checkIndexAgainstMap(t, c)
	})
	t.Run("direct", func(t *testing.T) {
		const rows = 500
		c := NewDirectClass(dim, 200*(dim*4+directSlotBytes)+4*3*rows+64*8, 3*rows)
		if c == nil || !c.Direct() || c.slots < 150 {
			t.Fatalf("direct class: %+v", c)
		}
		c.Lock()
		for tb := uint32(1); tb <= 3; tb++ {
			c.Attach(tb, rows)
		}
		c.Unlock()
		checkIndexAgainstMap(t, c)
		// A table never attached is never admitted.
		c.Lock()
		defer c.Unlock()
		if c.Admit(Key(9, 1), Hash(Key(9, 1)), make([]float32, dim)) {
			t.Fatal("admitted a row of a table not attached")
		}
		// The dropped table's map is gone and its rows miss.
		if miss := c.Gather(2, []int64{0, 1}, make([]float32, 2*dim), make([]int32, 2), nil); len(miss) != 2 {
			t.Fatalf("dropped table: misses %v", miss)
		}
	})
}

// TestNewTierPicksIndex: a tier that holds most of its tables' rows uses
// direct slot maps; a small one in front of large tables hashes.
func TestNewTierPicksIndex(t *testing.T) {
	const dim = 16
	rows := int64(1 << 20)
	weight := map[int]int64{dim: rows * dim * 4}
	big := NewTier(2*rows*dim*4, weight).Class(dim)
	if big == nil || !big.Direct() || int64(big.slots) != rows {
		t.Fatalf("large tier: direct %v, %d slots for %d rows", big != nil && big.Direct(), big.slots, rows)
	}
	small := NewTier(rows*dim*4/100, weight).Class(dim)
	if small == nil || small.Direct() {
		t.Fatal("a tier of 1% of the rows should hash")
	}
}

func checkIndexAgainstMap(t *testing.T, c *Class) {
	const dim = 4
	model := map[uint64][]float32{}
	r := rand.New(rand.NewPCG(1, 2))
	c.Lock()
	defer c.Unlock()
	for i := range 20000 {
		k := Key(uint32(1+r.IntN(3)), r.Int64N(500))
		h := Hash(k)
		row := []float32{float32(i), 1, 2, 3}
		switch r.IntN(4) {
		case 0:
			c.Delete(k, h)
			delete(model, k)
		case 1:
			c.Put(k, h, row)
			if _, ok := model[k]; ok {
				model[k] = row
			}
		default:
			c.Record([]uint64{h, h, h, h})
			if c.Admit(k, h, row) {
				if _, ok := model[k]; !ok {
					model[k] = row
				}
			}
		}
		// Residents the model does not know were evicted from it too.
		for mk := range model {
			if _, ok := c.Get(mk, Hash(mk)); !ok {
				delete(model, mk)
			}
		}
		if len(model) != c.used {
			t.Fatalf("step %d: %d resident, model has %d", i, c.used, len(model))
		}
	}
	for k, want := range model {
		got, ok := c.Get(k, Hash(k))
		if !ok || got[0] != want[0] {
			t.Fatalf("key %x: got %v %v, want %v", k, got, ok, want)
		}
	}
	// Gather agrees with the model, skips negative ids, reports misses.
	for tb := uint32(1); tb <= 3; tb++ {
		ids := make([]int64, 600)
		for i := range ids {
			ids[i] = r.Int64N(500)
		}
		ids[7] = -1
		out := make([]float32, len(ids)*dim)
		for i := range out {
			out[i] = -7
		}
		miss := c.Gather(tb, ids, out, make([]int32, len(ids)), nil)
		missed := map[int32]bool{}
		for _, p := range miss {
			missed[p] = true
		}
		for i, id := range ids {
			want, ok := model[Key(tb, id)]
			switch {
			case id < 0:
				if missed[int32(i)] || out[i*dim] != -7 {
					t.Fatalf("table %d: negative id touched", tb)
				}
			case ok != !missed[int32(i)]:
				t.Fatalf("table %d id %d: resident %v, missed %v", tb, id, ok, missed[int32(i)])
			case ok && out[i*dim] != want[0]:
				t.Fatalf("table %d id %d: gathered %v, want %v", tb, id, out[i*dim:(i+1)*dim], want)
			}
		}
	}
	c.DeleteTable(2)
	for s := range c.used {
		if c.slotKey[s]>>40 == 2 {
			t.Fatal("DeleteTable left a row")
		}
	}
}

// simulate runs accesses through a class as the store does (count, then
// admit on a miss) and returns the hit ratio of the second half.
func simulate(c *Class, keys []uint64) float64 {
	row := make([]float32, c.Dim())
	hits := 0
	c.Lock()
	defer c.Unlock()
	for i, k := range keys {
		h := Hash(k)
		c.Record([]uint64{h})
		if _, ok := c.Get(k, h); ok {
			if i >= len(keys)/2 {
				hits++
			}
			continue
		}
		c.Admit(k, h, row)
	}
	return float64(hits) / float64(len(keys)-len(keys)/2)
}

// TestPolicyZipfAndScan: on Zipf traffic the tier keeps the head (hit
// ratio near the ideal of caching the top ids), and a long scan of cold
// ids mixed in does not flush it.
func TestPolicyZipfAndScan(t *testing.T) {
	const (
		dim   = 8
		slots = 1000
		ids   = 100000
	)
	r := rand.New(rand.NewPCG(3, 4))
	z := rand.NewZipf(r, 1.2, 1, ids-1)
	var zipf []uint64
	for range 400000 {
		zipf = append(zipf, Key(1, int64(z.Uint64())))
	}
	budget := int64(slots * (dim*4 + slotOverhead))
	base := simulate(NewClass(dim, budget), zipf)

	// The same traffic with a scan over 200k cold ids interleaved 1:1.
	var mixed []uint64
	scan := int64(0)
	for i, k := range zipf {
		mixed = append(mixed, k)
		if i >= len(zipf)/4 {
			mixed = append(mixed, Key(2, scan))
			scan++
		}
	}
	c := NewClass(dim, budget)
	mixedRatio := simulate(c, mixed)
	// Hits among the Zipf accesses only (scan ids never repeat).
	zipfHitsMixed := mixedRatio * float64(len(mixed)-len(mixed)/2) / float64(len(mixed)/2/2)
	t.Logf("zipf hit ratio %.3f; with a scan interleaved %.3f (per zipf access)", base, zipfHitsMixed)
	if base < 0.6 {
		t.Errorf("zipf 1.2 hit ratio %.3f with 1%% of ids cached; TinyLFU should keep the head", base)
	}
	if zipfHitsMixed < base*0.85 {
		t.Errorf("a scan flushed the tier: zipf hit ratio %.3f -> %.3f", base, zipfHitsMixed)
	}
	if s := c.Stats(); s.Rejections == 0 {
		t.Errorf("admission never rejected a scanned row: %+v", s)
	}
}
