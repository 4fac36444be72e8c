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
