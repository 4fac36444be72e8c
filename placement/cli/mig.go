package cli

import (
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prism-serve/prism/placement/mig"
)

// ParseDemands reads "name=demand,...": with full 0, demands in full-GPU
// equivalents; with full > 0, demands in requests/s, of which one full
// GPU serves full (the default throughput table scaled to it).
func ParseDemands(s string, m mig.Model, full float64) ([]mig.Service, error) {
	if !(full >= 0) || math.IsInf(full, 0) {
		return nil, fmt.Errorf("a full GPU's throughput is 0 (demands in full GPUs) or more requests/s, got %v", full)
	}
	unit, scale := "full GPUs", 1.0
	if full > 0 {
		unit, scale = "requests/s", full
	}
	var svcs []mig.Service
	seen := map[string]bool{}
	for _, kv := range strings.Split(s, ",") {
		name, v, ok := strings.Cut(strings.TrimSpace(kv), "=")
		d, perr := strconv.ParseFloat(v, 64)
		switch {
		case !ok || perr != nil || name == "":
			return nil, fmt.Errorf("%q, want name=demand", kv)
		case !(d >= 0) || math.IsInf(d, 0):
			return nil, fmt.Errorf("%q: a demand is 0 or more %s", kv, unit)
		case seen[name]:
			return nil, fmt.Errorf("%q: service %s given twice", kv, name)
		}
		seen[name] = true
		svcs = append(svcs, mig.Service{Name: name, Demand: d, Throughput: mig.DefaultThroughput(m, scale)})
	}
	return svcs, nil
}

// ParseMemory reads "name=GB,...", the memory one instance of each named
// service needs (mig.Service.MemGB), into svcs; services it does not name
// keep theirs (0: any slice holds them). Empty s names none.
func ParseMemory(s string, svcs []mig.Service) error {
	if strings.TrimSpace(s) == "" {
		return nil
	}
	seen := map[string]bool{}
	for _, kv := range strings.Split(s, ",") {
		name, v, ok := strings.Cut(strings.TrimSpace(kv), "=")
		gb, perr := strconv.ParseFloat(strings.TrimSuffix(strings.ToLower(v), "gb"), 64)
		i := slices.IndexFunc(svcs, func(sv mig.Service) bool { return sv.Name == name })
		switch {
		case !ok || perr != nil || name == "":
			return fmt.Errorf("%q, want name=GB", kv)
		case !(gb >= 0) || math.IsInf(gb, 0):
			return fmt.Errorf("%q: memory is 0 or more GB", kv)
		case seen[name]:
			return fmt.Errorf("%q: service %s given twice", kv, name)
		case i < 0:
			return fmt.Errorf("%q: no service %s in the demands", kv, name)
		}
		seen[name] = true
		svcs[i].MemGB = gb
	}
	return nil
}

// MIG plans svcs on GPUs of model m, prints each GPU's layout and the
// count against whole-GPU allocation, and, when the heuristic needs at
// most maxExact GPUs, the exact solver's count, with its layouts when it
// needs fewer GPUs than the heuristic.
func MIG(w io.Writer, m mig.Model, svcs []mig.Service, maxExact int) error {
	g, err := mig.Greedy(m, svcs)
	if err != nil {
		return err
	}
	layouts(w, "gpu", m, svcs, g)
	whole := mig.WholeGPUs(m, svcs)
	fmt.Fprintf(w, "heuristic: %d GPUs; whole-GPU allocation: %d GPUs (saves %.0f%%)\n", len(g.GPUs), whole, 100*float64(whole-len(g.GPUs))/float64(max(whole, 1)))
	if len(g.GPUs) <= maxExact {
		ex, err := mig.Exact(m, svcs, maxExact)
		if errors.Is(err, mig.ErrStepLimit) {
			fmt.Fprintf(w, "exact: stopped after %d search steps; the heuristic's %d GPUs are not proven fewest\n", mig.ExactSteps, len(g.GPUs))
			return nil
		}
		if err != nil {
			return err
		}
		fmt.Fprintf(w, "exact: %d GPUs\n", len(ex.GPUs))
		if len(ex.GPUs) < len(g.GPUs) {
			// The plan to create is the exact one: its layouts, which
			// the heuristic's above are not.
			layouts(w, "exact gpu", m, svcs, ex)
		}
	}
	return nil
}

