package exporters

import (
	pb "github.com/prism-serve/prism/internal/onnxpb"
	"github.com/prism-serve/prism/models"
)

const dim = 4

// Corpus returns every pattern's model, built from seed.
func Corpus(seed uint64) []*Model {
	return append([]*Model{
		selectEmbedding(seed), unbindSplit(seed), splitOpset11(seed), sliceNarrow(seed),
		torchrecFused(seed), singleFloatInput(seed), idArithmetic(seed), foldedTables(seed),
		int32IDs(seed),
	}, append(append(append(Fallback(seed), LoopBags(seed)...), DynamoBags(seed)...), DynamoFixedBags(seed)...)...) // fallback.go: id work for pre.onnx; loopbag.go: EmbeddingBag with offsets, and 2-D
}

// ByName returns the corpus or broken-twin model called name, or nil.
func ByName(name string, seed uint64) *Model {
	for _, m := range append(append(append(Corpus(seed), Broken(seed)...), FixedBatch(seed)...), append(append(HugeCTR(seed), HugeCTRMultiTask(seed), HugeCTRSharedBottom(seed), TorchTupleHeads(seed)), append(Quantized(seed), append(Paddle(seed), PaddleMultiTask(seed))...)...)...) {
		if m.Name == name {
			return m
		}
	}
	return nil
}

// selectEmbedding: x[:, k] on a packed id tensor, then nn.Embedding.
// torch/onnx/symbolic_opset9.py select (Gather(self, index, axis=dim)
// with the index a scalar Constant) and embedding (Gather(weight,
// indices)); opset 13.
func selectEmbedding(seed uint64) *Model {
	m := &Model{Name: "ts-select-embedding", Source: "torch/onnx/symbolic_opset9.py: select, embedding (opset 13)"}
	b := newBuilder("main_graph", 13, seed)
	ids := b.input("sparse", pb.TensorProto_INT64, 3)
	dense := b.input("dense", pb.TensorProto_FLOAT, 4)
	rows := []int64{30, 40, 50}
	var tabs [][][]float32
	parts := []string{dense}
	for k, r := range rows {
		name := "emb_l." + string(rune('0'+k)) + ".weight"
		tabs = append(tabs, b.table(name, int(r), dim))
		col := b.node("Gather", []string{ids, b.constI(nil, int64(k))}, ai("axis", 1))
		parts = append(parts, b.node("Gather", []string{name, col}))
	}
	m.Sig = models.Signature{Inputs: []models.InputSpec{
		ranged("sparse", models.SparseKind, rng(0, 30), rng(0, 40), rng(0, 50)),
		{Name: "dense", Kind: models.DenseKind, Width: 4},
	}}
	m.feats = func(s sample) []float64 {
		x := []float64{s.f(1, 0), s.f(1, 1), s.f(1, 2), s.f(1, 3)}
		for k := range rows {
			x = append(x, row64(tabs[k], s.id(0, k))...)
		}
		return x
	}
	b.finish(m, parts, 4+3*dim)
	return m
}

