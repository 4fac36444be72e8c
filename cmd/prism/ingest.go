package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/prism-serve/prism/cpuserve/store"
	"github.com/prism-serve/prism/internal/flagval"
	"github.com/prism-serve/prism/internal/progress"
	"github.com/prism-serve/prism/plan"
)

func init() { subcommands = append(subcommands, newIngestCmd) }

// newIngestCmd is `prism ingest PLAN_DIR --db DIR`: bulk-load a plan's
// tables into the embedding store as a new model version.
func newIngestCmd() *cobra.Command {
	var (
		db, dtype, model, hotBytes, sstBytes string
		noActivate, ifChanged                bool
		shard, shards, keep                  int
	)
	cmd := &cobra.Command{
		Use:   "ingest PLAN_DIR --db DIR [--shard K [--shards N]]",
		Short: "Load a plan's embedding tables into the store (SST ingestion; re-run to resume)",
		Long: `Ingest loads the tables of a partition plan into the embedding store at
--db as a new version of the model and switches to it (unless
--no-activate). It is resumable: after a crash or ^C, running the same
command again goes on where it stopped; a table is served only once all
its rows are in. A plan whose tables a version of the model holds
already (the same plan ingested again, none of them updated since) adds
no version: that one is switched to.

--dtype sets the stored dtype: float32 (default, exact), float16 or int8
(a per-row scale), for every table ("int8") or per table
("emb_l.2.weight=int8,float16" : the bare one is the default). The
accuracy lost is reported per table.

--shard K ingests only shard K of the plan's sharding (prism shard): its
table-wise tables and its rows of the row-wise ones; the store records
the shard it holds. --shards N (with --shard) refuses, before the store
is opened, a plan sharded into another count than N: a start-up step
that expects N shards (the Helm chart's embedding.shards) then leaves
the store as it is.

--if-changed ingests only when the store's active version of the model
does not hold the plan's tables already (with --shard, shard K as the
plan places it): a start-up step (the Helm chart's init container) then
ingests a retrained model, a new version that the model's updates carry
over to, and leaves a store holding the plan as it is, updates made
since included (ingested again, a plan whose tables were updated since
adds a version). With --dtype, a store holding the plan in another
dtype is ingested again in this one (another version); without it the
stored dtype is not compared. --hot-bytes is recorded either way.

--keep-versions N drops, after the ingest, the model's versions older
than the newest N, but never the active one or the one --rollback
returns to: each retrained model's ingest adds a whole version.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if db == "" {
				return fmt.Errorf("--db is required")
			}
			if keep < 0 {
				return fmt.Errorf("--keep-versions %d: want 0 (keep every version) or more", keep)
			}
			io := store.IngestOptions{Model: model, NoActivate: noActivate}
			if cmd.Flags().Changed("shard") {
				io.Shard = &shard
			}
			var err error
			if io.HotBytes, err = flagval.Bytes(hotBytes); err != nil {
				return fmt.Errorf("--hot-bytes: %w", err)
			}
			if io.SSTBytes, err = flagval.Bytes(sstBytes); err != nil {
				return fmt.Errorf("--sst-bytes: %w", err)
			}
			// The store took 0 for its 64 MiB, and recorded no hot tier
			// size for 0.
			for _, f := range []struct {
				name, spec string
				n          int64
			}{{"hot-bytes", hotBytes, io.HotBytes}, {"sst-bytes", sstBytes, io.SSTBytes}} {
				if cmd.Flags().Changed(f.name) && f.n <= 0 {
					return fmt.Errorf("--%s %s: want a positive size", f.name, f.spec)
				}
			}
			if io.DType, io.TableDTypes, err = store.ParseDTypes(dtype); err != nil {
				return fmt.Errorf("--dtype: %w", err)
			}
			// A plan that cannot be read fails before the store is made:
			// no empty store is left in a folder this run created.
			p, err := plan.Read(args[0])
			if err != nil {
				return err
			}
			if cmd.Flags().Changed("shards") {
				switch {
				// It was compared with the plan's count, and the error
				// advised "run prism shard --shards 0".
				case shards < 1 || shards > plan.MaxShards:
					return fmt.Errorf("--shards %d: want 1 to %d, the plan's shard count", shards, plan.MaxShards)
				case io.Shard == nil:
					return fmt.Errorf("--shards %d needs --shard K", shards)
				case p.Sharding == nil:
					return fmt.Errorf("%s: the plan has no sharding section (run prism shard --shards %d first)", args[0], shards)
				case p.Sharding.Shards != shards:
					return fmt.Errorf("%s: the plan is sharded into %d shards, not %d (--shards): run prism shard --shards %d, or serve %d shards", args[0], p.Sharding.Shards, shards, shards, p.Sharding.Shards)
				}
			}
			// SIGTERM too (a Pod deleted during the chart's ingest step):
			// the store is then closed as after Ctrl-C, not dropped.
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			_, statErr := os.Stat(db)
			made := errors.Is(statErr, fs.ErrNotExist)
			s, err := store.Open(db, &store.Options{HotBytes: -1})
			if err != nil {
				return err
			}
			defer s.Close()
			if rep, ok := s.Swapped(); ok {
				fmt.Fprintf(cmd.ErrOrStderr(), "swapped in the copy of another worker's store that prism store copy staged in %s; %s\n", db, keptNote(rep))
			}
			if ifChanged {
				name := cmp.Or(model, p.Model.Name, filepath.Base(args[0])) // store.Ingest's rule
				match := s.MatchPlan(name, p)
				if io.Shard != nil {
					match = s.MatchShard(name, p, *io.Shard)
				}
				if match == nil && cmd.Flags().Changed("dtype") {
					match = s.MatchDTypes(name, io)
				}
				if match == nil {
					// Left as it is, but a --hot-bytes given is recorded
					// as an ingest would have.
					if io.HotBytes > 0 {
						if err := s.RecordHotBytes(io.HotBytes); err != nil {
							return err
						}
					}
					fmt.Fprintf(cmd.OutOrStdout(), "model %q: the store's active version holds the plan's tables already: left as it is (--if-changed)\n", name)
					return nil
				}
				if !errors.Is(match, store.ErrUnknownModel) {
					fmt.Fprintf(cmd.ErrOrStderr(), "ingest: %v: ingesting the plan\n", match)
				}
			}
			var bar *progress.Bar
			io.Progress = func(done, total int64) {
				if bar == nil {
					bar = progress.New(cmd.ErrOrStderr(), "ingest", total, true)
				}
				bar.Set(done)
			}
			rep, err := s.Ingest(ctx, args[0], io)
			if bar != nil {
				bar.Done()
			}
			if err != nil {
				if made && errors.Is(err, store.ErrBadRequest) {
					// Refused before anything was written: leave no empty
					// store behind in the folder this run made.
					s.Close()
					os.RemoveAll(db)
				}
				if ctx.Err() != nil {
					// It said "ingest table "t": context canceled" and no
					// more: what is kept and what to do.
					return fmt.Errorf("%w\nstopped by a signal: what it wrote is kept; run the same command again to go on where it stopped", err)
				}
				return err
			}
			rep.WriteText(cmd.OutOrStdout())
			if keep > 0 {
				return keepVersions(ctx, cmd.OutOrStdout(), s, rep.Model, keep)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&db, "db", "", "store directory (created if missing)")
	f.StringVar(&dtype, "dtype", "", "stored dtype: float32|float16|int8, or NAME=DTYPE,... per table")
	f.StringVar(&model, "model", "", "model name (default: the plan's)")
	f.StringVar(&hotBytes, "hot-bytes", "", "hot tier size to record as the store's default (e.g. 512MiB)")
	f.StringVar(&sstBytes, "sst-bytes", "", "bytes per ingested SST (default 64MiB)")
	f.BoolVar(&ifChanged, "if-changed", false, "ingest only when the store's active version does not hold the plan's tables (or shard) already")
	f.IntVar(&keep, "keep-versions", 0, "after ingesting, drop the model's versions older than the newest N (the active one and the one a rollback returns to are always kept); 0 keeps every version")
	f.BoolVar(&noActivate, "no-activate", false, "add the version without switching to it (a model's first version is always activated)")
	f.IntVar(&shard, "shard", 0, "ingest only this shard (0 to N-1) of the plan's sharding section (prism shard)")
	f.IntVar(&shards, "shards", 0, "with --shard: refuse a plan sharded into another count than this, before the store is opened")
	return cmd
}

// keepVersions drops model's versions but the newest keep, the active
// one and the previous one (Rollback's), freeing their disk: every
// retrained model's ingest adds a whole version, and without it they
// piled up until dropped by hand (prism store versions --drop).
func keepVersions(ctx context.Context, w io.Writer, s *store.Store, model string, keep int) error {
	vs, err := s.Versions(model)
	if err != nil {
		return err
	}
	for i, v := range vs { // oldest first
		if i >= len(vs)-keep || v.Active || v.Previous {
			continue
		}
		if err := s.DropVersion(ctx, model, v.N); err != nil {
			return fmt.Errorf("--keep-versions %d: %w", keep, err)
		}
		fmt.Fprintf(w, "model %q: dropped version %d (--keep-versions %d)\n", model, v.N, keep)
	}
	return nil
}
