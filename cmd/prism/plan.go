package main

import (
	"fmt"
	"math"
	"strings"

	"github.com/spf13/cobra"

	"github.com/prism-serve/prism/internal/flagval"
	"github.com/prism-serve/prism/placement"
	"github.com/prism-serve/prism/placement/cli"
	"github.com/prism-serve/prism/placement/cnhn"
	"github.com/prism-serve/prism/placement/mig"
)

func init() { subcommands = append(subcommands, newPlanCmd) }

// newPlanCmd is `prism plan`: cluster-level placement planning. The logic
// lives in placement/ and placement/cli; this file only parses flags.
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

// dataFlag resolves a data-file flag: its value, or when it is empty (no
// ../shared/data to default to) an error that names the data set, where
// it is published, and the flag to pass.
func dataFlag(flag, value, rel string) (string, error) {
	p, err := cli.DataPath(value, rel)
	if err != nil {
		return "", fmt.Errorf("--%s not given and %w; download it and pass --%s FILE", flag, err, flag)
	}
	return p, nil
}

func newPlanSimulateCmd() *cobra.Command {
	var (
		c                 cli.SimulateConfig
		policies, seeds   string
		nodes, tasks, out string
	)
	cmd := &cobra.Command{
		Use:   "simulate",
		Short: "Replay a GPU-cluster trace under placement policies (the FGD paper's method)",
		Long: `Simulate grows the task trace with seeded random draws to --inflation times the
cluster's GPU capacity, shuffles it with the same seed, places tasks one by one
(none leaves) and records GPU allocation and fragmentation against arrived load.
It writes curves.csv, summary.csv, alloc.png and frag.png to --out.`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var err error
			if c.Nodes, err = dataFlag("nodes", nodes, cli.OpenbNodes); err != nil {
				return err
			}
			if c.Tasks, err = dataFlag("tasks", tasks, cli.OpenbTasks); err != nil {
				return err
			}
			if c.Seeds, err = cli.ParseSeeds(seeds); err != nil {
				return fmt.Errorf("--seeds: %w", err)
			}
			if c.Policies, err = cli.ParsePolicies(placement.NewRegistry(), policies); err != nil {
				return fmt.Errorf("--policy: %w", err)
			}
			c.Out = out
			if c.Inflation == 0 {
				c.Inflation = -1 // as the flag says: the trace as is (0 in SimOptions is its default)
			}
			if !(c.Coverage > 0 && c.Coverage <= 1) {
				return fmt.Errorf("--coverage %v: a share of the tasks, in (0,1]", c.Coverage)
			}
			if top := 100 * c.Inflation; c.Inflation > 0 && float64(c.At) > top || c.At <= 0 {
				// The summary would report the last point reached as if
				// it were the load asked for.
				return fmt.Errorf("--at %d: want a percent of GPU capacity the runs arrive at, 1 to %.0f (--inflation %g)", c.At, max(top, 100), c.Inflation)
			}
			return cli.Simulate(cmd.OutOrStdout(), cmd.ErrOrStderr(), c)
		},
	}
	f := cmd.Flags()
	f.StringVar(&nodes, "nodes", cli.DefaultData(cli.OpenbNodes), "node CSV (sn,cpu_milli,memory_mib,gpu,model)")
	f.StringVar(&tasks, "tasks", cli.DefaultData(cli.OpenbTasks), "task CSV (name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,...)")
	f.StringVar(&policies, "policy", "all", "comma-separated policies, or all for the paper's six: "+strings.Join(placement.NewRegistry().Names(), ", "))
	f.StringVar(&seeds, "seeds", "42", "seeds: 42-51, 1,2,3 or 42")
	f.StringVar(&out, "out", "", "directory for curves.csv, summary.csv, alloc.png, frag.png")
	f.Float64Var(&c.Inflation, "inflation", 1.3, "grow GPU demand to this multiple of capacity (<= 0: trace as is)")
	f.Float64Var(&c.Coverage, "coverage", 0.95, "share of tasks the FGD target workload's shapes cover")
	f.StringVar(&c.TieBreak, "tie", "first", "tie break between best nodes: first (seeded node order) or random")
	f.IntVar(&c.At, "at", 100, "arrived load (percent of GPU capacity) the summary reports")
	f.BoolVar(&c.Bound, "bound", false, "also print placement.AllocBound, an upper bound on any policy's allocation for the same runs")
	return cmd
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
			path, err := dataFlag("trace", trace, cli.PrismTrace)
			if err != nil {
				return err
			}
			if err := flagval.Positive(cmd.Flags(), "gpu-node-cores", "gpu-node-gpus", "gpu-node-mem", "cpu-node-cores", "cpu-node-mem"); err != nil {
				return err
			}
			if err := flagval.NonNegative(cmd.Flags(), "gpu-node-rnics", "cpu-node-rnics"); err != nil {
				return err
			}
			return cli.CNHN(cmd.OutOrStdout(), cmd.ErrOrStderr(), path, cnhn.Options{GPUNode: gpu, CPUNode: cpu})
		},
	}
	f := cmd.Flags()
	f.StringVar(&trace, "trace", cli.DefaultData(cli.PrismTrace), "Prism trace CSV")
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
		memory   string
		full     float64
		maxExact int
		bench    int
	)
	cmd := &cobra.Command{
		Use:   "mig",
		Short: "Lay out MIG partitions so service demands are met with the fewest GPUs",
		Long: `mig plans per-GPU MIG layouts legal for the GPU model and assigns instances to
services. --demands lists each service's demand (name=demand,
comma-separated) in full-GPU equivalents, or in requests/s with
--full-throughput R (one full GPU serves R); throughput per slice follows MLPerf v1.1's
1g share of 0.136 of a full GPU per compute slice. --mem-gb lists the
memory one instance of a service needs (name=GB: the dense model's
weights, the activations of its largest batch and the runtime's own);
such a service only gets slices whose memory, as the profile's name gives
it (the 10 of 1g.10gb), is at least that, and one that no slice holds is
an error. The heuristic plan is compared with whole-GPU allocation and,
up to --max-exact GPUs, with the exact solver, which stops after 20
million search steps (a few seconds) and then says the heuristic's count
is unproven.`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			m, err := mig.ModelByName(model)
			if err != nil {
				return err
			}
			if !(full >= 0) || math.IsInf(full, 0) {
				return fmt.Errorf("--full-throughput %v: requests/s one full GPU serves, or 0 for demands in full GPUs", full)
			}
			if maxExact < 0 || bench < 0 {
				return fmt.Errorf("--max-exact %d and --bench %d must not be negative", maxExact, bench)
			}
			if bench > 0 && memory != "" {
				return fmt.Errorf("--mem-gb names services of --demands; --bench draws its own")
			}
			if bench > 0 {
				return cli.MIGBench(cmd.OutOrStdout(), m, bench, maxExact)
			}
			svcs, err := cli.ParseDemands(demands, m, full)
			if err != nil {
				return fmt.Errorf("--demands: %w", err)
			}
			if err := cli.ParseMemory(memory, svcs); err != nil {
				return fmt.Errorf("--mem-gb: %w", err)
			}
			return cli.MIG(cmd.OutOrStdout(), m, svcs, maxExact)
		},
	}
	f := cmd.Flags()
	f.StringVar(&model, "model", "A100-80GB", "GPU model: A100-40GB, A100-80GB, H100-80GB, H100-94GB, H200-141GB")
	f.StringVar(&demands, "demands", "resnet=0.4,bert=0.4,dlrm=1.3", "service demands, name=demand,...: full-GPU equivalents, or requests/s with --full-throughput")
	f.StringVar(&memory, "mem-gb", "", "memory one instance of a service needs, name=GB,...: only slices with at least that much serve it (unnamed services: any slice)")
	f.Float64Var(&full, "full-throughput", 0, "requests/s one full GPU serves: --demands are then in requests/s (0: demands in full GPUs)")
	f.IntVar(&maxExact, "max-exact", 6, "run the exact solver when the heuristic plan has at most this many GPUs")
	f.IntVar(&bench, "bench", 0, "instead of planning --demands: compare heuristic and exact on this many random small cases (seeds 1..N), then time the heuristic alone on large ones")
	return cmd
}