// unbindSplit: torch.unbind(ids, 1) at opset 13 (Split with a split
// input of ones, then Squeeze with an axes input), and a multi-hot bag
// pooled by embedding(bag).sum(1) (Gather, then ReduceSum with an axes
// input and keepdims=0). torch/onnx/symbolic_opset13.py unbind and
// _reduce_with_dtype (sum).
func unbindSplit(seed uint64) *Model {
	m := &Model{Name: "ts-unbind-split", Source: "torch/onnx/symbolic_opset13.py: unbind, sum (opset 13)"}
	b := newBuilder("main_graph", 13, seed)
	ids := b.input("ids", pb.TensorProto_INT64, 3)
	bag := b.input("bag", pb.TensorProto_INT64, 4)
	t := [][][]float32{b.table("t0", 20, dim), b.table("t1", 25, dim), b.table("t2", 30, dim), b.table("tbag", 60, dim)}
	outs := b.nodeN("Split", []string{ids, b.constI([]int64{3}, 1, 1, 1)}, 3, ai("axis", 1))
	var parts []string
	for k, o := range outs {
		sq := b.node("Squeeze", []string{o, b.constI([]int64{1}, 1)})
		parts = append(parts, b.node("Gather", []string{[]string{"t0", "t1", "t2"}[k], sq}))
	}
	g := b.node("Gather", []string{"tbag", bag})
	parts = append(parts, b.node("ReduceSum", []string{g, b.constI([]int64{1}, 1)}, ai("keepdims", 0)))
	m.Sig = models.Signature{Inputs: []models.InputSpec{
		ranged("ids", models.SparseKind, rng(0, 20), rng(0, 25), rng(0, 30)),
		{Name: "bag", Kind: models.SparseKind, Width: 4, Rows: 60},
	}}
	m.feats = func(s sample) []float64 {
		var x []float64
		for k := range 3 {
			x = append(x, row64(t[k], s.id(0, k))...)
		}
		return append(x, pool(t[3], []int64{s.id(1, 0), s.id(1, 1), s.id(1, 2), s.id(1, 3)}, "sum")...)
	}
	b.finish(m, parts, 4*dim)
	return m
}

// splitOpset11: torch.split(ids, [1, 2], 1) at opset 11 (Split with the
// split attribute), the single id squeezed (Squeeze with the axes
// attribute), the pair a bag averaged (ReduceMean with the axes
// attribute). torch/onnx/symbolic_opset11.py split, squeeze;
// symbolic_opset9.py mean.
func splitOpset11(seed uint64) *Model {
	m := &Model{Name: "ts-split-opset11", Source: "torch/onnx/symbolic_opset11.py: split, squeeze; symbolic_opset9.py: mean (opset 11)"}
	b := newBuilder("main_graph", 11, seed)
	ids := b.input("ids", pb.TensorProto_INT64, 3)
	dense := b.input("dense", pb.TensorProto_FLOAT, 2)
	t0, t1 := b.table("t0", 40, dim), b.table("t1", 45, dim)
	outs := b.nodeN("Split", []string{ids}, 2, ai("axis", 1), ais("split", 1, 2))
	e0 := b.node("Gather", []string{"t0", b.node("Squeeze", []string{outs[0]}, ais("axes", 1))})
	e1 := b.node("ReduceMean", []string{b.node("Gather", []string{"t1", outs[1]})}, ais("axes", 1), ai("keepdims", 0))
	m.Sig = models.Signature{Inputs: []models.InputSpec{
		ranged("ids", models.SparseKind, rng(0, 40), rng(0, 45), rng(0, 45)),
		{Name: "dense", Kind: models.DenseKind, Width: 2},
	}}
	m.feats = func(s sample) []float64 {
		x := append(row64(t0, s.id(0, 0)), pool(t1, []int64{s.id(0, 1), s.id(0, 2)}, "mean")...)
		return append(x, s.f(1, 0), s.f(1, 1))
	}
	b.finish(m, []string{e0, e1, dense}, 2*dim+2)
	return m
}

