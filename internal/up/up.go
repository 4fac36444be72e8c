// Package up runs Prism's three tiers on one machine as supervised child
// processes of the prism binary (prism up): the router, one dense worker
// per GPU or MIG slice (one per CPU core without a driver) and the
// embedding workers, on loopback, restarted when they die and stopped in
// order.
package up

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/capacity/loan"
	"github.com/prism-serve/prism/cpuserve/store"
	"github.com/prism-serve/prism/gpuserve/devices"
	"github.com/prism-serve/prism/internal/auth"
	"github.com/prism-serve/prism/internal/flagval"
	"github.com/prism-serve/prism/internal/readyline"
	"github.com/prism-serve/prism/internal/serve"
	"github.com/prism-serve/prism/internal/supervise"
	"github.com/prism-serve/prism/plan"
)

// Config is what prism up runs.
type Config struct {
	// Plans are the partition folders of the models to serve.
	Plans []string
	// DB is the embedding store folder (default: prism-db beside the
	// first plan); embedding worker i > 0 gets DB-i, since Pebble locks
	// its folder. With a sharded plan (prism shard) it is the parent
	// folder of the shards' stores (ShardDB: DB/shard-K, DB/shard-K-R),
	// which up ingests (shard.go).
	DB string
	// Addr is the router's address.
	Addr string
	// DenseWorkers: 0 is two per GPU and one per MIG slice, or without a driver
	// one per CPU this process may use (GOMAXPROCS); more than the
	// devices share them round-robin.
	DenseWorkers int
	// EmbeddingWorkers is how many embedding workers serve the models;
	// with a sharded plan Run sets it to shards x Replicas.
	EmbeddingWorkers int
	// Replicas is how many embedding workers serve each shard of a
	// sharded plan (0: 1); unused without sharding.
	Replicas int
	// shards is the sharded plans' shard count (Run sets it; 0: none
	// is sharded).
	shards int
	// Threads are ONNX Runtime's intra-op threads of each session of a
	// dense worker (serve dense --threads).
	Threads int
	// DenseAcrossModels is serve dense --across-models ("": its default).
	DenseAcrossModels string
	// DenseSessions are ONNX Runtime sessions per model in each dense
	// worker (serve dense --sessions; 0 or 1: one).
	DenseSessions int
	// DenseSharedArena passes --shared-arena to the dense workers.
	DenseSharedArena bool
	MicroBatch       int
	MaxBatch         int
	MaxDelay         time.Duration
	// BatchOrder is the dense workers' --batch-order ("": theirs, edf).
	BatchOrder string
	// FixedAdmission passes --fixed-admission to the router (admission
	// by count and bytes only, not by predicted finish).
	FixedAdmission bool
	// AdmitShare passes --admit-share to the router (0: its default).
	AdmitShare float64
	// AdmitLimit passes --admit-limit to the router.
	AdmitLimit bool
	// DictionaryFrames is passed to the embedding workers as
	// --dictionary-frames=true or =false (prism up's flag is on by
	// default, as serve embedding's is).
	DictionaryFrames bool
	// HotBytes is passed to the embedding workers as written ("" : theirs).
	HotBytes string
	// Certs is the certificate folder (auth.InitCerts) the tiers serve
	// and dial with: each child is given only its role's folder
	// (Certs/ROLE), up lists the registry with Certs/admin. It is made
	// when absent or empty (default: certs beside DB). A folder of the
	// old flat layout is still passed whole (with a warning).
	Certs string
	// CACert and CAKey (prism up --tls-ca, --tls-ca-key), both or
	// neither, are an operator's CA that signs the certificates up makes
	// in an empty Certs (auth.CertOptions); a Certs made already must
	// hold that CA.
	CACert, CAKey string
	// Insecure runs every tier on plaintext without authentication
	// (Certs is then unused).
	Insecure bool
	// HTTPAddr passes --http-addr to the router: Recommend over
	// HTTP/JSON there ("": none).
	HTTPAddr string
	// AuthTokenFile passes --auth-token-file to the router: clients
	// without a certificate call Recommend with this bearer token (over
	// TLS; Run refuses it with Insecure).
	AuthTokenFile string
	// MemoryLimit is the memory up's processes may use together (prism
	// up --memory-limit: the memory cgroup's limit by default; 0: none
	// known, each embedding worker then reads its own cgroup; negative:
	// none, --memory-limit off, which the workers are given too), half of
	// it shared out among the embedding workers.
	MemoryLimit int64
	// flatCerts says Certs has the old flat layout (Run sets it), which
	// has no role folders to pass.
	flatCerts bool
	// KeepVersions, when positive, is passed to the ingests up runs
	// (prism ingest --keep-versions N): a store re-ingested because its
	// plan changed (a retrained model) keeps the model's newest N
	// versions, not every one. 0 keeps every version.
	KeepVersions int
	// ReadyTimeout bounds each worker's start-up (ingest included) and
	// the wait for every registration.
	ReadyTimeout time.Duration
	// Exe is the prism binary the children run (default: this one).
	Exe string
	// NVML finds the devices (default nvml.New()).
	NVML nvml.Interface
	// CUDAUnavailable says why the dense workers could not serve on the
	// GPUs NVML found ("" when they can); the command passes
	// gpuserve.CUDAUnavailable (a tier: internal packages do not import
	// one). nil: the GPUs are taken as usable.
	CUDAUnavailable func() string
	// Loan, when set, runs capacity loaning beside the router
	// (capacity/loan.ParseSpec: local:max=N,...).
	Loan string
	// Stdout gets the children's output and the "Prism is up" line,
	// Stderr their logs and up's notes (defaults os.Stdout, os.Stderr).
	// Both are written from several goroutines: they must be safe for
	// concurrent use, as os.Stdout and os.Stderr are.
	Stdout, Stderr io.Writer
	// Force, once closed while up stops (ctx ended), kills the children
	// still draining instead of waiting out their grace: the command
	// closes it on a second SIGINT or SIGTERM. Nil: never.
	Force <-chan struct{}
}

