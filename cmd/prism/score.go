package main

import (
	"errors"

	"github.com/spf13/cobra"

	"github.com/prism-serve/prism/internal/flagval"
	"github.com/prism-serve/prism/internal/score"
)

func init() { subcommands = append(subcommands, newScoreCmd) }

func newScoreCmd() *cobra.Command {
	var o score.Options
	cmd := &cobra.Command{
		Use:   "score MODEL.onnx [--samples N | --criteo FILE] [--plan DIR] [--batch B]",
		Short: "Score samples with the whole model in one ONNX Runtime session (the monolithic reference and baseline)",
		Long: `score runs the whole model in one ONNX Runtime session, on synthetic
samples (Zipf ids, seeded) or on Criteo rows, and prints the first scores and
a throughput summary. Every later correctness check compares against it and
every performance figure is a ratio against it.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := flagval.Positive(cmd.Flags(), "zipf"); err != nil {
				return err
			}
			// Below 0 each ran as 0, silently.
			if err := flagval.NonNegative(cmd.Flags(), "show", "warmup"); err != nil {
				return err
			}
			if err := flagval.AtMostPerCore(cmd.Flags(), "threads"); err != nil {
				return err
			}
			switch {
			case o.Batch <= 0:
				return errors.New("score: --batch must be positive")
			case o.Samples <= 0 && o.Criteo == "":
				return errors.New("score: --samples must be positive")
			case o.Threads < 0:
				return errors.New("score: --threads must not be negative")
			}
			o.Progress = cmd.ErrOrStderr()
			return score.Run(cmd.OutOrStdout(), args[0], o)
		},
	}
	fl := cmd.Flags()
	fl.IntVar(&o.Samples, "samples", 1024, "synthetic samples to score (ignored with --criteo)")
	fl.StringVar(&o.Criteo, "criteo", "", "score rows of this Criteo file (TSV, or CSV/TSV with a header)")
	fl.StringVar(&o.Plan, "plan", "", "draw samples (or read Criteo rows) for the inputs of this partition folder's plan.json: packed ids, ids among float values, offsets into fused tables")
	fl.IntVar(&o.Batch, "batch", 256, "samples per ONNX Runtime run")
	fl.IntVar(&o.Threads, "threads", 1, "ONNX Runtime intra-op threads (0: one per core)")
	fl.Uint64Var(&o.Seed, "seed", 1, "seed of the synthetic samples")
	fl.Float64Var(&o.Zipf, "zipf", 1.05, "Zipf exponent of synthetic ids")
	fl.IntVar(&o.Show, "show", 5, "print the first N scores")
	fl.StringVar(&o.ScoresOut, "scores-out", "", "write every score to this file, one sample per line (a multi-task plan's k scores apart by spaces)")
	fl.IntVar(&o.Warmup, "warmup", 3, "untimed batches run first")
	return cmd
}
