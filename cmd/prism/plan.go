package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/prism-serve/prism/placement"
	"github.com/prism-serve/prism/placement/cnhn"
	"github.com/prism-serve/prism/placement/mig"
)

func init() { subcommands = append(subcommands, newPlanCmd) }

// newPlanCmd is `prism plan`: cluster-level placement planning. The logic
// lives in placement/; this file only parses flags and writes files.
func newPlanCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "plan",
		Short: "Plan placement: simulate scheduling policies, compare CN/HN deployments, lay out MIG",
	}
	cmd.AddCommand(newPlanSimulateCmd(), newPlanCNHNCmd(), newPlanMIGCmd())
	for _, mk := range planSubcommands {
		cmd.AddCommand(mk())
	}
	return cmd
}

// planSubcommands lets other files of this package add plan jobs.
var planSubcommands []func() *cobra.Command

// sharedData finds ../shared/data beside the repository root (the
// directory holding go.mod), walking up from the working directory; "" if
// there is none.
func sharedData() string {
	dir, err := os.Getwd()
	if err != nil {
		return ""
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			p := filepath.Join(filepath.Dir(dir), "shared", "data")
			if st, err := os.Stat(p); err == nil && st.IsDir() {
				return p
			}
			return ""
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return ""
		}
		dir = parent
	}
}

// defaultDataFile returns the shared data file if it exists, else "".
func defaultDataFile(rel string) string {
	d := sharedData()
	if d == "" {
		return ""
	}
	p := filepath.Join(d, rel)
	if _, err := os.Stat(p); err != nil {
		return ""
	}
	return p
}

// parseSeeds reads "42-51", "1,5,9" or "7".
func parseSeeds(s string) ([]uint64, error) {
	var out []uint64
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		if lo, hi, ok := strings.Cut(part, "-"); ok {
			a, err1 := strconv.ParseUint(strings.TrimSpace(lo), 10, 64)
			b, err2 := strconv.ParseUint(strings.TrimSpace(hi), 10, 64)
			if err1 != nil || err2 != nil || b < a {
				return nil, fmt.Errorf("--seeds: bad range %q, want like 42-51", part)
			}
			if b-a > 100000 {
				return nil, fmt.Errorf("--seeds: range %q too long", part)
			}
			for v := a; v <= b; v++ {
				out = append(out, v)
			}
			continue
		}
		v, err := strconv.ParseUint(part, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("--seeds: %q is not a seed", part)
		}
		out = append(out, v)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("--seeds: no seeds in %q", s)
	}
	return out, nil
}

