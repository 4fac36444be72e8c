package gpuserve

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/internal/onnxpb"
	"github.com/prism-serve/prism/internal/ort"
	"github.com/prism-serve/prism/plan"
)

// auxFirstPlan copies dlrm-tiny's partition (plan.json, dense.onnx) into
// a folder of its own whose dense.onnx has a second output, aux (the
// score negated), listed before the score: a model exporting an
// auxiliary head beside the score, in an order other than the plan's.
// With label, a third output too, before the score: an int64 (ArgMax of
// the score). edit, if set, changes the copied plan before it is written.
func auxFirstPlan(t *testing.T, label bool, edit func(*plan.Plan)) string {
	t.Helper()
	src := tinyPlan(t)
	p, err := plan.Read(src)
	if err != nil {
		t.Fatal(err)
	}
	m, err := onnxpb.ReadModel(filepath.Join(src, p.DenseModel), onnxpb.ReadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	g := m.GetGraph()
	if len(g.Output) != 1 || g.Output[0].GetName() != p.Outputs[0].Name {
		t.Fatalf("dense.onnx outputs %v, want the plan's %q alone", g.Output, p.Outputs[0].Name)
	}
	score := g.Output[0]
	g.Node = append(g.Node, &onnxpb.NodeProto{OpType: "Neg", Input: []string{score.GetName()}, Output: []string{"aux"}, Name: "aux_head"})
	aux := proto.Clone(score).(*onnxpb.ValueInfoProto)
	aux.Name = "aux"
	g.Output = []*onnxpb.ValueInfoProto{aux, score}
	if label {
		g.Node = append(g.Node, &onnxpb.NodeProto{OpType: "ArgMax", Input: []string{score.GetName()}, Output: []string{"label"}, Name: "label_head"})
		l := proto.Clone(score).(*onnxpb.ValueInfoProto)
		l.Name = "label"
		l.Type.GetTensorType().ElemType = int32(onnxpb.TensorProto_INT64)
		l.Type.GetTensorType().Shape = nil
		g.Output = []*onnxpb.ValueInfoProto{aux, l, score}
	}
	dir := t.TempDir()
	if err := onnxpb.WriteModel(filepath.Join(dir, p.DenseModel), m, onnxpb.WriteOptions{External: onnxpb.ExternalNever}); err != nil {
		t.Fatal(err)
	}
	if edit != nil {
		edit(p)
	}
	delete(p.PartSHA256, p.DenseModel) // dense.onnx edited on purpose
	if err := plan.Write(dir, p); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestScoreTakesPlanOutput: a dense.onnx with several outputs, the score
// not first, is scored by the output plan.json names as the score
// (outputs[0]), not by whichever output ONNX Runtime lists first; an
// output that is not float32 beside it (an int64 label) is not fetched,
// so it fails neither the load nor a Score.
func TestScoreTakesPlanOutput(t *testing.T) {
	for _, label := range []bool{false, true} {
		t.Run(fmt.Sprintf("label=%v", label), func(t *testing.T) { scoreTakesPlanOutput(t, label) })
	}
}

func scoreTakesPlanOutput(t *testing.T, label bool) {
	dir := auxFirstPlan(t, label, nil)
	s, err := New(Options{Plans: []string{dir}, Threads: 1, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	p, err := plan.Read(dir)
	if err != nil {
		t.Fatal(err)
	}
	ref, err := ort.NewSession(filepath.Join(tinyPlan(t), p.DenseModel), ort.SessionOptions{IntraOpThreads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer ref.Close()
	const n = 7
	x := cutTensors(p, n, rand.New(rand.NewPCG(3, 4)))
	want := direct(t, ref, p, n, x)
	resp, err := s.Score(context.Background(), &prismv1.ScoreRequest{Model: p.Model.Name, NumSamples: n, Tensors: encode(t, n, x)})
	if err != nil {
		t.Fatal(err)
	}
	for i, w := range want {
		if math.Abs(float64(resp.Scores[i]-w)) > 1e-5 {
			t.Fatalf("score %d is %g, want %g (plan output %q): scores %v, want %v", i, resp.Scores[i], w, p.Outputs[0].Name, resp.Scores, want)
		}
	}
}

// TestLoadRefusesModelWithoutPlanOutput: a dense.onnx without the output
// plan.json names as the score cannot be served: loading says which.
func TestLoadRefusesModelWithoutPlanOutput(t *testing.T) {
	dir := auxFirstPlan(t, false, func(p *plan.Plan) { p.Outputs[0].Name = "click_prob" })
	s, err := New(Options{Plans: []string{dir}, Threads: 1, Logger: slog.New(slog.DiscardHandler)})
	if err == nil {
		s.Close()
		t.Fatal("New served a dense.onnx without the plan's score output")
	}
	if !strings.Contains(err.Error(), `"click_prob"`) {
		t.Fatalf("New: %v; want an error naming the missing output %q", err, "click_prob")
	}
}

// multiTaskPlan copies dlrm-tiny's partition into a folder whose
// dense.onnx's score is two tasks, [batch, 2]: the score and its
// negation side by side (Concat on axis 1), the plan's first output
// "tasks" of per-sample shape shape.
func multiTaskPlan(t *testing.T, shape []int64) string {
	t.Helper()
	return multiTaskPlanNamed(t, shape, "tasks")
}

// multiTaskPlanNamed is multiTaskPlan with the output named name.
func multiTaskPlanNamed(t *testing.T, shape []int64, name string) string {
	t.Helper()
	src := tinyPlan(t)
	p, err := plan.Read(src)
	if err != nil {
		t.Fatal(err)
	}
	m, err := onnxpb.ReadModel(filepath.Join(src, p.DenseModel), onnxpb.ReadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	g := m.GetGraph()
	score := g.Output[0]
	g.Node = append(g.Node,
		&onnxpb.NodeProto{OpType: "Neg", Input: []string{score.GetName()}, Output: []string{"neg"}, Name: "task1"},
		&onnxpb.NodeProto{OpType: "Concat", Input: []string{score.GetName(), "neg"}, Output: []string{name}, Name: "tasks",
			Attribute: []*onnxpb.AttributeProto{{Name: "axis", Type: onnxpb.AttributeProto_INT, I: 1}}})
	out := proto.Clone(score).(*onnxpb.ValueInfoProto)
	out.Name = name
	out.Type.GetTensorType().Shape = nil
	g.Output = []*onnxpb.ValueInfoProto{out}
	dir := t.TempDir()
	if err := onnxpb.WriteModel(filepath.Join(dir, p.DenseModel), m, onnxpb.WriteOptions{External: onnxpb.ExternalNever}); err != nil {
		t.Fatal(err)
	}
	p.Outputs = append([]plan.TensorInfo{{Name: name, DType: "float32", Shape: shape}}, p.Outputs...)
	delete(p.PartSHA256, p.DenseModel) // dense.onnx edited on purpose
	if err := plan.Write(dir, p); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestScoreMultiTask: a plan whose score has per-sample shape [k] (a
// multi-task model) is served: Score answers k values a sample,
// sample-major, with tasks k, each as the dense model gives it. A score
// of any other shape than one value or [k], or of more than
// plan.MaxTasks tasks, is refused at load, naming it.
func TestScoreMultiTask(t *testing.T) {
	checkTwoTasks(t, multiTaskPlan(t, []int64{2}), []string{"tasks[0]", "tasks[1]"})
	// An output named past the router's bound (plan.MaxTaskName),
	// which ONNX allows: served, its tasks unnamed, as by an earlier
	// release. Named, the router failed every request (Internal).
	checkTwoTasks(t, multiTaskPlanNamed(t, []int64{2}, strings.Repeat("x", plan.MaxTaskName)), nil)
	for _, tc := range []struct {
		shape []int64
		want  string
	}{
		{[]int64{1, 2}, `first output "tasks" has per-sample shape [1 2]; want one score per sample, or [k]`},
		{[]int64{plan.MaxTasks + 1}, "more than 64 tasks"},
	} {
		s, err := New(Options{Plans: []string{multiTaskPlan(t, tc.shape)}, Threads: 1, Logger: slog.New(slog.DiscardHandler)})
		if err == nil {
			s.Close()
			t.Fatalf("shape %v served", tc.shape)
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("shape %v: %v; want %q", tc.shape, err, tc.want)
		}
	}
}

// TestScoreTaskOutputs: a plan whose scores are several outputs (a
// multi-task model exported with one output per task, plan.TaskOutputs)
// is answered with every task output's values, interleaved sample-major
// in the plan's order, whatever dense.onnx's output order; before, the
// first output alone was served.
func TestScoreTaskOutputs(t *testing.T) {
	src := tinyPlan(t)
	p, err := plan.Read(src)
	if err != nil {
		t.Fatal(err)
	}
	m, err := onnxpb.ReadModel(filepath.Join(src, p.DenseModel), onnxpb.ReadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	g := m.GetGraph()
	score := g.Output[0]
	g.Node = append(g.Node, &onnxpb.NodeProto{OpType: "Neg", Input: []string{score.GetName()}, Output: []string{"neg"}, Name: "task1"})
	neg := proto.Clone(score).(*onnxpb.ValueInfoProto)
	neg.Name = "neg"
	g.Output = []*onnxpb.ValueInfoProto{neg, score}
	dir := t.TempDir()
	if err := onnxpb.WriteModel(filepath.Join(dir, p.DenseModel), m, onnxpb.WriteOptions{External: onnxpb.ExternalNever}); err != nil {
		t.Fatal(err)
	}
	p.Outputs = append(p.Outputs, plan.TensorInfo{Name: "neg", DType: "float32", Shape: p.Outputs[0].Shape})
	p.TaskOutputs, p.Version = 2, plan.Version
	delete(p.PartSHA256, p.DenseModel) // changed on purpose, as the error says
	if err := plan.Write(dir, p); err != nil {
		t.Fatal(err)
	}
	checkTwoTasks(t, dir, []string{p.Outputs[0].Name, "neg"})
}

// checkTwoTasks serves the plan in dir, whose scores are dlrm-tiny's
// score and its negation (two tasks), and checks Score's answer on
// random cut tensors against dlrm-tiny's dense.onnx run directly, and
// the tasks' names it gives (names).
func checkTwoTasks(t *testing.T, dir string, names []string) {
	t.Helper()
	s, err := New(Options{Plans: []string{dir}, Threads: 1, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	p, err := plan.Read(dir)
	if err != nil {
		t.Fatal(err)
	}
	ref, err := ort.NewSession(filepath.Join(tinyPlan(t), p.DenseModel), ort.SessionOptions{IntraOpThreads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer ref.Close()
	const n = 7
	x := cutTensors(p, n, rand.New(rand.NewPCG(3, 4)))
	want := direct(t, ref, p, n, x)
	resp, err := s.Score(context.Background(), &prismv1.ScoreRequest{Model: p.Model.Name, NumSamples: n, Tensors: encode(t, n, x)})
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetTasks() != 2 || len(resp.GetScores()) != 2*n {
		t.Fatalf("tasks %d, %d scores; want 2, %d", resp.GetTasks(), len(resp.GetScores()), 2*n)
	}
	if !slices.Equal(resp.GetTaskNames(), names) {
		t.Errorf("task names %q, want %q", resp.GetTaskNames(), names)
	}
	for i, w := range want {
		if math.Abs(float64(resp.Scores[2*i]-w)) > 1e-5 || math.Abs(float64(resp.Scores[2*i+1]+w)) > 1e-5 {
			t.Fatalf("sample %d scored %v, want [%g %g]", i, resp.Scores[2*i:2*i+2], w, -w)
		}
	}
}