// sliceNarrow: ids[:, 1:2].squeeze(1) and ids.narrow(1, 2, 3) at opset
// 13 (Slice with starts, ends, axes and steps inputs; Squeeze with an
// axes input), the narrow a bag pooled by max (ReduceMax, axes an
// attribute before opset 18). torch/onnx/symbolic_opset10.py slice,
// symbolic_opset13.py squeeze, symbolic_opset9.py max (dim).
func sliceNarrow(seed uint64) *Model {
	m := &Model{Name: "ts-slice-narrow", Source: "torch/onnx/symbolic_opset10.py: slice; symbolic_opset13.py: squeeze; symbolic_opset9.py: max (opset 13)"}
	b := newBuilder("main_graph", 13, seed)
	ids := b.input("ids", pb.TensorProto_INT64, 5)
	t0, t1 := b.table("t0", 33, dim), b.table("t1", 27, dim)
	one := []int64{1}
	s0 := b.node("Slice", []string{ids, b.constI(one, 1), b.constI(one, 2), b.constI(one, 1), b.constI(one, 1)})
	e0 := b.node("Gather", []string{"t0", b.node("Squeeze", []string{s0, b.constI(one, 1)})})
	s1 := b.node("Slice", []string{ids, b.constI(one, 2), b.constI(one, 5), b.constI(one, 1), b.constI(one, 1)})
	e1 := b.node("ReduceMax", []string{b.node("Gather", []string{"t1", s1})}, ais("axes", 1), ai("keepdims", 0))
	m.Sig = models.Signature{Inputs: []models.InputSpec{
		ranged("ids", models.SparseKind, rng(0, 1), rng(0, 33), rng(0, 27), rng(0, 27), rng(0, 27)),
	}}
	m.feats = func(s sample) []float64 {
		return append(row64(t0, s.id(0, 1)), pool(t1, []int64{s.id(0, 2), s.id(0, 3), s.id(0, 4)}, "max")...)
	}
	b.finish(m, []string{e0, e1}, 2*dim)
	return m
}

// torchrecFused: TorchRec's fused table layout: the features' tables
// stacked in one, each feature's ids shifted by the cumulative sum of
// the tables' sizes before it (torchrec/sparse/jagged_tensor.py
// KeyedJaggedTensor keys and offsets; fbgemm_gpu
// split_table_batched_embeddings_ops hash_size_cumsum), unpooled
// [batch, 3, dim] then flattened (Flatten axis 1).
func torchrecFused(seed uint64) *Model {
	m := &Model{Name: "torchrec-fused-offsets", Source: "torchrec KeyedJaggedTensor + fbgemm_gpu TBE hash_size_cumsum (opset 17)"}
	b := newBuilder("main_graph", 17, seed)
	ids := b.input("ids", pb.TensorProto_INT64, 3)
	dense := b.input("dense", pb.TensorProto_FLOAT, 3)
	sizes := []int64{20, 30, 25}
	fused := b.table("ebc.fused.weight", 75, dim)
	fid := b.node("Add", []string{ids, b.initI("feature_offsets", []int64{3}, 0, 20, 50)})
	flat := b.node("Flatten", []string{b.node("Gather", []string{"ebc.fused.weight", fid})}, ai("axis", 1))
	m.Sig = models.Signature{Inputs: []models.InputSpec{
		ranged("ids", models.SparseKind, rng(0, sizes[0]), rng(0, sizes[1]), rng(0, sizes[2])),
		{Name: "dense", Kind: models.DenseKind, Width: 3},
	}}
	m.feats = func(s sample) []float64 {
		x := []float64{s.f(1, 0), s.f(1, 1), s.f(1, 2)}
		off := int64(0)
		for k := range 3 {
			x = append(x, row64(fused, off+s.id(0, k))...)
			off += sizes[k]
		}
		return x
	}
	b.finish(m, []string{dense, flat}, 3+3*dim)
	return m
}

