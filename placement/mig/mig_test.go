package mig

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
)

// The A100-40GB rules must match the placements go-nvml's simulated DGX
// A100 reports for every profile.
func TestA100PlacementsMatchNVMLMock(t *testing.T) {
	server := dgxa100.New()
	dev := server.Devices[0]
	for _, p := range A100_40GB.Profiles {
		info, ret := dev.GetGpuInstanceProfileInfo(p.NVMLID)
		if ret != nvml.SUCCESS {
			t.Fatalf("%s: GetGpuInstanceProfileInfo(%d): %v", p.Name, p.NVMLID, ret)
		}
		places, ret := dev.GetGpuInstancePossiblePlacements(&info)
		if ret != nvml.SUCCESS {
			t.Fatalf("%s: placements: %v", p.Name, ret)
		}
		var starts []int
		for _, pl := range places {
			if int(pl.Size) != p.Size {
				t.Errorf("%s: nvml size %d, ours %d", p.Name, pl.Size, p.Size)
			}
			starts = append(starts, int(pl.Start))
		}
		if !slices.Equal(starts, p.Starts) {
			t.Errorf("%s: nvml starts %v, ours %v", p.Name, starts, p.Starts)
		}
		if int(info.SliceCount) != p.Compute {
			t.Errorf("%s: nvml slice count %d, ours %d", p.Name, info.SliceCount, p.Compute)
		}
	}
}

// Profile names per model as NVIDIA's MIG user guide and mig-parted's
// default config list them (the +me variants left out); every model
// keeps the same placement rules.
func TestModelProfileNames(t *testing.T) {
	for _, tc := range []struct {
		model string
		want  []string
	}{
		{"A100-40GB", []string{"1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"}},
		{"A100-80GB", []string{"1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"}},
		{"H100-80GB", []string{"1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"}},
		{"H100-94GB", []string{"1g.12gb", "1g.24gb", "2g.24gb", "3g.47gb", "4g.47gb", "7g.94gb"}},
		{"h200-141gb", []string{"1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"}},
	} {
		m, err := ModelByName(tc.model)
		if err != nil {
			t.Errorf("%s: %v", tc.model, err)
			continue
		}
		var got []string
		for i, p := range m.Profiles {
			got = append(got, p.Name)
			if a := A100_40GB.Profiles[i]; p.Size != a.Size || p.Compute != a.Compute || !slices.Equal(p.Starts, a.Starts) || p.NVMLID != a.NVMLID {
				t.Errorf("%s %s: placement rules differ from A100-40GB's %s", tc.model, p.Name, a.Name)
			}
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s: profiles %v, want %v", tc.model, got, tc.want)
		}
		if n := len(m.MaximalLayouts()); n != 38 {
			t.Errorf("%s has %d maximal layouts, want 38", tc.model, n)
		}
	}
	if _, err := ModelByName("A30-24GB"); err == nil {
		t.Error("A30-24GB (4 memory slices) accepted with the 8-slice rules")
	}
}

func TestLegal(t *testing.T) {
	m := A100_40GB
	ok := []Layout{
		{{Profile: 3, Start: 0}, {Profile: 3, Start: 4}},                         // 3g+3g
		{{Profile: 4, Start: 0}, {Profile: 2, Start: 4}, {Profile: 0, Start: 6}}, // 4g+2g+1g
		{{Profile: 5, Start: 0}},                                                 // 7g
	}
	for _, l := range ok {
		if err := m.Legal(l); err != nil {
			t.Errorf("%s: %v", m.String(l), err)
		}
	}
	bad := []Layout{
		{{Profile: 0, Start: 7}},                         // 1g cannot start at 7
		{{Profile: 3, Start: 2}},                         // 3g starts at 0 or 4
		{{Profile: 4, Start: 0}, {Profile: 3, Start: 0}}, // overlap
		{{Profile: 5, Start: 0}, {Profile: 0, Start: 6}}, // overlap with 7g
	}
	for _, l := range bad {
		if m.Legal(l) == nil {
			t.Errorf("%v accepted", l)
		}
	}
	if n := len(m.MaximalLayouts()); n != 38 {
		t.Errorf("A100-40GB has %d maximal layouts, want 38", n)
	}
}

func smallCase(seed int) (Model, []Service) {
	m := A100_80GB
	rng := seed*7919 + 13
	next := func(n int) int { rng = (rng*1103515245 + 12345) & 0x7fffffff; return rng % n }
	var svcs []Service
	for s := 0; s < 2+next(2); s++ {
		full := float64(100 + next(200))
		t := DefaultThroughput(m, full)
		// Some models gain from bigger slices less than linearly.
		if next(2) == 0 {
			for i, p := range m.Profiles {
				if p.Compute > 1 && p.Compute < 7 {
					t[i] *= 0.9
				}
			}
		}
		svcs = append(svcs, Service{Name: fmt.Sprintf("s%d", s), Demand: full * float64(1+next(20)) / 10, Throughput: t})
	}
	return m, svcs
}

