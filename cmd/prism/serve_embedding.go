package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/cpuserve/server"
	"github.com/prism-serve/prism/cpuserve/store"
	"github.com/prism-serve/prism/cpuserve/storecopy"
	"github.com/prism-serve/prism/internal/auth"
	"github.com/prism-serve/prism/internal/auth/authflag"
	"github.com/prism-serve/prism/internal/flagval"
	"github.com/prism-serve/prism/internal/progress"
	"github.com/prism-serve/prism/internal/readyline"
	"github.com/prism-serve/prism/internal/serve"
)

func init() { serveSubcommands = append(serveSubcommands, newServeEmbeddingCmd) }

// newServeEmbeddingCmd is `prism serve embedding` (formerly `serve cpu`).
func newServeEmbeddingCmd() *cobra.Command {
	var (
		db, hotBytes, preload, addr, metricsAddr, router, advertise, logFormat, logLevel string
		cacheBytes, memLimit                                                             string
		plans                                                                            []string
		maxSamples, threads, missParallel                                                int
		tlsFlags                                                                         authflag.Flags
	)
	// Trust and admission (router-side trust work).
	var maxInflightSamples int64
	var dictFrames, directReads, warmRestart bool
	var warmEvery, shutdownGrace, scrubEvery time.Duration
	var scrubRate string
	// Mending itself from a serving worker's store (mend.go).
	var mend bool
	var mendRate string
	var mendEvery time.Duration
	cmd := &cobra.Command{
		Use:     "embedding --db DIR --plan DIR [--plan DIR ...]",
		Aliases: []string{"cpu"},
		Short:   "Run the embedding tier: store lookups, cpu.onnx, and the cut tensors sent to a dense worker",
		Long: `Serve embedding opens the embedding store at --db and serves the models of
the given partition folders (--plan, repeatable). A model the store does not
hold yet is ingested from its plan first, with progress on stderr.

For each Lookup (one micro-batch) it looks up and pools the embeddings,
runs cpu.onnx where the plan has one, frames the cut tensors as Arrow and
sends them to the dense worker the request names; the scores and a
per-stage time breakdown come back. Once serving it prints one line,
"embedding tier listening on ADDR", to stdout. With --router it
announces itself to every router's registry (role "embedding")
at --advertise-addr.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			// The server takes 0 or less for its defaults.
			if err := flagval.ListenAddrs(cmd.Flags(), "addr", "metrics-addr"); err != nil {
				return err
			}
			if err := flagval.Positive(cmd.Flags(), "max-samples", "max-inflight-samples", "shutdown-grace"); err != nil {
				return err
			}
			// A negative interval saved at shutdown only, as 0 does.
			if err := flagval.NonNegative(cmd.Flags(), "warm-snapshot-every", "threads"); err != nil {
				return err
			}
			if err := flagval.AtMostPerCore(cmd.Flags(), "threads"); err != nil {
				return err
			}
			// Checked here, naming the flag: the store's and the server's
			// own checks said "preload", "miss parallel" and "threads".
			switch store.PreloadMode(preload) {
			case store.PreloadAuto, store.PreloadOn, store.PreloadOff:
			default:
				return fmt.Errorf("--preload %q: want auto, on or off", preload)
			}
			if err := checkMissParallel(missParallel); err != nil {
				return err
			}
			rate, err := flagval.Bytes(strings.TrimSuffix(mendRate, "/s"))
			if err != nil || rate < storecopy.MinRate {
				return fmt.Errorf("--mend-rate %q: want bytes a second, at least 1MiB/s, e.g. 200MiB/s", mendRate)
			}
			if mendEvery <= 0 {
				return fmt.Errorf("--mend-every %v: want a positive interval", mendEvery)
			}
			if scrubEvery < 0 {
				return fmt.Errorf("--scrub-every %v: want an interval, or 0 (no scrub)", scrubEvery)
			}
			scrubBytes, err := flagval.Bytes(strings.TrimSuffix(scrubRate, "/s"))
			if err != nil || scrubBytes < 1<<20 {
				return fmt.Errorf("--scrub-rate %q: want bytes a second, at least 1MiB/s, e.g. 32MiB/s", scrubRate)
			}
			if db == "" {
				return fmt.Errorf("--db is required")
			}
			if len(plans) == 0 {
				return fmt.Errorf("--plan is required (a partition folder; repeat it for more models)")
			}
			log, err := newLogger(logFormat, logLevel)
			if err != nil {
				return err
			}
			stopTracing, err := startTracing("prism-embedding", log)
			if err != nil {
				return err
			}
			defer stopTracing()
			tlsFlags.Warn(cmd.ErrOrStderr(), "the embedding tier")
			tlsConf, err := tlsFlags.Server(auth.Embedding, auth.ServerTLSOptions{})
			if err != nil {
				return err
			}
			// Cut tensors go only to a dense worker's certificate; the
			// registry only to the router's.
			toDense, err := tlsFlags.Dial(auth.Embedding, auth.Dense)
			if err != nil {
				return err
			}
			toRouter, err := tlsFlags.Dial(auth.Embedding, auth.Router)
			if err != nil {
				return err
			}
			so := store.Options{Preload: store.PreloadMode(preload), MissParallel: missParallel, DirectReads: directReads, WarmRestart: warmRestart, WarmSnapshotEvery: warmEvery}
			mem, err := memoryLimit(memLimit)
			if err != nil {
				return fmt.Errorf("--memory-limit: %w", err)
			}
			if err := so.SetHotBytes(hotBytes, mem.Effective()); err != nil {
				return fmt.Errorf("--hot-bytes: %w", err)
			}
			if cacheBytes != "" {
				if so.CacheBytes, err = flagval.Bytes(cacheBytes); err != nil {
					return fmt.Errorf("--cache-bytes: %w", err)
				}
				if so.CacheBytes == 0 {
					// The store took 0 for its 256 MiB.
					return fmt.Errorf("--cache-bytes %s: want a positive size", cacheBytes)
				}

			} else if mem.Cgroup > 0 {
				so.CacheBytes = store.CacheBytesFor(mem.Cgroup)
			}
			if err := pastMachine(so, mem, hotBytes, cacheBytes); err != nil {
				return err
			}
			budget, err := applyBudget(&so, mem.Cgroup)
			if err != nil {
				return err
			}
			sigCtx, stop := signalContext()
			defer stop()
			// A worker that mended itself ends (restart) to be restarted.
			ctx, restart := context.WithCancelCause(sigCtx)
			defer restart(nil)
			// A read finding a damaged file of the store tells the mender
			// (--mend), which replaces the store with a serving worker's.
			damageNews := make(chan struct{}, 1)
			so.OnDamage = func(string) {
				select {
				case damageNews <- struct{}{}:
				default:
				}
			}
			st, err := store.Open(db, &so)
			if err != nil {
				return err
			}
			defer st.Close()
			if rep, ok := st.Swapped(); ok {
				log.Info("swapped in the copy of another worker's store that prism store copy staged; the store's files from before, if any, are kept: remove their folder once this worker serves", "db", db, "files", rep.Files, "kept", rep.Replaced)
			}
			var bar *progress.Bar
			var barModel string
			// A lookup naming a dense worker the router registered since
			// the last heartbeat has the worker announce out of turn.
			var prompt *serve.Prompt
			var askRouter func()
			if router != "" {
				prompt = serve.NewPrompt()
				askRouter = prompt.Ask
			}
			srv, err := server.New(ctx, st, server.Options{
				Plans: plans, MaxSamples: maxSamples, Threads: threads, Logger: log.With("tier", "embedding"),
				// Trust and admission: cut tensors go only to the dense
				// workers the router announces (any, without a router).
				MaxInflightSamples: maxInflightSamples, MaxInflightBytes: budget.inflight(st), AnyDenseAddr: router == "", AskRouter: askRouter,
				DictionaryFrames: dictFrames,
				DialOptions:      []grpc.DialOption{toDense},
				IngestProgress: func(model string, done, total int64) {
					if bar == nil || barModel != model {
						if bar != nil {
							bar.Done()
						}
						bar, barModel = progress.New(cmd.ErrOrStderr(), "ingest "+model, total, true), model
					}
					bar.Set(done)
				},
			})
			if bar != nil {
				bar.Done()
			}
			if err != nil {
				return err
			}
			defer srv.Close()
			budget.report(cmd.ErrOrStderr(), log, st)
			if index, filter, err := st.IndexBytes(); err == nil {
				cache := cmp.Or(so.CacheBytes, store.DefaultCacheBytes)
				if msg := indexCacheAdvice(index, filter, cache, st.Preloaded().Complete); msg != "" {
					fmt.Fprintln(cmd.ErrOrStderr(), "warning: "+msg)
					log.Warn("block cache smaller than the index", "cache_bytes", cache, "index_bytes", index, "filter_bytes", filter)
				}
			}
			if from, to := budget.raiseProcs(st, missParallel); to != from {
				fmt.Fprintf(cmd.ErrOrStderr(), "misses are read from the device: GOMAXPROCS %d -> %d (a blocking read holds its P)\n", from, to)
				log.Info("GOMAXPROCS raised for device reads", "from", from, "to", to)
			}
			if pr := st.Preloaded(); pr.Rows > 0 {
				log.Info("hot tier preloaded", "tables", pr.Tables, "rows", pr.Rows, "bytes", pr.Bytes, "elapsed", pr.Elapsed.Round(time.Millisecond), "complete", pr.Complete)
				fmt.Fprintf(cmd.ErrOrStderr(), "preloaded %d rows (%.1f MiB) of %d tables into the hot tier in %s\n",
					pr.Rows, float64(pr.Bytes)/(1<<20), pr.Tables, pr.Elapsed.Round(time.Millisecond))
			}
			if _, done := st.Warmed(); warmRestart {
				go func() {
					<-done
					rep, _ := st.Warmed()
					if errors.Is(rep.Err, context.Canceled) {
						return // shut down while restoring
					}
					if rep.Err != nil {
						log.Warn("hot tier warm restart stopped early", "keys", rep.Keys, "rows", rep.Rows, "elapsed", rep.Elapsed.Round(time.Millisecond), "err", rep.Err)
					} else if rep.Keys > 0 {
						log.Info("hot tier restored from its snapshot", "keys", rep.Keys, "rows", rep.Rows, "sketches", rep.Sketches, "elapsed", rep.Elapsed.Round(time.Millisecond))
						fmt.Fprintf(cmd.ErrOrStderr(), "warm restart: read %d rows of the hot tier's snapshot back in %s\n", rep.Rows, rep.Elapsed.Round(time.Millisecond))
					}
				}()
			}
			s, err := serve.New("embedding", serve.Options{Addr: addr, MetricsAddr: metricsAddr, ShutdownGrace: shutdownGrace, TLS: tlsConf, MetricsRequireClientCert: tlsFlags.MetricsClientCert, Logger: log})
			if err != nil {
				return err
			}
			prismv1.RegisterEmbeddingTierServer(s.GRPC, srv)
			s.Registry.MustRegister(srv.Collectors()...)
			info := srv.WorkerInfo
			mended := make(chan struct{}) // the mender ended (closed at once without one)
			if !mend || router == "" {
				close(mended)
			} else {
				routers, err := serve.ParseRouters(router)
				if err != nil {
					return err
				}
				// The id the worker last announced under: the routers'
				// view of it (stranded or not) is under that id.
				var id atomic.Pointer[string]
				id.Store(new(string))
				m := newMender(db, routers, tlsFlags, rate, mendEvery, log)
				m.out, m.news, m.forget, m.restart = srv.OutForGood, srv.OutNews(), srv.ForgetStranded, restart
				m.damaged, m.damageNews = st.Damaged, damageNews
				m.info = func() *prismv1.WorkerInfo { return srv.WorkerInfo(*id.Load(), "") }
				m.metrics = newMendMetrics()
				if last, ok, err := store.LastMend(vfs.Default, db); err == nil {
					m.metrics.mended(last, ok)
				}
				s.Registry.MustRegister(m.metrics.collectors()...)
				go func() {
					defer close(mended)
					m.run(ctx)
				}()
				info = func(announced, addr string) *prismv1.WorkerInfo {
					id.Store(&announced)
					w := srv.WorkerInfo(announced, addr)
					w.Mends = true // prism status: it mends itself
					return w
				}
			}
			scrubbed := make(chan struct{}) // the scrub ended
			go func() {
				defer close(scrubbed)
				scrubLoop(ctx, st, scrubEvery, scrubBytes, log)
			}()
			err = s.ServeWorker(ctx, serve.WorkerOptions{
				Router:        router,
				AdvertiseAddr: advertise,
				Announced: func(r *prismv1.AnnounceResponse) {
					if err := srv.Announced(r); err != nil {
						log.Error("cannot record the election epoch of the router sequencing updates: the updates of a router that lost the sequencing lease may still be applied", "err", err)
					}
				},
				Prompt:      prompt,
				Info:        info,
				Ready:       func(addr string) { readyline.WriteEmbedding(cmd.OutOrStdout(), addr) },
				DialOptions: []grpc.DialOption{toRouter},
			})
			// The mender ends (a copy under way stops, its staged files
			// kept for the next) before the store closes.
			restart(nil)
			<-mended
			<-scrubbed
			var staged *errMended
			if errors.As(context.Cause(ctx), &staged) && err == nil {
				log.Warn("mend: "+staged.Error(), "from", staged.from)
				return staged
			}
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&db, "db", "", "embedding store directory (created if missing)")
	f.StringArrayVar(&plans, "plan", nil, "partition folder of a model to serve (repeatable); ingested at startup if the store lacks it")
	f.StringVar(&hotBytes, "hot-bytes", store.HotBytesAuto, `hot tier size, e.g. 512MiB; "auto": enough to hold every row of the served models' tables when that is at most half of the memory this worker may use (physical memory, or less under --memory-limit), else the store's recorded size (256MiB unless ingest recorded one), capped by the memory budget; negative disables`)
	f.StringVar(&cacheBytes, "cache-bytes", "", "Pebble block cache size below the hot tier, e.g. 32MiB (default: 256MiB, or a sixteenth of --memory-limit when that is less); in a memory limit, size it to the store's index blocks with room to spare")
	f.StringVar(&memLimit, "memory-limit", "auto", `memory this worker may use, e.g. 8GiB (at most its memory cgroup's limit, which the kernel applies anyway): the hot tier, block cache, Go's heap limit and the bytes of lookups in flight are sized to fit it with a quarter left for the page cache; "auto": the memory cgroup's limit (a container's) when there is one; "off": no budget`)
	f.BoolVar(&directReads, "direct-reads", true, "under a memory budget, read the blocks of the rows the hot tier misses with O_DIRECT (Linux), past the page cache; false: buffered reads, their pages dropped after each read")
	f.DurationVar(&shutdownGrace, "shutdown-grace", 10*time.Second, "time in-flight lookups and updates get at shutdown (SIGTERM), after the worker left the routers; keep it below the pod's terminationGracePeriodSeconds")
	f.DurationVar(&warmEvery, "warm-snapshot-every", 10*time.Minute, "with --warm-restart, also save the hot tier's keys and frequencies this often while serving, so a worker killed without a shutdown (out of memory, its node lost) restarts warm too, from at most this long ago; a save of a million rows' keys takes about 0.15-0.25 s of one core (0: at shutdown only)")
	f.BoolVar(&warmRestart, "warm-restart", true, "when the hot tier does not hold every row: save its keys and access frequencies on shutdown, and at startup read those rows back from the store in the background while serving")
	f.IntVar(&missParallel, "miss-parallel", 0, fmt.Sprintf("reads in flight per lookup for the rows the hot tier misses (1 to 64; 0: %d): a larger-than-memory store on a device that serves many reads at once wants more", store.DefaultMissParallel))
	f.StringVar(&preload, "preload", "auto", `fill the hot tier from the store at startup and after ingest, one sequential scan per table: "auto" when the hot tier holds every row, "on" until it is full, "off" never (rows then enter on their misses)`)
	f.StringVar(&addr, "addr", "127.0.0.1:0", "gRPC listen address (port 0: chosen by the OS)")
	f.StringVar(&metricsAddr, "metrics-addr", "127.0.0.1:0", `Prometheus /metrics listen address ("off" disables)`)
	f.StringVar(&router, "router", "", "routers to announce this worker to: HOST:PORT, comma-separated; a name stands for every address it resolves to (resolved again every 30s)")
	f.StringVar(&advertise, "advertise-addr", "", `address announced to the routers, HOST[:PORT] ([IPV6]:PORT with a port) (default: the --addr host when it is specific, else the address of the interface that routes to the router, with the bound port)`)
	f.IntVar(&maxSamples, "max-samples", server.DefaultMaxSamples, "most samples one Lookup may carry")
	f.IntVar(&threads, "threads", 0, "ONNX Runtime intra-op threads of each model's cpu.onnx and pre.onnx session (0: the process's cores (GOMAXPROCS) shared among the models' sessions, at least one each; a single session with every core of the machine: ONNX Runtime's choice, one per core)")
	f.StringVar(&logFormat, "log-format", "text", "log format: text or json")
	f.StringVar(&logLevel, "log-level", "info", "log level: debug, info, warn, error")
	tlsFlags.Register(cmd, auth.Embedding)
	tlsFlags.RegisterMetrics(cmd)
	// Trust and admission (router-side trust work).
	f.BoolVar(&dictFrames, "dictionary-frames", true, "send a cut tensor that is one id's row per sample dictionary-encoded in micro-batches of 32 samples or more (each distinct row looked up and sent once; --dictionary-frames=false sends every row)")
	f.Int64Var(&maxInflightSamples, "max-inflight-samples", server.DefaultMaxInflightSamples, "samples of the lookups in flight at once; beyond it a lookup gets ResourceExhausted")
	f.BoolVar(&mend, "mend", true, "with --router: when the sequencing router finds this worker's copy of a model diverged from its peers', or behind by updates its log no longer holds (stranded), or a read finds a file of its store damaged, copy a serving worker's whole store into --db (staged beside the store, at --mend-rate) and exit, so that the restart (Kubernetes, prism up, systemd) swaps it in; the store's files from before are kept in --db/replaced-<time>. false: leave it to the operator (prism store copy)")
	f.DurationVar(&scrubEvery, "scrub-every", 24*time.Hour, "read every block of the store's table files against its checksum this often, in the background at --scrub-rate, so damage no lookup has read yet (cold rows, rows the hot tier holds) is found and mended (--mend) before it travels in a copy or outlives the other replicas (0: never)")
	f.StringVar(&scrubRate, "scrub-rate", "32MiB/s", "bound the scrub's reads to this many bytes a second, so it keeps the disk for lookups")
	f.StringVar(&mendRate, "mend-rate", "200MiB/s", "with --mend: bound the copy to this many bytes a second of the worker copied, so it keeps its disk for its lookups")
	f.DurationVar(&mendEvery, "mend-every", time.Hour, "with --mend: copy again only this long after this worker's last copy (recorded in --db/copy-mended, which the swap leaves in place), so a worker whose build answers updates otherwise than its peers' does not copy a store after each one")
	return cmd
}

// checkMissParallel refuses a --miss-parallel the store would, naming
// the flag (the store's error said "miss parallel 100").
func checkMissParallel(n int) error {
	if n < 0 || n > 64 {
		return fmt.Errorf("--miss-parallel %d: want 1 to 64 (0: %d)", n, store.DefaultMissParallel)
	}
	return nil
}

// scrubLoop scrubs st (Store.Scrub) every `every` at rate bytes a
// second until ctx ends; 0 never. The first pass waits a whole
// interval: a start-up reads the store already (ingest, preload).
func scrubLoop(ctx context.Context, st *store.Store, every time.Duration, rate int64, log *slog.Logger) {
	if every <= 0 {
		return
	}
	t := time.NewTimer(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		start := time.Now()
		rep, err := st.Scrub(ctx, rate)
		switch {
		case ctx.Err() != nil || errors.Is(err, store.ErrClosed):
			return
		case err != nil:
			log.Error("scrub: the store's files could not be read whole; trying again at the next interval", "err", err, "every", every)
		case len(rep.Damaged) > 0:
			log.Warn("scrub: table files of the store are damaged (each logged with its tables above); with --mend the worker replaces its store", "damaged", rep.Damaged, "files", rep.Files, "bytes", rep.Bytes, "elapsed", time.Since(start).Round(time.Millisecond))
		default:
			log.Info("scrub: every block of the store's table files checks", "files", rep.Files, "bytes", rep.Bytes, "elapsed", time.Since(start).Round(time.Millisecond))
		}
		t.Reset(every)
	}
}
