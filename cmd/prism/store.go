package main

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/prism-serve/prism/cpuserve/store"
	"github.com/prism-serve/prism/cpuserve/storebench"
	"github.com/prism-serve/prism/internal/flagval"
)

func init() { subcommands = append(subcommands, newStoreCmd) }

// newStoreCmd is `prism store`: embedding store jobs besides ingest.
func newStoreCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "store", Short: "Embedding store: benchmarks, versions, a copy from a serving worker, a check of every block"}
	cmd.AddCommand(newStoreBenchCmd(), newStoreVersionsCmd(), newStoreCopyCmd(), newStoreCheckCmd())
	return cmd
}

func newStoreBenchCmd() *cobra.Command {
	var (
		cfg                      storebench.Config
		work, hot, cache         string
		dtype, scenario, cpuprof string
		zipfs                    []float64
		zipfList                 string
	)
	cmd := &cobra.Command{
		Use:   "bench --work DIR [--scenario gather|redis|ltm|preload|misses|setup]",
		Short: "Measure the store against a raw gather, Redis, and larger than memory",
		Long: `Bench builds zoo-shaped tables (seeded), ingests them into a store under
--work (kept for later runs), and measures lookups of Zipf batches:

  gather  hot-tier path vs a raw gather from flat []float32 tables
  redis   the store vs redis-server on loopback (MGET per batch); skipped
          when redis-server is not installed
  ltm     larger than memory: rows/s and p99 per --zipf exponent with the
          hot tier + block cache given by --hot-bytes/--cache-bytes
  misses  the miss path: point Gets vs the sorted pass (1 and
          --miss-parallel readers) per --zipf exponent, with the time in
          file reads and the device bytes; drops the store files' page
          cache first (run it in a memory cgroup: scripts/bench-ltm.sh)
  preload fresh Zipf batches against a hot tier of --hot-bytes filled by
          its misses (admission) and against a tier holding every row,
          preloaded at open; the raw gather beside each
  setup   build and ingest the tables only`,
		RunE: func(cmd *cobra.Command, args []string) error {
			w := cmd.OutOrStdout()
			if err := flagval.Positive(cmd.Flags(), "batch", "batches", "dim"); err != nil {
				return err
			}
			if err := flagval.NonNegative(cmd.Flags(), "warmup", "max-rows"); err != nil {
				return err
			}
			if err := checkMissParallel(cfg.MissParallel); err != nil {
				return err
			}
			if cfg.Warmup == 0 {
				cfg.Warmup = -1 // none (the Config's 0 is its default)
			}
			var err error
			cfg.Dir = work
			if cfg.HotBytes, err = flagval.Bytes(hot); err != nil {
				return fmt.Errorf("--hot-bytes: %w", err)
			}
			if cfg.CacheBytes, err = flagval.Bytes(cache); err != nil {
				return fmt.Errorf("--cache-bytes: %w", err)
			}
			// The store took 0 for its defaults (the recorded hot tier
			// size, a 256 MiB block cache).
			if cfg.HotBytes == 0 {
				return fmt.Errorf("--hot-bytes %s: want a positive size", hot)
			}
			if cfg.CacheBytes == 0 {
				return fmt.Errorf("--cache-bytes %s: want a positive size", cache)
			}
			if cfg.DType, err = store.ParseDType(dtype); err != nil {
				return err
			}
			for _, z := range strings.Split(zipfList, ",") {
				v, err := strconv.ParseFloat(strings.TrimSpace(z), 64)
				if err != nil || v <= 0 {
					return fmt.Errorf("--zipf %q: want positive exponents, comma-separated (e.g. 0.9,1.05)", zipfList)
				}
				zipfs = append(zipfs, v)
			}
			if err := storebench.CheckScenario(scenario); err != nil {
				return err // before Setup builds and ingests the tables
			}
			// ltm and misses run once per exponent; the other scenarios
			// draw their batches with Config.Zipf (it was never set: they
			// ran Zipf 1.05 whatever --zipf said).
			if len(zipfs) > 1 && scenario != "ltm" && scenario != "misses" {
				return fmt.Errorf("--zipf %q: the %s scenario takes one exponent (ltm and misses take several)", zipfList, scenario)
			}
			cfg.Zipf = zipfs[0]
			cfg.NoTables = scenario == "misses" || scenario == "ltm" || scenario == "setup"
			cfg.Log = func(f string, a ...any) { fmt.Fprintf(cmd.ErrOrStderr(), f+"\n", a...) }
			t0 := time.Now()
			e, err := storebench.Setup(cfg)
			if err != nil {
				return err
			}
			defer e.Close()
			fmt.Fprintf(w, "machine: %s/%s, %d cores; %s: %d tables, dim %d, batch %d, dtype %s; setup %.0fs\n",
				runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), e.Name, len(e.Rows), e.Dim, e.Cfg.Batch, e.Cfg.DType, time.Since(t0).Seconds())
			if r := e.Ingest; r != nil {
				sec := r.Elapsed.Seconds()
				fmt.Fprintf(w, "ingest: %d rows in %.1fs: %.2f M rows/s, %.0f MB/s (float32 source bytes)\n", r.Rows, sec, float64(r.Rows)/sec/1e6, float64(r.Bytes)/sec/1e6)
			}
			if cpuprof != "" {
				f, err := os.Create(cpuprof)
				if err != nil {
					return err
				}
				defer f.Close()
				if err := pprof.StartCPUProfile(f); err != nil {
					return err
				}
				defer pprof.StopCPUProfile()
			}
			return storebench.Run(w, e, scenario, zipfs)
		},
	}
	f := cmd.Flags()
	f.StringVar(&work, "work", "", "work folder (plan and store are kept there)")
	f.StringVar(&cfg.Model, "model", "dlrm-kaggle", "zoo preset whose table shapes to use")
	f.IntVar(&cfg.Dim, "dim", 0, "embedding width (default: the preset's)")
	f.Float64Var(&cfg.RowsScale, "rows-scale", 0, "scale the preset's rows")
	f.Int64Var(&cfg.MaxRows, "max-rows", 0, "cap every table at this many rows (0: the preset's default)")
	f.StringVar(&zipfList, "zipf", "1.05", "Zipf exponent of the ids; ltm and misses: exponents, comma-separated, a run each")
	f.IntVar(&cfg.Batch, "batch", 256, "samples per batch")
	f.IntVar(&cfg.Batches, "batches", 2000, "measured batches")
	f.IntVar(&cfg.Warmup, "warmup", 2000, "warm-up batches (0: none)")
	f.StringVar(&hot, "hot-bytes", "1GiB", "hot tier size")
	f.StringVar(&cache, "cache-bytes", "256MiB", "Pebble block cache size")
	f.StringVar(&dtype, "dtype", "float32", "stored dtype")
	f.StringVar(&scenario, "scenario", "gather", "gather, redis, ltm, preload, misses or setup")
	f.IntVar(&cfg.MissParallel, "miss-parallel", 0, "readers a lookup's sorted misses are split among (default: the store's)")
	f.StringVar(&cpuprof, "cpuprofile", "", "write a CPU profile of the measured part")
	_ = cmd.MarkFlagRequired("work")
	return cmd
}

