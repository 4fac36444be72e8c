package plan

import "fmt"

// PreOpKind names a native pre-lookup op.
type PreOpKind string

// The pre-lookup ops. Each works on one sample's values, row-major in
// its per-sample shape (the batch dimension left out); "axis 0" below is
// the first per-sample axis (the model's axis 1).
const (
	// PreColumn picks Index along axis 0, dropping the axis
	// (Gather(axis=1) with a scalar index).
	PreColumn PreOpKind = "column"
	// PreSlice keeps [Start, End) along axis 0 (Slice, Split).
	PreSlice PreOpKind = "slice"
	// PreCast converts to To ("int64" or "int32", the latter wrapping
	// as a two's-complement int32); a float becomes an integer by
	// truncation toward zero, as ONNX Cast does. A float outside To's
	// range (or NaN), which ONNX leaves undefined, is an error.
	PreCast PreOpKind = "cast"
	// PreAdd adds Values: one value, or one per element of the sample.
	// On int32 values (an int32 input, or after a cast to int32) the
	// result wraps at 32 bits, as ONNX int32 Add does; so does sub.
	PreAdd PreOpKind = "add"
	// PreSub subtracts Values (one, or one per element).
	PreSub PreOpKind = "sub"
	// PreMod is the integer remainder by Values (one, or one per
	// element), with the sign of the divisor (ONNX Mod, fmod=0).
	PreMod PreOpKind = "mod"
	// PreClip clamps to [Min, Max]; either bound may be absent (Clip,
	// Min, Max).
	PreClip PreOpKind = "clip"
	// PreWhereEqual replaces every value equal to Equal by Default
	// (Where(Equal(x, Equal), Default, x)).
	PreWhereEqual PreOpKind = "where_equal"
	// PreReshape gives the sample the per-sample Shape (same count of
	// values, same order: Reshape, Flatten, Squeeze, Unsqueeze).
	PreReshape PreOpKind = "reshape"
)

// PreOp is one pre-lookup op of a Lookup. Which fields it uses depends
// on Op (see the PreOpKind constants).
type PreOp struct {
	Op     PreOpKind `json:"op"`
	Index  int64     `json:"index,omitempty"`
	Start  int64     `json:"start,omitempty"`
	End    int64     `json:"end,omitempty"`
	To     string    `json:"to,omitempty"`
	Values []int64   `json:"values,omitempty"`
	Min    *int64    `json:"min,omitempty"`
	Max    *int64    `json:"max,omitempty"`
	// Equal and Default of where_equal.
	Equal   int64   `json:"equal,omitempty"`
	Default int64   `json:"default,omitempty"`
	Shape   []int64 `json:"shape,omitempty"`
}

// PreShape follows a per-sample shape (all sizes known) through ops and
// returns the shape of the ids they make, and the element type ("int64",
// "int32" or "float32") of the values at the end, given the input's.
// The error names the first op that does not fit.
func PreShape(in []int64, dtype string, ops []PreOp) ([]int64, string, error) {
	shape := append([]int64(nil), in...)
	count := func() int64 {
		n := int64(1)
		for _, d := range shape {
			n *= d
		}
		return n
	}
	for _, d := range shape {
		if d < 0 {
			return nil, "", fmt.Errorf("input shape %v: pre-lookup ops need every size known", in)
		}
	}
	for i, op := range ops {
		where := fmt.Sprintf("pre[%d] %s", i, op.Op)
		integer := dtype == "int64" || dtype == "int32"
		switch op.Op {
		case PreColumn:
			if len(shape) == 0 || op.Index < 0 || op.Index >= shape[0] {
				return nil, "", fmt.Errorf("%s: index %d outside a sample of shape %v", where, op.Index, shape)
			}
			shape = shape[1:]
		case PreSlice:
			if len(shape) == 0 || op.Start < 0 || op.End <= op.Start || op.End > shape[0] {
				return nil, "", fmt.Errorf("%s: [%d, %d) outside a sample of shape %v", where, op.Start, op.End, shape)
			}
			shape = append([]int64{op.End - op.Start}, shape[1:]...)
		case PreCast:
			if op.To != "int64" && op.To != "int32" {
				return nil, "", fmt.Errorf("%s: to %q, want int64 or int32", where, op.To)
			}
			dtype = op.To
		case PreAdd, PreSub, PreMod:
			if !integer {
				return nil, "", fmt.Errorf("%s: on %s values; arithmetic needs integers (cast first)", where, dtype)
			}
			if n := int64(len(op.Values)); n != 1 && n != count() {
				return nil, "", fmt.Errorf("%s: %d values for a sample of shape %v (want 1 or %d)", where, n, shape, count())
			}
			if op.Op == PreMod {
				for _, v := range op.Values {
					if v == 0 {
						return nil, "", fmt.Errorf("%s: divisor 0", where)
					}
				}
			}
		case PreClip:
			if !integer {
				return nil, "", fmt.Errorf("%s: on %s values; clip needs integers (cast first)", where, dtype)
			}
			if op.Min != nil && op.Max != nil && *op.Min > *op.Max {
				return nil, "", fmt.Errorf("%s: min %d above max %d", where, *op.Min, *op.Max)
			}
		case PreWhereEqual:
			if !integer {
				return nil, "", fmt.Errorf("%s: on %s values; where_equal needs integers (cast first)", where, dtype)
			}
		case PreReshape:
			n := int64(1)
			for _, d := range op.Shape {
				if d < 0 {
					return nil, "", fmt.Errorf("%s: shape %v: sizes must be known", where, op.Shape)
				}
				// Bounded as the inputs are: a product past
				// MaxSampleElements could wrap int64 and pass as equal.
				if d > 0 && n > MaxSampleElements/d {
					return nil, "", fmt.Errorf("%s: shape %v: more than %d values per sample", where, op.Shape, MaxSampleElements)
				}
				n *= d
			}
			if n != count() {
				return nil, "", fmt.Errorf("%s: shape %v holds %d values, the sample %v has %d", where, op.Shape, n, shape, count())
			}
			shape = append([]int64(nil), op.Shape...)
		default:
			return nil, "", fmt.Errorf("%s: unknown op (want column, slice, cast, add, sub, mod, clip, where_equal or reshape)", where)
		}
	}
	return shape, dtype, nil
}
