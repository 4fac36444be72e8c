package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/cpuserve/store"
	"github.com/prism-serve/prism/cpuserve/storebench"
	"github.com/prism-serve/prism/cpuserve/storecopy"
	"github.com/prism-serve/prism/internal/auth"
	"github.com/prism-serve/prism/internal/auth/authflag"
	"github.com/prism-serve/prism/internal/flagval"
	"github.com/prism-serve/prism/internal/progress"
	"github.com/prism-serve/prism/internal/serve"
	"github.com/prism-serve/prism/router"
)

func init() { subcommands = append(subcommands, newStoreCmd) }

// newStoreCmd is `prism store`: embedding store jobs besides ingest.
func newStoreCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "store", Short: "Embedding store: benchmarks, versions, a copy from a serving worker"}
	cmd.AddCommand(newStoreBenchCmd(), newStoreVersionsCmd(), newStoreCopyCmd())
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
				fmt.Fprintf(cmd.ErrOrStderr(), "swapped in the copy of another worker's store that prism store copy staged in %s; the store's files from before are in %s (remove it once the worker serves)\n", db, rep.Replaced)
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

func newStoreCopyCmd() *cobra.Command {
	var (
		tlsFlags      authflag.Flags
		from, db      string
		allowDiverged bool
		rate          string
		routerAddr    string
		modelNames    []string
		shard         int
		seed          bool
	)
	cmd := &cobra.Command{
		Use:   "copy (--from ADDR | --router ADDR --model NAME... [--shard K]) --db DIR [--seed] [--certs DIR] [--rate BYTES/s]",
		Short: "Replace a store with a copy of a serving embedding worker's (the mend for a diverged worker)",
		Long: `copy asks the embedding worker at --from (its gRPC address, as prism status
lists it) for a consistent copy of its whole store and makes it the store in
--db: the mend for a worker whose copy of a model diverged from its peers'
(prism status: diverged) or fell further behind than the router's update log
reaches. The copy is written into a folder inside --db, each file checked
against the sender's size and CRC-32C, and opened as a store before it counts
as complete; then it is swapped in: at once when no process holds --db, else
by the store's next open, so with the worker still running (a Kubernetes Pod,
its volume mounted at --db) restart it once the copy is staged. The store's
own files are kept in a folder replaced-<time> inside --db; remove it once the
worker serves again. The worker asked must serve the same models (and shard)
and be in sync (prism status: serving); the copy carries its updates, versions
and marks. A copy whose own store marks a model diverged, or that lacks a
model the store it replaces holds (checked when no process holds --db), is
refused unless --allow-diverged. Needs an admin or an embedding worker's
certificate (--certs DIR: inside a worker's Pod, the folder the chart mounts).

--router ADDR --model NAME (repeated; --shard K for a shard's worker) asks
that router for a worker serving those models (and shard) in sync and
out of none, instead of --from. --seed copies only into a folder holding
no store yet, and takes finding no worker to copy from (none serves, the
router does not answer) for "nothing to copy": a new replica of a model
that has had updates, whose store ingested from the plan would lack
updates the router's log may no longer hold, starts from a serving
worker's store this way (the chart's embedding Pods do, before their
ingest step).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var perSecond int64
			if rate != "" {
				var err error
				if perSecond, err = flagval.Bytes(strings.TrimSuffix(rate, "/s")); err != nil || perSecond <= 0 {
					return fmt.Errorf("--rate %q: want bytes a second, e.g. 200MiB/s", rate)
				}
			}
			if (from == "") == (routerAddr == "") {
				return errors.New("give one of --from ADDR (a worker) and --router ADDR (a router to ask for one)")
			}
			if routerAddr != "" && len(modelNames) == 0 {
				return errors.New("--router: give the models the copy must hold (--model NAME, repeated)")
			}
			out := cmd.OutOrStdout()
			if seed {
				if desc, err := pebble.Peek(db, vfs.Default); err == nil && desc.Exists {
					fmt.Fprintf(out, "%s holds a store already: nothing copied (--seed)\n", db)
					return nil
				}
			}
			tlsFlags.WarnClient(cmd.ErrOrStderr(), "prism store copy")
			creds, err := tlsFlags.Dial(auth.Admin, auth.Embedding)
			if err != nil {
				return err
			}
			if routerAddr != "" {
				src, err := copySourceFrom(cmd.Context(), &tlsFlags, routerAddr, modelNames, shard)
				if err != nil || src == "" {
					if err == nil {
						err = fmt.Errorf("router %s: no embedding worker serves %s%s in sync (prism status --router %s)", routerAddr, strings.Join(modelNames, ", "), shardNote(shard), routerAddr)
					}
					if seed {
						fmt.Fprintf(out, "nothing to copy from (%v): nothing copied (--seed)\n", err)
						return nil
					}
					return err
				}
				fmt.Fprintf(out, "router %s names %s to copy from\n", routerAddr, src)
				from = src
			}
			conn, err := grpc.NewClient(from, creds)
			if err != nil {
				return fmt.Errorf("dial embedding worker %s: %w", from, err)
			}
			defer conn.Close()
			ctx, cancel := context.WithCancel(cmd.Context())
			defer cancel()
			client := prismv1.NewEmbeddingTierClient(conn)
			open := func(req *prismv1.SnapshotRequest) (storecopy.Stream, error) {
				return client.Snapshot(ctx, req)
			}
			var bar, checkBar *progress.Bar
			res, err := storecopy.Receive(open, db, storecopy.Options{AllowDiverged: allowDiverged, Rate: perSecond,
				Check: func(done, total int64) {
					if checkBar == nil {
						checkBar = progress.New(cmd.ErrOrStderr(), "check what an earlier copy left", total, true)
					}
					checkBar.Set(done)
				},
				Progress: func(done, total int64) {
					if checkBar != nil {
						checkBar.Done()
					}
					if bar == nil {
						bar = progress.New(cmd.ErrOrStderr(), "copy", total, true)
					}
					bar.Set(done)
				}})
			if bar != nil {
				bar.Done()
			}
			if err != nil {
				return fmt.Errorf("%w (copying from embedding worker %s)", err, from)
			}
			fmt.Fprintf(out, "received a copy of %s's store (%s): %d files, %s", from, res.Source, res.Files, progress.Bytes(res.Bytes))
			if res.Reused > 0 {
				fmt.Fprintf(out, " (%d files, %s, kept from an earlier copy)", res.Reused, progress.Bytes(res.ReusedBytes))
			}
			fmt.Fprintln(out)
			for _, m := range res.Models {
				fmt.Fprintf(out, "  %s: version %d, updates applied %d", m.Name, m.Version, m.Applied)
				if m.Diverged > 0 {
					fmt.Fprintf(out, ", DIVERGED at %d (the worker copied is out of serving itself: copy one prism status shows serving)", m.Diverged)
				}
				fmt.Fprintln(out)
			}
			s, err := store.Open(db, &store.Options{HotBytes: -1})
			if errors.Is(err, syscall.EAGAIN) {
				fmt.Fprintf(out, "staged in %s: the process holding %s (its worker) swaps it in at its next start; restart it\n", res.Staged, db)
				return nil
			} else if err != nil {
				return fmt.Errorf("swap the copy in: %w (unless the swap was made, the copy stays staged in %s for the store's next open)", err, res.Staged)
			}
			rep, swapped := s.Swapped()
			if err := s.Close(); err != nil {
				return err
			}
			if !swapped {
				return fmt.Errorf("the copy staged in %s was not swapped in (another process swapped or replaced it meanwhile?)", res.Staged)
			}
			fmt.Fprintf(out, "swapped in: %s is the copy now; its files from before are in %s (remove that folder once the worker serves)\n", db, rep.Replaced)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&from, "from", "", "the gRPC address of an embedding worker serving the same models in sync (prism status lists them)")
	f.StringVar(&routerAddr, "router", "", "instead of --from: a router's gRPC address, to ask for a worker serving --model (and --shard) in sync")
	f.StringArrayVar(&modelNames, "model", nil, "with --router: a model the copy must hold, served in sync (repeat for each)")
	f.IntVar(&shard, "shard", -1, "with --router: the shard of the models the copy must hold (-1: whole models)")
	f.BoolVar(&seed, "seed", false, "copy only into a folder holding no store, and take finding no worker to copy from for nothing to copy (a new replica's first start)")
	f.StringVar(&db, "db", "", "the store folder to replace (made if missing)")
	f.StringVar(&rate, "rate", "", "bound the copy to this many bytes a second (e.g. 200MiB/s), so the worker copied keeps its disk for its lookups; unbounded by default")
	f.BoolVar(&allowDiverged, "allow-diverged", false, "take a copy whose store marks a model diverged, or that lacks a model the store it replaces holds")
	_ = cmd.MarkFlagRequired("db")
	tlsFlags.Register(cmd, auth.Admin)
	return cmd
}

// copySourceFrom asks the router at addr (Registry/List) for an
// embedding worker to copy a store holding models (of shard, -1: whole)
// from: router.CopySource's pick, "" when none.
func copySourceFrom(ctx context.Context, tlsFlags *authflag.Flags, addr string, models []string, shard int) (string, error) {
	creds, err := tlsFlags.Dial(auth.Admin, auth.Router)
	if err != nil {
		return "", err
	}
	conn, err := grpc.NewClient(addr, creds, serve.ListDialOption())
	if err != nil {
		return "", fmt.Errorf("dial router %s: %w", addr, err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := prismv1.NewRegistryClient(conn).List(ctx, &prismv1.ListRequest{})
	if err != nil {
		return "", fmt.Errorf("router %s: %w", addr, err)
	}
	if resp.GetNotSequencing() {
		if seq := resp.GetSequencer(); seq != "" && seq != addr {
			return copySourceFrom(ctx, tlsFlags, seq, models, shard) // only it knows who is in sync
		}
		return "", fmt.Errorf("router %s does not sequence embedding updates now and names none that does", addr)
	}
	need := map[string]string{}
	for _, m := range models {
		need[m] = ""
		if shard >= 0 {
			need[m] = fmt.Sprintf("%d/", shard)
		}
	}
	return router.CopySource(router.Fleet(resp), need, ""), nil
}

func shardNote(shard int) string {
	if shard < 0 {
		return ""
	}
	return fmt.Sprintf(" (shard %d)", shard)
}
