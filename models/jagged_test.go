package models

import (
	"reflect"
	"slices"
	"strings"
	"testing"
)

// TestJaggedBatch: a jagged signature's batches draw bags of 1 to Width
// values, check their offsets, and slice to the samples' values with the
// offsets rebased (and the last offset kept for LastOffset).
func TestJaggedBatch(t *testing.T) {
	for _, last := range []bool{false, true} {
		sig := Signature{Inputs: []InputSpec{
			{Name: "indices", Kind: SparseKind, Width: 5, Rows: 40, Offsets: "offsets"},
			{Name: "offsets", Kind: OffsetsKind, Width: 1, Rank1: true, LastOffset: last},
			{Name: "psw", Kind: DenseKind, Width: 5, Offsets: "offsets"},
			{Name: "dense", Kind: DenseKind, Width: 2},
		}}
		src, err := NewSynthetic(sig, SyntheticOptions{Seed: 3})
		if err != nil {
			t.Fatal(err)
		}
		b, _ := src.Next(50)
		if err := b.Check(); err != nil {
			t.Fatal(err)
		}
		off := b.Columns[1].I64
		total := len(b.Columns[0].I64)
		if want := 50 + btoi(last); len(off) != want || len(b.Columns[2].F32) != total {
			t.Fatalf("last=%v: %d offsets, %d ids, %d weights", last, len(off), total, len(b.Columns[2].F32))
		}
		for s := range 50 {
			lo, hi := b.Bag(0, s)
			if n := hi - lo; n < 1 || n > 5 {
				t.Fatalf("sample %d: bag of %d, want 1 to 5", s, n)
			}
		}
		if got := b.Shape(0); !slices.Equal(got, []int64{int64(total)}) {
			t.Fatalf("shape of the ids %v", got)
		}
		if got := b.Shape(1); !slices.Equal(got, []int64{int64(len(off))}) {
			t.Fatalf("shape of the offsets %v", got)
		}
		sub := b.Slice(10, 20)
		if err := sub.Check(); err != nil {
			t.Fatalf("last=%v: slice: %v", last, err)
		}
		lo, _ := b.Bag(0, 10)
		_, hi := b.Bag(0, 19)
		if !slices.Equal(sub.Columns[0].I64, b.Columns[0].I64[lo:hi]) || !slices.Equal(sub.Columns[2].F32, b.Columns[2].F32[lo:hi]) {
			t.Fatalf("slice holds other values")
		}
		if o := sub.Columns[1].I64; o[0] != 0 || o[5] != off[15]-off[10] || len(o) != 10+btoi(last) {
			t.Fatalf("slice offsets %v from %v", o, off[10:21])
		}
		// Bad offsets are named.
		b.Columns[1].I64[3] = b.Columns[1].I64[2] - 1
		if err := b.Check(); err == nil || !strings.Contains(err.Error(), "offsets never decrease") {
			t.Fatalf("decreasing offsets: %v", err)
		}
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// TestSyntheticSampleIndependentOfN: sample k of a seed is the same
// whatever the number of samples drawn with it (prism score --samples
// N --show 1 showed another sample 0 for every N), for plain, packed
// (per-value ranges) and jagged inputs; and n samples drawn at once are
// n draws of one.
func TestSyntheticSampleIndependentOfN(t *testing.T) {
	jagged := Signature{Inputs: []InputSpec{
		{Name: "indices", Kind: SparseKind, Width: 5, Rows: 40, Offsets: "offsets"},
		{Name: "offsets", Kind: OffsetsKind, Width: 1, Rank1: true, LastOffset: true},
		{Name: "psw", Kind: DenseKind, Width: 5, Offsets: "offsets"},
		{Name: "dense", Kind: DenseKind, Width: 2},
	}}
	sigs := map[string]Signature{"jagged": jagged}
	for _, name := range []string{"dlrm-tiny", "dlrm-tiny-packed"} {
		p, err := Lookup(name)
		if err != nil {
			t.Fatal(err)
		}
		sigs[name] = p.Config.Signature()
	}
	for name, sig := range sigs {
		for _, uniform := range []bool{false, true} {
			draw := func(sizes ...int) []*Batch {
				src, err := NewSynthetic(sig, SyntheticOptions{Seed: 7, Uniform: uniform})
				if err != nil {
					t.Fatal(err)
				}
				var parts []*Batch
				for _, n := range sizes {
					b, err := src.Next(n)
					if err != nil {
						t.Fatal(err)
					}
					parts = append(parts, b)
				}
				return parts
			}
			three := draw(3)[0]
			if !reflect.DeepEqual(three.Slice(0, 3), draw(300)[0].Slice(0, 3)) {
				t.Errorf("%s uniform=%v: the first 3 samples differ between draws of 3 and of 300", name, uniform)
			}
			for k, one := range draw(1, 1, 1) {
				if !reflect.DeepEqual(one.Slice(0, 1), three.Slice(k, k+1)) {
					t.Errorf("%s uniform=%v: sample %d drawn alone differs from drawn with others", name, uniform, k)
				}
			}
		}
	}
}
