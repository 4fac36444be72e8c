package ort

import (
	"google.golang.org/protobuf/proto"

	pb "github.com/prism-serve/prism/internal/onnxpb"
)

func identityModel() []byte {
	vi := func(name string) *pb.ValueInfoProto {
		return &pb.ValueInfoProto{Name: name, Type: &pb.TypeProto{Value: &pb.TypeProto_TensorType{TensorType: &pb.TypeProto_Tensor{
			ElemType: int32(pb.TensorProto_FLOAT),
			Shape:    &pb.TensorShapeProto{Dim: []*pb.TensorShapeProto_Dimension{{Value: &pb.TensorShapeProto_Dimension_DimParam{DimParam: "n"}}}},
		}}}}
	}
	m := &pb.ModelProto{IrVersion: 8, OpsetImport: []*pb.OperatorSetIdProto{{Version: 18}}, Graph: &pb.GraphProto{
		Name:   "id",
		Node:   []*pb.NodeProto{{OpType: "Identity", Input: []string{"x"}, Output: []string{"y"}}},
		Input:  []*pb.ValueInfoProto{vi("x")},
		Output: []*pb.ValueInfoProto{vi("y")},
	}}
	b, err := proto.Marshal(m)
	if err != nil {
		panic(err)
	}
	return b
}

// matMulModel is Y = MatMul(X, W) with X [n, k] and W a [k, k] float32
// initializer.
func matMulModel(k int, w []float32) []byte {
	vi := func(name string) *pb.ValueInfoProto {
		return &pb.ValueInfoProto{Name: name, Type: &pb.TypeProto{Value: &pb.TypeProto_TensorType{TensorType: &pb.TypeProto_Tensor{
			ElemType: int32(pb.TensorProto_FLOAT),
			Shape: &pb.TensorShapeProto{Dim: []*pb.TensorShapeProto_Dimension{
				{Value: &pb.TensorShapeProto_Dimension_DimParam{DimParam: "n"}},
				{Value: &pb.TensorShapeProto_Dimension_DimValue{DimValue: int64(k)}},
			}},
		}}}}
	}
	m := &pb.ModelProto{IrVersion: 8, OpsetImport: []*pb.OperatorSetIdProto{{Version: 18}}, Graph: &pb.GraphProto{
		Name:        "matmul",
		Node:        []*pb.NodeProto{{OpType: "MatMul", Input: []string{"x", "w"}, Output: []string{"y"}}},
		Initializer: []*pb.TensorProto{{Name: "w", Dims: []int64{int64(k), int64(k)}, DataType: int32(pb.TensorProto_FLOAT), FloatData: w}},
		Input:       []*pb.ValueInfoProto{vi("x")},
		Output:      []*pb.ValueInfoProto{vi("y")},
	}}
	b, err := proto.Marshal(m)
	if err != nil {
		panic(err)
	}
	return b
}
