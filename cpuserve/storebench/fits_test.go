package storebench

import (
	"strings"
	"testing"
)

// TestFits: tables or drawn ids past half of memory are refused, naming
// the flag, before anything is allocated (they ended in "fatal error:
// runtime: out of memory"); what fits, and an unknown memory, pass.
func TestFits(t *testing.T) {
	rows := []int64{1000, 1000} // 2000 rows
	for _, tc := range []struct {
		name string
		cfg  Config
		dim  int
		mem  int64
		want string // "" passes
	}{
		{"defaults", Config{Batch: 256, Batches: 2000, Warmup: 2000}, 16, 8 << 30, ""},
		{"no warm-up", Config{Batch: 256, Batches: 2000, Warmup: -1}, 16, 8 << 30, ""},
		// 2000 rows x 1e9 x 4 bytes = 8 TB.
		{"dim", Config{Batch: 1, Batches: 1}, 1e9, 8 << 30, "--dim 1000000000: the 2 tables' 2000 rows take 7450.6GiB at that width, more than half of the 8GiB of memory"},
		{"batch", Config{Batch: 1e12, Batches: 2000, Warmup: 2000}, 16, 8 << 30, "--batch 1000000000000 over --batches 2000 (and --warmup 2000): the ids drawn ahead take"},
		{"batches", Config{Batch: 256, Batches: 1e12}, 16, 8 << 30, "--batch 256 over --batches 1000000000000 (and --warmup 0)"},
		{"product past int64", Config{Batch: 1 << 40, Batches: 1 << 40}, 16, 8 << 30, "the ids drawn ahead take"},
		// 2 tables x 256 x 8 bytes = 4 KiB a batch: 2^20 batches are 4 GiB.
		{"just fits", Config{Batch: 256, Batches: 1 << 20, Warmup: -1}, 16, 8 << 30, ""},
		{"just past", Config{Batch: 256, Batches: 1<<20 + 1, Warmup: -1}, 16, 8 << 30, "more than half of the 8GiB"},
		{"memory unknown", Config{Batch: 1e12, Batches: 1e12}, 1e9, 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := fits(tc.cfg, rows, tc.dim, tc.mem)
			if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Fatalf("got %v, want %q", err, tc.want)
			}
		})
	}
}
