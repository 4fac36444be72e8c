package verify_test

import (
	"math/rand/v2"
	"path/filepath"
	"testing"

	pb "github.com/prism-serve/prism/internal/onnxpb"
	"github.com/prism-serve/prism/models"
	"github.com/prism-serve/prism/partitioner"
	"github.com/prism-serve/prism/partitioner/verify"
)

// packedModel is written the way exporters write packed inputs: ids
// [batch, 3] plus per-feature offsets into one fused table (TorchRec),
// and one float input x [batch, 4] carrying 2 dense features and 2 ids
// (sliced, cast to int64, picked by Gather(axis=1)), the second of them
// 1-based and clamped; the lookups and dense part meet in a Gemm.
func packedModel(t *testing.T, r *rand.Rand) *pb.ModelProto {
	const rows, dim = 50, 4
	f32 := func(name string, dims []int64, n int) *pb.TensorProto {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(r.NormFloat64() * 0.5)
		}
		return &pb.TensorProto{Name: name, DataType: int32(pb.TensorProto_FLOAT), Dims: dims, FloatData: v}
	}
	i64 := func(name string, dims []int64, v ...int64) *pb.TensorProto {
		return &pb.TensorProto{Name: name, DataType: int32(pb.TensorProto_INT64), Dims: dims, Int64Data: v}
	}
	in := func(name string, elem pb.TensorProto_DataType, w int64) *pb.ValueInfoProto {
		return &pb.ValueInfoProto{Name: name, Type: &pb.TypeProto{Value: &pb.TypeProto_TensorType{TensorType: &pb.TypeProto_Tensor{ElemType: int32(elem), Shape: &pb.TensorShapeProto{Dim: []*pb.TensorShapeProto_Dimension{
			{Value: &pb.TensorShapeProto_Dimension_DimParam{DimParam: "batch"}}, {Value: &pb.TensorShapeProto_Dimension_DimValue{DimValue: w}}}}}}}}
	}
	node := func(op string, ins []string, out string, attrs ...*pb.AttributeProto) *pb.NodeProto {
		return &pb.NodeProto{OpType: op, Input: ins, Output: []string{out}, Name: out, Attribute: attrs}
	}
	ai := func(name string, v int64) *pb.AttributeProto {
		return &pb.AttributeProto{Name: name, Type: pb.AttributeProto_INT, I: v}
	}
	g := &pb.GraphProto{
		Name:  "packed",
		Input: []*pb.ValueInfoProto{in("ids", pb.TensorProto_INT64, 3), in("x", pb.TensorProto_FLOAT, 4)},
		Initializer: []*pb.TensorProto{
			f32("fused", []int64{3 * rows, dim}, 3*rows*dim), i64("offsets", []int64{3}, 0, rows, 2*rows),
			f32("t_a", []int64{rows, dim}, rows*dim), f32("t_b", []int64{rows, dim}, rows*dim),
			i64("s0", []int64{1}, 0), i64("s2", []int64{1}, 2), i64("s4", []int64{1}, 4), i64("ax", []int64{1}, 1),
			i64("k0", nil, 0), i64("k1", nil, 1), i64("one", nil, 1), i64("lo", nil, 0), i64("hi", nil, rows-1),
			f32("w", []int64{2 + 3*dim + 2*dim, 1}, 2+5*dim), f32("bias", []int64{1}, 1),
		},
		Node: []*pb.NodeProto{
			node("Add", []string{"ids", "offsets"}, "fid"),
			node("Gather", []string{"fused", "fid"}, "ef"),
			node("Flatten", []string{"ef"}, "eff", ai("axis", 1)),
			node("Slice", []string{"x", "s0", "s2", "ax"}, "dense"),
			node("Slice", []string{"x", "s2", "s4", "ax"}, "idf"),
			node("Cast", []string{"idf"}, "xid", ai("to", int64(pb.TensorProto_INT64))),
			node("Gather", []string{"xid", "k0"}, "a", ai("axis", 1)),
			node("Gather", []string{"xid", "k1"}, "b1", ai("axis", 1)),
			node("Sub", []string{"b1", "one"}, "b0"),
			node("Clip", []string{"b0", "lo", "hi"}, "b"),
			node("Gather", []string{"t_a", "a"}, "ea"),
			node("Gather", []string{"t_b", "b"}, "eb"),
			node("Concat", []string{"dense", "eff", "ea", "eb"}, "cat", ai("axis", 1)),
			node("Gemm", []string{"cat", "w", "bias"}, "logit"),
			node("Sigmoid", []string{"logit"}, "score"),
		},
		Output: []*pb.ValueInfoProto{in("score", pb.TensorProto_FLOAT, 1)},
	}
	return &pb.ModelProto{IrVersion: 8, OpsetImport: []*pb.OperatorSetIdProto{{Version: 17}}, Graph: g}
}

// packedSource draws valid inputs for packedModel: ids in [0, 50) per
// column, x's id columns as float ids (the second 1-based, sometimes
// out of range to exercise the clamp).
type packedSource struct {
	r   *rand.Rand
	sig *models.Signature
}

func (s *packedSource) Next(n int) (*models.Batch, error) {
	b := &models.Batch{N: n, Sig: s.sig, Columns: make([]models.Column, 2)}
	for range n {
		for range 3 {
			b.Columns[0].I64 = append(b.Columns[0].I64, s.r.Int64N(50))
		}
		b.Columns[1].F32 = append(b.Columns[1].F32, float32(s.r.NormFloat64()), float32(s.r.NormFloat64()),
			float32(s.r.Int64N(50)), float32(s.r.Int64N(60)))
	}
	return b, nil
}

func TestPackedInputsPartitionAndVerify(t *testing.T) {
	requireORT(t)
	r := rand.New(rand.NewPCG(7, 7))
	dir := t.TempDir()
	model := filepath.Join(dir, "model.onnx")
	if err := pb.WriteModel(model, packedModel(t, r), pb.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "part")
	res, err := partitioner.Partition(model, out, partitioner.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Plan.Tables) != 3 {
		t.Fatalf("%d tables, want 3:\n%s", len(res.Plan.Tables), res.Report())
	}
	for _, tab := range res.Plan.Tables {
		for _, l := range tab.Lookups {
			if len(l.Pre) == 0 {
				t.Errorf("table %q: lookup of %q has no pre-lookup ops", tab.Name, l.Input)
			}
		}
	}
	sig := &models.Signature{Inputs: []models.InputSpec{
		{Name: "ids", Kind: models.SparseKind, Width: 3, Rows: 50},
		{Name: "x", Kind: models.DenseKind, Width: 4},
	}}
	rep, err := verify.VerifySource(model, out, &packedSource{r: r, sig: sig}, 600)
	if err != nil {
		t.Fatalf("%v\n%s", err, res.Report())
	}
	t.Logf("max abs error %.2g\n%s", rep.MaxAbsErr, res.Report())
}