// Shutdown stages: the router first (it drains the requests in flight,
// which still need both tiers), then the embedding workers (whose last
// lookups still call the dense workers), then the dense workers.
const (
	stageRouter = iota
	stageEmbedding
	stageDense
)

// UpdateLogDir is where prism up's router keeps its update log for the
// store (or parent folder of a sharded model's stores) db: beside it,
// db's name and "-router-log". It holds the updates acknowledged on that
// store's history: removing a store to start afresh means removing its
// log too, or the router catches the new store up with the old updates.
func UpdateLogDir(db string) string { return filepath.Clean(db) + "-router-log" }

func dirExists(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.IsDir()
}

// validateCounts refuses worker and session counts no stack can run
// with, before anything starts (a negative --dense-workers cut the
// worker list out of range; --embedding-workers 0 reported a stack up
// that could answer no request).
// Validate checks the configuration's counts and values, as far as they
// can be judged before anything starts (a child refusing a value would
// stop up only after the others started, its error among their logs).
func (c *Config) Validate() error {
	if err := c.validateCounts(); err != nil {
		return err
	}
	// As the embedding workers will read it: "-lots" and "0" passed
	// here and stopped every worker.
	if err := new(store.Options).SetHotBytes(c.HotBytes, 0); err != nil {
		return fmt.Errorf("--hot-bytes: %w", err)
	}
	switch {
	case c.BatchOrder != "" && c.BatchOrder != "edf" && c.BatchOrder != "fifo":
		return fmt.Errorf("--batch-order %q: want edf or fifo", c.BatchOrder)
	case !(c.AdmitShare >= 0 && c.AdmitShare <= 1):
		return fmt.Errorf("--admit-share %g: want 0 < share <= 1 (0: the router's default)", c.AdmitShare)
	}
	if c.Addr != "" {
		if _, _, err := net.SplitHostPort(c.Addr); err != nil {
			return fmt.Errorf("--addr %q: want HOST:PORT: %w", c.Addr, err)
		}
	}
	if _, err := c.loanSpec(); err != nil {
		return err
	}
	return nil
}

// loanSpec is --loan read (the zero Spec without it): checked by
// Validate, before up makes certificates or ingests shards, and no
// longer only once the tiers have started.
func (c *Config) loanSpec() (loan.Spec, error) {
	if c.Loan == "" {
		return loan.Spec{}, nil
	}
	sp, err := loan.ParseSpec(c.Loan)
	if err != nil {
		return loan.Spec{}, fmt.Errorf("--loan: %w", err)
	}
	if sp.Provider != "local" {
		return loan.Spec{}, fmt.Errorf("--loan %s: prism up lends only local slots; the %s lender runs beside the routers on the cluster: prism loan --lender %s", c.Loan, sp.Provider, c.Loan)
	}
	// Each local slot is a dense worker process on this machine, as
	// --dense-workers is: max=99999999999 was taken.
	if cpus := runtime.NumCPU(); sp.Max > flagval.PerCore(cpus) {
		return loan.Spec{}, fmt.Errorf("--loan %s: max=%d: want at most %d local dense workers on this machine of %d cores (four a core, at least 16)", c.Loan, sp.Max, flagval.PerCore(cpus), cpus)
	}
	return sp, nil
}

func (c *Config) validateCounts() error {
	switch {
	case c.DenseWorkers < 0:
		return fmt.Errorf("--dense-workers %d: want 0 (two per GPU, one per MIG slice, else one per CPU core) or more", c.DenseWorkers)
	case c.EmbeddingWorkers < 1:
		return fmt.Errorf("--embedding-workers %d: want 1 or more", c.EmbeddingWorkers)
	case c.Replicas < 0:
		return fmt.Errorf("--replicas %d: want 1 or more", c.Replicas)
	case c.DenseSessions < 0 || c.DenseSessions > 64:
		return fmt.Errorf("--dense-sessions %d: want 1 to 64", c.DenseSessions)
	case c.MicroBatch < 0:
		return fmt.Errorf("--micro-batch %d: want a positive count", c.MicroBatch)
	case c.MaxBatch < 0:
		return fmt.Errorf("--max-batch %d: want 0 (by device) or more", c.MaxBatch)
	case c.MaxDelay < 0:
		return fmt.Errorf("--max-delay %s: want a positive duration", c.MaxDelay)
	case c.Threads < 0:
		return fmt.Errorf("--threads %d: want 0 (the cores shared among a dense worker's sessions) or more", c.Threads)
	case c.KeepVersions < 0:
		return fmt.Errorf("--keep-versions %d: want 0 (keep every version) or more", c.KeepVersions)
	case c.DenseAcrossModels != "" && c.DenseAcrossModels != "on" && c.DenseAcrossModels != "off":
		return fmt.Errorf("--dense-across-models %q: want on or off", c.DenseAcrossModels)
	}
	return nil
}

// The router has this long to print its address.
const routerReadyTimeout = 30 * time.Second

