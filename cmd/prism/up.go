package main

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/prism-serve/prism/gpuserve"
	"github.com/prism-serve/prism/internal/flagval"
	"github.com/prism-serve/prism/internal/up"
	"github.com/prism-serve/prism/plan"
	"github.com/prism-serve/prism/tune"
)

func init() { subcommands = append(subcommands, newUpCmd) }

func newUpCmd() *cobra.Command { return upCmd(&up.Config{}) }

// upCmd is the up command, its flags parsed into c (tune reads a
// configuration's values through them).
func upCmd(c *up.Config) *cobra.Command {
	var configFile, memLimit string
	cmd := &cobra.Command{
		Use:   "up --model PLAN_DIR...",
		Short: "Start all three tiers on this machine (real gRPC on loopback) and print the address to call",
		Long: `up starts the router, two dense workers per GPU and one per MIG slice (one
per CPU core without a driver) and the embedding tier as child processes of this binary,
on loopback ports, waits until every model has both tiers registered (and,
for a model that has had embedding updates, a worker holding every
acknowledged one), and prints the Recommend address. The router's update
log is kept beside the store, DB-router-log. Workers that die are restarted and register
again. Ctrl-C stops everything gracefully (the tiers drain their calls in
flight); a second Ctrl-C kills them at once.

A model sharded with prism shard (plan.json sharding) is served by one
embedding worker per shard (--replicas R: R per shard); --db is then the
parent folder of the shards' stores (DB/shard-K, DB/shard-K-R for the
other replicas), into which up ingests each shard (prism ingest --shard
K) unless its store already holds it.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if configFile != "" {
				// The command line's values are checked before the
				// file's apply, so that an error after is the file's and
				// says so ("--micro-batch 0: want a positive value" named
				// a flag the user had not typed).
				if err := checkUpFlags(cmd.Flags()); err != nil {
					return err
				}
				if err := c.Validate(); err != nil {
					return fmt.Errorf("up: %w", err)
				}
				kept, err := applyConfig(cmd.Flags(), configFile)
				if err != nil {
					return fmt.Errorf("up: --config: %w", err)
				}
				for _, k := range kept {
					fmt.Fprintf(cmd.ErrOrStderr(), "up: --config %s: %s\n", configFile, k)
				}
				if err := checkUpFlags(cmd.Flags()); err != nil {
					return fmt.Errorf("up: --config %s: %w", configFile, err)
				}
				if err := c.Validate(); err != nil {
					return fmt.Errorf("up: --config %s: %w", configFile, err)
				}
				if tuned := tune.TunedFor(configFile); tuned != "" {
					var served []string
					for _, dir := range c.Plans {
						if pl, err := plan.Read(dir); err == nil {
							served = append(served, pl.ServedName(dir))
						}
					}
					if len(served) > 0 && !slices.Contains(served, tuned) {
						fmt.Fprintf(cmd.ErrOrStderr(), "up: warning: --config %s was tuned for model %s, and this stack serves %s: its configuration may not suit them (prism tune --model PLAN_DIR tunes one)\n", configFile, tuned, strings.Join(served, ", "))
					}
				}
				// Dense workers per core, batches per GPU: a configuration
				// tuned on another shape of machine may not suit this one.
				if on := tune.TunedOn(configFile); on != nil {
					if here, _, _ := hostMachine(); *here != *on {
						fmt.Fprintf(cmd.ErrOrStderr(), "up: warning: --config %s was tuned on a machine of %s, and this one has %s: its configuration may not suit it (prism tune here tunes one)\n", configFile, on, here)
					}
				}
			}
			if err := checkUpFlags(cmd.Flags()); err != nil {
				return err
			}
			if len(c.Plans) == 0 {
				return errors.New("up: at least one --model PLAN_DIR is needed (make one with prism partition)")
			}
			mem, err := upMemoryLimit(memLimit)
			if err != nil {
				return fmt.Errorf("up: --memory-limit: %w", err)
			}
			c.MemoryLimit = mem
			ctx, force, stop := signalContextForce()
			defer stop()
			c.Force = force
			c.Stdout, c.Stderr = cmd.OutOrStdout(), cmd.ErrOrStderr()
			c.CUDAUnavailable = gpuserve.CUDAUnavailable
			if c.Insecure {
				if c.Certs != "" {
					return errors.New("--insecure goes without --certs")
				}
				what := "plaintext gRPC"
				if c.HTTPAddr != "" {
					what = "plaintext gRPC (and the router plain HTTP at --http-addr)"
				}
				fmt.Fprintf(c.Stderr, "prism: warning: --insecure: every tier runs %s without authentication; anyone who reaches their ports may call every RPC\n", what)
			}
			return up.Run(ctx, *c)
		},
	}
	fl := cmd.Flags()
	fl.StringArrayVar(&c.Plans, "model", nil, "partition folder (prism partition -o) to serve; repeatable")
	fl.StringVar(&c.DB, "db", "", "embedding store folder (default: prism-db beside the first model); for a sharded model the parent folder of its shards' stores (DB/shard-K)")
	fl.StringVar(&c.Addr, "addr", "127.0.0.1:8500", "router address (Recommend)")
	fl.StringVar(&c.HTTPAddr, "http-addr", "", `router's HTTP/JSON address ("": off): POST /v1/recommend with a RecommendRequest as JSON, as serve router --http-addr (HTTPS with up's certificates, plain HTTP with --insecure)`)
	fl.IntVar(&c.DenseWorkers, "dense-workers", 0, "dense workers (0: two per GPU, one per MIG slice; without a driver, one per CPU core)")
	fl.IntVar(&c.EmbeddingWorkers, "embedding-workers", 1, "embedding workers (a sharded model: shards x --replicas)")
	fl.IntVar(&c.Replicas, "replicas", 1, "embedding workers per shard of a sharded model (prism shard)")
	// The tiers' former names, kept so existing scripts run.
	fl.IntVar(&c.DenseWorkers, "gpu-workers", 0, "")
	fl.IntVar(&c.EmbeddingWorkers, "cpu-workers", 1, "")
	fl.MarkDeprecated("gpu-workers", "use --dense-workers")
	fl.MarkDeprecated("cpu-workers", "use --embedding-workers")
	fl.IntVar(&c.Threads, "threads", 1, "ONNX Runtime intra-op threads of each session of a dense worker on the CPU (0: each worker's share of the cores, shared among its --dense-sessions)")
	fl.StringVar(&c.DenseAcrossModels, "dense-across-models", "", "with several --model: serve dense --across-models (on, the default, or off)")
	fl.IntVar(&c.DenseSessions, "dense-sessions", 1, "ONNX Runtime sessions per model in each dense worker (serve dense --sessions)")
	fl.BoolVar(&c.DenseSharedArena, "dense-shared-arena", false, "the dense workers' sessions share one CPU memory arena (serve dense --shared-arena): with many models, about one batch's peak instead of the sum")
	fl.IntVar(&c.MicroBatch, "micro-batch", 512, "router micro-batch size")
	fl.IntVar(&c.MaxBatch, "max-batch", 0, "dense tier max batch size (0: the dense tier's by device, 512 on the CPU, 4096 on CUDA)")
	fl.DurationVar(&c.MaxDelay, "max-delay", 2*time.Millisecond, "dense tier max queue delay")
	fl.StringVar(&c.BatchOrder, "batch-order", "", "dense tier batch order: edf or fifo (default: the dense tier's, edf)")
	fl.Float64Var(&c.AdmitShare, "admit-share", 0, "router admits a request predicted to take at most this share of the time to its deadline, the ceiling of its adaptive share (0: the router's default, 1)")
	fl.BoolVar(&c.DictionaryFrames, "dictionary-frames", true, "embedding workers send a cut tensor that is one id's row per sample dictionary-encoded, each distinct row once (--dictionary-frames=false: every row)")
	fl.BoolVar(&c.AdmitLimit, "admit-limit", false, "router admits by an adaptive limit on samples in flight instead of by each request's predicted finish")
	fl.BoolVar(&c.FixedAdmission, "fixed-admission", false, "router admits by count and bytes only, not by predicted finish against the deadline")
	fl.StringVar(&c.HotBytes, "hot-bytes", "", "embedding hot tier size (e.g. 512MiB; auto; negative: none; default: serve embedding's, auto)")
	fl.StringVar(&memLimit, "memory-limit", "auto", `memory Prism may use on this host, e.g. 16GiB: the embedding workers share half of it (each budgets its share: serve embedding --memory-limit); "auto": the memory cgroup's limit when there is one; "off": none`)
	fl.StringVar(&c.Certs, "certs", "", "certificate folder for mutual TLS between the tiers (prism certs init); made when absent or empty (default: certs beside --db)")
	fl.StringVar(&c.CACert, "tls-ca", "", "your CA's certificate (PEM): up signs the tiers' certificates with it (and --tls-ca-key) when it makes the --certs folder, instead of making a development CA")
	fl.StringVar(&c.CAKey, "tls-ca-key", "", "your CA's key (PEM, unencrypted), with --tls-ca; read, never copied")
	fl.BoolVar(&c.Insecure, "insecure", false, "run every tier on plaintext gRPC without authentication")
	fl.StringVar(&c.AuthTokenFile, "auth-token-file", "", "file holding a bearer token (16 characters at least) that admits clients without a certificate to Recommend (authorization: Bearer TOKEN), as serve router --auth-token-file")
	fl.IntVar(&c.KeepVersions, "keep-versions", 0, "when up ingests a model its store holds another version of (a retrained plan), keep the model's newest N versions and drop older ones, freeing their disk (prism ingest --keep-versions); 0 keeps every version")
	fl.DurationVar(&c.ReadyTimeout, "ready-timeout", 10*time.Minute, "how long to wait for the tiers (ingest included)")
	fl.StringVar(&c.Loan, "loan", "", "borrow dense workers for peaks: local:max=N[,capacity=REQ/S,policy=reactive|predictive,promo=START/DURATION/FACTOR,high=,target=,low=,p99=,queue=,min-lease=,cool-down=,startup=,borrow-timeout=,drain-timeout=,tick=,window=,grace=,reclaim-after=D,hold=D,addr=] (README: Promotions and capacity loaning)")
	fl.StringVar(&configFile, "config", "", "take the serving configuration from this file: the best of a prism tune tune.json, or a JSON object of these flags' names to values; flags given on the command line win")
	return cmd
}

