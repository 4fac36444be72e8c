package exporters

import (
	pb "github.com/prism-serve/prism/internal/onnxpb"
	"github.com/prism-serve/prism/models"
)

// TorchTupleHeads is a multi-task model exported by PyTorch's
// TorchScript exporter from a module whose forward returns a tuple of
// heads, (ctr, cvr): torch.onnx.export(model, (sparse, dense), f,
// opset_version=17, input_names=["sparse", "dense"],
// output_names=["ctr", "cvr"], dynamic_axes={name: {0: "batch"}} for
// all four). output_names label the flattened tuple in order, so the
// graph has one output per task: ctr a Sigmoid of [batch, 1], cvr a
// Sigmoid squeezed to [batch] (cvr.squeeze(1): Squeeze with an axes
// input at opset 13 and later). A shared bottom (nn.Linear, ReLU) reads
// three embeddings picked by x[:, k] (Gather on a scalar index, then
// nn.Embedding's Gather) and the dense features; each head is an
// nn.Linear (Gemm with transB 1, weight [out, in]) to one value.
// Without output_names the outputs would keep the trace's value names;
// with dynamo=True the FX nodes' names: the partitioner reads shapes,
// not names. It has no float64 reference: the whole model is the
// reference (prism partition --verify, prism score).
func TorchTupleHeads(seed uint64) *Model {
	m := &Model{Name: "ts-tuple-heads", Source: "torch/onnx/utils.py export with output_names for a tuple of outputs (_set_input_and_output_names, in order); symbolic_opset9.py select, embedding, linear (Gemm transB=1), relu, sigmoid; symbolic_opset13.py squeeze (opset 17)"}
	b := newBuilder("main_graph", 17, seed)
	ids := b.input("sparse", pb.TensorProto_INT64, 3)
	dense := b.input("dense", pb.TensorProto_FLOAT, 4)
	parts := []string{dense}
	for k, r := range []int64{30, 40, 50} {
		name := "emb_l." + string(rune('0'+k)) + ".weight"
		b.table(name, int(r), dim)
		col := b.node("Gather", []string{ids, b.constI(nil, int64(k))}, ai("axis", 1))
		parts = append(parts, b.node("Gather", []string{name, col}))
	}
	const width, hidden = 4 + 3*dim, 8
	linear := func(prefix, x string, in, out int) string {
		w := make([]float32, out*in)
		for i := range w {
			w[i] = float32(b.r.NormFloat64() * 0.3)
		}
		bias := make([]float32, out)
		for i := range bias {
			bias[i] = float32(b.r.NormFloat64() * 0.1)
		}
		b.g.Initializer = append(b.g.Initializer,
			&pb.TensorProto{Name: prefix + ".weight", DataType: int32(pb.TensorProto_FLOAT), Dims: []int64{int64(out), int64(in)}, FloatData: w},
			&pb.TensorProto{Name: prefix + ".bias", DataType: int32(pb.TensorProto_FLOAT), Dims: []int64{int64(out)}, FloatData: bias})
		return b.node("Gemm", []string{x, prefix + ".weight", prefix + ".bias"}, &pb.AttributeProto{Name: "alpha", Type: pb.AttributeProto_FLOAT, F: 1},
			&pb.AttributeProto{Name: "beta", Type: pb.AttributeProto_FLOAT, F: 1}, ai("transB", 1))
	}
	h := b.node("Relu", []string{linear("bottom.0", b.node("Concat", parts, ai("axis", 1)), width, hidden)})
	ctr := b.node("Sigmoid", []string{linear("ctr_head", h, hidden, 1)})
	cvr := b.node("Squeeze", []string{b.node("Sigmoid", []string{linear("cvr_head", h, hidden, 1)}), b.constI([]int64{1}, 1)})
	// output_names rename the graph's outputs (the last nodes' outputs).
	for _, n := range b.g.Node {
		for i, o := range n.Output {
			switch o {
			case ctr:
				n.Output[i] = "ctr"
			case cvr:
				n.Output[i] = "cvr"
			}
		}
	}
	batch := &pb.TensorShapeProto_Dimension{Value: &pb.TensorShapeProto_Dimension_DimParam{DimParam: "batch"}}
	out := func(name string, dims ...*pb.TensorShapeProto_Dimension) *pb.ValueInfoProto {
		return &pb.ValueInfoProto{Name: name, Type: &pb.TypeProto{Value: &pb.TypeProto_TensorType{TensorType: &pb.TypeProto_Tensor{
			ElemType: int32(pb.TensorProto_FLOAT), Shape: &pb.TensorShapeProto{Dim: dims}}}}}
	}
	b.g.Output = append(b.g.Output, out("ctr", batch, &pb.TensorShapeProto_Dimension{Value: &pb.TensorShapeProto_Dimension_DimValue{DimValue: 1}}), out("cvr", batch))
	m.Sig = models.Signature{Inputs: []models.InputSpec{
		ranged("sparse", models.SparseKind, rng(0, 30), rng(0, 40), rng(0, 50)),
		{Name: "dense", Kind: models.DenseKind, Width: 4},
	}}
	m.Proto = &pb.ModelProto{IrVersion: 8, ProducerName: "pytorch", OpsetImport: []*pb.OperatorSetIdProto{{Version: b.opset}}, Graph: b.g,
		MetadataProps: []*pb.StringStringEntryProto{{Key: "prism.model", Value: m.Name}}}
	return m
}