func newPlanSimulateCmd() *cobra.Command {
	var (
		nodesPath, tasksPath, policies, seeds, out, tie string
		inflation, coverage                             float64
		at                                              int
		bound                                           bool
	)
	cmd := &cobra.Command{
		Use:   "simulate",
		Short: "Replay a GPU-cluster trace under placement policies (the FGD paper's method)",
		Long: `Simulate grows the task trace with seeded random draws to --inflation times the
cluster's GPU capacity, shuffles it with the same seed, places tasks one by one
(none leaves) and records GPU allocation and fragmentation against arrived load.
It writes curves.csv, summary.csv, alloc.png and frag.png to --out.`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if nodesPath == "" || tasksPath == "" {
				return fmt.Errorf("--nodes and --tasks are required (no ../shared/data found to default to)")
			}
			seedList, err := parseSeeds(seeds)
			if err != nil {
				return err
			}
			nodes, err := placement.LoadNodes(nodesPath)
			if err != nil {
				return err
			}
			tasks, err := placement.LoadTasks(tasksPath)
			if err != nil {
				return err
			}
			reg := placement.NewRegistry()
			var names []string
			for _, p := range strings.Split(policies, ",") {
				if p = strings.TrimSpace(p); p == "" {
					continue
				}
				if p == "all" {
					names = append(names, placement.PaperPolicies...)
					continue
				}
				if _, err := reg.New(p, placement.PolicyOptions{Workload: placement.TargetWorkload{{GPUMilli: 1000, GPUs: 1, Freq: 1}}}); err != nil {
					return fmt.Errorf("--policy: %w", err)
				}
				names = append(names, p)
			}
			if len(names) == 0 {
				return fmt.Errorf("--policy: no policy given")
			}
			stderr := cmd.ErrOrStderr()
			var results []*placement.SimResult
			total := len(names) * len(seedList)
			for i, name := range names {
				for j, seed := range seedList {
					run := i*len(seedList) + j + 1
					opts := placement.SimOptions{Seed: seed, Inflation: inflation, Coverage: coverage, TieBreak: tie, ProgressEvery: 2000,
						Progress: func(done, n int) {
							fmt.Fprintf(stderr, "\r[%d/%d] %s seed %d: %d/%d tasks", run, total, name, seed, done, n)
						}}
					r, err := placement.Simulate(nodes, tasks, name, reg, opts)
					if err != nil {
						return err
					}
					fmt.Fprintf(stderr, "\r[%d/%d] %s seed %d: %d tasks, %d failed, alloc %.2f%% at %d%% arrived\n",
						run, total, r.Policy, seed, r.Tasks, r.Failed, r.AllocAt(at), at)
					results = append(results, r)
				}
			}
			sums := placement.Summarize(results, at)
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "%-14s %5s %12s %8s %10s %8s\n", "policy", "seeds", "alloc@"+strconv.Itoa(at)+"%", "std", "frag", "failed")
			for _, s := range sums {
				fmt.Fprintf(w, "%-14s %5d %11.2f%% %8.2f %9.2f%% %7.2f%%\n", s.Policy, s.Seeds, s.AllocMean, s.AllocStd, s.FragMean, s.FailedPct)
			}
			if bound {
				var sum float64
				for _, seed := range seedList {
					b, err := placement.AllocBound(nodes, tasks, placement.SimOptions{Seed: seed, Inflation: inflation, Coverage: coverage, TieBreak: tie}, at)
					if err != nil {
						return err
					}
					sum += b
				}
				fmt.Fprintf(w, "%-14s %5d %11.2f%%  (upper bound for any policy: one GPU pool, dual feasible function)\n", "bound", len(seedList), sum/float64(len(seedList)))
			}
			if out == "" {
				return nil
			}
			if err := os.MkdirAll(out, 0o755); err != nil {
				return fmt.Errorf("create %q: %w", out, err)
			}
			if err := writeFile(filepath.Join(out, "curves.csv"), func(f *os.File) error { return placement.WriteCurvesCSV(f, results) }); err != nil {
				return err
			}
			if err := writeFile(filepath.Join(out, "summary.csv"), func(f *os.File) error { return placement.WriteSummaryCSV(f, sums) }); err != nil {
				return err
			}
			for _, m := range []string{"alloc", "frag"} {
				if err := placement.PlotCurvesPNG(filepath.Join(out, m+".png"), results, m); err != nil {
					return err
				}
			}
			fmt.Fprintf(stderr, "wrote %s/{curves.csv,summary.csv,alloc.png,frag.png}\n", out)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&nodesPath, "nodes", defaultDataFile("openb/openb_node_list_gpu_node.csv"), "node CSV (sn,cpu_milli,memory_mib,gpu,model)")
	f.StringVar(&tasksPath, "tasks", defaultDataFile("openb/openb_pod_list_default.csv"), "task CSV (name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,...)")
	f.StringVar(&policies, "policy", "all", "comma-separated policies, or all for the paper's six: "+strings.Join(placement.NewRegistry().Names(), ", "))
	f.StringVar(&seeds, "seeds", "42", "seeds: 42-51, 1,2,3 or 42")
	f.StringVar(&out, "out", "", "directory for curves.csv, summary.csv, alloc.png, frag.png")
	f.Float64Var(&inflation, "inflation", 1.3, "grow GPU demand to this multiple of capacity (<= 0: trace as is)")
	f.Float64Var(&coverage, "coverage", 0.95, "share of tasks the FGD target workload's shapes cover")
	f.StringVar(&tie, "tie", "first", "tie break between best nodes: first (seeded node order) or random")
	f.IntVar(&at, "at", 100, "arrived load (percent of GPU capacity) the summary reports")
	f.BoolVar(&bound, "bound", false, "also print placement.AllocBound, an upper bound on any policy's allocation for the same runs")
	return cmd
}

func writeFile(path string, fill func(*os.File) error) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("create %q: %w", path, err)
	}
	if err := fill(f); err != nil {
		f.Close()
		return fmt.Errorf("write %q: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("close %q: %w", path, err)
	}
	return nil
}

