package exporters

import (
	pb "github.com/prism-serve/prism/internal/onnxpb"
	"github.com/prism-serve/prism/models"
)

// Fallback returns the patterns whose id work the native pre-lookup ops
// do not cover (multiply-add hashing, feature crosses, floor-division
// bucketing, shifts and bit masks, absolute values): the partitioner
// cuts that work into pre.onnx, which the embedding tier runs through
// ONNX Runtime before the lookups.
func Fallback(seed uint64) []*Model {
	return []*Model{hashMulAddMod(seed), floorDivBucket(seed), bitmaskShift(seed)}
}

// FallbackBroken returns their broken twins, each with the error the
// partitioner must give.
func FallbackBroken(seed uint64) []*Model {
	return []*Model{floatHash(seed), divisorInput(seed)}
}

// hashMulAddMod: ids hashed by multiply-add-mod, (ids * A + B) % M (a
// hashing trick for unbounded ids: torch.onnx symbolic_opset9.py mul
// and add, a Python int as a Constant int64 scalar; symbolic_opset10.py
// remainder, Mod fmod=0), and a feature cross of two id columns,
// (a * 50 + b) % 113 (Add of two id tensors), each column picked by
// select (Gather axis 1); opset 13.
func hashMulAddMod(seed uint64) *Model {
	m := &Model{Name: "ts-hash-mul-add-mod", Source: "torch/onnx/symbolic_opset9.py: mul, add, select; symbolic_opset10.py: remainder (opset 13)"}
	b := newBuilder("main_graph", 13, seed)
	ids := b.input("ids", pb.TensorProto_INT64, 2)
	dense := b.input("dense", pb.TensorProto_FLOAT, 2)
	th, tc := b.table("hash.weight", 97, dim), b.table("cross.weight", 113, dim)
	col := func(k int64) string { return b.node("Gather", []string{ids, b.constI(nil, k)}, ai("axis", 1)) }
	a, c := col(0), col(1)
	h := b.node("Mod", []string{b.node("Add", []string{b.node("Mul", []string{a, b.constI(nil, 2654435761)}), b.constI(nil, 7)}), b.constI(nil, 97)}, ai("fmod", 0))
	x := b.node("Mod", []string{b.node("Add", []string{b.node("Mul", []string{a, b.constI(nil, 50)}), c}), b.constI(nil, 113)}, ai("fmod", 0))
	e0 := b.node("Gather", []string{"hash.weight", h})
	e1 := b.node("Gather", []string{"cross.weight", x})
	m.Sig = models.Signature{Inputs: []models.InputSpec{
		ranged("ids", models.SparseKind, rng(0, 1000000), rng(0, 50)),
		{Name: "dense", Kind: models.DenseKind, Width: 2},
	}}
	m.feats = func(s sample) []float64 {
		a, c := s.id(0, 0), s.id(0, 1)
		v := append(row64(th, (a*2654435761+7)%97), row64(tc, (a*50+c)%113)...)
		return append(v, s.f(1, 0), s.f(1, 1))
	}
	b.finish(m, []string{e0, e1, dense}, 2*dim+2)
	return m
}

// floorDiv writes self // k for an int64 self and a positive constant
// k as torch.onnx exports it (symbolic_opset10.py _floor_divide, the
// integer branch: Div truncates, so one is subtracted where the signs
// differ and the remainder is not 0), with torch.onnx.export's default
// do_constant_folding=True: Less(k, 0), on constants alone, is folded
// into a bool initializer.
func (b *builder) floorDiv(self string, k int64) string {
	other := b.constI(nil, k)
	folded := b.fresh("onnx::Xor")
	b.g.Initializer = append(b.g.Initializer, &pb.TensorProto{Name: folded, DataType: int32(pb.TensorProto_BOOL), Int32Data: []int32{0}})
	div := b.node("Div", []string{self, other})
	zero := b.constI(nil, 0)
	negative := b.node("Xor", []string{b.node("Less", []string{self, zero}), folded})
	mod := b.node("Mod", []string{self, other}, ai("fmod", 0))
	mask := b.node("And", []string{negative, b.node("Not", []string{b.node("Equal", []string{mod, zero})})})
	fixup := b.node("Sub", []string{div, b.constI(nil, 1)})
	return b.node("Where", []string{mask, fixup, div})
}

// floorDivBucket: ids bucketed by floor division (user_id // 1000: a
// coarse id, torch.floor_divide, see floorDiv) for a [batch] id, and
// for a bag of item ids pooled by mean (embedding(items // 1000)
// .mean(1): Gather, ReduceMean with the axes attribute); opset 13.
func floorDivBucket(seed uint64) *Model {
	m := &Model{Name: "ts-floor-div-bucket", Source: "torch/onnx/symbolic_opset10.py: _floor_divide (integer branch), constant folding; symbolic_opset9.py: mean (opset 13)"}
	b := newBuilder("main_graph", 13, seed)
	user := b.input("user", pb.TensorProto_INT64)
	items := b.input("items", pb.TensorProto_INT64, 3)
	tu, ti := b.table("user_bucket.weight", 40, dim), b.table("item_bucket.weight", 25, dim)
	e0 := b.node("Gather", []string{"user_bucket.weight", b.floorDiv(user, 1000)})
	e1 := b.node("ReduceMean", []string{b.node("Gather", []string{"item_bucket.weight", b.floorDiv(items, 1000)})}, ais("axes", 1), ai("keepdims", 0))
	m.Sig = models.Signature{Inputs: []models.InputSpec{
		{Name: "user", Kind: models.SparseKind, Width: 1, Rank1: true, Rows: 40000},
		ranged("items", models.SparseKind, rng(0, 25000), rng(0, 25000), rng(0, 25000)),
	}}
	m.feats = func(s sample) []float64 {
		it := []int64{s.id(1, 0) / 1000, s.id(1, 1) / 1000, s.id(1, 2) / 1000}
		return append(row64(tu, s.id(0, 0)/1000), pool(ti, it, "mean")...)
	}
	b.finish(m, []string{e0, e1}, 2*dim)
	return m
}