// upMemoryLimit is up.Config.MemoryLimit for prism up --memory-limit
// spec: the limit in bytes, 0 when none is known (auto without a
// cgroup limit), negative for off, which the embedding workers are then
// given (their own auto would budget the cgroup's whole limit each).
func upMemoryLimit(spec string) (int64, error) {
	mem, err := memoryLimit(spec)
	if err != nil {
		return 0, err
	}
	if strings.TrimSpace(spec) == "off" {
		return -1, nil
	}
	return mem.Cgroup, nil
}

// applyConfig sets the flags a config file names, except those given on
// the command line, which it lists where the file's value differs (the
// command line won without a word); a key that is not a prism up flag
// is an error.
func applyConfig(fl *pflag.FlagSet, path string) (kept []string, err error) {
	cfg, err := tune.ReadConfig(path)
	if err != nil {
		return nil, err
	}
	keys := make([]string, 0, len(cfg))
	for k := range cfg {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		f := fl.Lookup(k)
		if f == nil || k == "config" {
			return nil, fmt.Errorf("%s: unknown key %q (not a prism up flag)", path, k)
		}
		if typed := changedAlias(fl, f); typed != "" {
			if v := f.Value.String(); v != fileValue(k, cfg[k]) {
				file := cfg[k]
				if typed != k {
					file = k + " " + file
				}
				kept = append(kept, fmt.Sprintf("the command line's --%s %s wins over the file's %s", typed, v, file))
			}
			continue
		}
		if err := fl.Set(k, cfg[k]); err != nil {
			return nil, fmt.Errorf("%s: %s: %w", path, k, err)
		}
	}
	return kept, nil
}