// singleFloatInput: one float tensor carrying 4 dense features and 3
// ids (DLRM scripts that feed x = cat([dense, sparse.float()], 1)):
// x[:, :4] for the dense part, x[:, 4:].long() for the ids (Slice, then
// Cast to int64: symbolic_opset9.py _cast_Long / to), each picked by
// select.
func singleFloatInput(seed uint64) *Model {
	m := &Model{Name: "dlrm-single-float-input", Source: "torch/onnx/symbolic_opset10.py: slice; symbolic_opset9.py: to (Cast), select (opset 13)"}
	b := newBuilder("main_graph", 13, seed)
	x := b.input("x", pb.TensorProto_FLOAT, 7)
	one := []int64{1}
	dense := b.node("Slice", []string{x, b.constI(one, 0), b.constI(one, 4), b.constI(one, 1), b.constI(one, 1)})
	idf := b.node("Slice", []string{x, b.constI(one, 4), b.constI(one, 7), b.constI(one, 1), b.constI(one, 1)})
	ids := b.node("Cast", []string{idf}, ai("to", int64(pb.TensorProto_INT64)))
	rows := []int64{50, 60, 70}
	var tabs [][][]float32
	parts := []string{dense}
	for k, r := range rows {
		name := "emb." + string(rune('a'+k))
		tabs = append(tabs, b.table(name, int(r), dim))
		parts = append(parts, b.node("Gather", []string{name, b.node("Gather", []string{ids, b.constI(nil, int64(k))}, ai("axis", 1))}))
	}
	m.Sig = models.Signature{Inputs: []models.InputSpec{
		ranged("x", models.DenseKind, rng(0, 0), rng(0, 0), rng(0, 0), rng(0, 0), rng(0, 50), rng(0, 60), rng(0, 70)),
	}}
	m.feats = func(s sample) []float64 {
		v := []float64{s.f(0, 0), s.f(0, 1), s.f(0, 2), s.f(0, 3)}
		for k := range rows {
			v = append(v, row64(tabs[k], int64(s.f(0, 4+k)))...)
		}
		return v
	}
	b.finish(m, parts, 4+3*dim)
	return m
}

// idArithmetic: ids hashed (ids % n: Mod fmod=0,
// symbolic_opset10.py remainder), 1-based (ids - 1: Sub), clamped
// (ids.clamp(0, n-1): Clip with min and max inputs,
// symbolic_opset12.py clamp), and the unknown id -1 mapped to row 0
// (torch.where(ids == -1, 0, ids): Equal, Where), each column picked by
// select; opset 13.
func idArithmetic(seed uint64) *Model {
	m := &Model{Name: "ts-id-arithmetic", Source: "torch/onnx/symbolic_opset10.py: remainder; symbolic_opset12.py: clamp; symbolic_opset9.py: sub, eq, where (opset 13)"}
	b := newBuilder("main_graph", 13, seed)
	ids := b.input("ids", pb.TensorProto_INT64, 4)
	t := [][][]float32{b.table("hash", 31, dim), b.table("onebased", 20, dim), b.table("clamped", 24, dim), b.table("unk", 18, dim)}
	col := func(k int64) string { return b.node("Gather", []string{ids, b.constI(nil, k)}, ai("axis", 1)) }
	h := b.node("Mod", []string{col(0), b.constI(nil, 31)}, ai("fmod", 0))
	o := b.node("Sub", []string{col(1), b.constI(nil, 1)})
	c := b.node("Clip", []string{col(2), b.constI(nil, 0), b.constI(nil, 23)})
	u3 := col(3)
	u := b.node("Where", []string{b.node("Equal", []string{u3, b.constI(nil, -1)}), b.constI(nil, 0), u3})
	parts := []string{b.node("Gather", []string{"hash", h}), b.node("Gather", []string{"onebased", o}),
		b.node("Gather", []string{"clamped", c}), b.node("Gather", []string{"unk", u})}
	m.Sig = models.Signature{Inputs: []models.InputSpec{
		ranged("ids", models.SparseKind, rng(0, 1000), rng(1, 21), rng(-5, 30), rng(-1, 18)),
	}}
	m.feats = func(s sample) []float64 {
		x := row64(t[0], s.id(0, 0)%31)
		x = append(x, row64(t[1], s.id(0, 1)-1)...)
		x = append(x, row64(t[2], min(max(s.id(0, 2), 0), 23))...)
		u := s.id(0, 3)
		if u == -1 {
			u = 0
		}
		return append(x, row64(t[3], u)...)
	}
	b.finish(m, parts, 4*dim)
	return m
}

