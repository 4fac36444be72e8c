package plan

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestContent: two copies of one plan folder have one content, whatever
// else lies beside the plan's files; another table content, dense.onnx,
// cpu.onnx or pre.onnx make another; a plan without table hashes has
// none (unknown); a part missing is an error naming it.
func TestContent(t *testing.T) {
	write := func(t *testing.T, p *Plan, files map[string]string) string {
		dir := t.TempDir()
		for name, body := range files {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		return dir
	}
	base := func() *Plan {
		return &Plan{DenseModel: "dense.onnx", CPUModel: "cpu.onnx",
			Tables: []Table{{Name: "a", SHA256: "aa11"}, {Name: "b", SHA256: "bb22"}}}
	}
	files := map[string]string{"dense.onnx": "dense", "cpu.onnx": "cpu"}
	content := func(t *testing.T, p *Plan, files map[string]string) string {
		t.Helper()
		c, err := p.Content(write(t, p, files))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	want := content(t, base(), files)
	if len(want) != 16 {
		t.Fatalf("content %q, want 16 hex digits", want)
	}
	extra := map[string]string{"dense.onnx": "dense", "cpu.onnx": "cpu", "README": "notes", "pre.onnx": "not the plan's"}
	if got := content(t, base(), extra); got != want {
		t.Errorf("a copy with other files beside: %s, want %s", got, want)
	}
	reordered := base()
	reordered.Tables[0], reordered.Tables[1] = reordered.Tables[1], reordered.Tables[0]
	if got := content(t, reordered, files); got != want {
		t.Errorf("tables listed in another order: %s, want %s", got, want)
	}
	for _, c := range []struct {
		name  string
		edit  func(p *Plan)
		files map[string]string
	}{
		{"table content", func(p *Plan) { p.Tables[1].SHA256 = "bb23" }, files},
		{"table name", func(p *Plan) { p.Tables[1].Name = "c" }, files},
		{"dense.onnx", func(*Plan) {}, map[string]string{"dense.onnx": "retrained", "cpu.onnx": "cpu"}},
		{"cpu.onnx", func(*Plan) {}, map[string]string{"dense.onnx": "dense", "cpu.onnx": "other"}},
		{"pre.onnx", func(p *Plan) { p.PreModel = "pre.onnx" }, map[string]string{"dense.onnx": "dense", "cpu.onnx": "cpu", "pre.onnx": "pre"}},
		{"no cpu.onnx", func(p *Plan) { p.CPUModel = "" }, files},
		{"task outputs", func(p *Plan) { p.Outputs, p.TaskOutputs = twoTasks("ctr", "cvr"), 2 }, files},
	} {
		p := base()
		c.edit(p)
		if got := content(t, p, c.files); got == want {
			t.Errorf("%s changed: the content stayed %s", c.name, got)
		}
	}
	// The tasks served are the model's: a plan of the same parts
	// serving one task (an earlier release's plan, or --tasks ctr) and
	// one serving two, or the two in another order, differ; a plan of
	// one task keeps the content earlier releases compute, whatever its
	// outputs.
	one := base()
	one.Outputs = twoTasks("ctr", "cvr")
	if got := content(t, one, files); got != want {
		t.Errorf("one task of two outputs: %s, want %s (as earlier releases)", got, want)
	}
	both, swapped := base(), base()
	both.Outputs, both.TaskOutputs = twoTasks("ctr", "cvr"), 2
	swapped.Outputs, swapped.TaskOutputs = twoTasks("cvr", "ctr"), 2
	if a, b := content(t, both, files), content(t, swapped, files); a == b || a == want {
		t.Errorf("tasks ctr, cvr: %s; cvr, ctr: %s; one task: %s: want three contents", a, b, want)
	}
	unhashed := base()
	unhashed.Tables[0].SHA256 = ""
	if got := content(t, unhashed, files); got != "" {
		t.Errorf("a table without a hash: content %q, want none", got)
	}
	_, err := base().Content(write(t, base(), map[string]string{"dense.onnx": "dense"}))
	if err == nil || !strings.Contains(err.Error(), "cpu.onnx") {
		t.Errorf("cpu.onnx missing: %v, want an error naming it", err)
	}
}

func twoTasks(a, b string) []TensorInfo {
	return []TensorInfo{{Name: a, DType: "float32", Shape: []int64{1}}, {Name: b, DType: "float32", Shape: []int64{1}}}
}

// TestContentPartDamaged: a part whose bytes are not those plan.json
// records (PartSHA256) is a PartDamagedError naming the file and its
// role; the recorded bytes pass; a plan recording none (earlier
// releases) is not checked.
func TestContentPartDamaged(t *testing.T) {
	dir := t.TempDir()
	for name, body := range map[string]string{"dense.onnx": "dense", "cpu.onnx": "cpu"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	sum := func(name string) string {
		s, err := PartSum(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	p := &Plan{DenseModel: "dense.onnx", CPUModel: "cpu.onnx", Tables: []Table{{Name: "a", SHA256: "aa11"}},
		PartSHA256: map[string]string{"dense.onnx": sum("dense.onnx"), "cpu.onnx": sum("cpu.onnx")}}
	want, err := p.Content(dir)
	if err != nil {
		t.Fatal(err)
	}
	old := &Plan{DenseModel: "dense.onnx", CPUModel: "cpu.onnx", Tables: []Table{{Name: "a", SHA256: "aa11"}}}
	if got, err := old.Content(dir); err != nil || got != want {
		t.Fatalf("the same parts without recorded sums: %q, %v; want %q", got, err, want)
	}
	for _, tc := range []struct{ file, role string }{{"dense.onnx", "dense"}, {"cpu.onnx", "cpu"}} {
		if err := os.WriteFile(filepath.Join(dir, tc.file), []byte("damaged"), 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := p.Content(dir)
		var pd *PartDamagedError
		if !errors.As(err, &pd) || pd.Role != tc.role || !strings.Contains(err.Error(), tc.file) || !strings.Contains(err.Error(), "partition the model again") {
			t.Errorf("%s damaged: %v, want a PartDamagedError of role %s naming it", tc.file, err, tc.role)
		}
		if _, err := old.Content(dir); err != nil {
			t.Errorf("%s changed, no sums recorded: %v", tc.file, err)
		}
		if err := os.WriteFile(filepath.Join(dir, tc.file), []byte(strings.TrimSuffix(tc.file, ".onnx")), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
