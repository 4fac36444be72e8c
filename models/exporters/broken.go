package exporters

import (
	"math"

	pb "github.com/prism-serve/prism/internal/onnxpb"
	"github.com/prism-serve/prism/models"
)

// Broken returns the patterns the partitioner cannot take, each with
// the error it must give: the broken twins of the corpus, among them a
// Loop that reads a table but is not an EmbeddingBag (the bag form is
// in the corpus: loopbag.go), and quantized tables the store cannot
// take (quant.go).
func Broken(seed uint64) []*Model {
	return append(append([]*Model{floatIDs(seed), offsetsLength(seed), EmbeddingBagLoop(seed, false)}, FallbackBroken(seed)...), QuantizedBroken(seed)...)
}

// floatIDs: ids computed by a float MatMul and cast (the twin of
// dlrm-single-float-input whose ids are not the input's).
func floatIDs(seed uint64) *Model {
	m := &Model{Name: "broken-float-ids", WantErr: `indices come from a float MatMul`}
	b := newBuilder("main_graph", 13, seed)
	x := b.input("x", pb.TensorProto_FLOAT, 8)
	w := make([]float32, 8)
	b.g.Initializer = append(b.g.Initializer, &pb.TensorProto{Name: "proj", DataType: int32(pb.TensorProto_FLOAT), Dims: []int64{8, 1}, FloatData: w})
	b.table("emb", 50, dim)
	h := b.node("MatMul", []string{x, "proj"})
	id := b.node("Squeeze", []string{b.node("Cast", []string{h}, ai("to", int64(pb.TensorProto_INT64))), b.constI([]int64{1}, 1)})
	e := b.node("Gather", []string{"emb", id})
	m.Sig = models.Signature{Inputs: []models.InputSpec{{Name: "x", Kind: models.DenseKind, Width: 8}}}
	b.finish(m, []string{e}, dim)
	m.feats = nil
	return m
}

// offsetsLength: the TorchRec fused table with an offsets constant of
// the wrong length (2 offsets for 3 features).
func offsetsLength(seed uint64) *Model {
	m := &Model{Name: "broken-offsets-length", WantErr: `does not broadcast to the ids`}
	b := newBuilder("main_graph", 17, seed)
	ids := b.input("ids", pb.TensorProto_INT64, 3)
	b.table("ebc.fused.weight", 75, dim)
	fid := b.node("Add", []string{ids, b.initI("feature_offsets", []int64{2}, 0, 20)})
	flat := b.node("Flatten", []string{b.node("Gather", []string{"ebc.fused.weight", fid})}, ai("axis", 1))
	b.finish(m, []string{flat}, 3*dim)
	m.feats = nil
	return m
}

// EmbeddingBagLoop is nn.EmbeddingBag(mode="sum") called with 1-D
// indices and offsets, as the TorchScript exporter writes it
// (torch/onnx/symbolic_helper.py _embedding_bag_helper): offsets
// completed with len(indices) by Concat, the starts and ends sliced from
// them, and a Loop over the bags whose body slices the bag's indices,
// gathers their rows and reduces them (ReduceSum with axes [0]); the
// bags are the model's output. The corpus's EmbeddingBag models (with a
// reference, every pooling, weights, include_last_offset) are in
// loopbag.go. bag false is the broken twin: a Loop whose body gathers
// one row per iteration and pools nothing, which the partitioner names
// as not an EmbeddingBag.
func EmbeddingBagLoop(seed uint64, bag bool) *Model {
	m := &Model{Name: "ts-embedding-bag-loop", Source: "torch/onnx/symbolic_helper.py: _embedding_bag_helper (opset 13)"}
	if !bag {
		m.Name, m.Source, m.WantErr = "broken-loop-not-bag", "", "which is not an EmbeddingBag with offsets: its scan output is not a ReduceSum"
	}
	b := newBuilder("main_graph", 13, seed)
	indices := b.input("indices", pb.TensorProto_INT64)
	offsets := b.input("offsets", pb.TensorProto_INT64)
	b.g.Input[0].Type.GetTensorType().Shape.Dim[0].Value = &pb.TensorShapeProto_Dimension_DimParam{DimParam: "total"}
	b.table("embedding_bag.weight", 40, dim)
	cond := b.node("Cast", []string{b.constI(nil, 1)}, ai("to", int64(pb.TensorProto_BOOL)))
	zero := b.constI([]int64{1}, 0)
	n := b.node("Gather", []string{b.node("Shape", []string{indices}), b.constI(nil, 0)}, ai("axis", 0))
	full := b.node("Concat", []string{offsets, b.node("Unsqueeze", []string{n, b.constI([]int64{1}, 0)})}, ai("axis", 0))
	one := []int64{1}
	starts := b.node("Slice", []string{full, b.constI(one, 0), b.constI(one, math.MaxInt64), b.constI(one, 0), b.constI(one, 1)})
	ends := b.node("Slice", []string{full, b.constI(one, 1), b.constI(one, math.MaxInt64), b.constI(one, 0), b.constI(one, 1)})
	count := b.node("Gather", []string{b.node("Shape", []string{ends}), b.constI(nil, 0)}, ai("axis", 0))

	body := &builder{g: &pb.GraphProto{Name: "loop_body"}, r: b.r, opset: 13, n: 1000}
	iter, condIn := "iter", "cond_in"
	scalar := func(name string, elem pb.TensorProto_DataType) *pb.ValueInfoProto {
		return &pb.ValueInfoProto{Name: name, Type: &pb.TypeProto{Value: &pb.TypeProto_TensorType{TensorType: &pb.TypeProto_Tensor{ElemType: int32(elem), Shape: &pb.TensorShapeProto{}}}}}
	}
	body.g.Input = []*pb.ValueInfoProto{scalar(iter, pb.TensorProto_INT64), scalar(condIn, pb.TensorProto_BOOL)}
	var emb string
	if bag {
		s := body.node("Unsqueeze", []string{body.node("Gather", []string{starts, iter}, ai("axis", 0)), body.constI(one, 0)})
		e := body.node("Unsqueeze", []string{body.node("Gather", []string{ends, iter}, ai("axis", 0)), body.constI(one, 0)})
		row := body.node("Slice", []string{indices, s, e, zero})
		emb = body.node("ReduceSum", []string{body.node("Gather", []string{"embedding_bag.weight", row}, ai("axis", 0)), body.constI(one, 0)}, ai("keepdims", 0))
	} else {
		emb = body.node("Gather", []string{"embedding_bag.weight", body.node("Gather", []string{indices, iter}, ai("axis", 0))}, ai("axis", 0))
	}
	condOut := body.node("Cast", []string{cond}, ai("to", int64(pb.TensorProto_BOOL)))
	body.g.Output = []*pb.ValueInfoProto{
		scalar(condOut, pb.TensorProto_BOOL),
		{Name: emb, Type: &pb.TypeProto{Value: &pb.TypeProto_TensorType{TensorType: &pb.TypeProto_Tensor{ElemType: int32(pb.TensorProto_FLOAT), Shape: &pb.TensorShapeProto{Dim: []*pb.TensorShapeProto_Dimension{{Value: &pb.TensorShapeProto_Dimension_DimValue{DimValue: dim}}}}}}}},
	}
	bags := b.node("Loop", []string{count, cond}, &pb.AttributeProto{Name: "body", Type: pb.AttributeProto_GRAPH, G: body.g})
	b.finish(m, []string{bags}, dim)
	return m
}
