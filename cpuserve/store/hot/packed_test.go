package hot

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// TestPackedClass: a class holding rows packed (halves, int8), hashed,
// direct and complete, gives back through Gather the floats admitted,
// updated and moved (a delete moves the last slot into the hole). A row
// the form cannot hold exactly (an int8 class given floats that are no
// scale times int8s) is refused by Admit and Load, and an update to one
// drops the resident row rather than serve the old one.
func TestPackedClass(t *testing.T) {
	for _, f := range []struct {
		name  string
		width func(int) int
		dims  []int
		// stored is what a table stored in the form decodes x to.
		stored func(x []float32) []float32
		// bad is a row the form cannot hold; nil if every row fits.
		bad []float32
	}{
		{"half", HalfWidth, []int{1, 7, 16}, func(x []float32) []float32 {
			out := make([]float32, len(x))
			for i, v := range x {
				out[i] = F16ToF32(F32ToF16(v))
			}
			return out
		}, nil},
		{"int8", Int8Width, []int{8, 13, 64}, int8Row, []float32{1, 0.3}},
	} {
		r := rand.New(rand.NewPCG(1, 2))
		for _, dim := range f.dims {
			const rows = 500
			data := make([]float32, 0, rows*dim)
			for range rows {
				x := make([]float32, dim)
				for i := range x {
					x[i] = float32(r.NormFloat64() * 0.05)
				}
				data = append(data, f.stored(x)...)
			}
			row := func(id int64) []float32 { return data[id*int64(dim) : (id+1)*int64(dim)] }
			budget := int64(300 * (dim*4 + slotOverhead))
			for name, c := range map[string]*Class{
				"hashed":   NewClass(f.width(dim), budget),
				"direct":   NewDirectClass(f.width(dim), budget+4*rows, rows),
				"complete": newCompleteClass(f.width(dim), rows),
			} {
				what := f.name + " " + name
				if c.Dim() != dim || c.Width() != f.width(dim) {
					t.Fatalf("%s dim %d: Dim %d, Width %#x", what, dim, c.Dim(), c.Width())
				}
				c.Lock()
				c.Attach(1, rows)
				for id := range int64(rows) {
					k := Key(1, id)
					if name == "complete" {
						c.Load(k, Hash(k), row(id))
					} else {
						c.Admit(k, Hash(k), row(id))
					}
				}
				// An update, and a delete that moves the last slot.
				upd := f.stored(slices.Repeat([]float32{0.5, -0.25}, (dim+1)/2)[:dim])
				k3, k0 := Key(1, 3), Key(1, 0)
				c.Put(k3, Hash(k3), upd)
				copy(data[3*dim:], upd)
				c.Delete(k0, Hash(k0))
				gone := []int32{0}
				if f.bad != nil {
					bad := make([]float32, dim)
					copy(bad, f.bad)
					k7, kb := Key(1, 7), Key(1, rows-1)
					if _, held := c.lookup(k7, Hash(k7)); !held {
						t.Fatalf("%s dim %d: row 7 not held", what, dim)
					}
					c.Put(k7, Hash(k7), bad) // row 7 must go
					c.Delete(kb, Hash(kb))
					if name == "complete" && c.Load(kb, Hash(kb), bad) || name != "complete" && c.Admit(kb, Hash(kb), bad) {
						t.Fatalf("%s dim %d: took a row the form cannot hold", what, dim)
					}
					gone = append(gone, 7, rows-1)
				}
				c.Unlock()
				ids := make([]int64, rows)
				for i := range ids {
					ids[i] = int64(i)
				}
				out := make([]float32, rows*dim)
				c.RLock()
				miss := c.Gather(1, ids, out, make([]int32, rows), nil)
				c.RUnlock()
				held := 0
				for i := range ids {
					if slices.Contains(miss, int32(i)) {
						continue
					}
					held++
					if got := out[i*dim : (i+1)*dim]; !slices.Equal(got, row(int64(i))) {
						t.Fatalf("%s dim %d: row %d = %v, want %v", what, dim, i, got, row(int64(i)))
					}
				}
				for _, g := range gone {
					if !slices.Contains(miss, g) {
						t.Fatalf("%s dim %d: row %d is still held", what, dim, g)
					}
				}
				if held == 0 {
					t.Fatalf("%s dim %d: nothing held", what, dim)
				}
			}
		}
	}
}

// TestPackedClassHoldsMore: in a budget, a packed class of dim-64 rows
// (the larger-than-memory benchmark's) holds more rows than a float32
// class: 128 bytes a row as halves and 68 as int8 against 256, the index
// and sketch's 48 the same for all.
func TestPackedClassHoldsMore(t *testing.T) {
	const budget = 64 << 20
	full := NewClass(64, budget).Stats().Slots
	for _, c := range []struct {
		name  string
		width int
		least float64
	}{{"halves", HalfWidth(64), 1.6}, {"int8", Int8Width(64), 2.4}} {
		n := NewClass(c.width, budget).Stats().Slots
		if float64(n) < c.least*float64(full) {
			t.Fatalf("%d rows as %s, %d as float32 in %d MiB", n, c.name, full, budget>>20)
		}
		t.Logf("%d MiB: %d rows as %s, %d as float32 (%.2fx)", budget>>20, n, c.name, full, float64(n)/float64(full))
	}
}
