package ort

import (
	"google.golang.org/protobuf/proto"

	pb "github.com/prism-serve/prism/internal/onnxpb"
)

// floatInput is a float32 value info of shape [n, dims...] (n symbolic).
func floatInput(name string, dims ...int64) *pb.ValueInfoProto {
	shape := []*pb.TensorShapeProto_Dimension{{Value: &pb.TensorShapeProto_Dimension_DimParam{DimParam: "n"}}}
	for _, d := range dims {
		shape = append(shape, &pb.TensorShapeProto_Dimension{Value: &pb.TensorShapeProto_Dimension_DimValue{DimValue: d}})
	}
	return &pb.ValueInfoProto{Name: name, Type: &pb.TypeProto{Value: &pb.TypeProto_TensorType{TensorType: &pb.TypeProto_Tensor{
		ElemType: int32(pb.TensorProto_FLOAT),
		Shape:    &pb.TensorShapeProto{Dim: shape},
	}}}}
}

// marshalModel wraps g in an opset-18 model.
func marshalModel(g *pb.GraphProto) []byte {
	b, err := proto.Marshal(&pb.ModelProto{IrVersion: 8, OpsetImport: []*pb.OperatorSetIdProto{{Version: 18}}, Graph: g})
	if err != nil {
		panic(err)
	}
	return b
}

func identityModel() []byte {
	return marshalModel(&pb.GraphProto{
		Name:   "id",
		Node:   []*pb.NodeProto{{OpType: "Identity", Input: []string{"x"}, Output: []string{"y"}}},
		Input:  []*pb.ValueInfoProto{floatInput("x")},
		Output: []*pb.ValueInfoProto{floatInput("y")},
	})
}

// matMulModel is Y = MatMul(X, W) with X [n, k] and W a [k, k] float32
// initializer.
func matMulModel(k int, w []float32) []byte {
	return marshalModel(&pb.GraphProto{
		Name:        "matmul",
		Node:        []*pb.NodeProto{{OpType: "MatMul", Input: []string{"x", "w"}, Output: []string{"y"}}},
		Initializer: []*pb.TensorProto{{Name: "w", Dims: []int64{int64(k), int64(k)}, DataType: int32(pb.TensorProto_FLOAT), FloatData: w}},
		Input:       []*pb.ValueInfoProto{floatInput("x", int64(k))},
		Output:      []*pb.ValueInfoProto{floatInput("y", int64(k))},
	})
}
