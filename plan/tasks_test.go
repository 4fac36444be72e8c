package plan

import (
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