// On small cases the heuristic is never better than the exact solver (it
// cannot be) and at most one GPU worse; both plans are legal and meet
// every demand.
func TestGreedyVersusExact(t *testing.T) {
	worse := 0
	for seed := 0; seed < 25; seed++ {
		m, svcs := smallCase(seed)
		ex, err := Exact(m, svcs, 6)
		if err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		gr, err := Greedy(m, svcs)
		if err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		for name, p := range map[string]*Plan{"exact": ex, "greedy": gr} {
			if err := p.Validate(m, svcs); err != nil {
				t.Fatalf("seed %d %s: %v", seed, name, err)
			}
		}
		if len(gr.GPUs) < len(ex.GPUs) {
			t.Fatalf("seed %d: greedy %d GPUs beats exact %d", seed, len(gr.GPUs), len(ex.GPUs))
		}
		if len(gr.GPUs) > len(ex.GPUs)+1 {
			t.Fatalf("seed %d: greedy %d GPUs, exact %d", seed, len(gr.GPUs), len(ex.GPUs))
		}
		if len(gr.GPUs) > len(ex.GPUs) {
			worse++
		}
		if ex.GPUs != nil && len(ex.GPUs) > WholeGPUs(m, svcs) {
			t.Fatalf("seed %d: exact %d worse than whole GPUs %d", seed, len(ex.GPUs), WholeGPUs(m, svcs))
		}
	}
	t.Logf("greedy one GPU worse than exact in %d of 25 cases", worse)
}

// Hand-checked: one service needing 0.4 of a GPU fits a 3g slice (0.408);
// whole-GPU allocation needs 1 GPU, so does MIG; two such services share
// one GPU (3g+3g) where whole GPUs need two.
func TestByHand(t *testing.T) {
	m := A100_40GB
	s := func(name string, d float64) Service {
		return Service{Name: name, Demand: d, Throughput: DefaultThroughput(m, 1)}
	}
	svcs := []Service{s("a", 0.4), s("b", 0.4)}
	ex, err := Exact(m, svcs, 3)
	if err != nil {
		t.Fatal(err)
	}
	if len(ex.GPUs) != 1 || WholeGPUs(m, svcs) != 2 {
		t.Fatalf("exact %d GPUs, whole %d; want 1 and 2", len(ex.GPUs), WholeGPUs(m, svcs))
	}
	if _, err := Greedy(m, []Service{{Name: "x", Demand: 1, Throughput: make([]float64, len(m.Profiles))}}); err == nil {
		t.Fatal("unservable demand accepted")
	}
}

// Services alike, each coverable alone, that no fewer GPUs can serve
// together: the exact solver must see the shortfall from the sum of
// shares, not by trying every split (5 x 0.9 took 2m14s that way; the
// default of prism plan mig --max-exact 6 runs it).
func TestExactServicesAlikeIsFast(t *testing.T) {
	for _, tc := range []struct {
		n      int
		demand float64
		want   int
	}{
		{n: 5, demand: 0.9, want: 5},
		{n: 6, demand: 0.9, want: 6},
		{n: 6, demand: 0.4, want: 3},
	} {
		m := A100_80GB
		var svcs []Service
		for i := range tc.n {
			svcs = append(svcs, Service{Name: fmt.Sprint(i), Demand: tc.demand, Throughput: DefaultThroughput(m, 1)})
		}
		done := make(chan *Plan, 1)
		go func() {
			p, err := Exact(m, svcs, 6)
			if err != nil {
				t.Error(err)
			}
			done <- p
		}()
		select {
		case p := <-done:
			if p == nil {
				continue
			}
			if err := p.Validate(m, svcs); err != nil || len(p.GPUs) != tc.want {
				t.Errorf("%d x %v: %d GPUs (%v), want %d", tc.n, tc.demand, len(p.GPUs), err, tc.want)
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("%d x %v: exact still searching after 20s", tc.n, tc.demand)
		}
	}
}

func BenchmarkGreedy100Services(b *testing.B) {
	m, svcs := largeCase()
	for b.Loop() {
		if _, err := Greedy(m, svcs); err != nil {
			b.Fatal(err)
		}
	}
}

func largeCase() (Model, []Service) {
	m := A100_80GB
	var svcs []Service
	for i := 0; i < 100; i++ {
		svcs = append(svcs, Service{Name: fmt.Sprint(i), Demand: float64(5 + (i*37)%60), Throughput: DefaultThroughput(m, 100)})
	}
	return m, svcs
}

func TestGreedyLargeIsFast(t *testing.T) {
	m, svcs := largeCase()
	t0 := time.Now()
	p, err := Greedy(m, svcs)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Validate(m, svcs); err != nil {
		t.Fatal(err)
	}
	t.Logf("100 services: %d GPUs (whole GPUs %d) in %v", len(p.GPUs), WholeGPUs(m, svcs), time.Since(t0))
}

// TestGreedyDemandPastTheBound: a demand no million GPUs serve is
// refused at once with the bound's message, however large: 1e18 left the
// greedy's gain at 0 against float64 rounding ("demand left that no
// layout serves"), and 1e9 took seconds of layouts to refuse.
func TestGreedyDemandPastTheBound(t *testing.T) {
	m := A100_40GB
	for _, d := range []float64{1.5e6, 1e9, 1e18, 1e300, math.Inf(1)} {
		start := time.Now()
		_, err := Greedy(m, []Service{{Name: "x", Demand: d, Throughput: DefaultThroughput(m, 1)}})
		if err == nil || !strings.Contains(err.Error(), "need more than 1000000 GPUs") {
			t.Errorf("demand %g: %v, want the bound's error", d, err)
		}
		if el := time.Since(start); el > time.Second {
			t.Errorf("demand %g: refused after %v, want at once", d, el)
		}
	}
}
