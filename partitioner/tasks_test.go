package partitioner_test

import (
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	pb "github.com/prism-serve/prism/internal/onnxpb"
	"github.com/prism-serve/prism/models/exporters"
	"github.com/prism-serve/prism/partitioner"
)

// TestChooseTasksBesideScore: the tasks prism partition picks by default
// beside a model's score. A second head of one value a sample (cvr,
// [batch]) is a task; an output [batch, 16] (a user embedding) is not 16
// tasks, and an output whose shape neither the model declares nor the
// partitioner infers (its plan shape [] would read as one value a
// sample) is no task: either was served as one, the embedding's values
// sent back for every candidate, the unknown output failing every Score
// ("output 1 has 15 values for 5 samples of 1 tasks") of a model whose
// score served before. --tasks still names an embedding (the user's
// choice), never an output of unknown shape.
func TestChooseTasksBesideScore(t *testing.T) {
	shape := func(dims ...any) *pb.TypeProto {
		tt := &pb.TypeProto_Tensor{ElemType: int32(pb.TensorProto_FLOAT)}
		if dims != nil {
			tt.Shape = &pb.TensorShapeProto{}
			for _, d := range dims {
				dim := &pb.TensorShapeProto_Dimension{}
				switch v := d.(type) {
				case int:
					dim.Value = &pb.TensorShapeProto_Dimension_DimValue{DimValue: int64(v)}
				case string:
					dim.Value = &pb.TensorShapeProto_Dimension_DimParam{DimParam: v}
				}
				tt.Shape.Dim = append(tt.Shape.Dim, dim)
			}
		}
		return &pb.TypeProto{Value: &pb.TypeProto_TensorType{TensorType: tt}}
	}
	// Heads read the model's score (a Sigmoid of [batch, 1]).
	heads := map[string]func(g *pb.GraphProto){
		"cvr": func(g *pb.GraphProto) { // torch: 1 - score, .squeeze(1)
			g.Initializer = append(g.Initializer, &pb.TensorProto{Name: "axes1", DataType: int32(pb.TensorProto_INT64), Dims: []int64{1}, Int64Data: []int64{1}})
			g.Node = append(g.Node, &pb.NodeProto{Name: "/cvr/Neg", OpType: "Neg", Input: []string{"score"}, Output: []string{"neg"}},
				&pb.NodeProto{Name: "/cvr/Squeeze", OpType: "Squeeze", Input: []string{"neg", "axes1"}, Output: []string{"cvr"}})
			g.Output = append(g.Output, &pb.ValueInfoProto{Name: "cvr", Type: shape("batch")})
		},
		"user_emb": func(g *pb.GraphProto) { // score @ proj: [batch, 16]
			g.Initializer = append(g.Initializer, &pb.TensorProto{Name: "proj", DataType: int32(pb.TensorProto_FLOAT), Dims: []int64{1, 16}, FloatData: make([]float32, 16)})
			g.Node = append(g.Node, &pb.NodeProto{Name: "/user/MatMul", OpType: "MatMul", Input: []string{"score", "proj"}, Output: []string{"user_emb"}})
			g.Output = append(g.Output, &pb.ValueInfoProto{Name: "user_emb", Type: shape("batch", 16)})
		},
		"tiled": func(g *pb.GraphProto) { // Tile, no declared shape: [batch, 3] at run time
			g.Initializer = append(g.Initializer, &pb.TensorProto{Name: "reps", DataType: int32(pb.TensorProto_INT64), Dims: []int64{2}, Int64Data: []int64{1, 3}})
			g.Node = append(g.Node, &pb.NodeProto{Name: "/Tile", OpType: "Tile", Input: []string{"score", "reps"}, Output: []string{"tiled"}})
			g.Output = append(g.Output, &pb.ValueInfoProto{Name: "tiled", Type: shape()})
		},
	}
	for _, tc := range []struct {
		name  string
		heads []string
		tasks []string // --tasks
		want  []string // the plan's task names, in order
		err   string
	}{
		{"second head", []string{"cvr"}, nil, []string{"score", "cvr"}, ""},
		{"embedding", []string{"user_emb"}, nil, []string{"score"}, ""},
		{"embedding between heads", []string{"user_emb", "cvr"}, nil, []string{"score", "cvr"}, ""},
		{"unknown shape", []string{"tiled"}, nil, []string{"score"}, ""},
		{"unknown shape and a head", []string{"tiled", "cvr"}, nil, []string{"score", "cvr"}, ""},
		{"embedding named", []string{"user_emb"}, []string{"score", "user_emb"}, append([]string{"score"}, embNames()...), ""},
		{"unknown shape named", []string{"tiled"}, []string{"score", "tiled"}, nil, `--tasks "tiled": the output's per-sample shape is unknown`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := exporters.ByName("ts-select-embedding", 5)
			for _, h := range tc.heads {
				heads[h](m.Proto.Graph)
			}
			model := filepath.Join(t.TempDir(), "model.onnx")
			if err := m.Write(model); err != nil {
				t.Fatal(err)
			}
			res, err := partitioner.Partition(model, "", partitioner.Options{ReportOnly: true, Tasks: tc.tasks})
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("%v; want an error with %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			names, err := res.Plan.TaskNames()
			if err != nil || !slices.Equal(names, tc.want) {
				t.Fatalf("tasks %q, %v; want %q\n%s", names, err, tc.want, res.Report())
			}
			if v := 4 + min(len(tc.want)-1, 1); res.Plan.Version != v && len(tc.tasks) == 0 {
				t.Errorf("version %d, want %d", res.Plan.Version, v)
			}
		})
	}
}

func embNames() []string {
	var out []string
	for j := range 16 {
		out = append(out, "user_emb["+strconv.Itoa(j)+"]")
	}
	return out
}

// TestTasksContent: partitions of one export that answer with other
// outputs (--tasks) have other contents (plan.Plan.Content), so the
// router neither pairs their workers nor scores one request's
// micro-batches on both (a request answered 1 and 2 tasks a candidate
// was an Internal error; ctr from some workers and cvr from others, the
// same content, a silent mix); the same outputs, named or by default,
// have the same content.
func TestTasksContent(t *testing.T) {
	dir := t.TempDir()
	model := filepath.Join(dir, "model.onnx")
	if err := exporters.TorchTupleHeads(5).Write(model); err != nil {
		t.Fatal(err)
	}
	content := map[string]string{}
	for _, tasks := range [][]string{nil, {"ctr", "cvr"}, {"cvr", "ctr"}, {"ctr"}, {"cvr"}} {
		key := strings.Join(tasks, ",")
		out := filepath.Join(dir, "part-"+key)
		res, err := partitioner.Partition(model, out, partitioner.Options{Tasks: tasks})
		if err != nil {
			t.Fatal(err)
		}
		if content[key], err = res.Plan.Content(out); err != nil || content[key] == "" {
			t.Fatalf("--tasks %q: content %q, %v", key, content[key], err)
		}
	}
	if content[""] != content["ctr,cvr"] {
		t.Errorf("--tasks ctr,cvr (the default's): content %s, the default's %s", content["ctr,cvr"], content[""])
	}
	seen := map[string]string{}
	for _, key := range []string{"ctr,cvr", "cvr,ctr", "ctr", "cvr"} {
		if other, ok := seen[content[key]]; ok {
			t.Errorf("--tasks %s and --tasks %s: one content %s", key, other, content[key])
		}
		seen[content[key]] = key
	}
}