// Run starts the tiers, prints the Recommend address once every model
// has its workers registered, and supervises them until ctx ends; then
// it stops them all and returns.
func Run(ctx context.Context, c Config) error {
	if len(c.Plans) == 0 {
		return errors.New("up: no models to serve")
	}
	if c.ReadyTimeout <= 0 {
		return fmt.Errorf("up: ready timeout %s, want > 0", c.ReadyTimeout)
	}
	if err := c.Validate(); err != nil {
		return fmt.Errorf("up: %w", err)
	}
	if c.AuthTokenFile != "" {
		if c.Insecure {
			return errors.New("up: --auth-token-file needs TLS: over --insecure the token would travel in the clear")
		}
		// Read here so a bad file fails before any child starts; the
		// router reads it again, from an absolute path (children may not
		// share up's working folder).
		if _, err := auth.ReadToken(c.AuthTokenFile); err != nil {
			return fmt.Errorf("up: --auth-token-file: %w", err)
		}
		abs, err := filepath.Abs(c.AuthTokenFile)
		if err != nil {
			return fmt.Errorf("up: --auth-token-file: %w", err)
		}
		c.AuthTokenFile = abs
	}
	if c.Stdout == nil {
		c.Stdout = os.Stdout
	}
	if c.Stderr == nil {
		c.Stderr = os.Stderr
	}
	if c.NVML == nil {
		c.NVML = nvml.New()
	}
	if c.CUDAUnavailable == nil {
		c.CUDAUnavailable = func() string { return "" }
	}
	var models []string
	var plans []*plan.Plan
	for _, p := range c.Plans {
		pl, err := plan.Read(p)
		if err != nil {
			return fmt.Errorf("up: %w", err)
		}
		// The name its workers announce it by (a plan of a graph
		// without a name: its folder's), which up waits for.
		models = append(models, pl.ServedName(p))
		plans = append(plans, pl)
	}
	if err := checkNames(c.Plans, plans); err != nil {
		return fmt.Errorf("up: %w", err)
	}
	if c.DB == "" {
		c.DB = filepath.Join(filepath.Dir(filepath.Clean(c.Plans[0])), "prism-db")
	}
	shardedList, shards, err := shardedPlans(c.Plans, plans)
	if err != nil {
		return fmt.Errorf("up: %w", err)
	}
	if shards > 0 {
		c.shards = shards
		c.Replicas = max(c.Replicas, 1)
		if c.EmbeddingWorkers != 1 && c.EmbeddingWorkers != shards*c.Replicas {
			fmt.Fprintf(c.Stderr, "up: the models are sharded into %d shards: %d embedding workers (%d per shard, --replicas), not %d\n", shards, shards*c.Replicas, c.Replicas, c.EmbeddingWorkers)
		}
		c.EmbeddingWorkers = shards * c.Replicas
		// Before the certificates are made beside it.
		if err := checkShardParent(c.DB); err != nil {
			return fmt.Errorf("up: %w", err)
		}
	} else if c.Replicas > 1 {
		fmt.Fprintf(c.Stderr, "up: --replicas %d is for sharded models (prism shard), and these are not: %d embedding worker(s) of the whole model (--embedding-workers)\n", c.Replicas, c.EmbeddingWorkers)
	}
	var dialCreds grpc.DialOption
	var adminFiles auth.Files // up's client certificate, for the hints it prints
	if c.Insecure {
		dialCreds = grpc.WithTransportCredentials(insecure.NewCredentials())
	} else {
		if c.Certs == "" {
			c.Certs = filepath.Join(filepath.Dir(filepath.Clean(c.DB)), "certs")
		}
		made, layout, err := ensureCerts(c.Certs, c.Addr, certInstances(c), c.CACert, c.CAKey)
		if err != nil {
			return fmt.Errorf("up: %w", err)
		}
		switch {
		case made && c.CACert != "":
			fmt.Fprintf(c.Stderr, "up: made certificates signed by %s in %s\n", c.CACert, c.Certs)
		case made:
			fmt.Fprintf(c.Stderr, "up: made a development CA and certificates in %s\n", c.Certs)
		}
		c.flatCerts = layout == auth.Flat
		if _, err := os.Stat(auth.InstanceDir(c.Certs, auth.Embedding, 0)); err != nil {
			fmt.Fprintf(c.Stderr, "prism: warning: %s has no per-worker certificates: the workers of a role share one identity, and one could take over another's id at the router (make a folder with prism certs init --instances N)\n", c.Certs)
		}
		// up lists the registry as admin.
		admin, err := auth.ResolveCerts(c.Certs, auth.Admin)
		if err != nil {
			return fmt.Errorf("up: %w", err)
		}
		for _, w := range admin.Warnings {
			fmt.Fprintf(c.Stderr, "prism: warning: %s\n", w)
		}
		tc, err := auth.ClientTLS(admin.Files, auth.Router)
		if err != nil {
			return fmt.Errorf("up: %w", err)
		}
		dialCreds = grpc.WithTransportCredentials(credentials.NewTLS(tc))
		adminFiles = admin.Files
	}
	if c.Exe == "" {
		exe, err := os.Executable()
		if err != nil {
			return fmt.Errorf("up: %w", err)
		}
		c.Exe = exe
	}
	// The router keeps its update log beside the store, named after it
	// (DB-router-log), so a restarted router still catches lagging
	// workers up, and stacks on stores in one folder keep logs apart.
	updateLog := UpdateLogDir(c.DB)
	if InUse(c.DB) {
		// Said by the router child, it named its own flag
		// (--update-log-dir) among the other children's logs; and
		// before ingestShards, which took a locked shard store for one
		// to ingest.
		return fmt.Errorf("up: --db %s is in use by another prism up (or a prism serve of it): stop that one or give this one another --db", c.DB)
	}
	if len(shardedList) > 0 {
		// Before any child: each shard's store must hold its shard when
		// its worker starts (a worker ingests a missing plan whole).
		if err := ingestShards(ctx, c, shardedList); err != nil {
			if ctx.Err() != nil {
				fmt.Fprintln(c.Stderr, "up: stopping")
				return nil
			}
			return fmt.Errorf("up: %w", err)
		}
	}
	// A store holding another version of an unsharded model than its
	// plan's: its worker would refuse it.
	if err := ingestChanged(ctx, c, c.Plans, plans); err != nil {
		if ctx.Err() != nil {
			fmt.Fprintln(c.Stderr, "up: stopping")
			return nil
		}
		return fmt.Errorf("up: %w", err)
	}
	metrics := &routerMetricsWatch{w: c.Stdout}
	spec, err := c.loanSpec() // checked by Validate
	if err != nil {
		return fmt.Errorf("up: %w", err)
	}
	sup := supervise.New(supervise.Options{
		Starter: &supervise.Exec{Path: c.Exe, Stderr: c.Stderr},
		Stdout:  metrics,
		Logf:    func(format string, args ...any) { fmt.Fprintf(c.Stderr, "up: "+format+"\n", args...) },
		Force:   c.Force,
	})
	defer sup.Shutdown()

	if legacy := filepath.Join(filepath.Dir(filepath.Clean(c.DB)), "router-log"); dirExists(legacy) {
		how := "remove it"
		if !dirExists(updateLog) {
			how = fmt.Sprintf("to keep its updates, stop, move it there (mv %s %s) and start again; else remove it", legacy, updateLog)
		}
		fmt.Fprintf(c.Stderr, "up: warning: %s is an update log an earlier prism up kept beside its store; this one keeps %s's at %s and does not read it: %s\n",
			legacy, c.DB, updateLog, how)
	}
	rt := &supervise.Child{Name: "router", Ready: readyline.Router, Stage: stageRouter,
		Args: append([]string{"serve", "router", "--addr", c.Addr, "--update-log-dir", updateLog}, tlsArgs(c, auth.Router)...)}
	if c.MicroBatch > 0 { // else serve router's default
		rt.Args = append(rt.Args, "--micro-batch", fmt.Sprint(c.MicroBatch))
	}
	if c.AdmitShare > 0 {
		rt.Args = append(rt.Args, "--admit-share", fmt.Sprint(c.AdmitShare))
	}
	if c.AdmitLimit {
		rt.Args = append(rt.Args, "--admit-limit")
	}
	if c.FixedAdmission {
		rt.Args = append(rt.Args, "--fixed-admission")
	}
	if c.AuthTokenFile != "" {
		rt.Args = append(rt.Args, "--auth-token-file", c.AuthTokenFile)
	}
	if c.HTTPAddr != "" {
		rt.Args = append(rt.Args, "--http-addr", c.HTTPAddr)
	}
	// A signal during start-up (ctx ends) stops it as one after it would.
	stopping := func(err error) error {
		if ctx.Err() != nil {
			fmt.Fprintln(c.Stderr, c.stoppingLine())
			return nil
		}
		return err
	}
	bound, err := sup.Start(ctx, rt, routerReadyTimeout)
	if err != nil {
		return stopping(err)
	}
	// A router that dies is restarted like the workers (its update log
	// is on disk for that), on the port the first one bound: the workers
	// announce to that address, also when --addr asked for port 0.
	pinRouterAddr(rt, "--addr", c.Addr, bound)
	httpAddr := metrics.http()
	if c.HTTPAddr != "" {
		// Its HTTP/JSON port too: clients were told it.
		pinRouterAddr(rt, "--http-addr", c.HTTPAddr, httpAddr)
	}
	routerAddr := RouterDialAddr(c.Addr, bound)
	sup.Supervise(ctx, rt, routerReadyTimeout)

	disc, err := devices.Discover(c.NVML)
	if err != nil {
		return fmt.Errorf("up: device discovery: %w", err)
	}
	disc = denseDevices(disc, c.CUDAUnavailable, c.Stderr)
	dense := DenseWorkers(disc, c.DenseWorkers, runtime.GOMAXPROCS(0))
	workers := Children(c, routerAddr, dense)
	if err := startWorkers(ctx, sup, workers, c.ReadyTimeout); err != nil {
		return stopping(err)
	}
	if err := waitRegistered(ctx, routerAddr, dialCreds, models, len(dense), c.EmbeddingWorkers, c.ReadyTimeout, updateLog); err != nil {
		return stopping(err)
	}
	if c.Loan != "" {
		stopLoan, err := startLoan(ctx, c, spec, routerAddr, dialCreds, metrics, disc, dense, models)
		if err != nil {
			return fmt.Errorf("up: %w", err)
		}
		// Before the supervisor's shutdown (deferred earlier): the lent
		// workers drain while the router still serves.
		defer stopLoan()
	}
	readyline.WriteUp(c.Stdout, routerAddr, models, len(dense), c.EmbeddingWorkers)
	// How a client reaches it: the certificates up made or found (a
	// client without them is refused), or --insecure.
	creds := "--insecure"
	if !c.Insecure {
		creds = "--certs " + shellQuote(c.Certs)
	}
	if len(models) > 0 {
		fmt.Fprintf(c.Stderr, "up: clients connect with %s, e.g. prism loadgen --target %s %s --model %s --duration 10s\n", creds, shellQuote(routerAddr), creds, shellQuote(models[0]))
		if httpAddr != "" {
			fmt.Fprintf(c.Stderr, "up: Recommend over HTTP/JSON: %s\n", curlHint(adminFiles, RouterDialAddr(c.HTTPAddr, httpAddr)))
		}
	}
	fmt.Fprintf(c.Stderr, "up: which workers serve what: prism status --router %s %s\n", shellQuote(routerAddr), creds)

	// A child that dies is restarted (Supervise, above) and a worker
	// registers again.
	<-ctx.Done()
	fmt.Fprintln(c.Stderr, c.stoppingLine())
	return nil
}

