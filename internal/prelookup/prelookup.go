// Package prelookup runs a lookup's pre-lookup ops (plan.PreOp: column
// pick, slice, cast, offset add, sub, mod, clip, where-equal-default,
// reshape) natively on a batch of one model input, making the ids the
// lookup reads. The embedding tier runs it before its store lookups and
// partitioner/verify before its reference lookups, so both execute the
// ops the same way.
package prelookup

import (
	"fmt"
	"math"

	"github.com/prism-serve/prism/plan"
)

// Program is a lookup's pre-lookup ops checked against its input.
type Program struct {
	ops []step
	// InWidth is the input's values per sample; Width the ids' per sample.
	InWidth, Width int
	float          bool // the input is float32
}

type step struct {
	op    plan.PreOp
	width int // values per sample before the op
	inner int // values per index of axis 0 (column, slice)
	// i32: the values are int32 before the op (an int32 input, or a cast
	// to int32), so add and sub wrap at 32 bits as ONNX int32 does.
	i32 bool
}

// Compile checks ops against the input in (per-sample shape fully
// known, dtype int64, int32 or float32) and prepares them to run.
func Compile(in plan.TensorInfo, ops []plan.PreOp) (*Program, error) {
	p := &Program{float: in.DType == "float32" || in.DType == "float"}
	shape := append([]int64(nil), in.Shape...)
	dtype := in.DType
	if dtype == "float" {
		dtype = "float32"
	}
	width := func(s []int64) int {
		n := 1
		for _, d := range s {
			n *= int(d)
		}
		return n
	}
	_, outType, err := plan.PreShape(shape, dtype, ops)
	if err != nil {
		return nil, fmt.Errorf("pre-lookup ops on %q: %w", in.Name, err)
	}
	if outType != "int64" && outType != "int32" {
		return nil, fmt.Errorf("pre-lookup ops on %q end in %s values, want integer ids", in.Name, outType)
	}
	for _, d := range shape {
		if d < 0 || (d > 0 && int64(width(shape)) > plan.MaxSampleElements) {
			return nil, fmt.Errorf("pre-lookup ops on %q: input shape %v: unknown or more than %d values per sample", in.Name, in.Shape, plan.MaxSampleElements)
		}
	}
	p.InWidth = width(shape)
	for _, op := range ops {
		st := step{op: op, width: width(shape), i32: dtype == "int32"}
		if op.Op == plan.PreCast {
			dtype = op.To
		}
		// Every copy stays inside its sample (PreShape bounded the
		// shapes; this keeps Run from slicing out of range whatever
		// reached it).
		inRange := func(off, k int64) error {
			if len(shape) == 0 || off < 0 || k < 0 || off > int64(st.width) || k > int64(st.width)-off {
				return fmt.Errorf("pre-lookup ops on %q: %s reads values %d..%d of a sample of %d", in.Name, op.Op, off, off+k, st.width)
			}
			return nil
		}
		switch op.Op {
		case plan.PreColumn:
			if len(shape) == 0 {
				return nil, fmt.Errorf("pre-lookup ops on %q: column of a scalar", in.Name)
			}
			st.inner = width(shape[1:])
			if err := inRange(op.Index*int64(st.inner), int64(st.inner)); err != nil {
				return nil, err
			}
			shape = shape[1:]
		case plan.PreSlice:
			if len(shape) == 0 {
				return nil, fmt.Errorf("pre-lookup ops on %q: slice of a scalar", in.Name)
			}
			st.inner = width(shape[1:])
			if err := inRange(op.Start*int64(st.inner), (op.End-op.Start)*int64(st.inner)); err != nil {
				return nil, err
			}
			shape = append([]int64{op.End - op.Start}, shape[1:]...)
		case plan.PreReshape:
			shape = append([]int64(nil), op.Shape...)
		}
		p.ops = append(p.ops, st)
	}
	p.Width = width(shape)
	return p, nil
}

// Run applies the ops to n samples of the input, given as f32 (a float32
// input) or i64 (an integer input), and returns n*Width ids.
func (p *Program) Run(n int, f32 []float32, i64 []int64) ([]int64, error) {
	var fv []float32
	var iv []int64
	if p.float {
		if len(f32) != n*p.InWidth {
			return nil, fmt.Errorf("%d values for %d samples of %d", len(f32), n, p.InWidth)
		}
		fv = f32
	} else {
		if len(i64) != n*p.InWidth {
			return nil, fmt.Errorf("%d ids for %d samples of %d", len(i64), n, p.InWidth)
		}
		iv = i64
	}
	return p.run(n, fv, iv, p.ops)
}

// FirstColumn says whether the program starts by picking one value per
// sample (x[:, k] of a [batch, F] integer input), and which: its input
// can then be split into columns once for every lookup that picks from
// it (Columns, RunColumn) instead of once per lookup.
func (p *Program) FirstColumn() (int, bool) {
	if p.float || len(p.ops) == 0 || p.ops[0].op.Op != plan.PreColumn || p.ops[0].inner != 1 {
		return 0, false
	}
	return int(p.ops[0].op.Index), true
}

// FirstColumnOK is FirstColumn of a program that may be nil (a lookup
// without pre-lookup ops): false for nil.
func (p *Program) FirstColumnOK() (int, bool) {
	if p == nil {
		return 0, false
	}
	return p.FirstColumn()
}

