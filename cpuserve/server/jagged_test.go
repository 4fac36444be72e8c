package server

import (
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/internal/ort"
	"github.com/prism-serve/prism/plan"
)

// TestDecodeJagged: an EmbeddingBag's ids, weights and offsets decode
// from the candidates (n offsets, or n+1 ending at the number of ids)
// into the n+1 offsets the store pools by; bad offsets, counts and
// sides are InvalidArgument naming what is wrong.
func TestDecodeJagged(t *testing.T) {
	p := &plan.Plan{
		Version: plan.Version, Model: plan.ModelInfo{Name: "bag"}, DenseModel: "dense.onnx",
		Inputs: []plan.TensorInfo{
			{Name: "indices", DType: "int64", Shape: []int64{}, Sides: []plan.Side{plan.CPU}, Offsets: "offsets"},
			{Name: "offsets", DType: "int64", Shape: []int64{}, Sides: []plan.Side{plan.CPU}},
			{Name: "psw", DType: "float32", Shape: []int64{}, Sides: []plan.Side{plan.CPU}, Offsets: "offsets"},
		},
		Outputs: []plan.TensorInfo{{Name: "score", DType: "float32", Shape: []int64{1}}},
		Cut:     []plan.CutTensor{{TensorInfo: plan.TensorInfo{Name: "bags", DType: "float32", Shape: []int64{4}}, BytesPerSample: 16, From: "lookup"}},
		Tables: []plan.Table{{Name: "emb", File: "tables/emb.arrow", Rows: 40, Dim: 4, DType: "float32",
			Lookups: []plan.Lookup{{Input: "indices", Offsets: "offsets", Bag: 1, Pooling: plan.PoolSum, Weights: "psw", Output: "bags"}}}},
	}
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	m, err := loadModel(t.TempDir(), p, ort.SessionOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ids := func(name string, v ...int64) *prismv1.Input { return &prismv1.Input{Name: name, Ids: v} }
	vals := func(name string, v ...float32) *prismv1.Input { return &prismv1.Input{Name: name, Values: v} }
	idx := ids("indices", 3, 1, 4, 1, 5)
	w := vals("psw", 1, 2, 3, 4, 5)
	for _, tc := range []struct {
		name  string
		cands []*prismv1.Input
		ctx   []*prismv1.Input
		want  []int64 // the decoded offsets
		error string
	}{
		{"n offsets", []*prismv1.Input{idx, ids("offsets", 0, 2, 2), w}, nil, []int64{0, 2, 2, 5}, ""},
		{"n+1 offsets", []*prismv1.Input{idx, ids("offsets", 0, 2, 2, 5), w}, nil, []int64{0, 2, 2, 5}, ""},
		{"empty last bag", []*prismv1.Input{idx, ids("offsets", 0, 2, 5), w}, nil, []int64{0, 2, 5, 5}, ""},
		{"first not 0", []*prismv1.Input{idx, ids("offsets", 1, 2, 3), w}, nil, nil, `offsets "offsets" of input "indices": the first offset is 1, want 0`},
		{"decreasing", []*prismv1.Input{idx, ids("offsets", 0, 3, 2), w}, nil, nil, "offset 2 is 2, less than offset 1 (3): offsets never decrease"},
		{"past the ids", []*prismv1.Input{idx, ids("offsets", 0, 2, 6), w}, nil, nil, "offset 2 is 6, past the 5 values"},
		{"too few", []*prismv1.Input{idx, ids("offsets", 0, 2), w}, nil, nil, `offsets "offsets": 2 offsets for 3 candidates: want one per candidate`},
		{"last not the count", []*prismv1.Input{idx, ids("offsets", 0, 2, 2, 4), w}, nil, nil, "4 offsets for 3 candidates end at 4, but input"},
		{"weights short", []*prismv1.Input{idx, ids("offsets", 0, 2, 2), vals("psw", 1, 2)}, nil, nil, `are jagged over the same offsets "offsets": one value per id in each`},
		{"weights as ids", []*prismv1.Input{idx, ids("offsets", 0, 2, 2), ids("psw", 1, 2, 3, 4, 5)}, nil, nil, `input "psw" takes float values (one weight per id), got ids`},
		{"in the context", []*prismv1.Input{idx, w}, []*prismv1.Input{ids("offsets", 0)}, nil, `context: input "offsets" is jagged`},
		{"missing offsets", []*prismv1.Input{idx, w}, nil, nil, "missing input(s) offsets"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := &prismv1.LookupRequest{Model: "bag", NumSamples: 3, Candidates: &prismv1.Features{Inputs: tc.cands}}
			if tc.ctx != nil {
				req.Context = &prismv1.Features{Inputs: tc.ctx}
			}
			got, err := m.decode(req, 3)
			if tc.error != "" {
				if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tc.error) {
					t.Fatalf("got %v, want InvalidArgument saying %q", err, tc.error)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if o := got["offsets"].i64; !slices.Equal(o, tc.want) {
				t.Fatalf("offsets %v, want %v", o, tc.want)
			}
			if len(got["indices"].i64) != 5 || len(got["psw"].f32) != 5 {
				t.Fatalf("ids %v, weights %v", got["indices"].i64, got["psw"].f32)
			}
		})
	}
}