// stoppingLine is what up says as it stops its children: each tier
// drains for up to its grace (the router's calls in flight first), so a
// user waiting at the terminal is told how to cut that short.
func (c *Config) stoppingLine() string {
	if c.Force == nil {
		return "up: stopping"
	}
	return "up: stopping (the tiers drain their calls in flight; Ctrl-C again kills them now)"
}

// startWorkers starts the workers and returns once each has printed its
// ready line, or with the first failure, which ends the wait for the
// others (they are left to the supervisor's Shutdown). The dense
// workers start together: started one after another, up's start-up was
// the sum of the workers', and every dense worker loads and warms up
// every model, so with many models it grew by models x workers. The
// embedding workers start one after another, beside them: on a first
// start each ingests its store, which gains nothing from sharing the
// disk, and started together each would take all of their time against
// its --ready-timeout.
func startWorkers(ctx context.Context, sup *supervise.Supervisor, workers []*supervise.Child, timeout time.Duration) error {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make(chan error, len(workers))
	start := func(w *supervise.Child) error {
		if err := sctx.Err(); err != nil {
			// up is stopping, or a worker failed: none to start.
			return fmt.Errorf("%s: %w", w.Name, err)
		}
		if _, err := sup.Start(sctx, w, timeout); err != nil {
			return err
		}
		// From its ready line on: one that dies before it has
		// registered is restarted, not waited for until ReadyTimeout.
		sup.Supervise(ctx, w, timeout)
		return nil
	}
	var chain []*supervise.Child
	for _, w := range workers {
		if w.Stage == stageEmbedding {
			chain = append(chain, w)
			continue
		}
		go func() { errs <- start(w) }()
	}
	go func() {
		for _, w := range chain {
			errs <- start(w)
		}
	}()
	var first error
	for range workers {
		if err := <-errs; err != nil && first == nil {
			first = err
			cancel() // the others' waits end
		}
	}
	return first
}

