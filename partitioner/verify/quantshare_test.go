package verify_test

import (
	"path/filepath"
	"testing"

	pb "github.com/prism-serve/prism/internal/onnxpb"
	"github.com/prism-serve/prism/partitioner"
	"github.com/prism-serve/prism/partitioner/verify"
)

func tensorVI(name string, elem pb.TensorProto_DataType, dims ...any) *pb.ValueInfoProto {
	shape := &pb.TensorShapeProto{}
	for _, d := range dims {
		switch d := d.(type) {
		case string:
			shape.Dim = append(shape.Dim, &pb.TensorShapeProto_Dimension{Value: &pb.TensorShapeProto_Dimension_DimParam{DimParam: d}})
		case int:
			shape.Dim = append(shape.Dim, &pb.TensorShapeProto_Dimension{Value: &pb.TensorShapeProto_Dimension_DimValue{DimValue: int64(d)}})
		}
	}
	return &pb.ValueInfoProto{Name: name, Type: &pb.TypeProto{Value: &pb.TypeProto_TensorType{TensorType: &pb.TypeProto_Tensor{ElemType: int32(elem), Shape: shape}}}}
}

// int8Tensor is an INT8 tensor of values v, in raw_data or, as
// onnx.helper.make_tensor writes it, in int32_data.
func int8Tensor(name string, dims []int64, v []int32, int32Data bool) *pb.TensorProto {
	t := &pb.TensorProto{Name: name, DataType: int32(pb.TensorProto_INT8), Dims: dims}
	if int32Data {
		t.Int32Data = v
		return t
	}
	for _, x := range v {
		t.RawData = append(t.RawData, byte(int8(x)))
	}
	return t
}

// TestQuantTablesShareParts: int8 table parts as a QDQ model may hold
// them, stored inline (raw_data), in int32_data (onnx.helper.make_tensor)
// or as external data: a table of two parts dequantized per row (axis
// 0) and joined by a Concat; the first part's per-row DequantizeLinear
// read by a Gather of its own too, and that part dequantized again by
// another DequantizeLinear, per tensor, for a third Gather. The third is
// a table of other values than the second (found by review: the two
// were taken for one table, their part the same initializer, and one
// Gather's rows read the other's scales), and the partition reproduces
// the model.
func TestQuantTablesShareParts(t *testing.T) {
	requireORT(t)
	for _, tc := range []struct {
		name      string
		int32Data bool
		external  bool
	}{
		{"raw_data", false, false},
		{"int32_data", true, false},
		{"external", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const dim = 4
			rows := []int64{10, 6}
			var inits []*pb.TensorProto
			var nodes []*pb.NodeProto
			for p, r := range rows {
				q := make([]int32, r*dim)
				for i := range q {
					q[i] = int32((i*7+p)%23 - 11)
				}
				scale, zp := make([]float32, r), make([]int32, r)
				for i := range scale {
					scale[i] = float32(i%5+1) / 8
					zp[i] = int32(i%3 - 1)
				}
				pn, sn, zn := "P"+string(rune('0'+p))+"_quantized", "s"+string(rune('0'+p)), "z"+string(rune('0'+p))
				inits = append(inits, int8Tensor(pn, []int64{r, dim}, q, tc.int32Data), pb.NewFloatTensor(sn, []int64{r}, scale), int8Tensor(zn, []int64{r}, zp, tc.int32Data))
				nodes = append(nodes, &pb.NodeProto{Name: "dq" + pn, OpType: "DequantizeLinear", Input: []string{pn, sn, zn}, Output: []string{"D" + pn},
					Attribute: []*pb.AttributeProto{{Name: "axis", Type: pb.AttributeProto_INT, I: 0}}})
			}
			inits = append(inits, pb.NewFloatTensor("sc", nil, []float32{0.03125}))
			nodes = append(nodes,
				&pb.NodeProto{Name: "cat0", OpType: "Concat", Input: []string{"DP0_quantized", "DP1_quantized"}, Output: []string{"T"}, Attribute: []*pb.AttributeProto{{Name: "axis", Type: pb.AttributeProto_INT, I: 0}}},
				&pb.NodeProto{Name: "dqb", OpType: "DequantizeLinear", Input: []string{"P0_quantized", "sc"}, Output: []string{"B"}},
				&pb.NodeProto{Name: "ga", OpType: "Gather", Input: []string{"T", "ids"}, Output: []string{"ra"}},
				&pb.NodeProto{Name: "gb", OpType: "Gather", Input: []string{"B", "ids2"}, Output: []string{"rb"}},
				&pb.NodeProto{Name: "g0", OpType: "Gather", Input: []string{"DP0_quantized", "ids3"}, Output: []string{"r0"}},
				&pb.NodeProto{Name: "cat1", OpType: "Concat", Input: []string{"ra", "rb", "r0", "x"}, Output: []string{"y"}, Attribute: []*pb.AttributeProto{{Name: "axis", Type: pb.AttributeProto_INT, I: 1}}},
			)
			m := &pb.ModelProto{IrVersion: 8, OpsetImport: []*pb.OperatorSetIdProto{{Version: 18}}, Graph: &pb.GraphProto{
				Name: "shared-parts", Node: nodes, Initializer: inits,
				Input:  []*pb.ValueInfoProto{tensorVI("ids", pb.TensorProto_INT64, "batch"), tensorVI("ids2", pb.TensorProto_INT64, "batch"), tensorVI("ids3", pb.TensorProto_INT64, "batch"), tensorVI("x", pb.TensorProto_FLOAT, "batch", 2)},
				Output: []*pb.ValueInfoProto{tensorVI("y", pb.TensorProto_FLOAT, "batch", 3*dim+2)},
			}}
			dir := t.TempDir()
			model := filepath.Join(dir, "model.onnx")
			wo := pb.WriteOptions{}
			if tc.external {
				wo = pb.WriteOptions{External: pb.ExternalAlways, MinExternalBytes: 1}
			}
			if err := pb.WriteModel(model, m, wo); err != nil {
				t.Fatal(err)
			}
			out := filepath.Join(dir, "part")
			res, err := partitioner.Partition(model, out, partitioner.Options{})
			if err != nil {
				t.Fatal(err)
			}
			if len(res.Plan.Tables) != 3 {
				t.Errorf("%d tables, want 3\n%s", len(res.Plan.Tables), res.Report())
			}
			if _, err := verify.Verify(model, out, 50, 1); err != nil {
				t.Fatalf("verify: %v\n%s", err, res.Report())
			}
		})
	}
}
