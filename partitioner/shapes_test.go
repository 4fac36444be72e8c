package partitioner

import (
	"reflect"
	"testing"

	pb "github.com/prism-serve/prism/internal/onnxpb"
)

// TestInferShapes pins the per-op rules on one graph that chains them,
// batch dimension symbolic (-1) throughout.
func TestInferShapes(t *testing.T) {
	f := pb.TensorProto_FLOAT
	ints := func(name string, v ...int64) *pb.TensorProto {
		return pb.NewInt64Tensor(name, []int64{int64(len(v))}, v)
	}
	attr := func(n string, v int64) *pb.AttributeProto {
		return &pb.AttributeProto{Name: n, Type: pb.AttributeProto_INT, I: v}
	}
	node := func(op, out string, ins []string, attrs ...*pb.AttributeProto) *pb.NodeProto {
		return &pb.NodeProto{Name: out, OpType: op, Input: ins, Output: []string{out}, Attribute: attrs}
	}
	m := &pb.ModelProto{IrVersion: 8, OpsetImport: []*pb.OperatorSetIdProto{{Version: 18}}, Graph: &pb.GraphProto{
		Input: []*pb.ValueInfoProto{vi3("x", f, 13), vi3("ids", pb.TensorProto_INT64, 4)},
		Initializer: []*pb.TensorProto{
			pb.NewFloatTensor("w", []int64{8, 13}, make([]float32, 104)),
			pb.NewFloatTensor("table", []int64{100, 8}, make([]float32, 800)),
			ints("ax1", 1), ints("shape", -1, 2, 4), ints("ax2", 2),
		},
		Node: []*pb.NodeProto{
			node("Gemm", "g", []string{"x", "w"}, attr("transB", 1)),                                                                       // [B,8]
			node("Gather", "e", []string{"table", "ids"}),                                                                                  // [B,4,8]
			node("ReduceSum", "p", []string{"e", "ax1"}, attr("keepdims", 0)),                                                              // [B,8]
			node("Concat", "c", []string{"g", "p"}, attr("axis", 1)),                                                                       // [B,16]
			node("Reshape", "r", []string{"c", "shape"}),                                                                                   // [B,2,4]... -1 is batch? no: 16/8=2 per sample
			node("Transpose", "tr", []string{"e"}, &pb.AttributeProto{Name: "perm", Type: pb.AttributeProto_INTS, Ints: []int64{0, 2, 1}}), // [B,8,4]
			node("MatMul", "mm", []string{"e", "tr"}),                                                                                      // [B,4,4]
			node("Unsqueeze", "u", []string{"g", "ax2"}),                                                                                   // [B,8,1]
			node("Flatten", "fl", []string{"mm"}),                                                                                          // [B,16]
			node("Mul", "bc", []string{"g", "p"}),                                                                                          // [B,8]
			node("TopK", "unk", []string{"g"}),                                                                                             // unknown op
			node("Relu", "after", []string{"unk"}),                                                                                         // unknown stays unknown
		},
		Output: []*pb.ValueInfoProto{{Name: "after"}},
	}}
	g, err := NewGraph(m)
	if err != nil {
		t.Fatal(err)
	}
	types, unknownNodes := InferShapes(g)
	want := map[string][]int64{
		"g": {-1, 8}, "e": {-1, 4, 8}, "p": {-1, 8}, "c": {-1, 16}, "tr": {-1, 8, 4},
		"mm": {-1, 4, 4}, "u": {-1, 8, 1}, "fl": {-1, 16}, "bc": {-1, 8},
	}
	for name, dims := range want {
		if got := types[name]; !got.Known || !reflect.DeepEqual(got.Dims, dims) {
			t.Errorf("%s: %+v, want %v", name, got, dims)
		}
	}
	// Reshape [-1,2,4] of [B,16]: 8 elements named, 16 per sample, so the
	// -1 is not the batch alone; inference must not guess.
	if types["r"].Known {
		t.Errorf("r: %+v, want unknown", types["r"])
	}
	if types["unk"].Known || types["after"].Known {
		t.Error("an unknown op's output was typed")
	}
	if len(unknownNodes) != 3 {
		t.Errorf("unknown nodes %v, want r, unk, after", unknownNodes)
	}
	if b, ok := types["c"].BytesPerSample(); !ok || b != 64 {
		t.Errorf("c: %d bytes/sample", b)
	}
}

func vi3(name string, elem pb.TensorProto_DataType, width int64) *pb.ValueInfoProto {
	return &pb.ValueInfoProto{Name: name, Type: &pb.TypeProto{Value: &pb.TypeProto_TensorType{TensorType: &pb.TypeProto_Tensor{
		ElemType: int32(elem),
		Shape: &pb.TensorShapeProto{Dim: []*pb.TensorShapeProto_Dimension{
			{Value: &pb.TensorShapeProto_Dimension_DimParam{DimParam: "N"}},
			{Value: &pb.TensorShapeProto_Dimension_DimValue{DimValue: width}},
		}},
	}}}}
}