// shellQuote is s as one word of a shell command: as it is when it
// holds only characters no shell reads specially, else in single
// quotes. An IPv6 address printed bare ([::1]:8500) is a glob pattern
// to zsh, which refuses the command when nothing matches.
func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_./:=@%+,-") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// pinRouterAddr makes rt's flag (--addr, --http-addr) the address its
// first process bound (bound, its ready line's), where addr (prism up
// --addr) let the OS pick the port: a restarted router must listen
// where the workers already announce, and where clients were told.
// Called before rt is supervised.
func pinRouterAddr(rt *supervise.Child, flag, addr, bound string) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil || port != "0" {
		return
	}
	_, bport, err := net.SplitHostPort(bound)
	if err != nil {
		return
	}
	for i := 0; i+1 < len(rt.Args); i++ {
		if rt.Args[i] == flag {
			rt.Args[i+1] = net.JoinHostPort(host, bport)
			return
		}
	}
}

// curlHint is a curl command that POSTs a request (prism loadgen
// --print-request 1 > req.json) to the router's HTTP/JSON address addr
// with admin's certificate, or over plain HTTP when admin is empty
// (--insecure).
func curlHint(admin auth.Files, addr string) string {
	if admin.Cert == "" {
		return "curl --json @req.json " + shellQuote("http://"+addr+"/v1/recommend")
	}
	return fmt.Sprintf("curl --cacert %s --cert %s --key %s --json @req.json %s",
		shellQuote(admin.CA), shellQuote(admin.Cert), shellQuote(admin.Key), shellQuote("https://"+addr+"/v1/recommend"))
}

// RouterDialAddr is the address up's workers, up itself and its
// clients dial the router at, given its --addr and bound, the address
// its ready line named: bound; where --addr names a host (node7:8500),
// that name at the bound port (the ready line names the IP address it
// resolved to, which the certificates up makes for the name do not
// cover); where the router listens on every interface (--addr
// 0.0.0.0:P, [::]:P or :P, whose ready line names [::]:P), loopback at
// its port. Over TLS the workers verify the router's certificate
// against the host they dial, and no certificate is valid for an
// unspecified address: the workers dialling [::]:P never registered,
// and up waited out --ready-timeout.
func RouterDialAddr(addr, bound string) string {
	host, port, err := net.SplitHostPort(bound)
	if err != nil {
		return bound
	}
	if h, _, err := net.SplitHostPort(addr); err == nil && h != "" && net.ParseIP(h) == nil {
		return net.JoinHostPort(h, port)
	}
	if ip := net.ParseIP(host); host != "" && (ip == nil || !ip.IsUnspecified()) {
		return bound
	}
	loopback := "127.0.0.1"
	if h, _, err := net.SplitHostPort(addr); err == nil {
		if ip := net.ParseIP(h); ip != nil && ip.To4() == nil {
			loopback = "::1" // an IPv6 --addr: the router may not take IPv4
		}
	}
	return net.JoinHostPort(loopback, port)
}

// denseDevices is what the dense workers will run on: disc, or the CPU
// when there is no driver or when ONNX Runtime cannot use the GPUs found
// (a CPU build: then one worker per core, as without a driver, rather
// than two CPU workers per GPU). It says which on w.
func denseDevices(disc devices.Discovery, cudaUnavailable func() string, w io.Writer) devices.Discovery {
	if disc.NoDriver == "" {
		// GPUs without a device to run on (MIG on, no instances): said
		// here, where their dense workers would have started.
		for _, why := range disc.Skipped {
			fmt.Fprintf(w, "up: not used: %s\n", why)
		}
	}
	if disc.NoDriver != "" {
		fmt.Fprintf(w, "up: %s: dense workers run on the CPU\n", disc.WhyCPU())
		return disc
	}
	why := cudaUnavailable()
	if why == "" {
		return disc
	}
	fmt.Fprintf(w, "up: %d NVIDIA device(s) found, but ONNX Runtime cannot use them (%s): dense workers run on the CPU, one per core; make setup-cuda installs a CUDA build\n", len(disc.Devices), why)
	return devices.Discovery{Devices: []devices.Device{{Kind: devices.KindCPU, Name: "cpu"}}, NoDriver: why, DriverVersion: disc.DriverVersion}
}

// DenseWorkers is two workers per whole GPU of disc and one per MIG
// slice, or n (when > 0) sharing the devices round-robin. Two on a GPU
// because one worker's host side (assembling a batch, ONNX Runtime's
// copies and launches) leaves the GPU idle between its runs: on an H200,
// dlrm-kaggle, two workers served 1.1M samples/s against 0.63M for one
// (BENCHMARKS.md). Without a driver and with n == 0, one per CPU (cpus):
// single-threaded dense workers with no barrier between threads measured
// 25% more throughput than one worker with a thread per core.
func DenseWorkers(disc devices.Discovery, n, cpus int) []devices.Worker {
	workers := devices.Plan(disc)
	if disc.NoDriver != "" && n == 0 {
		n = cpus
	}
	if n == 0 {
		for _, w := range workers[:len(workers):len(workers)] {
			if w.Device.Kind == devices.KindGPU {
				workers = append(workers, w)
			}
		}
		return workers
	}
	if len(workers) > 0 {
		base := len(workers)
		for len(workers) < n {
			workers = append(workers, workers[len(workers)%base])
		}
		workers = workers[:n]
	}
	return workers
}

