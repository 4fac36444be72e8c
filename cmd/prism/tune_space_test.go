package main

import (
	"slices"
	"testing"
)

// TestTuneSpaces: the default dense worker counts per core on the CPU,
// and per device with batches around the CUDA default on GPUs.
func TestTuneSpaces(t *testing.T) {
	for _, tc := range []struct {
		cpus int
		want []string
	}{{1, []string{"1", "2"}}, {2, []string{"1", "2", "4"}}, {16, []string{"8", "16", "32"}}} {
		if got := workerCounts(tc.cpus); !slices.Equal(got, tc.want) {
			t.Errorf("workerCounts(%d) = %v, want %v", tc.cpus, got, tc.want)
		}
	}
	for _, tc := range []struct {
		gpus                    int
		batch, workers, threads []string
	}{
		{1, []string{"1024", "4096", "8192"}, []string{"1", "2", "4"}, []string{"1"}},
		{8, []string{"1024", "4096", "8192"}, []string{"8", "16", "32"}, []string{"1"}},
	} {
		b, w, th := gpuSpace(tc.gpus)
		if !slices.Equal(b, tc.batch) || !slices.Equal(w, tc.workers) || !slices.Equal(th, tc.threads) {
			t.Errorf("gpuSpace(%d) = %v %v %v, want %v %v %v", tc.gpus, b, w, th, tc.batch, tc.workers, tc.threads)
		}
	}
}

// TestTuneHotSpace: the hot tier is searched only when the tables do
// not fit in half of the memory (auto holds every row then), and then
// at sizes below the tables'.
func TestTuneHotSpace(t *testing.T) {
	const GiB = 1 << 30
	for _, tc := range []struct {
		tables, mem int64
		want        []string
	}{
		{2 * GiB, 24 * GiB, []string{"auto"}},
		{12 * GiB, 24 * GiB, []string{"auto"}},
		{2 * GiB, 0, []string{"auto"}},
		{13 * GiB, 24 * GiB, []string{"auto", "3GiB", "6GiB", "12GiB"}},
		{5 * GiB, 8 * GiB, []string{"auto", "1GiB", "2GiB", "4GiB"}},
		{97 * GiB, 16 * GiB, []string{"auto", "2GiB", "4GiB", "8GiB"}},
		{4*GiB + 1, 8 * GiB, []string{"auto", "1GiB", "2GiB", "4GiB"}},
	} {
		if got := hotSpace(tc.tables, tc.mem); !slices.Equal(got, tc.want) {
			t.Errorf("hotSpace(%d, %d) = %v, want %v", tc.tables, tc.mem, got, tc.want)
		}
	}
}
