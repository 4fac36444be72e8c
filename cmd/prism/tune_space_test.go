package main

import (
	"slices"
	"strings"
	"testing"

	"github.com/prism-serve/prism/cpuserve/store"
	"github.com/prism-serve/prism/gpuserve/devices"
	"github.com/prism-serve/prism/internal/flagval"
	"github.com/prism-serve/prism/internal/memlimit"
	"github.com/prism-serve/prism/loadgen"
	"github.com/prism-serve/prism/plan"
	"github.com/prism-serve/prism/tune"
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
	host := func(gpus, migSlices int) devices.Discovery {
		var d devices.Discovery
		for range gpus {
			d.Devices = append(d.Devices, devices.Device{Kind: devices.KindGPU})
		}
		for range migSlices {
			d.Devices = append(d.Devices, devices.Device{Kind: devices.KindMIG})
		}
		return d
	}
	batch := []string{"1024", "4096", "8192"}
	for _, tc := range []struct {
		gpus, migSlices  int
		workers, threads []string
		start            string // prism up's dense workers
	}{
		{1, 0, []string{"1", "2", "4"}, []string{"1"}, "2"},
		{8, 0, []string{"8", "16", "32"}, []string{"1"}, "16"},
		// One worker per MIG slice under prism up, not two: the
		// search started at 14 on a GPU split in seven.
		{0, 7, []string{"7", "14", "28"}, []string{"1"}, "7"},
		{1, 2, []string{"3", "4", "6", "12"}, []string{"1"}, "4"},
	} {
		b, w, th, start := gpuSpace(host(tc.gpus, tc.migSlices))
		if !slices.Equal(b, batch) || !slices.Equal(w, tc.workers) || !slices.Equal(th, tc.threads) || start != tc.start {
			t.Errorf("gpuSpace(%d GPUs, %d MIG slices) = %v %v %v start %s, want %v %v %v start %s", tc.gpus, tc.migSlices, b, w, th, start, batch, tc.workers, tc.threads, tc.start)
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
	// prism up under a memory cgroup gives its embedding workers half of
	// it, each budgeted as the worker budgets itself; without one, the
	// machine's memory and no budget. Every default size must be one
	// the worker takes, small cgroups and several workers included.
	if share, hotMax := workerMemory(memlimit.Limits{Physical: 64 * GiB}, 1); share != 64*GiB || hotMax != 0 {
		t.Errorf("no cgroup: share %d, hot max %d", share, hotMax)
	}
	for _, tc := range []struct {
		cgroup  int64
		workers int
	}{{24 * GiB, 1}, {8 * GiB, 2}, {2 * GiB, 1}, {1 * GiB, 1}, {800 << 20, 1}, {8 * GiB, 4}, {128 << 20, 1}} {
		share, hotMax := workerMemory(memlimit.Limits{Physical: 64 * GiB, Cgroup: tc.cgroup}, tc.workers)
		if share != tc.cgroup/2/int64(tc.workers) {
			t.Errorf("cgroup %d, %d workers: share %d", tc.cgroup, tc.workers, share)
		}
		o := store.Options{CacheBytes: store.CacheBytesFor(share)}
		b, err := store.NewBudget(share, &o)
		sizes := hotSpace(97*GiB, share, hotMax)
		if err != nil {
			if len(sizes) != 1 {
				t.Errorf("cgroup %d: no budget fits, yet tune tries %v", tc.cgroup, sizes)
			}
			continue
		}
		if len(sizes) < 2 {
			t.Errorf("cgroup %d, %d workers: tune tries only %v", tc.cgroup, tc.workers, sizes)
		}
		for _, v := range sizes[1:] {
			n, err := flagval.Bytes(v)
			if err != nil || b.CheckHot(n) != nil {
				t.Errorf("cgroup %d, %d workers: %s: %v, %v: the worker would refuse it", tc.cgroup, tc.workers, v, err, b.CheckHot(n))
			}
		}
	}
	// A sharded plan: one worker per shard, each holding its shard's
	// tables.
	p := &plan.Plan{Cost: plan.CostReport{TableBytes: 30 * GiB}, Sharding: &plan.Sharding{Shards: 3, Shard: []plan.ShardInfo{{Bytes: 9 * GiB}, {Bytes: 11 * GiB}, {Bytes: 10 * GiB}}}}
	if w, tables := embeddingShare(p); w != 3 || tables != 11*GiB {
		t.Errorf("sharded: %d workers, %d bytes", w, tables)
	}
	if w, tables := embeddingShare(&plan.Plan{Cost: plan.CostReport{TableBytes: 30 * GiB}}); w != 1 || tables != 30*GiB {
		t.Errorf("unsharded: %d workers, %d bytes", w, tables)
	}
}

// TestTuneCheckSpace: a value prism up would refuse is refused before
// any trial, naming the flag (each trial's up exited before it was
// ready, and the search ended in "no configuration met the SLO").
func TestTuneCheckSpace(t *testing.T) {
	dim := func(flag string, vals ...string) tune.Space {
		return tune.Space{Dims: []tune.Dim{{Flag: "threads", Values: []string{"1"}}, {Flag: flag, Values: vals}}}
	}
	for _, tc := range []struct {
		space tune.Space
		want  string // "" : accepted
	}{
		{dim("micro-batch", "256", "512"), ""},
		{dim("hot-bytes", "auto", "512MiB", "-1"), ""},
		{dim("max-delay", "1ms", "2ms"), ""},
		{dim("max-delay", "0s", "1ms"), "--max-delay 0s: want a positive value"},
		{dim("admit-share", "1", "0.7"), ""},
		{dim("micro-batch", "256", "abc"), `--micro-batch "abc": want a whole number`},
		{dim("micro-batch", "256", "0"), "--micro-batch 0: want a positive value"},
		{dim("max-delay", "5"), `--max-delay "5": time: missing unit in duration "5"`},
		{dim("hot-bytes", "12XB"), `--hot-bytes: "12XB" is not a size`},
		{dim("admit-share", "2"), "--admit-share 2: want 0 < share <= 1"},
		{dim("threads", "-1"), "--threads -1"},
		{dim("dense-sessions", "100"), "--dense-sessions 100: want 1 to 64"},
		{dim("nosuch", "1"), "--nosuch is not a prism up flag"},
	} {
		err := checkSpace(tc.space)
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%v: %v, want %q", tc.space.Dims[1], err, tc.want)
		}
	}
}

// TestTuneMeanCandidates: the prior's candidates feature is the mean of
// --candidates; uniform:10-20 was recorded as DLRMv2's 270, 18 times
// its mean, and weighed against other models' runs as that.
func TestTuneMeanCandidates(t *testing.T) {
	for s, want := range map[string]float64{"270": 270, "16": 16, "uniform:10-20": 15, "dlrmv2": 270} {
		c, err := loadgen.ParseCandidates(s)
		if err != nil {
			t.Fatal(err)
		}
		if got := meanCandidates(c); got != want {
			t.Errorf("meanCandidates(%s) = %v, want %v", s, got, want)
		}
	}
}