// Children are the worker processes up starts after the router, all
// at once (startWorkers): the dense workers (pinned to their devices by
// env), then the embedding workers, each with its own store folder
// (with sharding, shard by shard: worker i is replica i mod Replicas of
// shard i / Replicas).
// DenseArgs are dense worker i's arguments to the prism binary (serve
// dense), its certificate instance i's where the folder has one.
func DenseArgs(c Config, routerAddr string, i int) []string {
	args := []string{"serve", "dense", "--router", routerAddr, "--threads", fmt.Sprint(c.Threads), "--max-batch", fmt.Sprint(c.MaxBatch)}
	if c.MaxDelay > 0 { // else serve dense's default
		args = append(args, "--max-delay", c.MaxDelay.String())
	}
	args = append(args, workerTLSArgs(c, auth.Dense, i)...)
	if c.BatchOrder != "" {
		args = append(args, "--batch-order", c.BatchOrder)
	}
	if c.DenseAcrossModels != "" {
		args = append(args, "--across-models", c.DenseAcrossModels)
	}
	if c.DenseSessions > 1 {
		args = append(args, "--sessions", fmt.Sprint(c.DenseSessions))
	}
	if c.DenseSharedArena {
		args = append(args, "--shared-arena")
	}
	for _, p := range c.Plans {
		args = append(args, "--plan", p)
	}
	return args
}

func Children(c Config, routerAddr string, dense []devices.Worker) []*supervise.Child {
	var planArgs []string
	for _, p := range c.Plans {
		planArgs = append(planArgs, "--plan", p)
	}
	var out []*supervise.Child
	cpuWorkers := 0
	for _, w := range dense {
		if w.Device.Kind == devices.KindCPU {
			cpuWorkers++
		}
	}
	userSet := os.Getenv("GOMAXPROCS") != ""
	for i, w := range dense {
		env := w.Env
		if w.Device.Kind == devices.KindCPU {
			env = append(slices.Clip(env), cpuDenseEnv(c.Threads, runtime.GOMAXPROCS(0), cpuWorkers, userSet)...)
		}
		out = append(out, &supervise.Child{Name: fmt.Sprintf("dense%d", i), Ready: readyline.Dense, Stage: stageDense, Args: DenseArgs(c, routerAddr, i), Env: env})
	}
	for i := range c.EmbeddingWorkers {
		db := embeddingDB(c, i)
		args := append([]string{"serve", "embedding", "--router", routerAddr, "--db", db}, workerTLSArgs(c, auth.Embedding, i)...)
		args = append(args, planArgs...)
		if c.HotBytes != "" {
			args = append(args, "--hot-bytes", c.HotBytes)
		}
		args = append(args, fmt.Sprintf("--dictionary-frames=%t", c.DictionaryFrames))
		args = append(args, embeddingMemArgs(c.MemoryLimit, c.EmbeddingWorkers)...)
		out = append(out, &supervise.Child{Name: fmt.Sprintf("embedding%d", i), Ready: readyline.Embedding, Stage: stageEmbedding, Args: args,
			Env: embeddingEnv(runtime.GOMAXPROCS(0), c.EmbeddingWorkers, os.Getenv("GOMAXPROCS") != "")})
	}
	return out
}

// cpuDenseEnv is the environment of each of workers dense workers on
// the CPU sharing cpus cores, when their sessions' threads are left to
// them (threads 0): GOMAXPROCS=cpus/workers (at least 1), which each
// worker's sessions then share (serve dense sizes a session's pool by
// GOMAXPROCS when it is below the machine's cores). Without it each
// worker's ONNX Runtime took a thread per core of the machine: on two
// cores, two workers ran four. Explicit threads (prism up's default is
// 1), one worker, or a GOMAXPROCS the user set for prism up (inherited)
// get nothing.
func cpuDenseEnv(threads, cpus, workers int, userSet bool) []string {
	if threads != 0 || workers <= 1 || userSet || cpus <= 0 {
		return nil
	}
	return []string{fmt.Sprintf("GOMAXPROCS=%d", max(1, cpus/workers))}
}

// embeddingEnv is the environment of each of workers embedding workers
// sharing cpus cores (a sharded model's shards and replicas on one
// host): GOMAXPROCS=cpus/workers (at least 1), so that the workers
// together run no more Go threads than there are cores. With a Go
// scheduler per process sized to the whole host, three shard workers
// on two cores spent their CPU spinning for work and switching threads:
// scripts/bench-shard.sh read sharded/unsharded 0.73 with each at
// GOMAXPROCS=2 and 0.78 at 1 (BENCHMARKS.md). One worker, or a
// GOMAXPROCS the user set for prism up (inherited), gets nothing.
func embeddingEnv(cpus, workers int, userSet bool) []string {
	if workers <= 1 || userSet || cpus <= 0 {
		return nil
	}
	return []string{fmt.Sprintf("GOMAXPROCS=%d", max(1, cpus/workers))}
}

// embeddingMemArgs is the --memory-limit of each of workers embedding
// workers under a memory limit of limit bytes (0: none; each worker then
// reads its own cgroup, which is up's): together half of it, in equal
// shares. A negative limit (prism up --memory-limit off) is off for the
// workers too: left to their default, auto, each budgeted the whole
// container's limit. The other half is the router's, the dense
// workers' (ONNX Runtime's weights and arenas, outside any Go budget) and the page
// cache's beyond the workers' own quarter. Without it every embedding
// worker would size itself to the whole container.
func embeddingMemArgs(limit int64, workers int) []string {
	switch {
	case workers <= 0 || limit == 0:
		return nil
	case limit < 0:
		return []string{"--memory-limit", "off"}
	}
	return []string{"--memory-limit", fmt.Sprint(limit / 2 / int64(workers))}
}

// tlsArgs are the TLS flags of a child of role r: only its role's
// folder.
func tlsArgs(c Config, r auth.Role) []string {
	if c.Insecure {
		return []string{"--insecure"}
	}
	if c.flatCerts {
		return []string{"--certs", c.Certs}
	}
	return []string{"--certs", auth.RoleDir(c.Certs, r)}
}

