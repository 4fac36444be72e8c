package models

import (
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
