package plan

import (
	"slices"
	"strings"
	"testing"
)

// TestTasks: a plan's score is one value per sample, or k tasks of a
// 1-D [k] (bounded); any other shape is refused with what it is.
func TestTasks(t *testing.T) {
	for _, tc := range []struct {
		shape []int64
		want  int
		err   string
	}{
		{nil, 1, ""},
		{[]int64{1}, 1, ""},
		{[]int64{1, 1}, 1, ""},
		{[]int64{2}, 2, ""},
		{[]int64{MaxTasks}, MaxTasks, ""},
		{[]int64{MaxTasks + 1}, 0, "more than 64 tasks"},
		{[]int64{1 << 40}, 0, "more than 64 tasks"},
		{[]int64{2, 3}, 0, "want one score per sample, or [k]"},
		{[]int64{7, 0x6DB6DB6DB6DB6DB7}, 0, "want one score per sample, or [k]"}, // 7 x that overflows to 1
		{[]int64{1, 2}, 0, "want one score per sample, or [k]"},
		{[]int64{-1}, 0, "every dimension must be known"},
		{[]int64{0}, 0, "every dimension must be known"},
	} {
		p := &Plan{Outputs: []TensorInfo{{Name: "score", DType: "float32", Shape: tc.shape}}}
		got, err := p.Tasks()
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("shape %v: %d, %v; want an error with %q", tc.shape, got, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("shape %v: %d, %v; want %d", tc.shape, got, err, tc.want)
		}
	}
	if _, err := (&Plan{}).Tasks(); err == nil {
		t.Error("a plan without outputs has tasks")
	}
}

// TestTaskOutputs: a model with one output per task answers every task
// output's values, sample-major in output order, named after them; the
// first output alone without TaskOutputs; a task output that is not a
// float score, or more than MaxTasks in all, is refused by name.
func TestTaskOutputs(t *testing.T) {
	f := func(name string, shape ...int64) TensorInfo {
		return TensorInfo{Name: name, DType: "float32", Shape: shape}
	}
	for _, tc := range []struct {
		name   string
		outs   []TensorInfo
		n      int
		widths []int
		names  []string
		err    string
	}{
		{"first only", []TensorInfo{f("ctr", 1), f("cvr", 1)}, 0, []int{1}, []string{"ctr"}, ""},
		{"one", []TensorInfo{f("ctr", 1), f("cvr", 1)}, 1, []int{1}, []string{"ctr"}, ""},
		{"two", []TensorInfo{f("ctr", 1), f("cvr"), f("emb", 16)}, 2, []int{1, 1}, []string{"ctr", "cvr"}, ""},
		{"stacked and single", []TensorInfo{f("heads", 3), f("cvr", 1, 1)}, 2, []int{3, 1}, []string{"heads[0]", "heads[1]", "heads[2]", "cvr"}, ""},
		{"not float", []TensorInfo{f("ctr", 1), {Name: "rank", DType: "int64", Shape: []int64{1}}}, 2, nil, nil, `task output 1 "rank" is int64`},
		{"not a score", []TensorInfo{f("ctr", 1), f("emb", 2, 8)}, 2, nil, nil, `task output 1 "emb" has per-sample shape [2 8]`},
		{"too many", []TensorInfo{f("a", 40), f("b", 30)}, 2, nil, nil, "task outputs 0 to 1 have 70 values per sample: more than 64 tasks"},
	} {
		p := &Plan{Outputs: tc.outs, TaskOutputs: tc.n}
		widths, err := p.TaskWidths()
		names, nerr := p.TaskNames()
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) || nerr == nil {
				t.Errorf("%s: %v, %v; want an error with %q", tc.name, widths, err, tc.err)
			}
			continue
		}
		if err != nil || nerr != nil || !slices.Equal(widths, tc.widths) || !slices.Equal(names, tc.names) {
			t.Errorf("%s: widths %v, %v; names %v, %v; want %v and %v", tc.name, widths, err, names, nerr, tc.widths, tc.names)
		}
		if k, _ := p.Tasks(); k != len(tc.names) {
			t.Errorf("%s: %d tasks, want %d", tc.name, k, len(tc.names))
		}
		if want := 4 + min(max(tc.n-1, 0), 1); WriteVersion(p) != want {
			t.Errorf("%s: written at version %d, want %d", tc.name, WriteVersion(p), want)
		}
	}
}
