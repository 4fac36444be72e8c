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