// RunColumn runs a program that starts with a column pick (FirstColumn)
// on that column, already split from the input by Columns: n ids, shared
// (an op that changes them copies them first).
func (p *Program) RunColumn(n int, col []int64) ([]int64, error) {
	if _, ok := p.FirstColumn(); !ok {
		return nil, fmt.Errorf("RunColumn of a program that does not start with a column pick")
	}
	if len(col) != n {
		return nil, fmt.Errorf("a column of %d ids for %d samples", len(col), n)
	}
	return p.run(n, nil, col, p.ops[1:])
}

// Columns splits n samples of a [batch, w] integer input into its w
// columns, column-major (column k is out[k*n:(k+1)*n]), in one pass
// over the input: what every lookup picking a column of the same input
// reads, where w strided passes (one per lookup) each touched every
// cache line of it (BenchmarkPackedColumns).
//
// The columns are written into buf when it has room for them (the
// caller's reused buffer: fresh memory for every micro-batch costs more
// in page faults than the split itself), else into a new slice.
func Columns(n, w int, in, buf []int64) ([]int64, error) {
	if n < 0 || w <= 0 || len(in) != n*w {
		return nil, fmt.Errorf("%d ids for %d samples of %d", len(in), n, w)
	}
	out := buf[:0]
	if cap(out) < n*w {
		out = make([]int64, n*w)
	}
	out = out[:n*w]
	// In blocks of 8 samples: the block's rows stay in the L1 cache while
	// each column gets one cache line of them (writing a whole row at a
	// time would touch w lines n*8 bytes apart, which alias in the
	// cache when n*8 is a multiple of 4 KiB).
	const block = 8
	for s0 := 0; s0 < n; s0 += block {
		rows := in[s0*w : min(s0+block, n)*w]
		m := len(rows) / w
		for k := range w {
			col := out[k*n+s0 : k*n+s0+m]
			for j := range col {
				col[j] = rows[j*w+k]
			}
		}
	}
	return out, nil
}

// run applies ops to the values of n samples, fv (float32) or iv (ids,
// shared: copied before an op changes them).
func (p *Program) run(n int, fv []float32, iv []int64, ops []step) ([]int64, error) {
	owned := false // iv is ours to change in place
	for _, st := range ops {
		op := st.op
		switch op.Op {
		case plan.PreColumn:
			if fv != nil {
				fv = pick(fv, n, st.width, int(op.Index)*st.inner, st.inner)
			} else {
				iv, owned = pick(iv, n, st.width, int(op.Index)*st.inner, st.inner), true
			}
		case plan.PreSlice:
			k := int(op.End-op.Start) * st.inner
			if fv != nil {
				fv = pick(fv, n, st.width, int(op.Start)*st.inner, k)
			} else {
				iv, owned = pick(iv, n, st.width, int(op.Start)*st.inner, k), true
			}
		case plan.PreReshape:
		case plan.PreCast:
			if fv != nil {
				// A float outside the target type has no ONNX value
				// (ONNX Runtime on x86 makes every such float, 3e9 or
				// 5e9, the type's minimum): refused, as NaN is, rather
				// than wrapped to ids the whole model never reads.
				lim := float32(0x1p63)
				if op.To == "int32" {
					lim = 0x1p31
				}
				out := make([]int64, len(fv))
				for i, v := range fv {
					if math.IsNaN(float64(v)) || v >= lim || v < -lim {
						return nil, fmt.Errorf("sample %d: id %g is not an integer in range of %s", i/st.width, v, op.To)
					}
					out[i] = int64(v)
				}
				iv, fv, owned = out, nil, true
			}
			if op.To == "int32" {
				iv, owned = own(iv, owned)
				for i, v := range iv {
					iv[i] = int64(int32(v))
				}
			}
		case plan.PreAdd, plan.PreSub, plan.PreMod:
			iv, owned = own(iv, owned)
			vals := op.Values
			for i := range iv {
				b := vals[0]
				if len(vals) > 1 {
					b = vals[i%st.width]
				}
				switch op.Op {
				case plan.PreAdd:
					iv[i] += b
					if st.i32 {
						iv[i] = int64(int32(iv[i]))
					}
				case plan.PreSub:
					iv[i] -= b
					if st.i32 {
						iv[i] = int64(int32(iv[i]))
					}
				default:
					r := iv[i] % b
					if r != 0 && (r < 0) != (b < 0) {
						r += b
					}
					iv[i] = r
				}
			}
		case plan.PreClip:
			iv, owned = own(iv, owned)
			for i, v := range iv {
				if op.Min != nil && v < *op.Min {
					v = *op.Min
				}
				if op.Max != nil && v > *op.Max {
					v = *op.Max
				}
				iv[i] = v
			}
		case plan.PreWhereEqual:
			iv, owned = own(iv, owned)
			for i, v := range iv {
				if v == op.Equal {
					iv[i] = op.Default
				}
			}
		}
	}
	// Unless an op copied them, the ids are the input's, shared.
	return iv, nil
}

// pick copies, from each sample of width w, k values from offset off.
func pick[T any](in []T, n, w, off, k int) []T {
	out := make([]T, n*k)
	if k == 1 && n > 0 {
		// One column (x[:, k], the common case): a strided load per
		// sample, not a copy call (1.8x on a [512, 26] batch:
		// BenchmarkPackedColumns).
		in = in[off : off+(n-1)*w+1]
		for s := range out {
			out[s] = in[s*w]
		}
		return out
	}
	for s := range n {
		copy(out[s*k:(s+1)*k], in[s*w+off:s*w+off+k])
	}
	return out
}

// own returns v as a slice the caller may change: v itself when owned.
func own(v []int64, owned bool) ([]int64, bool) {
	if owned {
		return v, true
	}
	return append([]int64(nil), v...), true
}
