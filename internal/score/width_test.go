package score

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	pb "github.com/prism-serve/prism/internal/onnxpb"
	"github.com/prism-serve/prism/internal/ort"
)

// floatValue is a float32 value info of shape [n, w] (n symbolic).
func floatValue(name string, w int64) *pb.ValueInfoProto {
	return &pb.ValueInfoProto{Name: name, Type: &pb.TypeProto{Value: &pb.TypeProto_TensorType{TensorType: &pb.TypeProto_Tensor{
		ElemType: int32(pb.TensorProto_FLOAT),
		Shape: &pb.TensorShapeProto{Dim: []*pb.TensorShapeProto_Dimension{
			{Value: &pb.TensorShapeProto_Dimension_DimParam{DimParam: "n"}},
			{Value: &pb.TensorShapeProto_Dimension_DimValue{DimValue: w}},
		}},
	}}}}
}

// TestScoreOutputWidth: a model whose score output holds more than one
// value per sample (two class probabilities) is refused, not counted as
// twice the samples with its log loss taken against the wrong values.
func TestScoreOutputWidth(t *testing.T) {
	if err := ort.Init(); err != nil {
		t.Skip(err)
	}
	m := &pb.ModelProto{IrVersion: 8, OpsetImport: []*pb.OperatorSetIdProto{{Version: 18}}, Graph: &pb.GraphProto{
		Name:   "probs",
		Node:   []*pb.NodeProto{{OpType: "Identity", Input: []string{"dense"}, Output: []string{"probs"}}},
		Input:  []*pb.ValueInfoProto{floatValue("dense", 2)},
		Output: []*pb.ValueInfoProto{floatValue("probs", 2)},
	}}
	buf, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "model.onnx")
	if err := os.WriteFile(path, buf, 0o644); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	err = Run(&out, path, Options{Samples: 4, Batch: 4, Seed: 1, Threads: 1})
	if err == nil || !strings.Contains(err.Error(), `output "probs" has 8 values for 4 samples`) {
		t.Fatalf("Run: %v; printed:\n%s", err, out.String())
	}
}
