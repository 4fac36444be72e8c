package server

import (
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/internal/ort"
	"github.com/prism-serve/prism/plan"
)

// TestInt32IDMessage: an id past an int32 input's range is refused
// naming its position and its value, the right way round (the message
// said "id 5000000000 (value 1)": the value as the position and the
// position as the value), for a fixed-width input and a jagged one.
func TestInt32IDMessage(t *testing.T) {
	cpu := []plan.Side{plan.CPU}
	p := &plan.Plan{
		Version: plan.Version, Model: plan.ModelInfo{Name: "m"}, DenseModel: "dense.onnx",
		Inputs: []plan.TensorInfo{
			{Name: "a", DType: "int32", Shape: []int64{2}, Sides: cpu},
			{Name: "j", DType: "int32", Shape: []int64{}, Sides: cpu, Offsets: "jo"},
			{Name: "jo", DType: "int64", Shape: []int64{}, Sides: cpu},
		},
		Outputs: []plan.TensorInfo{{Name: "score", DType: "float32", Shape: []int64{1}}},
		Cut: []plan.CutTensor{
			{TensorInfo: plan.TensorInfo{Name: "asum", DType: "float32", Shape: []int64{2}}, BytesPerSample: 8, From: "lookup"},
			{TensorInfo: plan.TensorInfo{Name: "jsum", DType: "float32", Shape: []int64{2}}, BytesPerSample: 8, From: "lookup"},
		},
		Tables: []plan.Table{{Name: "t", File: "tables/t.arrow", Rows: 20, Dim: 2, DType: "float32", Lookups: []plan.Lookup{
			{Input: "a", Bag: 2, Pooling: plan.PoolSum, Output: "asum"},
			{Input: "j", Offsets: "jo", Bag: 1, Pooling: plan.PoolSum, Output: "jsum"},
		}}},
	}
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	m, err := loadModel(t.TempDir(), p, ort.SessionOptions{})
	if err != nil {
		t.Fatal(err)
	}
	const big = 5000000000
	for _, tc := range []struct {
		name string
		a, j []int64
		want string
	}{
		{"fixed", []int64{3, big}, []int64{1}, `input "a": id 1 (value 5000000000) does not fit the model's int32`},
		{"jagged", []int64{3, 4}, []int64{1, 2, big}, `input "j": id 2 (value 5000000000) does not fit the model's int32`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := &prismv1.LookupRequest{Model: "m", NumSamples: 1, Candidates: &prismv1.Features{Inputs: []*prismv1.Input{
				{Name: "a", Ids: tc.a}, {Name: "j", Ids: tc.j}, {Name: "jo", Ids: []int64{0}},
			}}}
			_, err := m.decode(req, 1)
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want InvalidArgument saying %q", err, tc.want)
			}
		})
	}
}
