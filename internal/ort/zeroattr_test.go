package ort

import (
	"path/filepath"
	"testing"

	pb "github.com/prism-serve/prism/internal/onnxpb"
)

// TestZeroAttributesWritten: a model written by onnxpb.WriteModel with
// attributes of value 0 (Constant's value_int and value_float, which
// ONNX Runtime reads only when present, and ReduceMax's keepdims) loads
// and runs as written, a local function's call with an attribute of 0
// too: the proto3 subset wrote no zero scalar, and ONNX
// Runtime refused the Constant ("Attribute 'value_int' expect an
// integer").
func TestZeroAttributesWritten(t *testing.T) {
	if err := Init(); err != nil {
		t.Skip(err)
	}
	g := &pb.GraphProto{Name: "zeros",
		Node: []*pb.NodeProto{
			{OpType: "Constant", Output: []string{"zi"}, Attribute: []*pb.AttributeProto{{Name: "value_int", Type: pb.AttributeProto_INT}}},
			{OpType: "Constant", Output: []string{"zf"}, Attribute: []*pb.AttributeProto{{Name: "value_float", Type: pb.AttributeProto_FLOAT}}},
			{OpType: "Cast", Input: []string{"zi"}, Output: []string{"zic"}, Attribute: []*pb.AttributeProto{{Name: "to", Type: pb.AttributeProto_INT, I: int64(pb.TensorProto_FLOAT)}}},
			{OpType: "ReduceMax", Input: []string{"x"}, Output: []string{"r"}, Attribute: []*pb.AttributeProto{
				{Name: "axes", Type: pb.AttributeProto_INTS, Ints: []int64{1}},
				{Name: "keepdims", Type: pb.AttributeProto_INT},
			}},
			{OpType: "Add", Input: []string{"r", "zf"}, Output: []string{"a"}},
			{OpType: "Add", Input: []string{"a", "zic"}, Output: []string{"b"}},
			// A call of a local function whose Constant takes the call's
			// attribute k, 0 (as ONNX Script's torchlib functions take
			// mode): ONNX Runtime reads the call's k when it inlines it.
			{OpType: "AddK", Domain: "local", Input: []string{"b"}, Output: []string{"y"}, Attribute: []*pb.AttributeProto{{Name: "k", Type: pb.AttributeProto_INT}}},
		},
		Input:  []*pb.ValueInfoProto{floatInput("x", 3)},
		Output: []*pb.ValueInfoProto{{Name: "y"}},
	}
	f := &pb.FunctionProto{Name: "AddK", Domain: "local", Input: []string{"v"}, Output: []string{"w"}, Attribute: []string{"k"},
		OpsetImport: []*pb.OperatorSetIdProto{{Version: 13}},
		Node: []*pb.NodeProto{
			{OpType: "Constant", Output: []string{"k"}, Attribute: []*pb.AttributeProto{{Name: "value_int", Type: pb.AttributeProto_INT, RefAttrName: "k"}}},
			{OpType: "Cast", Input: []string{"k"}, Output: []string{"kf"}, Attribute: []*pb.AttributeProto{{Name: "to", Type: pb.AttributeProto_INT, I: int64(pb.TensorProto_FLOAT)}}},
			{OpType: "Add", Input: []string{"v", "kf"}, Output: []string{"w"}},
		}}
	m := &pb.ModelProto{IrVersion: 8, OpsetImport: []*pb.OperatorSetIdProto{{Version: 13}, {Domain: "local", Version: 1}}, Graph: g, Functions: []*pb.FunctionProto{f}}
	path := filepath.Join(t.TempDir(), "zeros.onnx")
	if err := pb.WriteModel(path, m, pb.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	if n := len(m.Graph.Node[0].Attribute[0].ProtoReflect().GetUnknown()); n != 0 {
		t.Fatalf("WriteModel left %d bytes of marks in the caller's model", n)
	}
	s, err := NewSession(path, SessionOptions{})
	if err != nil {
		t.Fatalf("the written model does not load: %v", err)
	}
	defer s.Close()
	out, err := s.Run([]Input{{Name: "x", Shape: []int64{2, 3}, Float32: []float32{1, 5, 2, -1, -4, -2}}})
	if err != nil {
		t.Fatal(err)
	}
	if len(out) != 1 || len(out[0]) != 2 || out[0][0] != 5 || out[0][1] != -1 {
		t.Fatalf("y = %v, want [5 -1] (keepdims 0: one value a row)", out)
	}
	// Read back, the values are the same attributes (no unknown field).
	back, err := pb.ReadModel(path, pb.ReadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range back.GetGraph().GetNode() {
		for _, a := range n.GetAttribute() {
			if len(a.ProtoReflect().GetUnknown()) != 0 || a.GetType() == pb.AttributeProto_INT && a.GetName() != "to" && a.GetI() != 0 {
				t.Fatalf("read back %s's %s: %v", n.GetOpType(), a.GetName(), a)
			}
		}
	}
}
