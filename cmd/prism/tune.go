package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/spf13/cobra"

	"github.com/prism-serve/prism/cpuserve/store"
	"github.com/prism-serve/prism/gpuserve"
	"github.com/prism-serve/prism/gpuserve/devices"
	"github.com/prism-serve/prism/internal/flagval"
	"github.com/prism-serve/prism/internal/memlimit"
	"github.com/prism-serve/prism/internal/up"
	"github.com/prism-serve/prism/loadgen"
	"github.com/prism-serve/prism/plan"
	"github.com/prism-serve/prism/tune"
)

func init() { subcommands = append(subcommands, newTuneCmd) }

// newTuneCmd is `prism tune`: the search lives in tune/; this file only
// parses flags.
func newTuneCmd() *cobra.Command {
	var (
		planDir, db, certs, out, prior, candidates string
		insecure, grid                             bool
		threshold, startRPS                        float64
		maxTrials, pool, maxSteps                  int
		slo, step, timeout, readyTimeout           time.Duration
		microBatch, maxBatch, maxDelay, threads    []string
		denseWorkers, hotBytes                     []string
		admitShare, denseSessions                  []string
	)
	home, _ := os.UserHomeDir()
	defaultPrior := ""
	if home != "" {
		defaultPrior = filepath.Join(home, ".prism", "tune-prior.jsonl")
	}
	cpus := runtime.GOMAXPROCS(0)
	cmd := &cobra.Command{
		Use:   "tune --model PLAN_DIR --db DB [flags]",
		Short: "Search the serving configuration of a model on this machine by measured trials (prism up + loadgen find-max)",
		Long: `tune searches prism up's serving configuration (router micro-batch and
admit share, dense max batch and max delay, ONNX Runtime threads and sessions
per dense worker, dense workers, embedding hot-tier bytes) for the highest
samples/s whose p99 meets --slo. Each trial starts prism up with one configuration, runs prism loadgen --find-max
against it and stops it. The search starts from a prior learned from earlier
tuning runs of other models (--prior, read at the start and appended to at the
end), refines around the best measured configuration, and stops when the next
trial is not expected to improve the best by more than --threshold (or after
--max-trials). --grid measures every configuration instead. Each search flag
takes a comma-separated list of values; one value fixes it.

It writes --out/tune.json (every trial, the best) and the trials' logs
(trial-NN.log) beside it; an earlier run's there are kept, as
tune-TIME.json and in tune-TIME/. prism up --config OUT/tune.json
serves with the best configuration.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if planDir == "" {
				return errors.New("tune: --model PLAN_DIR is needed (make one with prism partition)")
			}
			if err := flagval.Positive(cmd.Flags(), "threshold", "start-rate", "slo", "step", "timeout", "ready-timeout"); err != nil {
				return fmt.Errorf("tune: %w", err)
			}
			if err := flagval.Positive(cmd.Flags(), "steps"); err != nil {
				return err
			}
			if err := flagval.NonNegative(cmd.Flags(), "max-trials", "pool"); err != nil {
				return fmt.Errorf("tune: %w", err)
			}
			if insecure && certs != "" {
				return errors.New("tune: --insecure goes without --certs")
			}
			pl, err := plan.Read(planDir)
			if err != nil {
				return fmt.Errorf("tune: %w", err)
			}
			cands, err := loadgen.ParseCandidates(candidates)
			if err != nil {
				return fmt.Errorf("tune: --candidates: %w", err)
			}
			meanCand := meanCandidates(cands)
			if db == "" {
				db = filepath.Join(filepath.Dir(filepath.Clean(planDir)), "prism-db")
			}
			if up.InUse(db) {
				// Every trial's prism up would fail alike on it.
				return fmt.Errorf("tune: --db %s is in use by another prism up (or a prism serve of it): stop that one or give tune another --db", db)
			}
			if certs == "" && !insecure {
				certs = filepath.Join(filepath.Dir(filepath.Clean(db)), "certs")
			}
			exe, err := os.Executable()
			if err != nil {
				return fmt.Errorf("tune: %w", err)
			}
			// On a host whose GPUs the dense tier would use, the CPU
			// defaults (workers per core, batches of 1024 at most) search
			// the wrong space: per device (GPU or MIG slice) and larger batches
			// instead, from prism up's count (two per GPU, one per MIG slice).
			startBatch, startWorkers := "512", fmt.Sprint(cpus)
			machine, disc, why := hostMachine()
			if machine.Devices > 0 {
				mb, dw, th, upWorkers := gpuSpace(disc)
				for _, d := range []struct {
					flag string
					v    *[]string
					def  []string
				}{{"max-batch", &maxBatch, mb}, {"dense-workers", &denseWorkers, dw}, {"threads", &threads, th}, {"dense-sessions", &denseSessions, []string{"1", "2"}}} {
					if !cmd.Flags().Changed(d.flag) {
						*d.v = d.def
					}
				}
				startBatch, startWorkers = strconv.Itoa(gpuserve.DefaultMaxBatch(true)), upWorkers
				fmt.Fprintf(cmd.ErrOrStderr(), "tune: %d device(s) (GPUs or MIG slices) the dense tier serves on with CUDA: max batch %v, dense workers %v, sessions %v, threads %v\n", len(disc.Devices), maxBatch, denseWorkers, denseSessions, threads)
			} else if why != "" {
				fmt.Fprintf(cmd.ErrOrStderr(), "tune: dense tier on the CPU (%s)\n", why)
			}
			if !cmd.Flags().Changed("hot-bytes") {
				workers, tables := embeddingShare(pl)
				share, hotMax := workerMemory(memlimit.Read(), workers)
				hotBytes = hotSpace(tables, share, hotMax)
				if len(hotBytes) > 1 {
					fmt.Fprintf(cmd.ErrOrStderr(), "tune: the tables an embedding worker holds (%s) exceed half of its memory (%s): hot-tier sizes %v\n", flagval.FormatBytes(tables), flagval.FormatBytes(share), hotBytes)
				}
			}
			space := tune.Space{Dims: []tune.Dim{
				{Flag: "micro-batch", Values: microBatch},
				{Flag: "max-batch", Values: maxBatch},
				{Flag: "max-delay", Values: maxDelay},
				{Flag: "threads", Values: threads},
				{Flag: "dense-workers", Values: denseWorkers},
				{Flag: "hot-bytes", Values: hotBytes},
				{Flag: "admit-share", Values: admitShare},
				{Flag: "dense-sessions", Values: denseSessions, Default: "1"},
			}}.Sorted()
			if err := space.Validate(); err != nil {
				return fmt.Errorf("tune: %w", err)
			}
			if err := checkSpace(space); err != nil {
				return fmt.Errorf("tune: %w", err)
			}
			// prism up's defaults, where the space lists them.
			start := tune.StartConfig(space, tune.Config{"micro-batch": "512", "max-batch": startBatch, "max-delay": "2ms",
				"threads": "1", "dense-workers": startWorkers, "hot-bytes": "auto", "admit-share": "1", "dense-sessions": "1"})
			// The name the workers serve it under: a plan of a graph
			// without a name is served under its folder's.
			served := pl.ServedName(planDir)
			ctx, stop := signalContext()
			defer stop()
			rep, err := tune.Run(ctx, tune.Options{
				Model: served, Features: tune.PlanFeatures(pl, meanCand), Machine: machine, Space: space, Start: start,
				Grid: grid, Threshold: threshold, MaxTrials: maxTrials, Prior: prior, StartRPS: startRPS,
				Out: out, Progress: cmd.ErrOrStderr(),
				Trialer: &tune.ProcessTrialer{Exe: exe, Plan: planDir, DB: db, Certs: certs, Insecure: insecure,
					Model: served, Candidates: candidates, Pool: pool, Timeout: timeout, SLO: slo,
					Step: step, Tolerance: 0.05, MaxSteps: maxSteps, LogDir: out, ReadyTimeout: readyTimeout},
			})
			w := cmd.OutOrStdout()
			if err != nil {
				// Stopped (Ctrl-C) or ended by a trial: the trials
				// measured are in tune.json, and its best serves as
				// well as a finished run's (the user was told only the
				// error).
				if rep != nil && rep.Best != nil {
					printBest(w, rep, "so far, ", planDir, db, out)
				}
				return err
			}
			if rep.Best == nil {
				return fmt.Errorf("tune: no configuration met the SLO in %d trials (logs in %s)", len(rep.Trials), out)
			}
			printBest(w, rep, "", planDir, db, out)
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&planDir, "model", "", "partition folder (prism partition -o) of the model to tune")
	fl.StringVar(&db, "db", "", "embedding store folder holding the model (default: prism-db beside the model); not in use by another prism up")
	fl.StringVar(&certs, "certs", "", "certificate folder for prism up and the load generator (default: certs beside --db)")
	fl.BoolVar(&insecure, "insecure", false, "run the trials on plaintext gRPC")
	fl.StringVar(&out, "out", "tune-out", "folder for tune.json and the trials' logs")
	fl.StringVar(&prior, "prior", defaultPrior, `prior file (JSON lines) read at the start and appended to at the end; "" for none`)
	fl.BoolVar(&grid, "grid", false, "measure every configuration of the space (for comparison) instead of searching")
	fl.Float64Var(&threshold, "threshold", 0.02, "stop when the next trial's expected improvement is below this fraction of the best")
	fl.IntVar(&maxTrials, "max-trials", 0, "at most this many trials (0: the space's size)")
	fl.DurationVar(&slo, "slo", 60*time.Millisecond, "p99 bound of the find-max search")
	fl.DurationVar(&step, "step", 6*time.Second, "length of each find-max step")
	fl.IntVar(&maxSteps, "steps", 8, "at most this many find-max steps per trial")
	fl.DurationVar(&timeout, "timeout", 250*time.Millisecond, "deadline of each request in the trials")
	fl.Float64Var(&startRPS, "start-rate", 100, "first find-max rate of the first trial (req/s; later trials start at 0.6x the best so far)")
	fl.StringVar(&candidates, "candidates", "270", "candidates per request (as prism loadgen --candidates)")
	fl.IntVar(&pool, "pool", 512, "requests built before each find-max step's clock starts")
	fl.DurationVar(&readyTimeout, "ready-timeout", 5*time.Minute, "how long prism up may take to start")
	fl.StringSliceVar(&microBatch, "micro-batch", []string{"128", "256", "512"}, "router micro-batch sizes to try")
	fl.StringSliceVar(&maxBatch, "max-batch", []string{"256", "512", "1024"}, "dense max batch sizes to try (on a host whose GPUs the dense tier uses: 1024,4096,8192)")
	fl.StringSliceVar(&maxDelay, "max-delay", []string{"1ms", "2ms", "4ms"}, "dense max queue delays to try")
	fl.StringSliceVar(&threads, "threads", []string{"1", "2"}, "ONNX Runtime threads per dense worker to try (with GPUs: 1)")
	fl.StringSliceVar(&denseWorkers, "dense-workers", workerCounts(cpus), "dense worker counts to try (default: half, one and two per core; with GPUs: one, two and four per GPU or MIG slice, and prism up's count)")
	fl.StringSliceVar(&hotBytes, "hot-bytes", []string{"auto"}, "embedding hot-tier sizes to try (e.g. 256MiB,auto; default: auto when the tables fit in half of the embedding worker's memory, else auto and an eighth, a quarter and half of that memory)")
	fl.StringSliceVar(&admitShare, "admit-share", []string{"1", "0.7"}, "router admission shares of the deadline to try (prism up --admit-share)")
	fl.StringSliceVar(&denseSessions, "dense-sessions", []string{"1"}, "ONNX Runtime sessions per model in each dense worker to try (prism up --dense-sessions; with GPUs: 1,2)")
	return cmd
}

// printBest says which configuration of rep is best (soFar: "so far, "
// for a run that did not finish) and how prism up serves with it.
func printBest(w io.Writer, rep *tune.Report, soFar, planDir, db, out string) {
	fmt.Fprintf(w, "tune: best %sof %d trials (%s): %.0f samples/s (%.1f req/s, p99 %.1f ms) with %v\n",
		soFar, len(rep.Trials), rep.Stop, rep.Best.Result.SamplesPerS, rep.Best.Result.MaxRPS, rep.Best.Result.P99Ms, tune.FlagArgs(rep.Best.Config))
	fmt.Fprintf(w, "wrote %s; serve with it: prism up --model %s --db %s --config %s\n",
		filepath.Join(out, tune.File), planDir, db, filepath.Join(out, tune.File))
}

// meanCandidates is the mean candidates per request of c: the prior's
// model feature.
func meanCandidates(c loadgen.Candidates) float64 {
	switch c := c.(type) {
	case loadgen.Fixed:
		return float64(c)
	case loadgen.Uniform:
		return float64(c.Min+c.Max) / 2
	}
	return 270 // DLRMv2's
}

// workerCounts are half, one and two dense workers per core.
// gpuSpace is tune's default search on a host whose devices (GPUs or
// MIG slices, disc) the dense tier serves on: max batches from a quarter
// of to twice the dense tier's CUDA default (4096 measured 1.9x the
// throughput of 512 on an H200), one, two and four workers per device
// (two measured 1.7x one) and prism up's own count, upWorkers, where they
// differ (two per whole GPU, one per MIG slice: the search starts there),
// and one ONNX Runtime thread (the GPU does the work).
func gpuSpace(disc devices.Discovery) (maxBatch, denseWorkers, threads []string, upWorkers string) {
	d := gpuserve.DefaultMaxBatch(true)
	n, upN := len(disc.Devices), len(up.DenseWorkers(disc, 0, 0))
	counts := []int{n, 2 * n, 4 * n}
	if !slices.Contains(counts, upN) {
		counts = append(counts, upN)
		slices.Sort(counts)
	}
	for _, c := range counts {
		denseWorkers = append(denseWorkers, strconv.Itoa(c))
	}
	return []string{strconv.Itoa(d / 4), strconv.Itoa(d), strconv.Itoa(2 * d)}, denseWorkers, []string{"1"}, strconv.Itoa(upN)
}

// embeddingShare is how many embedding workers prism up starts for pl
// (one per shard of a sharded plan, one otherwise; tune leaves
// --embedding-workers and --replicas at their defaults) and the table
// bytes the largest of them holds.
func embeddingShare(pl *plan.Plan) (workers int, tables int64) {
	if sh := pl.Sharding; sh != nil && sh.Shards > 1 {
		for _, k := range sh.Shard {
			tables = max(tables, k.Bytes)
		}
		return sh.Shards, tables
	}
	return 1, pl.Cost.TableBytes
}

// workerMemory is the memory each of prism up's workers embedding
// workers may use on a machine of limits mem (0: unknown), and the
// largest hot tier its budget takes (0: no budget; -1: none fits).
// Under a memory cgroup up gives its embedding workers half of the limit
// in equal shares (internal/up embeddingMemArgs), which budgets each as
// the worker does (store.NewBudget with the block cache of
// store.CacheBytesFor); without one a worker sizes "auto" from the
// machine's memory and has no budget.
func workerMemory(mem memlimit.Limits, workers int) (share, hotMax int64) {
	if mem.Cgroup <= 0 {
		return mem.Physical, 0
	}
	share = mem.Cgroup / 2 / int64(max(workers, 1))
	b, err := store.NewBudget(share, &store.Options{CacheBytes: store.CacheBytesFor(share)})
	if err != nil {
		return share, -1
	}
	return share, b.HotMax
}

// hotSpace is the default search of embedding hot-tier sizes for tables
// of tableBytes served by a worker that may use share bytes (0:
// unknown), whose budget takes a hot tier of at most hotMax (0: no
// budget; negative: none fits, and only auto is tried):
// "auto" alone when the tables fit in half of share (the worker's
// "auto" holds every row then, and a smaller tier only adds misses),
// else auto (the store's recorded size) and an eighth, a quarter and
// half of share, those below the tables' size and within hotMax, in
// whole MiB.
func hotSpace(tableBytes, share, hotMax int64) []string {
	out := []string{store.HotBytesAuto}
	if share <= 0 || tableBytes <= share/2 || hotMax < 0 {
		return out
	}
	for _, d := range []int64{8, 4, 2} {
		n := share / d >> 20 << 20
		if hotMax > 0 {
			n = min(n, hotMax>>20<<20)
		}
		if s := fmt.Sprintf("%dMiB", n>>20); n > 0 && n < tableBytes && !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	return out
}

func workerCounts(cpus int) []string {
	var out []string
	for _, n := range []int{max(cpus/2, 1), cpus, 2 * cpus} {
		s := strconv.Itoa(n)
		if len(out) == 0 || out[len(out)-1] != s {
			out = append(out, s)
		}
	}
	return out
}

// checkSpace parses each value of each dimension as prism up would and
// checks it as up does before it starts anything, so a value no trial
// could run is refused before the first trial (each trial's up exited
// before it was ready, and the search ended in "no configuration met
// the SLO").
func checkSpace(space tune.Space) error {
	for _, d := range space.Dims {
		for _, v := range d.Values {
			var c up.Config
			fl := upCmd(&c).Flags()
			f := fl.Lookup(d.Flag)
			if f == nil {
				return fmt.Errorf("--%s is not a prism up flag", d.Flag)
			}
			if err := fl.Set(d.Flag, v); err != nil {
				if want, ok := numberWanted[f.Value.Type()]; ok {
					return fmt.Errorf("--%s %q: want %s", d.Flag, v, want)
				}
				return fmt.Errorf("--%s %q: %w", d.Flag, v, errors.Unwrap(err))
			}
			if err := checkUpFlags(fl); err != nil {
				return err
			}
			if err := c.Validate(); err != nil {
				return err
			}
		}
	}
	return nil
}

// hostMachine is this host's shape as prism tune records it with every
// trial (tune.Machine): the Go runtime's CPUs and the GPUs or MIG
// slices the dense tier would serve on with CUDA; disc and why are the
// discovery's (why: the reason the dense tier runs on the CPU, "" when
// it does not).
func hostMachine() (m *tune.Machine, disc devices.Discovery, why string) {
	m = &tune.Machine{CPUs: runtime.GOMAXPROCS(0)}
	disc, why = gpuserve.CUDAUsable(nvml.New())
	if why == "" && len(disc.Devices) > 0 {
		m.Devices, m.Device = len(disc.Devices), disc.Devices[0].Name
	}
	return m, disc, why
}
