package main

import (
	"errors"
	"fmt"
	"slices"

	"github.com/spf13/cobra"

	"github.com/prism-serve/prism/internal/flagval"
	"github.com/prism-serve/prism/internal/progress"
	"github.com/prism-serve/prism/partitioner"
	"github.com/prism-serve/prism/partitioner/verify"
)

func init() { subcommands = append(subcommands, newPartitionCmd) }

func newPartitionCmd() *cobra.Command {
	var (
		out        string
		o          partitioner.Options
		verifyN    int
		verifySeed uint64
	)
	cmd := &cobra.Command{
		Use:   "partition MODEL.onnx -o OUT/",
		Short: "Cut an ONNX recommendation model into an embedding side and a dense side, optimally",
		Long: `partition finds the embedding lookups of MODEL.onnx (Gather on a 2-D table,
with its pooling), pins them to the CPU side and heavy dense ops to the dense
side, and places every other node by an exact minimum cut of bytes per sample
crossing plus each side's compute. It writes OUT/plan.json, OUT/cpu.onnx (when
there is CPU work besides the lookups), OUT/dense.onnx and OUT/tables/*.arrow,
and prints a report.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if out == "" && !o.ReportOnly {
				return errors.New("partition: -o OUT is required (or --report-only)")
			}
			if verifyN < 0 {
				return errors.New("partition: --verify must not be negative")
			}
			if verifyN > 0 && o.ReportOnly {
				// It was skipped without a word.
				return errors.New("partition: --verify checks the written partition: not with --report-only")
			}
			// Each is positive: 0 would stand for the default (the cost
			// model's zero fields), silently.
			if err := flagval.Positive(cmd.Flags(), "net-gbps", "cpu-gflops", "gpu-gflops", "gpu-launch-us", "batch"); err != nil {
				return fmt.Errorf("partition: %w", err)
			}
			for _, n := range o.ForceCPU {
				if slices.Contains(o.ForceGPU, n) {
					return fmt.Errorf("partition: node %q is in both --force-cpu and --force-gpu", n)
				}
			}
			var bar *progress.Bar
			o.TableProgress = func(done, total int64) {
				if total < 64<<20 {
					return // small tables are written before a bar would help
				}
				if bar == nil {
					bar = progress.New(cmd.ErrOrStderr(), "writing tables", total, true)
				}
				bar.Set(done)
			}
			res, err := partitioner.Partition(args[0], out, o)
			if bar != nil {
				bar.Done()
			}
			switch {
			case errors.Is(err, partitioner.ErrOutputExists):
				return fmt.Errorf("%w (use --overwrite)", err)
			case errors.Is(err, partitioner.ErrUnrecognised):
				return fmt.Errorf("%w\n(--report-only lists every table candidate; --allow-dense-only leaves them in the dense graph)", err)
			case errors.Is(err, partitioner.ErrBatchDependent):
				return fmt.Errorf("%w\n(--allow-batch-dependent writes the plan all the same)", err)
			case errors.Is(err, partitioner.ErrForced):
				return fmt.Errorf("%w (check --force-cpu/--force-gpu)", err)
			case errors.Is(err, partitioner.ErrCostsTooLarge):
				// It named no flag: --gpu-launch-us 1e18 or --net-gbps
				// 1e-300 gave it.
				return fmt.Errorf("%w (check the cost model: --net-gbps, --cpu-gflops, --gpu-gflops, --gpu-launch-us)", err)
			}
			if err != nil {
				return err
			}
			for _, r := range res.Removed {
				fmt.Fprintf(cmd.ErrOrStderr(), "partition: removed %s, the partial output of an earlier run stopped part way\n", r)
			}
			fmt.Fprint(cmd.OutOrStdout(), res.Report())
			if o.ReportOnly {
				return nil
			}
			fmt.Fprintf(cmd.OutOrStdout(), "wrote %s\n", out)
			if verifyN > 0 {
				var bar *progress.Bar
				rep, err := verify.VerifyProgress(args[0], out, verifyN, verifySeed, func(done, n int) {
					if bar == nil {
						bar = progress.New(cmd.ErrOrStderr(), "verify", int64(n), false)
					}
					bar.Set(int64(done))
				})
				if bar != nil {
					bar.Done()
				}
				if err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "verified on %d samples: max abs error %.3g (tolerance %g)\n", rep.Samples, rep.MaxAbsErr, verify.Tolerance)
				if len(rep.BatchSizes) > 0 {
					fmt.Fprintf(cmd.OutOrStdout(), "verified at batch sizes %v (the model runs whole at its exported batch only)\n", rep.BatchSizes)
				}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVarP(&out, "out", "o", "", "output folder (must be empty or absent)")
	f.BoolVar(&o.ReportOnly, "report-only", false, "print the plan, write nothing")
	f.BoolVar(&o.AllowDenseOnly, "allow-dense-only", false, "write the plan even when Gathers on tables are not recognised as lookups (they stay in the dense graph)")
	f.BoolVar(&o.AllowBatchDependent, "allow-batch-dependent", false, "write the plan even when a sample's score depends on the other samples of its batch (onnxruntime quantize_dynamic's DynamicQuantizeLinear)")
	f.BoolVar(&o.Overwrite, "overwrite", false, "replace a non-empty output folder")
	f.StringArrayVar(&o.ForceCPU, "force-cpu", nil, "place this node (by name) on the CPU side; repeatable")
	f.StringArrayVar(&o.ForceGPU, "force-gpu", nil, "place this node (by name) on the dense side; repeatable")
	f.BoolVar(&o.LookupsDense, "lookups-dense", false, "place every node reading an embedding lookup's output on the dense side, so cpu.onnx reads none: what prism shard needs to split a table off shard 0 (row-wise or onto another shard)")
	f.StringSliceVar(&o.Tasks, "tasks", nil, "the outputs to serve as scores, in order (comma-separated or repeated): each a float32 of one value per sample or [k]; default every such output, the one named score first, past the first only those of one value per sample (a multi-task model exported with one output per task is served with all of them; an embedding output is not)")
	f.IntVar(&verifyN, "verify", 0, "after writing, check the partition against the whole model on N random samples")
	f.Uint64Var(&verifySeed, "verify-seed", 1, "seed of the --verify samples")
	f.Float64Var(&o.Cost.NetGbps, "net-gbps", 100, "cost model: CPU-to-dense-tier bandwidth, Gb/s")
	f.Float64Var(&o.Cost.CPUGFlops, "cpu-gflops", 20, "cost model: CPU GFLOP/s")
	f.Float64Var(&o.Cost.GPUGFlops, "gpu-gflops", 20000, "cost model: GPU GFLOP/s")
	f.Float64Var(&o.Cost.GPULaunchMicros, "gpu-launch-us", 5, "cost model: GPU kernel launch, microseconds")
	f.IntVar(&o.Cost.Batch, "batch", 256, "cost model: batch size that amortises launches")
	return cmd
}