// fileValue is a config file's value for up's flag name as that flag
// writes it (0.004s as 4ms, 1 as true, 0.50 as 0.5), so that a value the
// command line gives too is compared as a value, not as text; one the
// flag does not read is returned as written (it differs).
func fileValue(name, value string) string {
	// A fresh up's flags, of the same types: setting the value into the
	// command line's own flag would change it (a --model array appends).
	f := upCmd(&up.Config{}).Flags().Lookup(name)
	if f == nil || f.Value.Set(value) != nil {
		return value
	}
	return f.Value.String()
}

// changedAlias is the name given on the command line of f, or of a flag
// setting the same variable (a deprecated name: --gpu-workers for
// --dense-workers), or "" if neither was: the command line wins over a
// config file.
func changedAlias(fl *pflag.FlagSet, f *pflag.Flag) string {
	if f.Changed {
		return f.Name
	}
	typed := ""
	fl.VisitAll(func(g *pflag.Flag) {
		if g.Changed && g.Value == f.Value {
			typed = g.Name
		}
	})
	return typed
}

// checkUpFlags refuses a value typed on up's command line (or searched
// by prism tune) whose zero up would leave out of its children's flags,
// so that they ran at their defaults: a micro-batch of 0 ran the
// router's 512, a max-delay of 0 the dense tier's 2 ms. (A --ready-timeout
// of 0 up refused itself, as "ready timeout", without the flag's name.)
//
// A count of threads or of workers is bounded by the machine's cores:
// --threads 10000 started as many threads in every dense worker, and
// --dense-workers as many processes.
func checkUpFlags(fl *pflag.FlagSet) error {
	if err := flagval.ListenAddrs(fl, "addr"); err != nil {
		return err
	}
	if f := fl.Lookup("http-addr"); f != nil && f.Value.String() != "" {
		if err := flagval.ListenAddr("http-addr", f.Value.String()); err != nil {
			return err
		}
	}
	if err := flagval.Positive(fl, "micro-batch", "max-delay", "dense-sessions", "replicas", "ready-timeout"); err != nil {
		return err
	}
	return flagval.AtMostPerCore(fl, "threads", "dense-workers", "gpu-workers", "embedding-workers", "cpu-workers", "replicas")
}