// bitmaskShift: bucketing by bits, (ids >> 4) & 63 (torch.onnx
// symbolic_opset9.py __rshift_: Div by Cast(Pow(2.0, shift)), which
// do_constant_folding folds to an int64 initializer 16;
// symbolic_opset18.py __and_ / bitwise_and: BitwiseAnd on integers),
// an absolute offset torch.abs(delta) (symbolic_opset9.py abs: Abs),
// and a hashed id carried in a float input beside dense values,
// (x[:, 2:3].long().squeeze(1) * 31) % 53 (Slice and Squeeze with
// input operands, Cast: symbolic_opset9.py to); opset 18.
func bitmaskShift(seed uint64) *Model {
	m := &Model{Name: "ts-bitmask-shift", Source: "torch/onnx/symbolic_opset9.py: __rshift_, abs, to, mul; symbolic_opset18.py: __and_ (BitwiseAnd); symbolic_opset10.py: slice, remainder (opset 18)"}
	b := newBuilder("main_graph", 18, seed)
	ids := b.input("ids", pb.TensorProto_INT64)
	delta := b.input("delta", pb.TensorProto_INT64)
	x := b.input("x", pb.TensorProto_FLOAT, 3)
	tb, ta, th := b.table("bits.weight", 64, dim), b.table("abs.weight", 30, dim), b.table("fhash.weight", 53, dim)
	pow2 := b.initI(b.fresh("onnx::Div"), nil, 16)
	bits := b.node("BitwiseAnd", []string{b.node("Div", []string{ids, pow2}), b.constI(nil, 63)})
	e0 := b.node("Gather", []string{"bits.weight", bits})
	e1 := b.node("Gather", []string{"abs.weight", b.node("Abs", []string{delta})})
	one := []int64{1}
	dns := b.node("Slice", []string{x, b.constI(one, 0), b.constI(one, 2), b.constI(one, 1), b.constI(one, 1)})
	idf := b.node("Slice", []string{x, b.constI(one, 2), b.constI(one, 3), b.constI(one, 1), b.constI(one, 1)})
	id := b.node("Squeeze", []string{b.node("Cast", []string{idf}, ai("to", int64(pb.TensorProto_INT64))), b.constI(one, 1)})
	h := b.node("Mod", []string{b.node("Mul", []string{id, b.constI(nil, 31)}), b.constI(nil, 53)}, ai("fmod", 0))
	e2 := b.node("Gather", []string{"fhash.weight", h})
	m.Sig = models.Signature{Inputs: []models.InputSpec{
		{Name: "ids", Kind: models.SparseKind, Width: 1, Rank1: true, Rows: 1 << 20},
		{Name: "delta", Kind: models.SparseKind, Width: 1, Rank1: true, Ranges: []models.IDRange{rng(-29, 30)}, Rows: 30},
		ranged("x", models.DenseKind, rng(0, 0), rng(0, 0), rng(0, 5000)),
	}}
	m.feats = func(s sample) []float64 {
		d := s.id(1, 0)
		if d < 0 {
			d = -d
		}
		v := append(row64(tb, (s.id(0, 0)>>4)&63), row64(ta, d)...)
		v = append(v, row64(th, (int64(s.f(2, 2))*31)%53)...)
		return append(v, s.f(2, 0), s.f(2, 1))
	}
	b.finish(m, []string{e0, e1, e2, dns}, 3*dim+2)
	return m
}

// floatHash: the twin of ts-bitmask-shift's float-carried id whose id
// is computed in float ((x * 100.0).long() % 50: a float Mul before the
// Cast), which no integer work makes.
func floatHash(seed uint64) *Model {
	m := &Model{Name: "broken-float-hash", WantErr: `indices come from a float Mul`}
	b := newBuilder("main_graph", 13, seed)
	x := b.input("x", pb.TensorProto_FLOAT)
	b.table("emb", 50, dim)
	scale := b.node("Constant", nil, &pb.AttributeProto{Name: "value", Type: pb.AttributeProto_TENSOR, T: &pb.TensorProto{DataType: int32(pb.TensorProto_FLOAT), FloatData: []float32{100}}})
	id := b.node("Cast", []string{b.node("Mul", []string{x, scale})}, ai("to", int64(pb.TensorProto_INT64)))
	e := b.node("Gather", []string{"emb", b.node("Mod", []string{id, b.constI(nil, 50)}, ai("fmod", 0))})
	m.Sig = models.Signature{Inputs: []models.InputSpec{{Name: "x", Kind: models.DenseKind, Width: 1, Rank1: true}}}
	b.finish(m, []string{e}, dim)
	m.feats = nil
	return m
}

// divisorInput: ids bucketed by a divisor the request gives (ids //
// width, both inputs): a divisor of 0 would stop the embedding tier, so
// the work is refused.
func divisorInput(seed uint64) *Model {
	m := &Model{Name: "broken-divisor-input", WantErr: `its divisor "width" is not a constant`}
	b := newBuilder("main_graph", 13, seed)
	ids := b.input("ids", pb.TensorProto_INT64)
	width := b.input("width", pb.TensorProto_INT64)
	b.table("emb", 50, dim)
	e := b.node("Gather", []string{"emb", b.node("Div", []string{ids, width})})
	b.finish(m, []string{e}, dim)
	m.feats = nil
	return m
}