// workerTLSArgs are the TLS flags of worker i of role r: its own
// certificate's folder (Certs/ROLE-I, certs init --instances) when
// there is one, so that the router binds its id to it alone; else the
// role's folder, which every worker of the role shares.
func workerTLSArgs(c Config, r auth.Role, i int) []string {
	args := tlsArgs(c, r)
	if !c.Insecure && !c.flatCerts {
		d := auth.InstanceDir(c.Certs, r, i)
		if _, err := os.Stat(auth.FolderFiles(d).Cert); err == nil {
			args = []string{"--certs", d}
		}
	}
	return args
}

// certInstances is how many certificates per worker role up makes
// when it makes the certificate folder: enough for every worker it
// starts (one dense worker per CPU without a driver); a worker beyond
// them (more GPUs than that) gets its role's shared certificate.
func certInstances(c Config) int {
	return max(c.EmbeddingWorkers, c.DenseWorkers, runtime.GOMAXPROCS(0), 8)
}

// EnsureCerts makes a development CA and certificates in dir when it is
// absent or empty (valid for loopback and addr's host), and checks that
// a folder it did not make holds every role's files: a prism certs init
// folder (auth.InitRoot), or one of the old flat layout (auth.Flat), not
// one role's folder, whose router certificate is valid for addr's host.
// made says whether it made them.
func EnsureCerts(dir, addr string) (made bool, layout auth.Layout, err error) {
	return ensureCerts(dir, addr, 0, "", "")
}

// ensureCerts is EnsureCerts making instances certificates of their own
// per worker role (auth.CertOptions.Instances) when it makes them.
func ensureCerts(dir, addr string, instances int, caCert, caKey string) (made bool, layout auth.Layout, err error) {
	entries, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return false, 0, fmt.Errorf("certificates: %w", err)
	}
	hosts := certHosts(addr)
	if len(entries) == 0 {
		if err := auth.InitCerts(dir, auth.CertOptions{Hosts: hosts, Instances: instances, CACert: caCert, CAKey: caKey}); err != nil {
			return false, 0, err
		}
		return true, auth.InitRoot, nil
	}
	if caCert != "" {
		// Made before: by this CA, or the flag would silently not hold.
		want, err := os.ReadFile(caCert)
		if err != nil {
			return false, 0, fmt.Errorf("CA certificate: %w", err)
		}
		res, err := auth.ResolveCerts(dir, auth.Admin)
		if err != nil {
			return false, 0, fmt.Errorf("certificate folder %s is not empty but is not a complete one (make one with prism certs init): %w", dir, err)
		}
		if have, err := os.ReadFile(res.Files.CA); err != nil || !samePEMCert(have, want) {
			return false, 0, fmt.Errorf("certificate folder %s holds certificates of another CA than %s: give --certs a new folder to make them with it, or leave out --tls-ca", dir, caCert)
		}
	}
	if _, err := os.Stat(auth.FolderFiles(dir).Cert); err == nil {
		return false, 0, fmt.Errorf("certificate folder %s is one role's folder: prism up runs every role and needs the folder prism certs init wrote (its parent, if that is one)", dir)
	}
	for _, r := range auth.Roles {
		res, err := auth.ResolveCerts(dir, r)
		if err != nil {
			return false, 0, fmt.Errorf("certificate folder %s is not empty but is not a complete one (make one with prism certs init): %w", dir, err)
		}
		if layout != 0 && res.Layout != layout {
			return false, 0, fmt.Errorf("certificate folder %s mixes layouts (%s and %s): make a new one with prism certs init", dir, layout, res.Layout)
		}
		layout = res.Layout
	}
	// Made for another --addr: the workers, which dial the router at
	// this host, would refuse its certificate and never register (up
	// waited out --ready-timeout, the reason in their logs alone).
	for _, h := range hosts {
		if err := coversHost(dir, h); err != nil {
			return false, 0, fmt.Errorf("certificate folder %s was made for another address: %w; give --certs a new (or empty) folder, which up makes for --addr %s, or make one with prism certs init DIR --host %s", dir, err, addr, h)
		}
	}
	return false, layout, nil
}

// certHosts are the hosts of addr (--addr) the certificates must be
// valid for besides loopback, which they always are: none for a
// loopback or unspecified address (the workers then dial loopback,
// RouterDialAddr).
func certHosts(addr string) []string {
	h, _, err := net.SplitHostPort(addr)
	if err != nil || h == "" || h == "localhost" {
		return nil
	}
	if ip := net.ParseIP(h); ip != nil && (ip.IsLoopback() || ip.IsUnspecified()) {
		return nil
	}
	return []string{h}
}

// coversHost says why the router's certificate in the folder dir is
// not valid for host (nil when it is).
func coversHost(dir, host string) error {
	res, err := auth.ResolveCerts(dir, auth.Router)
	if err != nil {
		return err
	}
	b, err := os.ReadFile(res.Files.Cert)
	if err != nil {
		return err
	}
	blk, _ := pem.Decode(b)
	if blk == nil || blk.Type != "CERTIFICATE" {
		return fmt.Errorf("%s: no PEM certificate", res.Files.Cert)
	}
	cert, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		return fmt.Errorf("%s: %w", res.Files.Cert, err)
	}
	if err := cert.VerifyHostname(host); err != nil {
		return fmt.Errorf("the router's certificate %s: %w", res.Files.Cert, err)
	}
	return nil
}

// samePEMCert: a and b hold the same first certificate.
func samePEMCert(a, b []byte) bool {
	ba, _ := pem.Decode(a)
	bb, _ := pem.Decode(b)
	return ba != nil && bb != nil && ba.Type == "CERTIFICATE" && bb.Type == "CERTIFICATE" && bytes.Equal(ba.Bytes, bb.Bytes)
}