func newStoreVersionsCmd() *cobra.Command {
	var db string
	var rollback bool
	var activate, drop int
	cmd := &cobra.Command{
		Use:   "versions MODEL --db DIR [--activate N | --rollback | --drop N]",
		Short: "List, switch, roll back or drop a model's versions",
		Long: `versions lists a model's versions in the store (* the active one, < the one
the last switch replaced, which --rollback returns to), after switching to
version N (--activate), back (--rollback) or dropping version N (--drop),
at most one of them. A store whose copy of the model a router found diverged
from its other workers' (it answered an update otherwise than they did) says
so below the list: every router keeps its worker out of the model's lookups
and updates until the store is replaced by a copy of an up-to-date worker's
store (a version switch carries the updates, and so the difference, along).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			n := 0
			for _, set := range []bool{cmd.Flags().Changed("activate"), rollback, cmd.Flags().Changed("drop")} {
				if set {
					n++
				}
			}
			if n > 1 {
				return errors.New("give at most one of --activate N, --rollback and --drop N")
			}
			if cmd.Flags().Changed("activate") && activate < 1 {
				return fmt.Errorf("--activate %d: want a version number, 1 or more", activate)
			}
			if cmd.Flags().Changed("drop") && drop < 1 {
				return fmt.Errorf("--drop %d: want a version number, 1 or more", drop)
			}
			s, err := store.Open(db, &store.Options{HotBytes: -1, MustExist: true})
			if err != nil {
				return err
			}
			defer s.Close()
			if rep, ok := s.Swapped(); ok {
				fmt.Fprintf(cmd.ErrOrStderr(), "swapped in the copy of another worker's store that prism store copy staged in %s; %s\n", db, keptNote(rep))
			}
			model := args[0]
			switch {
			case activate > 0:
				err = s.Activate(model, activate)
			case rollback:
				err = s.Rollback(model)
			case drop > 0:
				err = s.DropVersion(cmd.Context(), model, drop)
			}
			if err == nil {
				var vs []store.VersionInfo
				if vs, err = s.Versions(model); err == nil {
					store.WriteVersions(cmd.OutOrStdout(), vs)
					var marks map[string]int64
					if marks, err = s.Diverged(); err != nil {
						return err
					}
					if seq, ok := marks[model]; ok {
						store.WriteDiverged(cmd.OutOrStdout(), model, seq)
					}
					return nil
				}
			}
			if errors.Is(err, store.ErrUnknownModel) {
				if held := s.Models(); len(held) > 0 {
					return fmt.Errorf("%w; the store holds %s", err, strings.Join(held, ", "))
				}
				return fmt.Errorf("%w; the store holds no model (prism ingest adds one)", err)
			}
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&db, "db", "", "store directory")
	f.IntVar(&activate, "activate", 0, "switch to version N")
	f.BoolVar(&rollback, "rollback", false, "switch back to the version the last switch replaced")
	f.IntVar(&drop, "drop", 0, "drop version N (not the active one)")
	_ = cmd.MarkFlagRequired("db")
	return cmd
}
