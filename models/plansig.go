package models

import (
	"fmt"
	"math"
	"strings"

	"github.com/prism-serve/prism/plan"
)

// PlanSignature reads a model's inputs from its plan (plan.json), so
// samples can be drawn for models whose inputs the graph alone does not
// explain (packed ids, ids among float values, offsets into fused
// tables): a float input [batch, k...] is k dense values, except the
// values some lookup reads as ids; an integer input holds ids. Each id
// value's valid range comes from the table it indexes, worked back
// through the lookup's pre-lookup ops (offsets, 1-based ids, hashing,
// clamps). A plain id input whose lookups have no pre-lookup ops gets
// Rows (the smallest table it indexes) and no Ranges, as
// InferSignature gives it. An input the plan's pre.onnx reads for a
// lookup (pre_inputs) is drawn as ids of that lookup's table, every
// value in [0, rows), unless the plan gives its keys (the input's ids
// pass through a key map, plan.TensorInfo.Keys): then among those.
// Other subgraph work is not worked back, so a model whose pre.onnx
// takes other ids is verified on the caller's samples
// (verify.VerifySource).
func PlanSignature(p *plan.Plan) (Signature, error) {
	type use struct {
		rows int64
		l    plan.Lookup
	}
	uses := map[string][]use{}
	for _, t := range p.Tables {
		for _, l := range t.Lookups {
			uses[l.Input] = append(uses[l.Input], use{t.Rows, l})
			// Ids pre.onnx makes (pre_output): no ops to work back
			// through, so every value of every input it reads is drawn
			// as an id of the table, [0, rows), as for a plain input.
			for _, in := range l.PreInputs {
				if in != l.Input {
					uses[in] = append(uses[in], use{t.Rows, l})
				}
			}
		}
	}
	var sig Signature
	for _, in := range p.Inputs {
		if spec, ok := jaggedSpec(p, in); ok {
			sig.Inputs = append(sig.Inputs, spec)
			continue
		}
		width := 1
		for _, d := range in.Shape {
			if d < 0 {
				return sig, fmt.Errorf("plan input %q has an unknown dimension %v", in.Name, in.Shape)
			}
			width *= int(d)
		}
		spec := InputSpec{Name: in.Name, Width: width, Rank1: len(in.Shape) == 0}
		if len(in.Shape) > 1 {
			spec.Dims = append([]int64(nil), in.Shape...)
		}
		integer := strings.HasPrefix(in.DType, "int")
		if integer {
			spec.Kind = SparseKind
		} else if in.DType != "float32" && in.DType != "float" {
			return sig, fmt.Errorf("plan input %q: dtype %q (want float32, int64 or int32)", in.Name, in.DType)
		}
		us := uses[in.Name]
		if len(us) == 0 {
			if integer {
				return sig, fmt.Errorf("plan input %q holds ids but no table looks it up", in.Name)
			}
			sig.Inputs = append(sig.Inputs, spec)
			continue
		}
		plain := integer
		for _, u := range us {
			plain = plain && len(u.l.Pre) == 0
		}
		if plain {
			spec.Rows = us[0].rows
			for _, u := range us[1:] {
				spec.Rows = min(spec.Rows, u.rows)
			}
			if len(in.Keys) > 0 {
				// Ids through a key map: drawn among the keys it sends
				// to valid rows.
				spec.Keys = in.Keys
				spec.Rows = in.Keys[len(in.Keys)-1].Hi
			}
			sig.Inputs = append(sig.Inputs, spec)
			continue
		}
		ranges := make([]IDRange, width)
		read := make([]bool, width)
		for _, u := range us {
			got, err := IDRanges(in, u.l.Pre, u.rows)
			if err != nil {
				return sig, err
			}
			for j, r := range got {
				if !r.IsID() {
					continue
				}
				if read[j] {
					r = IDRange{max(r.Lo, ranges[j].Lo), min(r.Hi, ranges[j].Hi)}
					if !r.IsID() {
						return sig, fmt.Errorf("plan input %q: value %d is read by lookups whose valid ids do not overlap", in.Name, j)
					}
				}
				ranges[j], read[j] = r, true
			}
		}
		for j := range ranges {
			if integer && !read[j] {
				ranges[j] = IDRange{0, 1} // no lookup reads it: any valid id
			}
			spec.Rows = max(spec.Rows, ranges[j].Hi)
		}
		spec.Ranges = ranges
		sig.Inputs = append(sig.Inputs, spec)
	}
	if len(sig.Inputs) == 0 {
		return sig, fmt.Errorf("the plan has no inputs")
	}
	return sig, nil
}

