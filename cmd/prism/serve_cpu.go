package main

import (
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/cpuserve/server"
	"github.com/prism-serve/prism/cpuserve/store"
	"github.com/prism-serve/prism/internal/progress"
	"github.com/prism-serve/prism/internal/serve"
)

func init() { serveSubcommands = append(serveSubcommands, newServeCPUCmd) }

// newServeCPUCmd is `prism serve cpu`: the embedding tier.
func newServeCPUCmd() *cobra.Command {
	var (
		db, hotBytes, addr, metricsAddr, router, logFormat, logLevel string
		plans                                                        []string
		maxSamples, threads                                          int
	)
	cmd := &cobra.Command{
		Use:   "cpu --db DIR --plan DIR [--plan DIR ...]",
		Short: "Run the embedding tier: store lookups, cpu.onnx, and the cut tensors sent to a dense worker",
		Long: `Serve cpu opens the embedding store at --db and serves the models of the
given partition folders (--plan, repeatable). A model the store does not
hold yet is ingested from its plan first, with progress on stderr.

For each Lookup (one micro-batch) it looks up and pools the embeddings,
runs cpu.onnx where the plan has one, frames the cut tensors as Arrow and
sends them to the dense worker the request names; the scores and a
per-stage time breakdown come back. Once serving it prints one line,
"embedding tier listening on ADDR", to stdout. With --router it
announces itself to the router's registry (role "cpu").`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
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
			var hot int64 = -1 // "-1" or any negative size: no hot tier
			if !strings.HasPrefix(strings.TrimSpace(hotBytes), "-") {
				if hot, err = parseBytes(hotBytes); err != nil {
					return fmt.Errorf("--hot-bytes: %w", err)
				}
			}
			ctx, stop := signalContext()
			defer stop()
			st, err := store.Open(db, &store.Options{HotBytes: hot})
			if err != nil {
				return err
			}
			defer st.Close()
			var bar *progress.Bar
			var barModel string
			srv, err := server.New(ctx, st, server.Options{
				Plans: plans, MaxSamples: maxSamples, Threads: threads, Logger: log.With("tier", "cpu"),
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
			s, err := serve.New("cpu", serve.Options{Addr: addr, MetricsAddr: metricsAddr, Logger: log})
			if err != nil {
				return err
			}
			prismv1.RegisterEmbeddingTierServer(s.GRPC, srv)
			s.Registry.MustRegister(srv.Collectors()...)
			host, _ := os.Hostname()
			id := fmt.Sprintf("cpu/%s/%d/%d", host, os.Getpid(), time.Now().UnixNano())
			var announced <-chan struct{}
			if router != "" {
				announced = serve.Announce(ctx, router, func() *prismv1.WorkerInfo { return srv.WorkerInfo(id, s.Addr()) }, s.Log)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "embedding tier listening on %s\n", s.Addr())
			err = s.Serve(ctx)
			if announced != nil {
				<-announced
			}
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&db, "db", "", "embedding store directory (created if missing)")
	f.StringArrayVar(&plans, "plan", nil, "partition folder of a model to serve (repeatable); ingested at startup if the store lacks it")
	f.StringVar(&hotBytes, "hot-bytes", "", "hot tier size, e.g. 512MiB (default: the store's recorded size; negative disables)")
	f.StringVar(&addr, "addr", "127.0.0.1:0", "gRPC listen address (port 0: chosen by the OS)")
	f.StringVar(&metricsAddr, "metrics-addr", "127.0.0.1:0", `Prometheus /metrics listen address ("off" disables)`)
	f.StringVar(&router, "router", "", "router address to announce this worker to (optional)")
	f.IntVar(&maxSamples, "max-samples", server.DefaultMaxSamples, "most samples one Lookup may carry")
	f.IntVar(&threads, "threads", 0, "ONNX Runtime intra-op threads for cpu.onnx (0: one per core)")
	f.StringVar(&logFormat, "log-format", "text", "log format: text or json")
	f.StringVar(&logLevel, "log-level", "info", "log level: debug, info, warn, error")
	return cmd
}
