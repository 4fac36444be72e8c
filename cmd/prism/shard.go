package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/prism-serve/prism/internal/flagval"
	"github.com/prism-serve/prism/plan"
	"github.com/prism-serve/prism/sharding"
)

func init() { subcommands = append(subcommands, newShardCmd) }

// newShardCmd is `prism shard PLAN_DIR --shards N`: plan how the model's
// tables spread over N embedding workers, into plan.json. The planner
// lives in sharding/; this file only parses flags.
func newShardCmd() *cobra.Command {
	var (
		o          sharding.RunOptions
		shardBytes string
	)
	cmd := &cobra.Command{
		Use:   "shard PLAN_DIR --shards N [--shard-bytes B] [--criteo FILE | --zipf S]",
		Short: "Plan the sharding of a model's embedding tables over N embedding workers (into plan.json)",
		Long: `Shard writes a sharding section into the plan's plan.json: each table
table-wise on one shard, or row-wise (row r on the (r mod m)-th of its m
shards) when it is larger than a shard's budget or hotter than a shard's
share of the lookups; shards balanced by bytes and by expected lookups.
Expected lookups come from --criteo (row frequencies counted on a Criteo
sample, by default the sample the project's tests read when it is there
and the model reads Criteo rows) or --zipf S (row r looked up with weight
1/(r+1)^S); with neither and no sample at hand, --zipf 1.05 (it says so).
Then ingest each shard into its worker's store with
prism ingest PLAN_DIR --db DIR --shard K.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			// A 0 would be taken silently as the default (10%, the
			// Criteo sample or Zipf 1.05, the fair share plus 25%).
			if err := flagval.Positive(cmd.Flags(), "tolerance", "zipf"); err != nil {
				return err
			}
			// The planner's own check said "shards 0, want at least 1".
			if o.Shards < 1 || o.Shards > plan.MaxShards {
				return fmt.Errorf("--shards %d: want 1 to %d (the embedding workers holding a part of the tables)", o.Shards, plan.MaxShards)
			}
			var err error
			if o.ShardBytes, err = flagval.Bytes(shardBytes); err != nil {
				return fmt.Errorf("--shard-bytes: %w", err)
			}
			if cmd.Flags().Changed("shard-bytes") && o.ShardBytes <= 0 {
				return fmt.Errorf("--shard-bytes %s: want a positive value", shardBytes)
			}
			p, err := sharding.Run(args[0], o, cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			sharding.WriteText(cmd.OutOrStdout(), p.Sharding)
			if sh := p.Sharding; sh.Imbalance > sh.Tolerance {
				// Written anyway (the balance is the planner's aim, not a
				// rule), but 1000 shards of a small model were taken
				// without a word at 718.6%.
				fmt.Fprintf(cmd.ErrOrStderr(), "warning: imbalance %.1f%% is past --tolerance %.0f%%: the busiest shard expects %.1fx the mean shard's lookups, and the fan-out waits for it; fewer --shards balance better\n", 100*sh.Imbalance, 100*sh.Tolerance, 1+sh.Imbalance)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.IntVar(&o.Shards, "shards", 0, "number of shards (embedding workers holding a part of the tables)")
	f.StringVar(&shardBytes, "shard-bytes", "", "budget of float32 table bytes per shard, e.g. 8GiB (default: the fair share plus 25%)")
	f.StringVar(&o.Criteo, "criteo", "", "Criteo sample to count row frequencies on (default: the sample the tests read, when present)")
	f.Float64Var(&o.Zipf, "zipf", 0, "assume Zipf row frequencies with this exponent instead of a Criteo sample (e.g. 1.05)")
	f.Float64Var(&o.Tolerance, "tolerance", sharding.DefaultTolerance, "aim at every shard's expected lookups within this fraction of the mean")
	_ = cmd.MarkFlagRequired("shards")
	return cmd
}