// foldedTables: tables the exporter folded into the graph (a Constant
// node), and a half-precision table cast up for the lookup
// (model.half() with the embedding kept in float: Cast to float), its
// ids narrowed to int32 first (ids.int(): Cast to int32); opset 13.
func foldedTables(seed uint64) *Model {
	m := &Model{Name: "ts-folded-fp16-tables", Source: "torch/onnx/utils.py constant folding (Constant tables); symbolic_opset9.py: to (Cast) (opset 13)"}
	b := newBuilder("main_graph", 13, seed)
	ids := b.input("ids", pb.TensorProto_INT64, 2)
	dense := b.input("dense", pb.TensorProto_FLOAT, 1)
	ct, t0 := b.constTable(36, dim)
	t1 := b.tableF16("half.weight", 28, dim)
	col := func(k int64) string { return b.node("Gather", []string{ids, b.constI(nil, k)}, ai("axis", 1)) }
	e0 := b.node("Gather", []string{ct, col(0)})
	t1f := b.node("Cast", []string{"half.weight"}, ai("to", int64(pb.TensorProto_FLOAT)))
	e1 := b.node("Gather", []string{t1f, b.node("Cast", []string{col(1)}, ai("to", int64(pb.TensorProto_INT32)))})
	m.Sig = models.Signature{Inputs: []models.InputSpec{
		ranged("ids", models.SparseKind, rng(0, 36), rng(0, 28)),
		{Name: "dense", Kind: models.DenseKind, Width: 1},
	}}
	m.feats = func(s sample) []float64 {
		return append(append(row64(t0, s.id(0, 0)), row64(t1, s.id(0, 1))...), s.f(1, 0))
	}
	b.finish(m, []string{e0, e1, dense}, 2*dim+1)
	return m
}

// int32IDs: ids the model declares int32 (TorchRec and FBGEMM take
// int32 indices and offsets; a model exported with
// example inputs of dtype torch.int32 keeps that type): a packed
// [batch, 3] int32 tensor with int32 offsets into a fused table
// (Add), and a [batch] int32 id read directly by a Gather (int32
// indices are valid for Gather); opset 17.
func int32IDs(seed uint64) *Model {
	m := &Model{Name: "torchrec-int32-ids", Source: "torchrec KeyedJaggedTensor int32 values + fbgemm_gpu TBE int32 indices (opset 17)"}
	b := newBuilder("main_graph", 17, seed)
	ids := b.input("ids", pb.TensorProto_INT32, 3)
	user := b.input("user", pb.TensorProto_INT32)
	sizes := []int64{20, 30, 25}
	fused := b.table("ebc.fused.weight", 75, dim)
	users := b.table("user.weight", 50, dim)
	b.g.Initializer = append(b.g.Initializer, &pb.TensorProto{Name: "feature_offsets", DataType: int32(pb.TensorProto_INT32), Dims: []int64{3}, Int32Data: []int32{0, 20, 50}})
	fid := b.node("Add", []string{ids, "feature_offsets"})
	flat := b.node("Flatten", []string{b.node("Gather", []string{"ebc.fused.weight", fid})}, ai("axis", 1))
	u := b.node("Gather", []string{"user.weight", user})
	m.Sig = models.Signature{Inputs: []models.InputSpec{
		ranged("ids", models.SparseKind, rng(0, sizes[0]), rng(0, sizes[1]), rng(0, sizes[2])),
		{Name: "user", Kind: models.SparseKind, Width: 1, Rank1: true, Rows: 50},
	}}
	m.feats = func(s sample) []float64 {
		var x []float64
		off := int64(0)
		for k := range 3 {
			x = append(x, row64(fused, off+s.id(0, k))...)
			off += sizes[k]
		}
		return append(x, row64(users, s.id(1, 0))...)
	}
	b.finish(m, []string{flat, u}, 4*dim)
	return m
}
