package models

import (
	"fmt"
	"slices"

	"github.com/prism-serve/prism/plan"
)

// Jagged inputs are torch.nn.EmbeddingBag's with offsets: an input
// whose column holds every sample's values concatenated (ids, or one
// weight per id) and an OffsetsKind input holding each sample's start
// in it, offsets[0] = 0 and never decreasing (with LastOffset one more,
// the number of values). Sample s's values run from offsets[s] to
// offsets[s+1], the last sample's to the end.

// JaggedBag is the most ids a sample of a jagged input has in the
// signatures PlanSignature reads (Synthetic draws 1 to JaggedBag).
const JaggedBag = 8

// jaggedSpec is the signature of a plan input that is jagged or holds
// a jagged input's offsets (ok false for any other input).
func jaggedSpec(p *plan.Plan, in plan.TensorInfo) (InputSpec, bool) {
	if p.IsOffsets(in.Name) {
		return InputSpec{Name: in.Name, Kind: OffsetsKind, Width: 1, Rank1: true, LastOffset: p.LastOffset(in.Name)}, true
	}
	if in.Offsets == "" {
		return InputSpec{}, false
	}
	spec := InputSpec{Name: in.Name, Kind: DenseKind, Width: JaggedBag, Offsets: in.Offsets}
	for _, t := range p.Tables {
		for _, l := range t.Lookups {
			if l.Input == in.Name {
				spec.Kind = SparseKind
				if spec.Rows == 0 || t.Rows < spec.Rows {
					spec.Rows = t.Rows
				}
			}
		}
	}
	return spec, true
}

// offsetsOf is the column of the offsets input of jagged input i.
func (b *Batch) offsetsOf(i int) int {
	return slices.IndexFunc(b.Sig.Inputs, func(s InputSpec) bool { return s.Name == b.Sig.Inputs[i].Offsets })
}

// Bag is sample s's values [lo, hi) in the column of jagged input i.
func (b *Batch) Bag(i, s int) (lo, hi int) {
	off := b.Columns[b.offsetsOf(i)].I64
	n := b.Columns[i].len()
	lo, hi = int(off[s]), n
	if s+1 < len(off) {
		hi = int(off[s+1])
	}
	return lo, hi
}

func (c Column) len() int { return max(len(c.F32), len(c.I64)) }

// Shape is input i's shape in b: [n, ...] for a batched input, [values]
// for a jagged one, [n] or [n+1] (LastOffset) for offsets.
func (b *Batch) Shape(i int) []int64 {
	in := b.Sig.Inputs[i]
	switch {
	case in.Offsets != "":
		return []int64{int64(b.Columns[i].len())}
	case in.Kind == OffsetsKind:
		return []int64{int64(len(b.Columns[i].I64))}
	}
	return in.Shape(b.N)
}

// sliceJagged is column c for samples [i, j): a jagged input's values
// of those samples, or their offsets rebased to start at 0.
func (b *Batch) sliceJagged(c, i, j int) Column {
	in := b.Sig.Inputs[c]
	if in.Kind == OffsetsKind {
		off := b.Columns[c].I64
		var total int64
		for k, s := range b.Sig.Inputs {
			if s.Offsets == in.Name {
				total = int64(b.Columns[k].len())
				break
			}
		}
		end := total
		if j < len(off) {
			end = off[j]
		}
		out := make([]int64, 0, j-i+1)
		for _, o := range off[i:j] {
			out = append(out, o-off[i])
		}
		if in.LastOffset {
			out = append(out, end-off[i])
		}
		return Column{I64: out}
	}
	lo, _ := b.Bag(c, i)
	hi := b.Columns[c].len()
	if j < b.N {
		hi, _ = b.Bag(c, j)
	}
	var out Column
	if b.Columns[c].F32 != nil {
		out.F32 = b.Columns[c].F32[lo:hi]
	}
	if b.Columns[c].I64 != nil {
		out.I64 = b.Columns[c].I64[lo:hi]
	}
	return out
}

// checkJagged checks column i, jagged or offsets: offsets one per
// sample (one more with LastOffset, the number of values), starting at
// 0, never decreasing, within the values; ids in range.
func (b *Batch) checkJagged(i int) error {
	in := b.Sig.Inputs[i]
	if in.Kind == OffsetsKind {
		return nil // checked with the inputs jagged over them
	}
	k := b.offsetsOf(i)
	if k < 0 || b.Sig.Inputs[k].Kind != OffsetsKind {
		return fmt.Errorf("input %q: offsets %q is not an offsets input of the signature", in.Name, in.Offsets)
	}
	off, n := b.Columns[k].I64, b.Columns[i].len()
	want := b.N
	if b.Sig.Inputs[k].LastOffset {
		want++
	}
	if err := CheckOffsets(off, want, n, b.Sig.Inputs[k].LastOffset); err != nil {
		return fmt.Errorf("input %q: offsets %q: %w", in.Name, in.Offsets, err)
	}
	if in.Kind == SparseKind {
		for j, id := range b.Columns[i].I64 {
			if id < 0 || id >= in.Rows {
				return fmt.Errorf("input %q: value %d: id %d outside table of %d rows", in.Name, j, id, in.Rows)
			}
		}
	}
	return nil
}

// CheckOffsets checks offsets of want values over n jagged values: the
// first 0, never decreasing, none past n, and with last the final one n.
func CheckOffsets(off []int64, want, n int, last bool) error {
	switch {
	case len(off) != want:
		return fmt.Errorf("%d offsets, want %d", len(off), want)
	case want > 0 && off[0] != 0:
		return fmt.Errorf("the first offset is %d, want 0", off[0])
	case last && want > 0 && off[want-1] != int64(n):
		return fmt.Errorf("the last offset is %d, want the number of values %d", off[want-1], n)
	}
	for s := 1; s < len(off); s++ {
		if off[s] < off[s-1] {
			return fmt.Errorf("offset %d is %d, less than offset %d (%d): offsets never decrease", s, off[s], s-1, off[s-1])
		}
	}
	if len(off) > 0 && off[len(off)-1] > int64(n) {
		return fmt.Errorf("offset %d is %d, past the %d values", len(off)-1, off[len(off)-1], n)
	}
	return nil
}

// bagWidths is, per offsets input, the largest Width of the inputs
// jagged over it: its bags hold 1 to that many values.
func (s *Synthetic) bagWidths() map[string]int {
	out := map[string]int{}
	for _, in := range s.sig.Inputs {
		if in.Kind != OffsetsKind {
			continue
		}
		most := 1
		for _, v := range s.sig.Inputs {
			if v.Offsets == in.Name {
				most = max(most, v.Width)
			}
		}
		out[in.Name] = most
	}
	return out
}

// drawJagged appends a bag of l values of jagged input i to c: ids, or
// per-id weights.
func (s *Synthetic) drawJagged(c *Column, i int, in InputSpec, l int) {
	for range l {
		switch {
		case in.Kind != SparseKind:
			c.F32 = append(c.F32, float32(0.25+1.5*s.r.Float64()))
		case s.opts.Uniform:
			c.I64 = append(c.I64, s.r.Int64N(in.Rows))
		default:
			c.I64 = append(c.I64, s.perms[i].id(s.zipfs[i].Rank()))
		}
	}
}