func newPlanCNHNCmd() *cobra.Command {
	var (
		trace    string
		gpu, cpu cnhn.Shape
	)
	cmd := &cobra.Command{
		Use:   "cnhn",
		Short: "Compare Prism's disaggregated CN/HN deployment with a monolithic one on the Prism trace",
		Long: `cnhn replays the lifetime events of the Prism trace twice on elastic pools of
identical nodes (a node opens when nothing open fits, closes when empty, best
fit in between): disaggregated (CN instances on CPU nodes, HN on GPU nodes) and
monolithic (each HN instance carries its service's CN vCPUs and memory per HN
instance, on GPU nodes). It reports peak nodes and time-averaged CPU and GPU
fragmentation (unallocated share of the nodes in use).`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if trace == "" {
				return fmt.Errorf("--trace is required (no ../shared/data found to default to)")
			}
			tr, err := cnhn.LoadTrace(trace)
			if err != nil {
				return err
			}
			o := cnhn.Options{GPUNode: gpu, CPUNode: cpu}
			if err := o.Validate(); err != nil {
				return err
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "replaying %d instances twice...\n", len(tr))
			d, err := cnhn.Disaggregated(tr, o)
			if err != nil {
				return err
			}
			m, err := cnhn.Monolithic(tr, o)
			if err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "%-14s %9s %9s %9s %9s %12s %12s %9s %12s\n", "deployment", "gpu_nodes", "cpu_nodes", "cpu_frag", "gpu_frag", "gpupool_cpu", "cpupool_cpu", "unplaced", "capped_vcpu")
			for _, r := range []*cnhn.Result{d, m} {
				fmt.Fprintf(w, "%-14s %9d %9d %8.1f%% %8.1f%% %11.1f%% %11.1f%% %9d %12.0f\n", r.Mode, r.PeakGPUNodes, r.PeakCPUNodes, r.CPUFragPct, r.GPUFragPct, r.GPUPoolCPUFragPct, r.CPUPoolCPUFragPct, r.Unplaced, r.CappedCores)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&trace, "trace", defaultDataFile("prism/disaggregated_DLRM_trace.csv"), "Prism trace CSV")
	f.IntVar(&gpu.Cores, "gpu-node-cores", 128, "vCPUs of a GPU node")
	f.IntVar(&gpu.GPUs, "gpu-node-gpus", 8, "GPUs of a GPU node")
	f.IntVar(&gpu.RNICs, "gpu-node-rnics", 4, "RNICs of a GPU node")
	f.IntVar(&gpu.MemGiB, "gpu-node-mem", 2048, "memory GiB of a GPU node (not in the paper; assumed)")
	f.IntVar(&cpu.Cores, "cpu-node-cores", 128, "vCPUs of a CPU node")
	f.IntVar(&cpu.RNICs, "cpu-node-rnics", 1, "RNICs of a CPU node")
	f.IntVar(&cpu.MemGiB, "cpu-node-mem", 1024, "memory GiB of a CPU node (not in the paper; assumed)")
	return cmd
}

func newPlanMIGCmd() *cobra.Command {
	var (
		model    string
		demands  string
		full     float64
		maxExact int
		bench    int
	)
	cmd := &cobra.Command{
		Use:   "mig",
		Short: "Lay out MIG partitions so service demands are met with the fewest GPUs",
		Long: `mig plans per-GPU MIG layouts legal for the GPU model and assigns instances to
services. --demands lists each service's demand in full-GPU equivalents
(name=demand, comma-separated); throughput per slice follows MLPerf v1.1's
1g share of 0.136 of a full GPU per compute slice. The heuristic plan is
compared with whole-GPU allocation and, up to --max-exact GPUs, with the
exact solver.`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			m, err := mig.ModelByName(model)
			if err != nil {
				return err
			}
			if bench > 0 {
				return migBench(cmd.OutOrStdout(), m, bench, maxExact)
			}
			var svcs []mig.Service
			for _, kv := range strings.Split(demands, ",") {
				name, v, ok := strings.Cut(strings.TrimSpace(kv), "=")
				d, perr := strconv.ParseFloat(v, 64)
				if !ok || perr != nil || d < 0 {
					return fmt.Errorf("--demands: %q, want name=demand", kv)
				}
				svcs = append(svcs, mig.Service{Name: name, Demand: d * full, Throughput: mig.DefaultThroughput(m, full)})
			}
			g, err := mig.Greedy(m, svcs)
			if err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			for i, gpu := range g.GPUs {
				var parts []string
				for j, in := range gpu.Layout {
					who := "idle"
					if s := gpu.Assign[j]; s >= 0 {
						who = svcs[s].Name
					}
					parts = append(parts, fmt.Sprintf("%s@%d:%s", m.Profiles[in.Profile].Name, in.Start, who))
				}
				fmt.Fprintf(w, "gpu %d: %s\n", i, strings.Join(parts, " "))
			}
			whole := mig.WholeGPUs(m, svcs)
			fmt.Fprintf(w, "heuristic: %d GPUs; whole-GPU allocation: %d GPUs (saves %.0f%%)\n", len(g.GPUs), whole, 100*float64(whole-len(g.GPUs))/float64(max(whole, 1)))
			if len(g.GPUs) <= maxExact {
				ex, err := mig.Exact(m, svcs, maxExact)
				if err != nil {
					return err
				}
				fmt.Fprintf(w, "exact: %d GPUs\n", len(ex.GPUs))
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&model, "model", "A100-80GB", "GPU model: A100-40GB, A100-80GB, H100-80GB")
	f.StringVar(&demands, "demands", "resnet=0.4,bert=0.4,dlrm=1.3", "service demands in full-GPU equivalents, name=demand,...")
	f.Float64Var(&full, "full-throughput", 1000, "requests/s of one full GPU (scales demands and throughputs alike)")
	f.IntVar(&maxExact, "max-exact", 6, "run the exact solver when the heuristic plan has at most this many GPUs")
	f.IntVar(&bench, "bench", 0, "instead of planning --demands: compare heuristic and exact on this many random small cases (seeds 1..N), then time the heuristic alone on large ones")
	return cmd
}

// migBench is `plan mig --bench N`: GPUs and solve time of the heuristic
// against the exact solver on N random small cases (2-3 services, demands
// 0.1-2 GPUs), then the heuristic alone on larger random cases.
func migBench(w io.Writer, m mig.Model, n, maxExact int) error {
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
