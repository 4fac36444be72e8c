package main

import (
	"errors"
	"fmt"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/gpuserve"
	"github.com/prism-serve/prism/internal/auth"
	"github.com/prism-serve/prism/internal/auth/authflag"
	"github.com/prism-serve/prism/internal/flagval"
	"github.com/prism-serve/prism/internal/ort"
	"github.com/prism-serve/prism/internal/readyline"
	"github.com/prism-serve/prism/internal/serve"
)

func init() { serveSubcommands = append(serveSubcommands, newServeDenseCmd) }

// newServeDenseCmd is `prism serve dense` (formerly `serve gpu`).
func newServeDenseCmd() *cobra.Command {
	var shutdownGrace time.Duration
	var (
		addr, metricsAddr, router, advertise string
		plans                                []string
		maxBatch, maxQueue                   int
		maxDelay                             time.Duration
		maxSamples, threads                  int
		spin, sharedArena                    bool
		maxMessage, sessions                 int
		logFormat, logLevel                  string
		batchOrder, acrossModels             string
		tlsFlags                             authflag.Flags
	)
	cmd := &cobra.Command{
		Use:     "dense --plan DIR [--plan DIR...]",
		Aliases: []string{"gpu"},
		Short:   "Run the dense tier: dense.onnx through ONNX Runtime with dynamic batching",
		Long: `Run the dense tier (gpuserve): it scores the cut tensors the embedding tier
sends (DenseTier.Score) with each partitioned model's dense.onnx, batching
concurrent requests up to --max-batch samples or --max-delay. Devices are
discovered through NVML; with no NVIDIA driver, or an ONNX Runtime without
the CUDA execution provider, it says so once and serves on the CPU.

Once serving it prints one line, "dense tier listening on ADDR", to stdout.
With --router it announces itself to every router's registry (role "dense")
at --advertise-addr.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// The server took a --max-message-bytes of 0 or less for 64 MiB.
			if err := flagval.ListenAddrs(cmd.Flags(), "addr", "metrics-addr"); err != nil {
				return err
			}
			if err := flagval.Positive(cmd.Flags(), "max-delay", "max-samples", "sessions", "max-message-bytes", "shutdown-grace"); err != nil {
				return err
			}
			// Checked here, naming the flag: the dense tier's own checks
			// said "sessions 100" and "across models".
			if sessions > 64 {
				return fmt.Errorf("--sessions %d: want 1 to 64 per model", sessions)
			}
			if acrossModels != "on" && acrossModels != "off" {
				return fmt.Errorf("--across-models %q: want on or off", acrossModels)
			}
			// The batcher took a negative queue bound for its default.
			if err := flagval.NonNegative(cmd.Flags(), "max-queue"); err != nil {
				return err
			}
			if maxBatch < 0 {
				return fmt.Errorf("--max-batch %d: want 0 (by device) or more", maxBatch)
			}
			if threads < 0 {
				return fmt.Errorf("--threads %d: want 0 (the cores shared among the sessions) or more", threads)
			}
			if err := flagval.AtMostPerCore(cmd.Flags(), "threads"); err != nil {
				return err
			}
			serve.LightHeapGC()
			log, err := newLogger(logFormat, logLevel)
			if err != nil {
				return err
			}
			stopTracing, err := startTracing("prism-dense", log)
			if err != nil {
				return err
			}
			defer stopTracing()
			order, err := gpuserve.ParseOrder(batchOrder)
			if err != nil {
				return fmt.Errorf("--batch-order: %w", err)
			}
			tlsFlags.Warn(cmd.ErrOrStderr(), "the dense tier")
			tlsConf, err := tlsFlags.Server(auth.Dense, auth.ServerTLSOptions{})
			if err != nil {
				return err
			}
			toRouter, err := tlsFlags.Dial(auth.Dense, auth.Router)
			if err != nil {
				return err
			}
			if maxDelay < 0 {
				return fmt.Errorf("--max-delay %v: want a positive duration", maxDelay)
			}
			if sharedArena {
				if err := ort.ShareArena(); err != nil {
					return fmt.Errorf("--shared-arena: %w", err)
				}
			}
			dense, err := gpuserve.New(gpuserve.Options{
				Plans:        plans,
				Batch:        gpuserve.BatchOptions{MaxBatch: maxBatch, MaxDelay: maxDelay, MaxQueue: maxQueue, Order: order},
				Threads:      threads,
				Sessions:     sessions,
				AcrossModels: acrossModels,
				Spin:         spin,
				MaxSamples:   maxSamples,
				NVML:         nvml.New(),
				Logger:       log.With("tier", "dense"),
			})
			if be := (*gpuserve.BatchMemoryError)(nil); errors.As(err, &be) && be.MaxBatch == maxBatch {
				return fmt.Errorf("--max-batch %d: %w", maxBatch, err)
			}
			if err != nil {
				return err
			}
			defer dense.Close()
			s, err := serve.New("dense", serve.Options{Addr: addr, MetricsAddr: metricsAddr, MaxMessageBytes: maxMessage, ShutdownGrace: shutdownGrace, TLS: tlsConf, MetricsRequireClientCert: tlsFlags.MetricsClientCert, Logger: log})
			if err != nil {
				return err
			}
			if err := dense.Register(s.Registry); err != nil {
				return err
			}
			prismv1.RegisterDenseTierServer(s.GRPC, dense)
			ctx, stop := signalContext()
			defer stop()
			return s.ServeWorker(ctx, serve.WorkerOptions{
				Router:        router,
				AdvertiseAddr: advertise,
				Info:          dense.WorkerInfo,
				Ready:         func(addr string) { readyline.WriteDense(cmd.OutOrStdout(), addr) },
				// In-flight RPCs are done (or cut off) by now: drain the
				// batchers.
				Drained:     func() { dense.Close() },
				DialOptions: []grpc.DialOption{toRouter},
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&addr, "addr", "127.0.0.1:0", "gRPC listen address (port 0: the OS picks)")
	f.StringVar(&metricsAddr, "metrics-addr", "127.0.0.1:0", `Prometheus /metrics listen address ("off" disables)`)
	f.StringArrayVar(&plans, "plan", nil, "partition folder (plan.json, dense.onnx) of a model to serve; repeatable")
	f.StringVar(&router, "router", "", "routers to announce this worker to: HOST:PORT, comma-separated; a name stands for every address it resolves to (resolved again every 30s)")
	f.StringVar(&advertise, "advertise-addr", "", `address announced to the routers, HOST[:PORT] ([IPV6]:PORT with a port) (default: the --addr host when it is specific, else the address of the interface that routes to the router, with the bound port)`)
	f.IntVar(&maxBatch, "max-batch", 0, "most samples in one ONNX Runtime run (0: by device, 512 on the CPU, 4096 on CUDA)")
	f.StringVar(&acrossModels, "across-models", "on", "with several --plan: run the models' formed batches by deadline across them, at most --sessions at once in all (on), or each model's as formed (off)")
	f.StringVar(&batchOrder, "batch-order", "edf", "how a batch is filled: edf (earliest deadline first, work that would miss its deadline refused) or fifo (arrival order)")
	f.DurationVar(&maxDelay, "max-delay", 2*time.Millisecond, "how long a batch's first request waits for others")
	f.IntVar(&maxQueue, "max-queue", 0, "most samples queued or running per model before ResourceExhausted (0: 64 batches)")
	f.IntVar(&maxSamples, "max-samples", 4096, "most samples in one Score request (more: InvalidArgument)")
	f.IntVar(&threads, "threads", 0, "ONNX Runtime intra-op threads of each session, of each model (0: the process's cores (GOMAXPROCS) shared among the sessions that run at once, --sessions; with one session and every core of the machine, ONNX Runtime's choice: one per core)")
	f.IntVar(&sessions, "sessions", 1, "ONNX Runtime sessions per model on this worker's device, each fed by its own batching loop (one's host work overlaps another's run)")
	f.BoolVar(&sharedArena, "shared-arena", false, "every model's ONNX Runtime sessions allocate CPU memory from one arena instead of one each: a worker serving many models holds about one batch's peak, not the sum of every session's (20 sessions of dlrm-kaggle's dense side at --max-batch 4096: 872 to 177 MB resident); CUDA memory keeps its provider's arenas")
	f.BoolVar(&spin, "spin", false, "let ONNX Runtime's idle threads spin-wait (faster wake-up; steals CPU from tiers sharing the machine)")
	f.IntVar(&maxMessage, "max-message-bytes", 64<<20, "largest Score request accepted")
	f.DurationVar(&shutdownGrace, "shutdown-grace", 10*time.Second, "time in-flight Score calls get at shutdown (SIGTERM), after the worker left the routers; keep it below the pod's terminationGracePeriodSeconds")
	f.StringVar(&logFormat, "log-format", "text", "log format: text or json")
	f.StringVar(&logLevel, "log-level", "info", "log level: debug, info, warn, error")
	tlsFlags.Register(cmd, auth.Dense)
	tlsFlags.RegisterMetrics(cmd)
	cmd.MarkFlagRequired("plan")
	return cmd
}