// waitRegistered polls the router's registry until every model has its
// workers. It gives up at once when a shard's workers are all left out
// by the router (LeftOut), which waiting does not change; updateLog is
// the router's update log folder, for the message.
func waitRegistered(ctx context.Context, addr string, creds grpc.DialOption, models []string, dense, embedding int, timeout time.Duration, updateLog string) error {
	conn, err := grpc.NewClient(addr, creds, serve.ListDialOption())
	if err != nil {
		return fmt.Errorf("up: dial router %s: %w", addr, err)
	}
	defer conn.Close()
	reg := prismv1.NewRegistryClient(conn)
	deadline := time.Now().Add(timeout)
	// firstSeen is when each model's first embedding worker was listed:
	// the router takes the model's updates from three heartbeats after it
	// first heard of the model (its start-up window, while the workers
	// announce what they hold). Up is ready when they are taken too: an
	// Update sent on the ready line was answered Unavailable.
	firstSeen := map[string]time.Time{}
	for {
		resp, err := reg.List(ctx, &prismv1.ListRequest{})
		now := time.Now()
		for _, w := range resp.GetWorkers() {
			for _, m := range w.GetModels() {
				if _, ok := firstSeen[m]; !ok && w.GetRole() == prismv1.Role_ROLE_EMBEDDING {
					firstSeen[m] = now
				}
			}
		}
		settled := true
		for _, m := range models {
			if t, ok := firstSeen[m]; !ok || now.Sub(t) < updateWindow {
				settled = false
			}
		}
		if err == nil && Registered(resp.GetWorkers(), models, dense, embedding) && Servable(resp, models) == "" && settled {
			return nil
		}
		if err == nil && settled && Registered(resp.GetWorkers(), models, dense, embedding) {
			if why := LeftOut(resp, models); why != "" {
				return fmt.Errorf("up: %s, whatever they hold: they serve no lookups and take no updates (the router's log says why). If the model was sharded again after it took updates, the router's update log %s binds the old sharding: to serve the new one, stop up, remove that folder (or give up a new --db) and send again the updates the new stores lack", why, updateLog)
			}
		}
		if time.Now().After(deadline) {
			if err == nil && Registered(resp.GetWorkers(), models, dense, embedding) {
				return fmt.Errorf("up: the workers registered, but %s within %s", Servable(resp, models), timeout)
			}
			return fmt.Errorf("up: workers did not all register within %s", timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// InUse says whether another process holds db (an embedding store up
// would serve) or the update log up keeps beside it: another prism up,
// or a prism serve of them.
func InUse(db string) bool { return locked(UpdateLogDir(db)) || locked(db) }

// updateWindow is how long after first hearing of a model the router
// (at serve router's default --heartbeat of 1 s, which up keeps) takes
// its updates: three heartbeats, and a margin for the poll.
const updateWindow = 3*time.Second + 200*time.Millisecond

// Servable says why the router would not yet send a model's lookups
// to its embedding workers ("" when it would, for every model): a model
// that has had embedding updates is served once its start-up window has
// closed and, for each shard of it (one when unsharded), a worker holds
// every acknowledged update; until then Recommend answers Unavailable
// (a store re-ingested beside a kept update log is caught up first).
func Servable(resp *prismv1.ListResponse, models []string) string {
	for _, m := range models {
		want, have := map[int32]bool{}, map[int32]bool{}
		for _, w := range resp.GetWorkers() {
			if w.GetRole() != prismv1.Role_ROLE_EMBEDDING || !slices.Contains(w.GetModels(), m) {
				continue
			}
			// A sharded model's updates are numbered per shard
			// (prismv1.UpdateSeqKey): each shard's sequence judged apart.
			key := prismv1.UpdateSeqKeyOf(w, m)
			u := resp.GetUpdates()[key]
			if u == nil {
				continue // never updated: no worker lacks anything
			}
			if u.GetSettling() {
				return fmt.Sprintf("model %q is still in its start-up window (its workers announcing the updates they hold)", m)
			}
			shard := w.GetShards()[m].GetShard()
			want[shard] = true
			if slices.Contains(u.GetInSync(), w.GetId()) {
				have[shard] = true
			}
		}
		for shard := range want {
			if !have[shard] {
				return fmt.Sprintf("no embedding worker of model %q (shard %d) holds every acknowledged update yet (catching up from the router's update log, or too far behind it to catch up: the router's log says which)", m, shard)
			}
		}
	}
	return ""
}

// LeftOut says which shard of a model that has had updates the router
// serves with none of its embedding workers because it leaves every one
// of them out whatever it holds (ModelUpdates.left_out: of another
// layout than the one its updates were numbered in, holding updates it
// never numbered, or refusing one the others applied), which waiting
// does not change; "" when there is none.
func LeftOut(resp *prismv1.ListResponse, models []string) string {
	for _, m := range models {
		workers, out := map[string]int{}, map[string]int{} // by sequence
		what := map[string]string{}
		for _, w := range resp.GetWorkers() {
			if w.GetRole() != prismv1.Role_ROLE_EMBEDDING || !slices.Contains(w.GetModels(), m) {
				continue
			}
			key := prismv1.UpdateSeqKeyOf(w, m)
			u := resp.GetUpdates()[key]
			if u == nil || u.GetSettling() {
				continue
			}
			workers[key]++
			what[key] = fmt.Sprintf("model %q", m)
			if ref := w.GetShards()[m]; ref != nil {
				what[key] = fmt.Sprintf("model %q (shard %d of %d)", m, ref.GetShard(), ref.GetShards())
			}
			if slices.Contains(u.GetLeftOut(), w.GetId()) {
				out[key]++
			}
		}
		for _, key := range slices.Sorted(maps.Keys(workers)) {
			if out[key] == workers[key] {
				return fmt.Sprintf("the router leaves out every embedding worker of %s, %d of them", what[key], workers[key])
			}
		}
	}
	return ""
}

// Registered reports whether every model has at least dense dense and
// embedding embedding workers among ws.
func Registered(ws []*prismv1.WorkerInfo, models []string, dense, embedding int) bool {
	for _, m := range models {
		var e, d int
		for _, w := range ws {
			for _, wm := range w.GetModels() {
				if wm != m {
					continue
				}
				switch w.GetRole() {
				case prismv1.Role_ROLE_EMBEDDING:
					e++
				case prismv1.Role_ROLE_DENSE:
					d++
				}
			}
		}
		if e < embedding || d < dense {
			return false
		}
	}
	return true
}
