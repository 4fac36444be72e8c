package verify_test

import (
	"path/filepath"
	"testing"

	pb "github.com/prism-serve/prism/internal/onnxpb"
	"github.com/prism-serve/prism/internal/ort"
	"github.com/prism-serve/prism/models/exporters"
	"github.com/prism-serve/prism/partitioner"
	"github.com/prism-serve/prism/partitioner/verify"
)

// TestDenseOnlyLoopTable: --allow-dense-only keeps a table read in a
// Loop body in the dense graph; dense.onnx must then hold the table and
// every outer value the body reads.
func TestDenseOnlyLoopTable(t *testing.T) {
	requireORT(t)
	m := exporters.EmbeddingBagLoop(5, false)
	dir := t.TempDir()
	model := filepath.Join(dir, "model.onnx")
	if err := m.Write(model); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "part")
	res, err := partitioner.Partition(model, out, partitioner.Options{AllowDenseOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	// verify.Verify cannot draw samples for such a plan (its ids feed
	// no table it knows), so the test loads dense.onnx: before, the
	// table and the outer values the body reads were left out of it.
	sess, err := ort.NewSession(filepath.Join(out, "dense.onnx"), ort.SessionOptions{IntraOpThreads: 1})
	if err != nil {
		t.Fatalf("dense.onnx does not load: %v\n%s", err, res.Report())
	}
	sess.Close()
}

// TestIfReadsOuterNames: a dense-side If whose branches read an outer
// initializer and an outer computed tensor (what torch.onnx.export
// writes for scripted control flow, tf2onnx for tf.cond) partitions into
// parts that load and equal the model.
func TestIfReadsOuterNames(t *testing.T) {
	requireORT(t)
	f := pb.TensorProto_FLOAT
	table := make([]float32, 50*4)
	for i := range table {
		table[i] = float32(i%17) / 16
	}
	w := []float32{0.1, -0.2, 0.3, -0.4, 0.5, -0.6, 0.7, -0.8}
	branch := func(name string, nodes ...*pb.NodeProto) *pb.GraphProto {
		return &pb.GraphProto{Name: name, Node: nodes, Output: []*pb.ValueInfoProto{batchInfo(name+"_out", f, 1)}}
	}
	then := branch("then", &pb.NodeProto{Name: "then/add", OpType: "Add", Input: []string{"/mlp/MatMul:0", "bias"}, Output: []string{"then_out"}})
	els := branch("else", &pb.NodeProto{Name: "else/id", OpType: "Identity", Input: []string{"/mlp/MatMul:0"}, Output: []string{"else_out"}})
	m := &pb.ModelProto{IrVersion: 8, OpsetImport: []*pb.OperatorSetIdProto{{Version: 17}}, Graph: &pb.GraphProto{
		Name: "if_model",
		Node: []*pb.NodeProto{
			{Name: "/emb/Gather", OpType: "Gather", Input: []string{"emb.weight", "ids"}, Output: []string{"/emb/Gather:0"}},
			{Name: "/Concat", OpType: "Concat", Input: []string{"/emb/Gather:0", "x"}, Output: []string{"/Concat:0"}, Attribute: []*pb.AttributeProto{{Name: "axis", Type: pb.AttributeProto_INT, I: 1}}},
			{Name: "/mlp/MatMul", OpType: "MatMul", Input: []string{"/Concat:0", "w"}, Output: []string{"/mlp/MatMul:0"}},
			{Name: "/If", OpType: "If", Input: []string{"use_bias"}, Output: []string{"/If:0"}, Attribute: []*pb.AttributeProto{
				{Name: "then_branch", Type: pb.AttributeProto_GRAPH, G: then},
				{Name: "else_branch", Type: pb.AttributeProto_GRAPH, G: els}}},
			{Name: "/Sigmoid", OpType: "Sigmoid", Input: []string{"/If:0"}, Output: []string{"score"}},
		},
		Initializer: []*pb.TensorProto{
			pb.NewFloatTensor("emb.weight", []int64{50, 4}, table),
			pb.NewFloatTensor("w", []int64{8, 1}, w),
			pb.NewFloatTensor("bias", []int64{1}, []float32{0.25}),
			{Name: "use_bias", DataType: int32(pb.TensorProto_BOOL), Int32Data: []int32{1}},
		},
		Input:  []*pb.ValueInfoProto{batchInfo("ids", pb.TensorProto_INT64), batchInfo("x", f, 4)},
		Output: []*pb.ValueInfoProto{batchInfo("score", f, 1)},
	}}
	dir := t.TempDir()
	model := filepath.Join(dir, "model.onnx")
	if err := pb.WriteModel(model, m, pb.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "part")
	res, err := partitioner.Partition(model, out, partitioner.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Plan.Tables) != 1 {
		t.Fatalf("want the table as a lookup\n%s", res.Report())
	}
	if _, err := verify.Verify(model, out, 100, 1); err != nil {
		t.Fatalf("verify: %v\n%s", err, res.Report())
	}
}

// TestExternalConstant: onnx.save(save_as_external_data=True), which
// torch.onnx.export runs for a model over 2 GB, stores every tensor of
// 1 KB or more externally, the values of Constant nodes included. A
// dense weight held by a Constant node must reach dense.onnx.
func TestExternalConstant(t *testing.T) {
	requireORT(t)
	f := pb.TensorProto_FLOAT
	table := make([]float32, 500*4)
	for i := range table {
		table[i] = float32(i%17) / 16
	}
	w := make([]float32, 8*64)
	for i := range w {
		w[i] = float32(i%13-6) / 32
	}
	m := &pb.ModelProto{IrVersion: 8, OpsetImport: []*pb.OperatorSetIdProto{{Version: 12}}, Graph: &pb.GraphProto{
		Name: "const_weight",
		Node: []*pb.NodeProto{
			{Name: "/emb/Gather", OpType: "Gather", Input: []string{"emb.weight", "ids"}, Output: []string{"e"}},
			{Name: "/Concat", OpType: "Concat", Input: []string{"e", "x"}, Output: []string{"cat"}, Attribute: []*pb.AttributeProto{{Name: "axis", Type: pb.AttributeProto_INT, I: 1}}},
			{Name: "/mlp/Constant", OpType: "Constant", Output: []string{"w"}, Attribute: []*pb.AttributeProto{{Name: "value", Type: pb.AttributeProto_TENSOR, T: pb.NewFloatTensor("", []int64{8, 64}, w)}}},
			{Name: "/mlp/MatMul", OpType: "MatMul", Input: []string{"cat", "w"}, Output: []string{"h"}},
			{Name: "/ReduceSum", OpType: "ReduceSum", Input: []string{"h"}, Output: []string{"s"}, Attribute: []*pb.AttributeProto{{Name: "axes", Type: pb.AttributeProto_INTS, Ints: []int64{1}}}},
			{Name: "/Sigmoid", OpType: "Sigmoid", Input: []string{"s"}, Output: []string{"score"}},
		},
		Initializer: []*pb.TensorProto{pb.NewFloatTensor("emb.weight", []int64{500, 4}, table)},
		Input:       []*pb.ValueInfoProto{batchInfo("ids", pb.TensorProto_INT64), batchInfo("x", f, 4)},
		Output:      []*pb.ValueInfoProto{batchInfo("score", f, 1)},
	}}
	dir := t.TempDir()
	model := filepath.Join(dir, "model.onnx")
	if err := pb.WriteModel(model, m, pb.WriteOptions{External: pb.ExternalAlways}); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "part")
	res, err := partitioner.Partition(model, out, partitioner.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := verify.Verify(model, out, 100, 1); err != nil {
		t.Fatalf("verify: %v\n%s", err, res.Report())
	}
}

// batchInfo is a value of elem type with a symbolic batch axis first,
// then dims.
func batchInfo(name string, elem pb.TensorProto_DataType, dims ...int64) *pb.ValueInfoProto {
	d := []*pb.TensorShapeProto_Dimension{{Value: &pb.TensorShapeProto_Dimension_DimParam{DimParam: "batch"}}}
	for _, x := range dims {
		d = append(d, &pb.TensorShapeProto_Dimension{Value: &pb.TensorShapeProto_Dimension_DimValue{DimValue: x}})
	}
	return &pb.ValueInfoProto{Name: name, Type: &pb.TypeProto{Value: &pb.TypeProto_TensorType{TensorType: &pb.TypeProto_Tensor{ElemType: int32(elem), Shape: &pb.TensorShapeProto{Dim: d}}}}}
}
