package partitioner_test

import (
	"errors"
	"github.com/prism-serve/prism/plan"
	"os"
	"path/filepath"
	"strings"
	"testing"

	pb "github.com/prism-serve/prism/internal/onnxpb"
	"github.com/prism-serve/prism/models"
	"github.com/prism-serve/prism/partitioner"
)

func buildTiny(t *testing.T, name string, external bool) string {
	t.Helper()
	p, err := models.Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	m, err := models.New(p.Config, 1)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "model")
	if _, err := m.Write(dir, models.WriteOptions{External: external}); err != nil {
		t.Fatal(err)
	}
	return filepath.Join(dir, models.ModelFile)
}

// dense is a model without lookups: Gemm, Relu, Sigmoid.
func denseOnly() *pb.ModelProto {
	w := pb.NewFloatTensor("w", []int64{4, 3}, make([]float32, 12))
	b := pb.NewFloatTensor("b", []int64{4}, make([]float32, 4))
	return &pb.ModelProto{IrVersion: 8, OpsetImport: []*pb.OperatorSetIdProto{{Version: 18}}, Graph: &pb.GraphProto{
		Name: "dense",
		Node: []*pb.NodeProto{
			{Name: "gemm", OpType: "Gemm", Input: []string{"x", "w", "b"}, Output: []string{"h"}, Attribute: []*pb.AttributeProto{{Name: "transB", Type: pb.AttributeProto_INT, I: 1}}},
			{Name: "relu", OpType: "Relu", Input: []string{"h"}, Output: []string{"r"}},
			{Name: "sig", OpType: "Sigmoid", Input: []string{"r"}, Output: []string{"y"}},
		},
		Initializer: []*pb.TensorProto{w, b},
		Input:       []*pb.ValueInfoProto{vi("x", 3)},
		Output:      []*pb.ValueInfoProto{vi("y", 4)},
	}}
}

func vi(name string, width int64) *pb.ValueInfoProto {
	return &pb.ValueInfoProto{Name: name, Type: &pb.TypeProto{Value: &pb.TypeProto_TensorType{TensorType: &pb.TypeProto_Tensor{
		ElemType: int32(pb.TensorProto_FLOAT),
		Shape: &pb.TensorShapeProto{Dim: []*pb.TensorShapeProto_Dimension{
			{Value: &pb.TensorShapeProto_Dimension_DimParam{DimParam: "batch"}},
			{Value: &pb.TensorShapeProto_Dimension_DimValue{DimValue: width}},
		}},
	}}}}
}

