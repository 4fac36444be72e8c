package gpuserve

import (
	"errors"
	"math"
	"strings"
	"testing"
)

// TestBatchFits: a max batch whose inputs alone take more than half of
// the memory is refused before its warm-up run allocates them (a
// makeslice panic past int64, the OOM killer below it); what fits, and
// an unknown memory, pass.
func TestBatchFits(t *testing.T) {
	dlrm := []InputSpec{{Name: "dense", Width: 13}, {Name: "pooled", Width: 26 * 16}} // 1716 bytes a sample
	for _, tc := range []struct {
		name     string
		spec     []InputSpec
		maxBatch int
		memory   int64
		want     string // "" passes
	}{
		{"default batch", dlrm, 512, 8 << 30, ""},
		{"the largest that fits", dlrm, (1 << 30) / 1716, 2 << 30, ""},
		{"one past it", dlrm, (1<<30)/1716 + 1, 2 << 30, "a batch of 625724 samples of its dense inputs (1.7KiB a sample) takes more than half of the 2GiB of memory this process may use: want at most 625723"},
		{"past int64 bytes", dlrm, math.MaxInt, 8 << 30, "a batch of 9223372036854775807 samples"},
		{"a typo's extra digits", dlrm, 100_000_000, 16 << 30, "(1.7KiB a sample) takes more than half of the 16GiB"},
		{"memory unknown", dlrm, math.MaxInt, 0, ""},
		{"check off", dlrm, math.MaxInt, -1, ""},
		{"no inputs", nil, math.MaxInt, 8 << 30, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := batchFits("m", tc.spec, tc.maxBatch, tc.memory)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			var be *BatchMemoryError
			if !errors.As(err, &be) || be.MaxBatch != tc.maxBatch || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want a BatchMemoryError saying %q", err, tc.want)
			}
		})
	}
}
