package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/prism-serve/prism/internal/flagval"
	"github.com/prism-serve/prism/internal/memlimit"
	"github.com/prism-serve/prism/internal/progress"
	"github.com/prism-serve/prism/models"
)

func init() { subcommands = append(subcommands, newModelsCmd) }

func newModelsCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "models",
		Short: "List and build the model zoo (DLRM, DCNv2, DeepFM)",
	}
	cmd.AddCommand(newModelsListCmd(), newModelsBuildCmd())
	return cmd
}

func newModelsListCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "list",
		Short: "List the presets with their parameter counts and bytes",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return models.WriteList(cmd.OutOrStdout())
		},
	}
}

func newModelsBuildCmd() *cobra.Command {
	var (
		out      string
		seed     uint64
		scale    models.ScaleOptions
		external bool
	)
	cmd := &cobra.Command{
		Use:   "build NAME -o DIR",
		Short: "Build a preset with seeded weights into DIR/model.onnx (external data when large)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if out == "" {
				return fmt.Errorf("models build: -o DIR is required")
			}
			p, err := models.Lookup(args[0])
			if err != nil {
				return err
			}
			c, err := p.Resolve(scale)
			if err != nil {
				return fmt.Errorf("models build %s: %w", args[0], err)
			}
			if err := buildFits(c, memlimit.Read().Effective()); err != nil {
				return fmt.Errorf("models build %s: %w", args[0], err)
			}
			start := time.Now()
			stderr := cmd.ErrOrStderr()
			fmt.Fprintf(stderr, "building %s: %d tables, %s of parameters\n", c.Name, c.NumTables(), progress.Bytes(c.Bytes()))
			m, err := models.New(c, seed)
			if err != nil {
				return err
			}
			var bar *progress.Bar
			opts := models.WriteOptions{External: external}
			opts.Progress = func(done, total int64) {
				if bar == nil {
					bar = progress.New(stderr, "writing "+out, total, true)
				}
				bar.Set(done)
			}
			man, err := m.Write(out, opts)
			if bar != nil {
				bar.Done()
			}
			if err != nil {
				return err
			}
			where := out + "/" + man.ModelFile
			if man.External {
				where += " (+ " + man.DataFile + ")"
			}
			fmt.Fprintf(cmd.OutOrStdout(), "built %s (%s params, %s) in %s: %s\n", c.Name, models.HumanCount(man.Params), progress.Bytes(man.Bytes), time.Since(start).Round(time.Millisecond), where)
			return nil
		},
	}
	cmd.Flags().StringVarP(&out, "out", "o", "", "output folder (created)")
	cmd.Flags().Uint64Var(&seed, "seed", 1, "seed of the weights")
	cmd.Flags().Float64Var(&scale.RowsScale, "rows-scale", 0, "multiply every table's rows (tables keep at least min(rows, 1000)); 0: the preset's default")
	cmd.Flags().Int64Var(&scale.MaxRows, "max-rows", 0, "cap every table at this many rows; 0: the preset's default")
	cmd.Flags().BoolVar(&external, "external-data", false, "always write weights to model.onnx.data (default: only above 1 GiB)")
	return cmd
}

// buildFits refuses a model whose tables (built in memory, float32)
// take more than memory bytes (0: unknown, no check): --rows-scale 1e12
// panicked (makeslice: len out of range), and 1e5 grew past 24 GB in
// 24 s on a machine of 23.5 GB. In float64: no product overflows.
func buildFits(c models.Config, memory int64) error {
	if memory <= 0 {
		return nil
	}
	var rows float64
	for _, r := range c.TableRows {
		rows += float64(r)
	}
	if b := rows * float64(c.EmbDim) * 4; b > float64(memory) {
		return fmt.Errorf("its %d tables' %.0f rows of width %d take %s, more than the %s of memory this process may use: lower --rows-scale or --max-rows",
			len(c.TableRows), rows, c.EmbDim, flagval.FormatBytes(int64(min(b, 1<<62))), flagval.FormatBytes(memory))
	}
	return nil
}
