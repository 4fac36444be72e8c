package main

import (
	"runtime"
	"strings"
	"testing"

	"github.com/prism-serve/prism/cpuserve/store"
	"github.com/prism-serve/prism/internal/flagval"
	"github.com/prism-serve/prism/internal/memlimit"
	"github.com/prism-serve/prism/models"
)

// raiseProcs leaves GOMAXPROCS alone without a budget and when it was set
// by hand; with a budget and a hot tier that misses, it gives two Ps per
// miss reader.
func TestRaiseProcs(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	st, err := store.Open(t.TempDir(), &store.Options{HotBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	mb := &memBudget{}
	var none *memBudget
	if from, to := none.raiseProcs(st, 4); from != 1 || to != 1 {
		t.Fatalf("no budget: %d -> %d", from, to)
	}
	t.Setenv("GOMAXPROCS", "1")
	if from, to := mb.raiseProcs(st, 4); to != from {
		t.Fatalf("GOMAXPROCS set by hand: %d -> %d", from, to)
	}
	t.Setenv("GOMAXPROCS", "")
	complete := st.Preloaded().Complete
	from, to := mb.raiseProcs(st, 3)
	switch {
	case complete && to != from:
		t.Fatalf("a complete hot tier reads no misses: %d -> %d", from, to)
	case !complete && (from != 1 || to != 6 || runtime.GOMAXPROCS(0) != 6):
		t.Fatalf("misses from the device, 3 readers: %d -> %d (now %d), want 1 -> 6", from, to, runtime.GOMAXPROCS(0))
	}
	if from, to := mb.raiseProcs(st, 1); to != from {
		t.Fatalf("already above 2 per reader: %d -> %d", from, to)
	}
}

func TestIndexCacheAdvice(t *testing.T) {
	for _, tc := range []struct {
		name                 string
		index, filter, cache int64
		complete, warn       bool
	}{
		{"fits with a quarter to spare", 24 << 20, 0, 32 << 20, false, false},
		{"index and filter past three quarters", 20 << 20, 5 << 20, 32 << 20, false, true},
		{"larger than the cache", 400 << 20, 0, 256 << 20, false, true},
		{"every row in the hot tier: no miss reads", 400 << 20, 0, 256 << 20, true, false},
		{"empty store", 0, 0, 8 << 20, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			msg := indexCacheAdvice(tc.index, tc.filter, tc.cache, tc.complete)
			if (msg != "") != tc.warn {
				t.Fatalf("advice %q, want a warning: %v", msg, tc.warn)
			}
			if tc.warn && !strings.Contains(msg, "--cache-bytes "+flagval.FormatBytes((tc.index+tc.filter)*4/3)) {
				t.Fatalf("advice %q does not name the cache to give", msg)
			}
		})
	}
}

// TestUpMemoryLimit: prism up --memory-limit off is off (negative, so
// the embedding workers are given off), not "none known" (0), on which
// each worker budgets its cgroup's whole limit.
func TestUpMemoryLimit(t *testing.T) {
	for _, tc := range []struct {
		spec string
		want int64
	}{
		{"off", -1},
		{" off ", -1},
		{"16GiB", 16 << 30},
	} {
		if got, err := upMemoryLimit(tc.spec); err != nil || got != tc.want {
			t.Errorf("upMemoryLimit(%q) = %d, %v; want %d", tc.spec, got, err, tc.want)
		}
	}
	if got, err := upMemoryLimit("auto"); err != nil || got < 0 {
		t.Errorf("upMemoryLimit(auto) = %d, %v; want the cgroup's limit or 0", got, err)
	}
}

// TestMemoryLimitFlag: --memory-limit SIZE is a limit as if a cgroup
// set it, under the process's own: a size above the memory cgroup's
// limit was budgeted as given (8GiB in a 4GiB container: a hot tier and
// Go heap limit sized past what the kernel allows, so the worker grew
// into the OOM killer); now the smaller limit wins.
func TestMemoryLimitFlag(t *testing.T) {
	const phys = 64 << 30
	for _, tc := range []struct {
		spec   string
		l      memlimit.Limits
		cgroup int64
	}{
		{"auto", memlimit.Limits{Physical: phys, Cgroup: 4 << 30}, 4 << 30},
		{"off", memlimit.Limits{Physical: phys, Cgroup: 4 << 30}, 0},
		{"2GiB", memlimit.Limits{Physical: phys, Cgroup: 4 << 30}, 2 << 30},
		{"8GiB", memlimit.Limits{Physical: phys, Cgroup: 4 << 30}, 4 << 30},
		{"8GiB", memlimit.Limits{Physical: phys}, 8 << 30},
		// Above the machine's memory: the machine's.
		{"auto", memlimit.Limits{Physical: phys, Cgroup: 128 << 30}, phys},
		{"128GiB", memlimit.Limits{Physical: phys}, phys},
	} {
		got, err := memoryLimitFrom(tc.spec, tc.l)
		if err != nil {
			t.Fatalf("%q: %v", tc.spec, err)
		}
		if got.Cgroup != tc.cgroup || got.Physical != phys {
			t.Errorf("%q with a cgroup limit of %d: %+v, want cgroup %d", tc.spec, tc.l.Cgroup, got, tc.cgroup)
		}
	}
	for _, spec := range []string{"0", "-1GiB", "lots"} {
		if _, err := memoryLimitFrom(spec, memlimit.Limits{}); err == nil {
			t.Errorf("%q taken", spec)
		}
	}
}

// TestPastMachine: without a budget to check them against, a hot tier or
// block cache past the machine's memory is refused, naming the flag as
// typed; under a cgroup's limit the budget checks them (applyBudget), and
// an unknown machine checks nothing.
func TestPastMachine(t *testing.T) {
	machine := memlimit.Limits{Physical: 8 << 30}
	for _, tc := range []struct {
		name       string
		hot, cache int64
		l          memlimit.Limits
		want       string // "" passes
	}{
		{"defaults", 0, 0, machine, ""},
		{"hot tier disabled", -1, 0, machine, ""},
		{"the whole machine", 8 << 30, 8 << 30, machine, ""},
		{"hot past it", 1e18, 0, machine, "--hot-bytes H: 931322574.6GiB, more than this machine's 8GiB of memory"},
		{"cache past it", 0, 9 << 30, machine, "--cache-bytes C: 9GiB, more than this machine's 8GiB of memory"},
		{"under a cgroup the budget checks", 1e18, 1e18, memlimit.Limits{Physical: 8 << 30, Cgroup: 4 << 30}, ""},
		{"machine unknown", 1e18, 1e18, memlimit.Limits{}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := pastMachine(store.Options{HotBytes: tc.hot, CacheBytes: tc.cache}, tc.l, "H", "C")
			if tc.want == "" && err != nil || tc.want != "" && (err == nil || err.Error() != tc.want) {
				t.Fatalf("got %v, want %q", err, tc.want)
			}
		})
	}
}

// TestBuildFits: a model whose tables take more than the memory is
// refused before they are allocated, naming the flags that size them.
func TestBuildFits(t *testing.T) {
	for _, tc := range []struct {
		name string
		rows []int64
		dim  int
		mem  int64
		want string // "" passes
	}{
		{"dlrm-tiny", []int64{1000, 13300}, 16, 8 << 30, ""},
		{"exactly the memory", []int64{1 << 20}, 2048, 8 << 30, ""},
		{"one row past it", []int64{1<<20 + 1}, 2048, 8 << 30, "its 1 tables' 1048577 rows of width 2048 take 8.0GiB, more than the 8GiB of memory this process may use: lower --rows-scale or --max-rows"},
		{"rows-scale 1e12", []int64{1e15, 1.33e16}, 16, 8 << 30, "its 2 tables' 14300000000000000 rows of width 16 take 852346420.3GiB"},
		{"memory unknown", []int64{1e15}, 16, 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := buildFits(models.Config{TableRows: tc.rows, EmbDim: tc.dim}, tc.mem)
			if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Fatalf("got %v, want %q", err, tc.want)
			}
		})
	}
}