// IDRanges works out, for each value of a sample of input in, the
// values that make valid ids of a table of rows rows once the pre-lookup
// ops have run: [0, rows) worked back through the ops (offsets shift
// it, hashing and clamps widen it so that they are exercised). A value
// the ops do not pick gets the empty range.
func IDRanges(in plan.TensorInfo, ops []plan.PreOp, rows int64) ([]IDRange, error) {
	width := 1
	for _, d := range in.Shape {
		width *= int(d)
	}
	dtype := in.DType
	if dtype == "float" {
		dtype = "float32"
	}
	if _, _, err := plan.PreShape(in.Shape, dtype, ops); err != nil {
		return nil, fmt.Errorf("pre-lookup ops on %q: %w", in.Name, err)
	}
	// src maps each current value of a sample to the input value it
	// comes from; each value op keeps the layout it saw.
	src := make([]int, width)
	for i := range src {
		src[i] = i
	}
	shape := append([]int64(nil), in.Shape...)
	type valueOp struct {
		op  plan.PreOp
		pos map[int]int // input value -> index at this op
	}
	var vops []valueOp
	inner := func() int {
		n := 1
		for _, d := range shape[1:] {
			n *= int(d)
		}
		return n
	}
	for _, op := range ops {
		switch op.Op {
		case plan.PreColumn:
			k := inner()
			src = src[int(op.Index)*k : int(op.Index+1)*k]
			shape = shape[1:]
		case plan.PreSlice:
			k := inner()
			src = src[int(op.Start)*k : int(op.End)*k]
			shape = append([]int64{op.End - op.Start}, shape[1:]...)
		case plan.PreReshape:
			shape = append([]int64(nil), op.Shape...)
		default:
			pos := make(map[int]int, len(src))
			for i, p := range src {
				pos[p] = i
			}
			vops = append(vops, valueOp{op, pos})
		}
	}
	out := make([]IDRange, width)
	for _, p := range src {
		lo, hi := int64(0), rows // [lo, hi)
		for k := len(vops) - 1; k >= 0; k-- {
			op := vops[k].op
			v := int64(0)
			if len(op.Values) == 1 {
				v = op.Values[0]
			} else if len(op.Values) > 1 {
				v = op.Values[vops[k].pos[p]]
			}
			switch op.Op {
			case plan.PreAdd:
				lo, hi = lo-v, hi-v
			case plan.PreSub:
				lo, hi = lo+v, hi+v
			case plan.PreMod:
				if v > 0 && lo <= 0 && hi >= v {
					lo, hi = 0, 4*v // every value hashes to a row: exercise the wrap
				} else if v > 0 {
					lo, hi = max(lo, 0), min(hi, v)
				} else {
					lo, hi = max(lo, v+1), min(hi, 1)
				}
			case plan.PreClip:
				a, b := int64(math.MinInt64), int64(math.MaxInt64)
				if op.Min != nil {
					a = *op.Min
				}
				if op.Max != nil {
					b = *op.Max
				}
				if a >= lo && b < hi && op.Min != nil && op.Max != nil {
					slack := (b-a+1)/4 + 1
					lo, hi = a-slack, b+1+slack
				} else if op.Min == nil && b < hi {
					hi = b + 1 + (b-lo+1)/4 + 1
				} else if op.Max == nil && a >= lo {
					lo = a - (hi-a)/4 - 1
				} else {
					lo, hi = max(lo, a), min(hi, b+1)
				}
			case plan.PreWhereEqual:
				if op.Default >= lo && op.Default < hi {
					if op.Equal == lo-1 {
						lo--
					} else if op.Equal == hi {
						hi++
					}
				}
			case plan.PreCast:
				bound := int64(math.MaxInt64)
				if op.To == "int32" {
					bound = math.MaxInt32
				}
				if in.DType == "float32" || in.DType == "float" {
					bound = min(bound, 1<<24) // float32 holds integers exactly up to 2^24
				}
				lo, hi = max(lo, -bound), min(hi, bound)
			}
			if hi <= lo {
				return nil, fmt.Errorf("pre-lookup ops on %q: no value of input value %d makes a valid id of a table of %d rows", in.Name, p, rows)
			}
		}
		out[p] = IDRange{lo, hi}
	}
	return out, nil
}