// layouts prints each GPU of p: its instances as profile@start:service
// ("idle" for one no service uses), one line a GPU, named label and its
// index.
func layouts(w io.Writer, label string, m mig.Model, svcs []mig.Service, p *mig.Plan) {
	for i, gpu := range p.GPUs {
		var parts []string
		for j, in := range gpu.Layout {
			who := "idle"
			if s := gpu.Assign[j]; s >= 0 {
				who = svcs[s].Name
			}
			parts = append(parts, fmt.Sprintf("%s@%d:%s", m.Profiles[in.Profile].Name, in.Start, who))
		}
		fmt.Fprintf(w, "%s %d: %s\n", label, i, strings.Join(parts, " "))
	}
}

// MIGBench compares GPUs and solve time of the heuristic with the exact
// solver on n random small cases (2-3 services, demands 0.1-2 GPUs), then
// times the heuristic alone on larger random cases. It measures wall
// time, so its times vary from run to run; the GPU counts do not.
func MIGBench(w io.Writer, m mig.Model, n, maxExact int) error {
	var (
		sumG, sumE, sumWhole, solved, equal, plus1, worse int
		tG, tE, maxG, maxE                                time.Duration
	)
	for seed := uint64(1); seed <= uint64(n); seed++ {
		svcs := mig.RandomServices(m, seed, 2+int(seed%2), 2)
		t0 := time.Now()
		g, err := mig.Greedy(m, svcs)
		dg := time.Since(t0)
		if err != nil {
			return fmt.Errorf("bench seed %d greedy: %w", seed, err)
		}
		t0 = time.Now()
		ex, err := mig.Exact(m, svcs, maxExact)
		de := time.Since(t0)
		tG, tE, maxG, maxE = tG+dg, tE+de, max(maxG, dg), max(maxE, de)
		if err != nil { // nothing within maxExact GPUs: left out of the comparison
			continue
		}
		solved++
		sumG += len(g.GPUs)
		sumE += len(ex.GPUs)
		sumWhole += mig.WholeGPUs(m, svcs)
		switch d := len(g.GPUs) - len(ex.GPUs); {
		case d == 0:
			equal++
		case d == 1:
			plus1++
		default:
			worse++
		}
	}
	fmt.Fprintf(w, "%s, %d small cases (2-3 services, 0.1-2 GPUs each), exact up to %d GPUs: solved %d\n", m.Name, n, maxExact, solved)
	fmt.Fprintf(w, "  GPUs: heuristic %d, exact %d, whole-GPU %d (MIG saves %.1f%%); heuristic = exact in %d, +1 in %d, +2 or more in %d\n",
		sumG, sumE, sumWhole, 100*float64(sumWhole-sumE)/float64(max(sumWhole, 1)), equal, plus1, worse)
	fmt.Fprintf(w, "  solve time per case: heuristic mean %v max %v; exact (runs the heuristic first) mean %v max %v\n",
		(tG / time.Duration(n)).Round(time.Microsecond), maxG.Round(time.Microsecond), (tE / time.Duration(n)).Round(time.Microsecond), maxE.Round(time.Microsecond))
	fmt.Fprintf(w, "%8s %6s %10s %10s %8s %12s\n", "services", "cases", "heuristic", "whole-GPU", "saved", "time/case")
	for _, k := range []int{20, 50, 100, 200, 500} {
		const cases = 5
		var gpus, whole int
		var el time.Duration
		for seed := uint64(1); seed <= cases; seed++ {
			svcs := mig.RandomServices(m, 1000*uint64(k)+seed, k, 3)
			t0 := time.Now()
			g, err := mig.Greedy(m, svcs)
			el += time.Since(t0)
			if err != nil {
				return fmt.Errorf("bench %d services seed %d: %w", k, seed, err)
			}
			gpus += len(g.GPUs)
			whole += mig.WholeGPUs(m, svcs)
		}
		fmt.Fprintf(w, "%8d %6d %10d %10d %7.1f%% %12v\n", k, cases, gpus, whole, 100*float64(whole-gpus)/float64(whole), (el / cases).Round(time.Microsecond))
	}
	return nil
}
