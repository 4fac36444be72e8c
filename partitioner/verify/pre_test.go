package verify_test

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	pb "github.com/prism-serve/prism/internal/onnxpb"
	"github.com/prism-serve/prism/models"
	"github.com/prism-serve/prism/models/exporters"
	"github.com/prism-serve/prism/partitioner"
	"github.com/prism-serve/prism/partitioner/verify"
	"github.com/prism-serve/prism/plan"
)

// TestPreONNXFallback: the corpus models whose id work the native ops
// do not cover partition with every table a lookup, the work cut into
// pre.onnx (the plan names it, its lookups read its outputs, the
// report says so), and verify runs it as the embedding tier does,
// within 1e-5. Models whose id work is all native get no pre.onnx.
func TestPreONNXFallback(t *testing.T) {
	requireORT(t)
	fallback := map[string]bool{}
	for _, m := range exporters.Fallback(7) {
		fallback[m.Name] = true
	}
	for _, m := range exporters.Corpus(7) {
		t.Run(m.Name, func(t *testing.T) {
			model, out, res := partitionCorpus(t, m)
			p := res.Plan
			_, statErr := os.Stat(filepath.Join(out, partitioner.PreFile))
			if !fallback[m.Name] {
				if p.PreModel != "" || statErr == nil {
					t.Fatalf("native id work, yet pre_model %q (file: %v)\n%s", p.PreModel, statErr, res.Report())
				}
				return
			}
			if p.Version != plan.WriteVersion(p) || p.PreModel != partitioner.PreFile || statErr != nil {
				t.Fatalf("version %d, pre_model %q (file: %v), want version %d and %s\n%s", p.Version, p.PreModel, statErr, plan.WriteVersion(p), partitioner.PreFile, res.Report())
			}
			reads := 0
			for _, tab := range p.Tables {
				for _, l := range tab.Lookups {
					if l.PreOutput != "" {
						reads++
						if len(l.Pre) > 0 || len(l.PreInputs) == 0 || l.PreInputs[0] != l.Input {
							t.Errorf("table %q: lookup %+v", tab.Name, l)
						}
					}
				}
			}
			if reads == 0 || !strings.Contains(res.Report(), "pre-lookup subgraph (pre.onnx") {
				t.Fatalf("%d lookups read pre.onnx\n%s", reads, res.Report())
			}
			rep, err := verify.Verify(model, out, 300, 3)
			if err != nil {
				t.Fatalf("verify: %v\n%s", err, res.Report())
			}
			t.Logf("%d lookups read pre.onnx; max abs error %.2g\n%s", reads, rep.MaxAbsErr, res.Report())
		})
	}
}

// TestInt32WrapNative: ids cast to int32 and offset past 2^31 wrap as
// ONNX int32 Add does, in the native ops too: the partition (cast,
// add, mod run natively) equals the whole model on ids near the top of
// int32, where an add in int64 would pick other rows (review finding).
func TestInt32WrapNative(t *testing.T) {
	requireORT(t)
	dir := t.TempDir()
	model := filepath.Join(dir, "model.onnx")
	if err := pb.WriteModel(model, int32WrapModel(), pb.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "part")
	res, err := partitioner.Partition(model, out, partitioner.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if p := res.Plan; len(p.Tables) != 1 || p.PreModel != "" || len(p.Tables[0].Lookups[0].Pre) != 3 {
		t.Fatalf("want one lookup with native cast, add and mod\n%s", res.Report())
	}
	sig := models.Signature{Inputs: []models.InputSpec{{Name: "ids", Kind: models.SparseKind, Width: 1, Rank1: true,
		Ranges: []models.IDRange{{Lo: math.MaxInt32 - 400, Hi: math.MaxInt32}}, Rows: math.MaxInt32}}}
	src, err := models.NewSynthetic(sig, models.SyntheticOptions{Seed: 1, Uniform: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := verify.VerifySource(model, out, src, 300); err != nil {
		t.Fatal(err)
	}
}

// int32WrapModel: ids.int() + 1000 (int32 Add), % 50, an embedding, a
// sigmoid.
func int32WrapModel() *pb.ModelProto {
	dims := func(d ...int64) *pb.TypeProto {
		var ds []*pb.TensorShapeProto_Dimension
		for _, v := range d {
			dim := &pb.TensorShapeProto_Dimension{Value: &pb.TensorShapeProto_Dimension_DimValue{DimValue: v}}
			if v < 0 {
				dim.Value = &pb.TensorShapeProto_Dimension_DimParam{DimParam: "batch"}
			}
			ds = append(ds, dim)
		}
		return &pb.TypeProto{Value: &pb.TypeProto_TensorType{TensorType: &pb.TypeProto_Tensor{ElemType: int32(pb.TensorProto_FLOAT), Shape: &pb.TensorShapeProto{Dim: ds}}}}
	}
	in := dims(-1)
	in.GetTensorType().ElemType = int32(pb.TensorProto_INT64)
	table := make([]float32, 50*4)
	for i := range table {
		table[i] = float32(i%97) / 64
	}
	node := func(op string, ins []string, out string, attrs ...*pb.AttributeProto) *pb.NodeProto {
		return &pb.NodeProto{Name: out, OpType: op, Input: ins, Output: []string{out}, Attribute: attrs}
	}
	g := &pb.GraphProto{
		Name:  "int32_wrap",
		Input: []*pb.ValueInfoProto{{Name: "ids", Type: in}},
		Initializer: []*pb.TensorProto{
			{Name: "t", DataType: int32(pb.TensorProto_FLOAT), Dims: []int64{50, 4}, FloatData: table},
			{Name: "off", DataType: int32(pb.TensorProto_INT32), Int32Data: []int32{1000}},
			{Name: "m", DataType: int32(pb.TensorProto_INT32), Int32Data: []int32{50}},
		},
		Node: []*pb.NodeProto{
			node("Cast", []string{"ids"}, "i32", &pb.AttributeProto{Name: "to", Type: pb.AttributeProto_INT, I: int64(pb.TensorProto_INT32)}),
			node("Add", []string{"i32", "off"}, "a"),
			node("Mod", []string{"a", "m"}, "h", &pb.AttributeProto{Name: "fmod", Type: pb.AttributeProto_INT, I: 0}),
			node("Gather", []string{"t", "h"}, "e"),
			node("Sigmoid", []string{"e"}, "y"),
		},
		Output: []*pb.ValueInfoProto{{Name: "y", Type: dims(-1, 4)}},
	}
	return &pb.ModelProto{IrVersion: 8, OpsetImport: []*pb.OperatorSetIdProto{{Version: 13}}, Graph: g}
}
