package main

import (
	"slices"
	"testing"

	"github.com/prism-serve/prism/cpuserve/store"
	"github.com/prism-serve/prism/internal/flagval"
	"github.com/prism-serve/prism/internal/memlimit"
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
// not fit in half of the embedding worker's memory (its auto holds
// every row then), at sizes below the tables' and within its budget.
func TestTuneHotSpace(t *testing.T) {
	const GiB = 1 << 30
	for _, tc := range []struct {
		tables, share, hotMax int64
		want                  []string
	}{
		{2 * GiB, 24 * GiB, 0, []string{"auto"}},
		{12 * GiB, 24 * GiB, 0, []string{"auto"}},
		{2 * GiB, 0, 0, []string{"auto"}},
		{13 * GiB, 24 * GiB, 0, []string{"auto", "3072MiB", "6144MiB", "12288MiB"}},
		{5 * GiB, 8 * GiB, 0, []string{"auto", "1024MiB", "2048MiB", "4096MiB"}},
		{97 * GiB, 16 * GiB, 0, []string{"auto", "2048MiB", "4096MiB", "8192MiB"}},
		// Under a cgroup of 24 GiB: the worker's share is 12 GiB, and its
		// budget takes at most about 8.6 GiB.
		{10 * GiB, 12 * GiB, 8800 << 20, []string{"auto", "1536MiB", "3072MiB", "6144MiB"}},
		{97 * GiB, 12 * GiB, 5 * GiB, []string{"auto", "1536MiB", "3072MiB", "5120MiB"}},
		{97 * GiB, 12 * GiB, 1 * GiB, []string{"auto", "1024MiB"}},
	} {
		if got := hotSpace(tc.tables, tc.share, tc.hotMax); !slices.Equal(got, tc.want) {
			t.Errorf("hotSpace(%d, %d, %d) = %v, want %v", tc.tables, tc.share, tc.hotMax, got, tc.want)
		}
	}
	// prism up under a memory cgroup gives its embedding worker half of
	// it, budgeted; without one, the machine's memory and no budget.
	if share, hotMax := workerMemory(memlimit.Limits{Physical: 64 * GiB}); share != 64*GiB || hotMax != 0 {
		t.Errorf("no cgroup: share %d, hot max %d", share, hotMax)
	}
	share, hotMax := workerMemory(memlimit.Limits{Physical: 64 * GiB, Cgroup: 24 * GiB})
	if share != 12*GiB || hotMax <= 0 || hotMax >= share {
		t.Errorf("24 GiB cgroup: share %d, hot max %d", share, hotMax)
	}
	b, err := store.NewBudget(share, &store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range hotSpace(97*GiB, share, hotMax)[1:] {
		n, err := flagval.Bytes(v)
		if err != nil || b.CheckHot(n) != nil {
			t.Errorf("%s: %v, %v: the worker would refuse it", v, err, b.CheckHot(n))
		}
	}
}
