package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/spf13/cobra"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/internal/auth"
	"github.com/prism-serve/prism/internal/auth/authflag"
	"github.com/prism-serve/prism/internal/flagval"
	"github.com/prism-serve/prism/internal/kubelease"
	"github.com/prism-serve/prism/internal/readyline"
	"github.com/prism-serve/prism/internal/serve"
	"github.com/prism-serve/prism/router"
)

func init() { serveSubcommands = append(serveSubcommands, newServeRouterCmd) }

func newServeRouterCmd() *cobra.Command {
	var (
		so         serve.Options
		ro         router.Options
		logFormat  string
		logLevel   string
		maxMessage int
		tlsFlags   authflag.Flags
		tokenFile  string
		lease      string
		lo         kubelease.Options
		// watchEndpoints is --watch-endpoints.
		watchEndpoints string
	)
	cmd := &cobra.Command{
		Use:   "router",
		Short: "Run the router: Recommend API, micro-batch pipelining, worker registry",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := flagval.ListenAddrs(cmd.Flags(), "addr", "metrics-addr"); err != nil {
				return err
			}
			if so.HTTPAddr != "" {
				if err := flagval.ListenAddr("http-addr", so.HTTPAddr); err != nil {
					return err
				}
			}
			if err := flagval.Positive(cmd.Flags(), "micro-batch", "max-candidates", "max-inflight", "heartbeat", "default-timeout", "stream-window",
				"max-message-bytes", "max-context-bytes", "max-streams", "update-worker-timeout", "max-workers", "shutdown-grace",
				// The router and the lease took 0 or less for their
				// defaults (1 GiB, 256 MiB, 15 s).
				"max-inflight-bytes", "update-log-bytes", "update-log-total-bytes", "max-update-queue-bytes", "sequencer-lease-duration"); err != nil {
				return err
			}
			if !(ro.AdmitShare > 0 && ro.AdmitShare <= 1) { // NaN too
				return fmt.Errorf("--admit-share %g: want 0 < share <= 1", ro.AdmitShare)
			}
			// Checked here, before anything listens: router.Open's error
			// would otherwise reach the user with the hint of an update
			// log error.
			if maxMessage < router.MinMessageBytes {
				return fmt.Errorf("--max-message-bytes %d: want at least %d (1 MiB): an update and a page of the update log must fit in one message", maxMessage, router.MinMessageBytes)
			}
			serve.LightHeapGC()
			log, err := newLogger(logFormat, logLevel)
			if err != nil {
				return err
			}
			stopTracing, err := startTracing("prism-router", log)
			if err != nil {
				return err
			}
			defer stopTracing()
			so.Logger, ro.Logger = log, log
			so.MaxMessageBytes = maxMessage
			ro.MaxMessageBytes = maxMessage
			who := "the router"
			if so.HTTPAddr != "" && tlsFlags.Insecure {
				who = "the router (and its --http-addr, plain HTTP)"
			}
			tlsFlags.Warn(cmd.ErrOrStderr(), who)
			so.MetricsRequireClientCert = tlsFlags.MetricsClientCert
			if so.TLS, err = tlsFlags.Server(auth.Router, auth.ServerTLSOptions{AllowNoClientCert: tokenFile != ""}); err != nil {
				return err
			}
			if tokenFile != "" {
				if so.TLS == nil {
					return errors.New("--auth-token-file needs TLS (--certs or --tls-*): over --insecure the token would travel in the clear")
				}
				if so.BearerToken, err = auth.ReadToken(tokenFile); err != nil {
					return fmt.Errorf("--auth-token-file: %w", err)
				}
				if w := auth.TokenModeWarning(tokenFile); w != "" {
					fmt.Fprintf(cmd.ErrOrStderr(), "prism: warning: %s\n", w)
				}
			}
			// The router dials its embedding workers as router.
			toEmbedding, err := tlsFlags.Dial(auth.Router, auth.Embedding)
			if err != nil {
				return err
			}
			ro.DialOptions = append(ro.DialOptions, toEmbedding)
			// It probes an overdue dense worker's health as router too.
			toDense, err := tlsFlags.Dial(auth.Router, auth.Dense)
			if err != nil {
				return err
			}
			ro.DenseDialOptions = append(ro.DenseDialOptions, toDense)
			// and forwards updates to the sequencing router as router.
			toRouter, err := tlsFlags.Dial(auth.Router, auth.Router)
			if err != nil {
				return err
			}
			ro.SequencerDialOptions = append(ro.SequencerDialOptions, toRouter)
			if so.TLS != nil {
				// The registry binds each worker to its certificate,
				// and keeps one id live per worker's own certificate.
				ro.Peer = auth.Peer
				ro.PeerInstance = func(ctx context.Context) bool { return auth.PeerInstance(ctx) != "" }
			}
			// A --sequencer without a port (a typo, a missing :8500) was
			// taken: the router served, warned every few seconds that it
			// could not reach it, and forwarded every update there to fail.
			if ro.Sequencer != "" {
				if host, port, err := net.SplitHostPort(ro.Sequencer); err != nil || host == "" || port == "" {
					return fmt.Errorf("--sequencer %q: want HOST:PORT, the address of the router that orders embedding updates (an IPv6 address in brackets: [fd00::5]:8500)", ro.Sequencer)
				}
				// It then followed itself, warning each second that its
				// sequencer "does not sequence embedding updates now".
				if ro.Sequencer == so.Addr {
					return fmt.Errorf("--sequencer %s is this router's own --addr: give the sequencing router no --sequencer, and every other router its address", ro.Sequencer)
				}
			}
			s, err := serve.New("router", so)
			if err != nil {
				return err
			}
			if lease != "" {
				if ro.Sequencer != "" {
					return errors.New("--sequencer-lease elects the router that sequences updates; --sequencer names it: give one")
				}
				if lo.Namespace, lo.Name, err = kubelease.ParseLease(lease); err != nil {
					return fmt.Errorf("--sequencer-lease: %w", err)
				}
				if lo.Identity == "" {
					return errors.New("--sequencer-lease needs --advertise-addr: the address the other routers dial this one at (on Kubernetes, the pod's DNS name or IP and the port)")
				}
				// The lease's own check said "identity ..." and pointed
				// at --kubeconfig and --sequencer-lease-duration.
				if host, port, err := net.SplitHostPort(lo.Identity); err != nil || host == "" || port == "" {
					return fmt.Errorf("--advertise-addr %q: want HOST:PORT, the address the other routers dial this one at (an IPv6 address in brackets: [fd00::5]:8500)", lo.Identity)
				}
				lo.Logger = log
				if ro.Election, err = kubelease.New(lo); err != nil {
					return fmt.Errorf("--sequencer-lease: %w (--kubeconfig, --sequencer-lease-duration)", err)
				}
			}
			if ro.UpdateLogDir == "" && ro.Sequencer == "" && ro.Election == nil {
				log.Info("embedding update log kept in memory (--update-log-dir not set): a restarted router cannot catch up workers that missed updates before it")
			}
			r, err := router.Open(ro, s.Registry)
			if err != nil {
				return fmt.Errorf("%w (--update-log-dir)", err)
			}
			// Health reports SERVING once workers of both tiers have
			// registered, or after the announce window whatever registered
			// (router.DefaultAnnounceWindow: long enough for workers that
			// resolve the routers' name to find this one).
			s.ReadyGate = r.Ready()
			prismv1.RegisterRecommenderServer(s.GRPC, r)
			// Recommend over HTTP/JSON (--http-addr): the same handler,
			// called in process with the context a gRPC call has.
			s.HandleJSON(r.RecommendJSONRoute())
			s.HandleHTTP(router.OpenAPIPath, router.OpenAPIHandler())
			prismv1.RegisterRegistryServer(s.GRPC, r.Reg)
			prismv1.RegisterEmbeddingsServer(s.GRPC, r.Updater())
			ctx, stop := signalContext()
			defer stop()
			// The registry's upkeep and the worker connections outlive the
			// signal: requests in flight still need them while the server
			// drains. They stop after Serve returns.
			rctx, cancel := context.WithCancel(context.Background())
			ran := make(chan struct{})
			go func() { r.Run(rctx); close(ran) }()
			if watchEndpoints != "" {
				eo := kubelease.EndpointsOptions{Kubeconfig: lo.Kubeconfig, Logger: log}
				if eo.Namespace, eo.Services, err = kubelease.ParseServices(watchEndpoints); err != nil {
					cancel()
					return fmt.Errorf("--watch-endpoints: %w", err)
				}
				toPod := func(p kubelease.Pod) router.PodName {
					return router.PodName{Addresses: p.Addresses, Hostname: p.Hostname, Name: p.Name}
				}
				go func() {
					err := kubelease.WatchEndpoints(rctx, eo,
						func(p kubelease.Pod) {
							if ids := r.Reg.PodGone(toPod(p)); len(ids) > 0 {
								log.Warn("workers removed: their pod is no longer a ready endpoint", "pod", p.Name, "workers", ids)
							}
						},
						func(p kubelease.Pod) { r.Reg.PodBack(toPod(p)) })
					if err != nil {
						log.Error("watching the workers' EndpointSlices stopped; workers leave by missed heartbeats only", "err", err)
					}
				}()
			}
			readyline.WriteRouter(cmd.OutOrStdout(), s.Addr(), s.MetricsAddr(), s.HTTPAddr())
			// Told to stop, a router holding the sequencing Lease gives it
			// up before it drains (Router.Resign): another router
			// sequences the updates meanwhile. Its RecommendStream
			// streams take no more requests and end once those taken are
			// answered (Router.Drain): the server's graceful stop waits
			// for them.
			go func() {
				select {
				case <-ctx.Done():
					r.Resign()
					r.Drain()
				case <-rctx.Done():
				}
			}()
			err = s.Serve(ctx)
			cancel()
			<-ran // with --sequencer-lease, the lease is given up
			r.Close()
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&so.Addr, "addr", "127.0.0.1:8500", "gRPC listen address (Recommend and the registry)")
	f.StringVar(&so.HTTPAddr, "http-addr", "", `HTTP/JSON listen address ("": off): POST /v1/recommend takes a RecommendRequest as JSON (what loadgen --print-request writes) and answers the RecommendResponse as JSON; HTTPS with the router's certificate and the same authorization as gRPC (a client certificate or --auth-token-file's bearer token), plain HTTP only with --insecure`)
	f.StringVar(&so.MetricsAddr, "metrics-addr", "127.0.0.1:0", `Prometheus /metrics listen address ("off" to disable)`)
	f.IntVar(&ro.MicroBatch, "micro-batch", 512, "most candidates per micro-batch (a request is cut into equal micro-batches of at most this many)")
	f.IntVar(&ro.MaxCandidates, "max-candidates", 4096, "most candidates in one request")
	f.Int64Var(&ro.MaxInflight, "max-inflight", 65536, "samples admitted at once; beyond it requests get ResourceExhausted")
	f.Float64Var(&ro.AdmitShare, "admit-share", 1, "admit a request predicted to take at most this share of the time to its deadline (0 < share <= 1): the ceiling of a share that shrinks while admitted requests miss their deadlines and returns here when they no longer do (prism_router_admit_share)")
	f.BoolVar(&ro.AdmitLimit, "admit-limit", false, "admit by an adaptive limit on samples in flight, grown while latencies stay well inside their deadlines and shrunk as they near them, instead of by each request's predicted finish")
	f.BoolVar(&ro.FixedAdmission, "fixed-admission", false, "admit by --max-inflight and --max-inflight-bytes only, not also by predicted finish time against the deadline")
	f.DurationVar(&ro.Heartbeat, "heartbeat", time.Second, "worker heartbeat interval; silent for 3 intervals means removed")
	f.DurationVar(&ro.DefaultTimeout, "default-timeout", 30*time.Second, "deadline of a request whose client set none, and of each request of a RecommendStream (the stream's deadline is its whole job's; it decides when sooner)")
	f.IntVar(&ro.StreamWindow, "stream-window", 16, "requests of one RecommendStream worked on at once (answers stay in order)")
	f.Int64Var(&ro.UpdateLogBytes, "update-log-bytes", 256<<20, "bytes of memory that recent embedding updates kept per model (per shard of a sharded model) to catch lagging embedding workers up may hold: their rows, 8 bytes an id, and about 300 bytes an update")
	f.Int64Var(&ro.MaxUpdateQueueBytes, "max-update-queue-bytes", router.DefaultMaxUpdateQueueBytes, "bytes of this router's memory the embedding updates taken and not yet answered (waiting for their model's turn, or being written) may hold: each its decoded message and about 14 KiB for its call (handler stack, gRPC stream); beyond it updates get ResourceExhausted")
	f.Int64Var(&ro.UpdateLogTotalBytes, "update-log-total-bytes", 1<<30, "bound on the memory every model's recent updates hold together (counted as --update-log-bytes counts it): a model's log may use what the others leave of it (up to --update-log-bytes), and at least an equal share")
	f.IntVar(&maxMessage, "max-message-bytes", 64<<20, "largest request accepted (at least 1 MiB; an update is refused above it less 4 KiB)")
	f.DurationVar(&so.ShutdownGrace, "shutdown-grace", 10*time.Second, "time in-flight requests get at shutdown")
	f.StringVar(&logFormat, "log-format", "text", "text or json")
	f.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	f.StringVar(&tokenFile, "auth-token-file", "", "file holding a bearer token that admits clients without a certificate to Recommend (authorization: Bearer TOKEN)")
	tlsFlags.Register(cmd, auth.Router)
	tlsFlags.RegisterMetrics(cmd)
	// Trust and admission (router-side trust work).
	f.Int64Var(&ro.MaxInflightBytes, "max-inflight-bytes", router.DefaultMaxInflightBytes, "request bytes admitted at once (a shared context counts once per micro-batch); beyond it requests get ResourceExhausted")
	f.IntVar(&ro.MaxContextBytes, "max-context-bytes", router.DefaultMaxContextBytes, "largest shared context of one request")
	f.IntVar(&ro.MaxStreams, "max-streams", router.DefaultMaxStreams, "RecommendStream streams open at once")
	f.DurationVar(&ro.UpdateWorkerTimeout, "update-worker-timeout", router.DefaultUpdateWorkerTimeout, "how long an embedding update waits for one worker before leaving it behind (caught up later)")
	f.IntVar(&ro.Limits.MaxWorkers, "max-workers", 4096, "workers registered at once")
	// Durable updates.
	ro.UpdateQuorum = router.QuorumMajority
	f.Var(&ro.UpdateQuorum, "update-quorum", "how many of a model's embedding workers must hold an update before it is acknowledged: one, majority or all (below it the client gets Unavailable; the update still reaches the others by catch-up)")
	f.StringVar(&ro.UpdateLogDir, "update-log-dir", "", `Pebble folder keeping the recent embedding updates across router restarts ("": in memory)`)
	f.StringVar(&lease, "sequencer-lease", "", `with several routers on Kubernetes: NAMESPACE/NAME of the Lease through which the routers elect the one that orders embedding updates (the others forward to it); needs --advertise-addr, not with --sequencer or --update-log-dir`)
	f.StringVar(&lo.Identity, "advertise-addr", "", "with --sequencer-lease: the address the other routers dial this one at (HOST:PORT), its identity in the Lease")
	f.StringVar(&lo.Kubeconfig, "kubeconfig", "", `with --sequencer-lease or --watch-endpoints outside a cluster: the kubeconfig file reaching the API server ("": the pod's in-cluster configuration)`)
	f.StringVar(&watchEndpoints, "watch-endpoints", "", `on Kubernetes: NAMESPACE/SERVICE[,SERVICE...], the workers' Services whose EndpointSlices to watch: a worker whose Pod stops being a ready endpoint leaves the registry at once instead of after three missed heartbeats, and rejoins when it is ready again`)
	f.DurationVar(&lo.LeaseDuration, "sequencer-lease-duration", 15*time.Second, "with --sequencer-lease: how long a router that stopped renewing keeps the Lease, in whole seconds as the Lease records it (it renews within 2/3 of it, tries every 2/15 of it)")
	f.StringVar(&ro.Sequencer, "sequencer", "", `with several routers: the address of the one that orders embedding updates; this router forwards Embeddings.Update there ("": this router orders them; give every other router this one's address)`)
	return cmd
}
