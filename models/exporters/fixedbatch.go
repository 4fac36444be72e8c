package exporters

import (
	pb "github.com/prism-serve/prism/internal/onnxpb"
	"github.com/prism-serve/prism/models"
	"github.com/prism-serve/prism/plan"
)

// FixedBatch returns the corpus's models exported without dynamic axes
// (torch.onnx.export(model, args, f) with no dynamic_axes): the batch
// of the example input is a number in every input's and output's shape
// and in the Reshape constants the trace recorded. The first can be
// rewritten to a symbolic batch; the second cannot (a per-row constant
// of the exported batch's size), and serves at that batch only.
func FixedBatch(seed uint64) []*Model {
	return []*Model{fixedBatchView(seed), fixedBatchRowScale(seed), fixedBatchRowBias(seed)}
}

// fixedBatchView: a TorchRec fused table ([B, 3] ids plus offsets),
// its rows flattened per sample by emb.view(B, -1) (Reshape to the
// constant [8, 3*dim]: torch/onnx/symbolic_opset9.py view writes the
// traced sizes as a Constant), the dense features reshaped the way a
// traced x.view(B*2, 2) then .view(B, 4) writes it ([16, 2] then
// [8, 4]: the batch folded into one dimension and back); exported at
// B = 8, opset 13.
func fixedBatchView(seed uint64) *Model {
	const B = 8
	m := &Model{Name: "ts-fixed-batch-view", Batch: B, Source: "torch/onnx/utils.py export without dynamic_axes; symbolic_opset9.py view (opset 13)"}
	b := newBuilder("main_graph", 13, seed)
	ids := b.inputB("ids", B, pb.TensorProto_INT64, 3)
	dense := b.inputB("dense", B, pb.TensorProto_FLOAT, 4)
	sizes := []int64{20, 30, 25}
	fused := b.table("ebc.fused.weight", 75, dim)
	fid := b.node("Add", []string{ids, b.initI("feature_offsets", []int64{3}, 0, 20, 50)})
	emb := b.node("Reshape", []string{b.node("Gather", []string{"ebc.fused.weight", fid}), b.constI([]int64{2}, B, 3*dim)})
	d := b.node("Reshape", []string{b.node("Reshape", []string{dense, b.constI([]int64{2}, 2*B, 2)}), b.constI([]int64{2}, B, 4)})
	m.Sig = models.Signature{Inputs: []models.InputSpec{
		ranged("ids", models.SparseKind, rng(0, sizes[0]), rng(0, sizes[1]), rng(0, sizes[2])),
		{Name: "dense", Kind: models.DenseKind, Width: 4},
	}}
	m.feats = func(s sample) []float64 {
		var x []float64
		off := int64(0)
		for k := range 3 {
			x = append(x, row64(fused, off+s.id(0, k))...)
			off += sizes[k]
		}
		return append(x, s.f(1, 0), s.f(1, 1), s.f(1, 2), s.f(1, 3))
	}
	b.finishB(m, []string{emb, d}, 3*dim+4, B)
	return m
}

// fixedBatchRowBias: a per-row bias of the exported batch's size added
// to the features (a tensor of shape [B, 1] the trace folded into an
// initializer, as torch.arange(B) or a buffer sized by the example
// batch is): the graph is tied to B = 4 by that Add, which the
// partitioner names; the model serves batches of exactly 4. The cut
// puts the Add and the Concat after it on the embedding side.
func fixedBatchRowBias(seed uint64) *Model {
	const B = 4
	m := &Model{Name: "ts-fixed-batch-row-bias", Batch: B, Source: "torch/onnx/utils.py export without dynamic_axes, constant folding of a [B, 1] tensor (opset 13)"}
	b := newBuilder("main_graph", 13, seed)
	ids := b.inputB("ids", B, pb.TensorProto_INT64, 2)
	dense := b.inputB("dense", B, pb.TensorProto_FLOAT, 3)
	t0, t1 := b.table("emb.0", 30, dim), b.table("emb.1", 40, dim)
	col := func(k int64) string { return b.node("Gather", []string{ids, b.constI(nil, k)}, ai("axis", 1)) }
	e0 := b.node("Gather", []string{"emb.0", col(0)})
	e1 := b.node("Gather", []string{"emb.1", col(1)})
	bias := []float32{0.5, -0.25, 0.125, 1}
	b.g.Initializer = append(b.g.Initializer, &pb.TensorProto{Name: "row_bias", DataType: int32(pb.TensorProto_FLOAT), Dims: []int64{B, 1}, FloatData: bias})
	dd := b.node("Add", []string{dense, "row_bias"})
	m.Sig = models.Signature{Inputs: []models.InputSpec{
		ranged("ids", models.SparseKind, rng(0, 30), rng(0, 40)),
		{Name: "dense", Kind: models.DenseKind, Width: 3},
	}}
	m.feats = func(s sample) []float64 {
		x := append(row64(t0, s.id(0, 0)), row64(t1, s.id(0, 1))...)
		r := float64(bias[s.s%B])
		return append(x, s.f(1, 0)+r, s.f(1, 1)+r, s.f(1, 2)+r)
	}
	m.BlockedBy, m.BlockedSide = dd, plan.CPU
	b.finishB(m, []string{e0, e1, dd}, 2*dim+3, B)
	return m
}

// fixedBatchRowScale: a multi-hot bag gathered unpooled ([B, 6, dim]),
// scaled per row by a [B, 1, 1] constant of the exported batch's size
// (B = 4), then summed over the bag: the Mul and ReduceSum land on the
// embedding side (cpu.onnx: they shrink what crosses the cut), so the
// node that ties the graph to B is the embedding tier's, and dense.onnx
// is free of the batch.
func fixedBatchRowScale(seed uint64) *Model {
	const B = 4
	m := &Model{Name: "ts-fixed-batch-row-scale", Batch: B, Source: "torch/onnx/utils.py export without dynamic_axes, constant folding of a [B, 1, 1] tensor (opset 13)"}
	b := newBuilder("main_graph", 13, seed)
	bag := b.inputB("bag", B, pb.TensorProto_INT64, 6)
	dense := b.inputB("dense", B, pb.TensorProto_FLOAT, 2)
	t := b.table("bag.weight", 50, dim)
	scale := []float32{0.5, -0.25, 2, 1}
	b.g.Initializer = append(b.g.Initializer, &pb.TensorProto{Name: "row_scale", DataType: int32(pb.TensorProto_FLOAT), Dims: []int64{B, 1, 1}, FloatData: scale})
	g := b.node("Gather", []string{"bag.weight", bag})
	sc := b.node("Mul", []string{g, "row_scale"})
	pooled := b.node("ReduceSum", []string{sc, b.constI([]int64{1}, 1)}, ai("keepdims", 0))
	m.Sig = models.Signature{Inputs: []models.InputSpec{
		{Name: "bag", Kind: models.SparseKind, Width: 6, Rows: 50},
		{Name: "dense", Kind: models.DenseKind, Width: 2},
	}}
	m.feats = func(s sample) []float64 {
		x := pool(t, []int64{s.id(0, 0), s.id(0, 1), s.id(0, 2), s.id(0, 3), s.id(0, 4), s.id(0, 5)}, "sum")
		for i := range x {
			x[i] *= float64(scale[s.s%B])
		}
		return append(x, s.f(1, 0), s.f(1, 1))
	}
	m.BlockedBy, m.BlockedSide = sc, plan.CPU
	b.finishB(m, []string{pooled, dense}, dim+2, B)
	return m
}
