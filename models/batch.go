package models

import (
	"fmt"

	"github.com/prism-serve/prism/plan"
)

// InputKind tells dense features from sparse ids.
type InputKind int

const (
	DenseKind InputKind = iota
	SparseKind
	// OffsetsKind is a jagged input's offsets (jagged.go): one int64
	// per sample, the start of its bag.
	OffsetsKind
)

// InputSpec describes one model input per sample.
type InputSpec struct {
	Name string
	Kind InputKind
	// Width: features per sample (dense) or ids per sample (sparse).
	Width int
	// Rank1 marks a [batch] sparse input (one id, no bag axis).
	Rank1 bool
	// Rows is the id range of a sparse input.
	Rows int64
	// Ranges, when set (len Width), gives each value of a sample its own
	// valid range: a packed input whose columns feed different lookups
	// (or reach one through offsets, 1-based ids, clamps), or a float
	// input carrying ids among dense features. A range with Hi <= Lo
	// marks a dense value (a float input's) or a value no lookup reads.
	Ranges []IDRange
	// Keys, when set on a sparse input without Ranges, are the values
	// its ids take (sorted, disjoint ranges): ids that pass through a key
	// map before the lookups (plan.TensorInfo.Keys), where only the keys
	// the map sends to valid rows are valid. Synthetic draws among them
	// (the i-th key of the set for the i-th id of a table of as many
	// rows); Rows is then one past the largest key.
	Keys []plan.KeyRange
	// Dims, when set, is the per-sample shape (for inputs of rank 3 and
	// more; the product is Width).
	Dims []int64
	// Offsets, set on a jagged input (jagged.go), names the OffsetsKind
	// input holding each sample's start in its values; Width is then the
	// most values a sample has (Synthetic draws 1 to Width).
	Offsets string
	// LastOffset, on an OffsetsKind input, appends the number of values
	// as one offset more (include_last_offset=True).
	LastOffset bool
}

// IDRange is the valid ids [Lo, Hi) of one value of a sample.
type IDRange struct{ Lo, Hi int64 }

// IsID says whether the range holds ids (not a dense value).
func (r IDRange) IsID() bool { return r.Hi > r.Lo }

// Shape is the input's shape for a batch of n samples.
func (s InputSpec) Shape(n int) []int64 {
	if s.Dims != nil {
		return append([]int64{int64(n)}, s.Dims...)
	}
	if s.Rank1 {
		return []int64{int64(n)}
	}
	return []int64{int64(n), int64(s.Width)}
}

// Signature is a model's inputs, in graph order.
type Signature struct {
	Inputs []InputSpec
}

// Signature returns the inputs of c's graphs.
func (c *Config) Signature() Signature {
	sig := Signature{Inputs: []InputSpec{{Name: DenseInput, Kind: DenseKind, Width: c.NumDense}}}
	if c.Packed {
		in := InputSpec{Name: PackedInput, Kind: SparseKind, Width: c.NumTables()}
		for _, rows := range c.TableRows {
			in.Ranges = append(in.Ranges, IDRange{Lo: 0, Hi: rows})
			in.Rows = max(in.Rows, rows)
		}
		sig.Inputs = append(sig.Inputs, in)
		return sig
	}
	for k, rows := range c.TableRows {
		sig.Inputs = append(sig.Inputs, InputSpec{Name: SparseInput(k), Kind: SparseKind, Width: c.Bag(k), Rank1: c.BagSizes[k] == 0, Rows: rows})
	}
	return sig
}

// Column is one input's values for a batch: F32 for dense, I64 for sparse,
// n*Width values, sample-major.
type Column struct {
	F32 []float32
	I64 []int64
}

// Batch is n samples of a signature's inputs.
type Batch struct {
	N       int
	Sig     *Signature
	Columns []Column // aligned with Sig.Inputs
}

// Check verifies b against its signature: lengths and id ranges.
func (b *Batch) Check() error {
	if len(b.Columns) != len(b.Sig.Inputs) {
		return fmt.Errorf("batch has %d columns for %d inputs", len(b.Columns), len(b.Sig.Inputs))
	}
	for i, in := range b.Sig.Inputs {
		if in.Offsets != "" || in.Kind == OffsetsKind {
			if err := b.checkJagged(i); err != nil {
				return err
			}
			continue
		}
		col := b.Columns[i]
		want := b.N * in.Width
		switch in.Kind {
		case DenseKind:
			if len(col.F32) != want {
				return fmt.Errorf("input %q: %d values for %d samples of width %d", in.Name, len(col.F32), b.N, in.Width)
			}
			for j, v := range col.F32 {
				if in.Ranges != nil && in.Ranges[j%in.Width].IsID() {
					if r := in.Ranges[j%in.Width]; float64(v) != float64(int64(v)) || int64(v) < r.Lo || int64(v) >= r.Hi {
						return fmt.Errorf("input %q: sample %d: value %d holds id %g outside [%d, %d)", in.Name, j/in.Width, j%in.Width, v, r.Lo, r.Hi)
					}
				}
			}
		case SparseKind:
			if len(col.I64) != want {
				return fmt.Errorf("input %q: %d ids for %d samples of bag %d", in.Name, len(col.I64), b.N, in.Width)
			}
			for j, id := range col.I64 {
				if in.Ranges != nil {
					if r := in.Ranges[j%in.Width]; r.IsID() && (id < r.Lo || id >= r.Hi) {
						return fmt.Errorf("input %q: sample %d: value %d: id %d outside [%d, %d)", in.Name, j/in.Width, j%in.Width, id, r.Lo, r.Hi)
					}
					continue
				}
				if in.Keys != nil {
					if !plan.HasKey(in.Keys, id) {
						return fmt.Errorf("input %q: sample %d: id %d is not one of the input's valid keys", in.Name, j/in.Width, id)
					}
					continue
				}
				if id < 0 || id >= in.Rows {
					return fmt.Errorf("input %q: sample %d: id %d outside table of %d rows", in.Name, j/in.Width, id, in.Rows)
				}
			}
		}
	}
	return nil
}

// Slice returns samples [i, j) of b, sharing its storage.
func (b *Batch) Slice(i, j int) *Batch {
	out := &Batch{N: j - i, Sig: b.Sig, Columns: make([]Column, len(b.Columns))}
	for c, in := range b.Sig.Inputs {
		if in.Offsets != "" || in.Kind == OffsetsKind {
			out.Columns[c] = b.sliceJagged(c, i, j)
			continue
		}
		w := in.Width
		if b.Columns[c].F32 != nil {
			out.Columns[c].F32 = b.Columns[c].F32[i*w : j*w]
		}
		if b.Columns[c].I64 != nil {
			out.Columns[c].I64 = b.Columns[c].I64[i*w : j*w]
		}
	}
	return out
}
