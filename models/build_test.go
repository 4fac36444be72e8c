package models_test

import (
	"bytes"
	"errors"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	pb "github.com/prism-serve/prism/internal/onnxpb"
	"github.com/prism-serve/prism/models"
)

func TestInferSignatureMatchesConfig(t *testing.T) {
	for _, name := range models.Presets() {
		p, _ := models.Lookup(name)
		c, _ := p.Resolve(models.ScaleOptions{MaxRows: 5000})
		m, err := models.New(c, 1)
		if err != nil {
			t.Fatal(err)
		}
		got, err := models.InferSignature(m.Graph())
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if want := c.Signature(); !reflect.DeepEqual(got, want) {
			t.Errorf("%s: inferred %+v\nwant %+v", name, got.Inputs[:3], want.Inputs[:3])
		}
	}
}

// TestInferSignatureSharedIDs: ids that index two tables (the larger
// one first) are drawn in the smaller one's rows, so every Gather takes
// them.
func TestInferSignatureSharedIDs(t *testing.T) {
	ids := &pb.ValueInfoProto{Name: "ids", Type: &pb.TypeProto{Value: &pb.TypeProto_TensorType{TensorType: &pb.TypeProto_Tensor{
		ElemType: int32(pb.TensorProto_INT64), Shape: &pb.TensorShapeProto{Dim: []*pb.TensorShapeProto_Dimension{{Value: &pb.TensorShapeProto_Dimension_DimParam{DimParam: "batch"}}}}}}}}
	g := &pb.GraphProto{
		Input:       []*pb.ValueInfoProto{ids},
		Initializer: []*pb.TensorProto{pb.NewFloatTensor("big", []int64{100, 2}, make([]float32, 200)), pb.NewFloatTensor("small", []int64{10, 2}, make([]float32, 20))},
		Node: []*pb.NodeProto{
			{OpType: "Gather", Input: []string{"big", "ids"}, Output: []string{"a"}},
			{OpType: "Cast", Input: []string{"ids"}, Output: []string{"ids32"}},
			{OpType: "Gather", Input: []string{"small", "ids32"}, Output: []string{"b"}},
		},
	}
	sig, err := models.InferSignature(&pb.ModelProto{Graph: g})
	if err != nil {
		t.Fatal(err)
	}
	if got := sig.Inputs[0].Rows; got != 10 {
		t.Fatalf("ids drawn in [0, %d), want [0, 10): the smaller table's rows", got)
	}
}

func TestScaled(t *testing.T) {
	base := models.Config{TableRows: []int64{3, 1500, 40_000_000}}
	cases := []struct {
		o    models.ScaleOptions
		want []int64
	}{
		{models.ScaleOptions{}, []int64{3, 1500, 40_000_000}},
		{models.ScaleOptions{RowsScale: 1}, []int64{3, 1500, 40_000_000}},
		{models.ScaleOptions{RowsScale: 0.05}, []int64{3, 1000, 2_000_000}},
		{models.ScaleOptions{RowsScale: 0.5}, []int64{3, 1000, 20_000_000}},
		{models.ScaleOptions{MaxRows: 1200}, []int64{3, 1200, 1200}},
		{models.ScaleOptions{RowsScale: 2, MaxRows: 1_000_000}, []int64{6, 3000, 1_000_000}},
	}
	for _, tc := range cases {
		got, err := base.Scaled(tc.o)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got.TableRows, tc.want) {
			t.Errorf("%+v: rows %v, want %v", tc.o, got.TableRows, tc.want)
		}
	}
	// Past int64 a table kept its preset's rows, silently; under a cap
	// it is the cap.
	if got, err := base.Scaled(models.ScaleOptions{RowsScale: 1e18, MaxRows: 1000}); err != nil || !reflect.DeepEqual(got.TableRows, []int64{1000, 1000, 1000}) {
		t.Errorf("rows-scale 1e18 under max-rows 1000: %v, %v; want every table at 1000", got.TableRows, err)
	}
	for _, bad := range []models.ScaleOptions{{RowsScale: -1}, {RowsScale: math.NaN()}, {MaxRows: -5}, {RowsScale: 1e18}, {RowsScale: 1e300}} {
		if _, err := base.Scaled(bad); err == nil {
			t.Errorf("%+v: no error", bad)
		}
	}
}

// TestBuildDeterministic: the same preset and seed write the same bytes;
// another seed does not.
func TestBuildDeterministic(t *testing.T) {
	p, _ := models.Lookup("dcnv2-tiny")
	build := func(seed uint64) []byte {
		m, err := models.New(p.Config, seed)
		if err != nil {
			t.Fatal(err)
		}
		dir := t.TempDir()
		if _, err := m.Write(dir, models.WriteOptions{}); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(filepath.Join(dir, models.ModelFile))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	a, b, c := build(5), build(5), build(6)
	if !bytes.Equal(a, b) {
		t.Fatal("same seed, different model bytes")
	}
	if bytes.Equal(a, c) {
		t.Fatal("different seeds, same model bytes")
	}
}

// TestExternalDataInORT: the same model with its weights in
// model.onnx.data scores exactly as the inline one in ONNX Runtime.
func TestExternalDataInORT(t *testing.T) {
	requireORT(t)
	p, _ := models.Lookup("deepfm-tiny")
	m, _ := models.New(p.Config, 3)
	inline, ext := t.TempDir(), t.TempDir()
	if _, err := m.Write(inline, models.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	man, err := m.Write(ext, models.WriteOptions{External: true})
	if err != nil {
		t.Fatal(err)
	}
	if !man.External {
		t.Fatal("external data was not written")
	}
	src, _ := models.NewSynthetic(p.Config.Signature(), models.SyntheticOptions{Seed: 1})
	b, _ := src.Next(32)
	x, y := scoreORT(t, inline, b), scoreORT(t, ext, b)
	for i := range x {
		if x[i] != y[i] {
			t.Fatalf("sample %d: inline %v, external %v", i, x[i], y[i])
		}
	}
	// And it round-trips through our reader.
	r, err := pb.ReadModel(filepath.Join(ext, models.ModelFile), pb.ReadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := len(r.Graph.Initializer[0].RawData); got == 0 {
		t.Fatal("external data not loaded")
	}
}

// TestKaggleFullSize builds dlrm-kaggle at its real size (33.7M rows,
// 2 GiB in model.onnx.data), loads it in ONNX Runtime and checks it
// against the reference.
func TestKaggleFullSize(t *testing.T) {
	if testing.Short() {
		t.Skip("2 GiB model; -short")
	}
	requireORT(t)
	p, _ := models.Lookup("dlrm-kaggle")
	m, err := models.New(p.Config, 11)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	man, err := m.Write(dir, models.WriteOptions{})
	if errors.Is(err, pb.ErrNoSpace) {
		// Refused before writing: the machine's temporary folder is
		// too small (CI machines have had under 1 GiB free).
		t.Skipf("%v (set TMPDIR to a larger disk to run this test)", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	if !man.External {
		t.Fatal("a 2 GiB model must be written with external data")
	}
	src, _ := models.NewSynthetic(p.Config.Signature(), models.SyntheticOptions{Seed: 4})
	for _, n := range []int{1, 64} {
		b, _ := src.Next(n)
		got := scoreORT(t, dir, b)
		want, _ := m.Reference(b)
		for i := range got {
			if d := math.Abs(float64(got[i]) - want[i]); d > 1e-5 {
				t.Fatalf("batch %d sample %d: |%v - %v| = %g", n, i, got[i], want[i], d)
			}
		}
	}
}