func writeModel(t *testing.T, m *pb.ModelProto) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "m.onnx")
	if err := pb.WriteModel(p, m, pb.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestNoLookups(t *testing.T) {
	out := filepath.Join(t.TempDir(), "out")
	res, err := partitioner.Partition(writeModel(t, denseOnly()), out, partitioner.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Plan.CPUModel != "" || len(res.Plan.Tables) != 0 {
		t.Fatalf("plan: cpu %q, %d tables", res.Plan.CPUModel, len(res.Plan.Tables))
	}
	if !strings.Contains(res.Report(), "CPU side: empty (no embedding lookups found") {
		t.Errorf("report does not say the CPU side is empty:\n%s", res.Report())
	}
	if len(res.Plan.Cut) != 1 || res.Plan.Cut[0].Name != "x" || res.Plan.Cut[0].From != "input" {
		t.Errorf("cut = %+v, want the input x", res.Plan.Cut)
	}
	for _, f := range []string{"plan.json", "dense.onnx"} {
		if _, err := os.Stat(filepath.Join(out, f)); err != nil {
			t.Error(err)
		}
	}
	if _, err := os.Stat(filepath.Join(out, "cpu.onnx")); err == nil {
		t.Error("cpu.onnx written for an empty CPU side")
	}
}

// TestBadInput: each bad input is an error naming the file and the fault,
// and the output folder is left as it was.
func TestBadInput(t *testing.T) {
	good := buildTiny(t, "dlrm-tiny", true)
	goodBytes, _ := os.ReadFile(good)
	cyc := denseOnly()
	cyc.Graph.Node[0].Input[0] = "y" // gemm reads sig's output: a cycle
	cyc.Graph.Input = nil
	dangling := denseOnly()
	dangling.Graph.Node[1].Input[0] = "nowhere"

	cases := []struct {
		name  string
		model func(dir string) string
		want  []string
	}{
		{"not onnx", func(d string) string {
			p := filepath.Join(d, "readme.onnx")
			os.WriteFile(p, []byte("# not a model\n"), 0o644)
			return p
		}, []string{"readme.onnx", "not"}},
		{"truncated", func(d string) string {
			p := filepath.Join(d, "cut.onnx")
			os.WriteFile(p, goodBytes[:len(goodBytes)/2], 0o644)
			return p
		}, []string{"cut.onnx"}},
		{"missing external data", func(d string) string {
			p := filepath.Join(d, "model.onnx")
			os.WriteFile(p, goodBytes, 0o644) // model.onnx.data not copied
			return p
		}, []string{"model.onnx.data", "no such file"}},
		{"cycle", func(d string) string { return writeModelIn(t, d, cyc) }, []string{"m.onnx", "cycle", "gemm"}},
		{"dangling input", func(d string) string { return writeModelIn(t, d, dangling) }, []string{"m.onnx", "nowhere", "dangling"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			out := filepath.Join(dir, "out")
			_, err := partitioner.Partition(tc.model(dir), out, partitioner.Options{})
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
			ents, _ := os.ReadDir(dir)
			for _, e := range ents {
				if e.Name() == "out" || strings.Contains(e.Name(), "partial") {
					t.Errorf("left %s behind", e.Name())
				}
			}
		})
	}
}

func writeModelIn(t *testing.T, dir string, m *pb.ModelProto) string {
	p := filepath.Join(dir, "m.onnx")
	if err := pb.WriteModel(p, m, pb.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestOutputFolder(t *testing.T) {
	model := buildTiny(t, "dcnv2-tiny", false)
	out := filepath.Join(t.TempDir(), "out")
	os.MkdirAll(out, 0o755)
	os.WriteFile(filepath.Join(out, "keep.txt"), []byte("mine"), 0o644)
	_, err := partitioner.Partition(model, out, partitioner.Options{})
	if !errors.Is(err, partitioner.ErrOutputExists) {
		t.Fatalf("err = %v", err)
	}
	if b, _ := os.ReadFile(filepath.Join(out, "keep.txt")); string(b) != "mine" {
		t.Fatal("the existing folder was touched")
	}
	if _, err := partitioner.Partition(model, out, partitioner.Options{Overwrite: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(out, "keep.txt")); err == nil {
		t.Error("--overwrite kept the old contents")
	}
	// Readable by a tier running as another user (MkdirTemp's 0700
	// renamed into place was not).
	if st, err := os.Stat(out); err != nil || st.Mode().Perm() != 0o755 {
		t.Errorf("output folder mode %v, %v; want 0755", st.Mode().Perm(), err)
	}
	p, err := plan.Read(out)
	if err != nil || p.Version != plan.WriteVersion(p) || len(p.Tables) != 26 {
		t.Fatalf("plan %v, %v", p, err)
	}
	// An empty existing folder is fine.
	empty := filepath.Join(t.TempDir(), "empty")
	os.MkdirAll(empty, 0o755)
	if _, err := partitioner.Partition(model, empty, partitioner.Options{}); err != nil {
		t.Fatal(err)
	}
}

func TestReportOnlyWritesNothing(t *testing.T) {
	model := buildTiny(t, "deepfm-tiny", false)
	out := filepath.Join(t.TempDir(), "out")
	res, err := partitioner.Partition(model, out, partitioner.Options{ReportOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(out); err == nil {
		t.Fatal("--report-only wrote the output folder")
	}
	if len(res.Plan.Tables) != 52 {
		t.Errorf("%d tables, want 26 embedding + 26 first-order", len(res.Plan.Tables))
	}
}

func TestForce(t *testing.T) {
	model := writeModel(t, denseOnly())
	res, err := partitioner.Partition(model, "", partitioner.Options{ReportOnly: true, ForceCPU: []string{"relu"}})
	if err == nil {
		// relu reads gemm (pinned to the dense side): forcing it to the
		// CPU would send data back, which no placement allows.
		t.Fatalf("forced relu onto the CPU after a GPU Gemm: %+v", res.Plan.Cut)
	}
	if !strings.Contains(err.Error(), "cpu:relu") || !errors.Is(err, partitioner.ErrForced) {
		t.Errorf("error %q does not name the forced node or is not ErrForced", err)
	}
	if _, err := partitioner.Partition(model, "", partitioner.Options{ReportOnly: true, ForceGPU: []string{"nope"}}); err == nil || !strings.Contains(err.Error(), `"nope"`) || !errors.Is(err, partitioner.ErrForced) || strings.Contains(err.Error(), "--") {
		t.Errorf("unknown node: %v", err)
	}
	// DeepFM: its first-order sum runs on the CPU by choice; forcing it
	// to the dense side is obeyed and costs more.
	fm := buildTiny(t, "deepfm-tiny", false)
	free, err := partitioner.Partition(fm, "", partitioner.Options{ReportOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	forced, err := partitioner.Partition(fm, "", partitioner.Options{ReportOnly: true, ForceGPU: []string{"/ReduceSum_1"}})
	if err != nil {
		t.Fatal(err)
	}
	if forced.Plan.Cost.Objective <= free.Plan.Cost.Objective || forced.Plan.Cost.CutBytes <= free.Plan.Cost.CutBytes {
		t.Errorf("forcing the first-order sum to the GPU: objective %v -> %v, cut %d -> %d", free.Plan.Cost.Objective, forced.Plan.Cost.Objective, free.Plan.Cost.CutBytes, forced.Plan.Cost.CutBytes)
	}
}

// TestCutNeedsKnownShape: a tensor whose per-sample shape is not known
// (a Tile, which shape inference does not work out) cannot cross: the
// plan would declare it [] (one float a sample) and the tiers frame it
// so. Forcing its node onto the CPU side is refused, not written.
func TestCutNeedsKnownShape(t *testing.T) {
	m, err := partitioner.ParseGraph(`input ids int64 [N]
init emb float [100,4]
init reps int64 [2] = 1,2
init w float [8,1]
node Gather emb,ids -> g
node Tile g,reps -> tiled
node MatMul tiled,w -> l
node Sigmoid l -> score
output score float [N,1]`)
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range m.Graph.Initializer {
		if in.GetDataType() == int32(pb.TensorProto_FLOAT) {
			in.FloatData = make([]float32, in.Dims[0]*in.Dims[1])
		}
	}
	model := writeModel(t, m)
	res, err := partitioner.Partition(model, filepath.Join(t.TempDir(), "free"), partitioner.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Plan.Cut) != 1 || res.Plan.Cut[0].Name != "g" {
		t.Errorf("cut = %+v, want the lookup's g", res.Plan.Cut)
	}
	res, err = partitioner.Partition(model, filepath.Join(t.TempDir(), "forced"), partitioner.Options{ForceCPU: []string{"tiled"}})
	if !errors.Is(err, partitioner.ErrForced) {
		var cut []plan.CutTensor
		if res != nil {
			cut = res.Plan.Cut
		}
		t.Fatalf("Tile forced onto the CPU side: err %v, cut %+v; want ErrForced", err, cut)
	}
}
