// Package serve is the scaffolding every Prism tier shares: a gRPC server
// with standard health checking and reflection (so grpcurl and ghz work
// out of the box), RPC metrics by method and code, a Prometheus /metrics
// endpoint (HTTPS when the tier serves TLS), structured logs, graceful shutdown that finishes in-flight
// requests, the worker's heartbeat to the router's registry, and an
// optional HTTP/JSON front of unary methods (httpjson.go).
package serve

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/tap"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	// Registers gzip, so the tiers take compressed messages: grpc-js
	// (grpc.default_compression_algorithm), Java's and C++'s clients
	// send gzip when configured to, and without it every such call was
	// Unimplemented ("Decompressor is not installed"). A message is
	// still bounded by MaxMessageBytes once decompressed; answers are
	// compressed only to a caller that compressed its request.
	_ "google.golang.org/grpc/encoding/gzip"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/internal/auth"
	"github.com/prism-serve/prism/internal/tracing"
)

// Options configure a tier's server.
type Options struct {
	// Addr is the gRPC listen address (default 127.0.0.1:0: a port the OS picks).
	Addr string
	// Listener, if set, is served instead of a listener on Addr (tests
	// serve over bufconn); the Server owns it from New on.
	Listener net.Listener
	// MetricsAddr serves /metrics (default 127.0.0.1:0; "off" disables):
	// over HTTPS with TLS's certificate when TLS is set, else plain HTTP.
	MetricsAddr string
	// MetricsRequireClientCert, with TLS, refuses a /metrics client (a
	// scraper) without a certificate signed by the cluster's CA; by
	// default one is verified if given but not needed, so a scraper
	// holding only the CA (to verify the server) can read the metrics.
	MetricsRequireClientCert bool
	// HTTPAddr, when set, serves the routes given to HandleJSON over
	// HTTP/JSON there (HTTPS with TLS's certificate when TLS is set,
	// authorized as their gRPC methods are); "" serves none.
	HTTPAddr string
	// MaxMessageBytes bounds one request (default 64 MiB), an HTTP/JSON
	// body too.
	MaxMessageBytes int
	// ShutdownGrace is how long in-flight requests get at shutdown (default 10s).
	ShutdownGrace time.Duration
	// MaxConcurrentStreams bounds the RPCs one client connection runs at
	// once (default 1024): a client cannot open streams without bound.
	MaxConcurrentStreams uint32
	// TLS, when set, serves over TLS with it (auth.ServerTLS) and enforces
	// auth.Table on every RPC: the caller's role, from its certificate,
	// must be one the table allows for the method. Nil serves plaintext
	// with no authentication.
	TLS *tls.Config
	// BearerToken, with TLS, also admits callers without a certificate
	// that send "authorization: Bearer TOKEN" to the methods the table
	// opens to the token (Recommend, health, reflection).
	BearerToken string
	Logger      *slog.Logger
}

// EnsureDefaults fills zero fields.
func (o *Options) EnsureDefaults() {
	if o.Addr == "" {
		o.Addr = "127.0.0.1:0"
	}
	if o.MetricsAddr == "" {
		o.MetricsAddr = "127.0.0.1:0"
	}
	if o.MaxMessageBytes <= 0 {
		o.MaxMessageBytes = 64 << 20
	}
	if o.ShutdownGrace <= 0 {
		o.ShutdownGrace = 10 * time.Second
	}
	if o.MaxConcurrentStreams == 0 {
		o.MaxConcurrentStreams = 1024
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
}

// Validate checks the options (after EnsureDefaults).
func (o *Options) Validate() error {
	if o.BearerToken != "" && o.TLS == nil {
		return errors.New("a bearer token needs TLS: over plaintext it would travel in the clear")
	}
	return nil
}

// Server is one tier's gRPC and metrics endpoints.
type Server struct {
	GRPC     *grpc.Server
	Health   *health.Server
	Registry *prometheus.Registry
	Log      *slog.Logger
	name     string
	opts     Options
	lis      net.Listener
	mlis     net.Listener
	http     *http.Server
	// alis and api are the HTTP/JSON endpoint (Options.HTTPAddr), nil
	// when off; routes are its methods (HandleJSON), jsonCalls its
	// handlers running, which Serve waits for as gRPC's are.
	alis      net.Listener
	api       *http.Server
	routes    map[string]JSONRoute
	open      map[string]http.Handler // HandleHTTP
	jsonCalls sync.WaitGroup
	requests  *prometheus.CounterVec
	latency   *prometheus.HistogramVec
	// methods are the full names of the methods registered on GRPC,
	// set by Serve: a call refused before it reaches a handler is
	// counted under its method only when it names one of them, so the
	// caller cannot add label series of its choosing.
	methods atomic.Pointer[map[string]bool]
	// inflight counts the calls each method's handlers are running
	// (method name to *atomic.Int64): a shutdown whose grace ran out
	// says which it cut off.
	inflight sync.Map
	// ReadyGate, when set before Serve, keeps gRPC health NOT_SERVING
	// (load balancers and readiness probes send nothing yet) until it is
	// closed; the server takes calls all the same.
	ReadyGate <-chan struct{}
}

// New binds the listeners (so Addr is known at once) and builds the gRPC
// server; register services on s.GRPC, then call Serve.
func New(name string, o Options, extra ...grpc.ServerOption) (*Server, error) {
	o.EnsureDefaults()
	if err := o.Validate(); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	s := &Server{name: name, opts: o, Log: o.Logger.With("tier", name), Registry: prometheus.NewRegistry()}
	s.requests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "prism", Name: "rpc_requests_total", Help: "RPCs handled, by method and gRPC status code.",
	}, []string{"method", "code"})
	s.latency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: "prism", Name: "rpc_latency_seconds", Help: "RPC latency, by method.",
		Buckets: LatencyBuckets,
	}, []string{"method"})
	s.Registry.MustRegister(s.requests, s.latency, auth.ExpiryCollector(), collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	s.Registry.MustRegister(tracing.SpanCounters()...)
	var err error
	if s.lis = o.Listener; s.lis == nil {
		if s.lis, err = net.Listen("tcp", o.Addr); err != nil {
			return nil, fmt.Errorf("%s: --addr %s: %w", name, o.Addr, err)
		}
	}
	if o.MetricsAddr != "off" {
		if s.mlis, err = net.Listen("tcp", o.MetricsAddr); err != nil {
			s.lis.Close()
			return nil, fmt.Errorf("%s: --metrics-addr %s: %w", name, o.MetricsAddr, err)
		}
		mux := http.NewServeMux()
		// OpenMetrics to a scraper that asks for it (Prometheus does):
		// the only format that carries the latency histograms'
		// exemplars, the trace ids of sampled requests.
		mux.Handle("/metrics", promhttp.HandlerFor(s.Registry, promhttp.HandlerOpts{EnableOpenMetrics: true}))
		switch v := os.Getenv("PRISM_PPROF"); v {
		case "", "0", "1":
		default:
			// "true" or "yes" left profiling off without a word.
			s.Log.Warn("PRISM_PPROF is neither 1 (serve /debug/pprof/ beside /metrics) nor 0: profiling stays off", "PRISM_PPROF", v)
		}
		if os.Getenv("PRISM_PPROF") == "1" {
			// Profiling for the engineer chasing where the time goes;
			// off unless asked for, since it exposes internals.
			mux.HandleFunc("/debug/pprof/", pprof.Index)
			mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
			mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
			mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
			// Contention too (/debug/pprof/mutex, /debug/pprof/block):
			// one mutex event in 10 and blocking of 10 us or more.
			runtime.SetMutexProfileFraction(10)
			runtime.SetBlockProfileRate(10_000)
		}
		// The server's own complaints (a scraper speaking plain HTTP to
		// the HTTPS port, a failed handshake) at debug level.
		s.http = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, ErrorLog: slog.NewLogLogger(s.Log.Handler(), slog.LevelDebug)}
		if o.TLS != nil {
			s.mlis = tls.NewListener(s.mlis, MetricsTLS(o.TLS, o.MetricsRequireClientCert))
		}
	}
	if o.HTTPAddr != "" {
		if s.alis, err = listenJSON(o); err != nil {
			s.lis.Close()
			if s.mlis != nil {
				s.mlis.Close()
			}
			return nil, fmt.Errorf("%s: --http-addr %s: %w", name, o.HTTPAddr, err)
		}
	}
	unary, stream := []grpc.UnaryServerInterceptor{s.unaryMetrics}, []grpc.StreamServerInterceptor{s.streamMetrics}
	var creds []grpc.ServerOption
	if o.TLS != nil {
		// After the metrics: refused calls are counted, by their code.
		p := auth.Policy{Token: o.BearerToken}
		unary, stream = append(unary, p.UnaryInterceptor()), append(stream, p.StreamInterceptor())
		creds = append(creds, grpc.Creds(credentials.NewTLS(o.TLS)))
		// No read buffer of gRPC's own under TLS: crypto/tls already
		// buffers each decrypted record, so gRPC's 32 KiB bufio.Reader
		// above it only copied every received byte once more before the
		// framer copied it again into the message (on the dense worker,
		// every 463 KB cut-tensor frame). The framer reads the record
		// buffer directly; a small read (a frame header) costs no syscall.
		creds = append(creds, grpc.ReadBufferSize(0))
		// The same check before the request is read: gRPC decodes a
		// message before any interceptor runs, so without this a caller
		// with no right to a method could still make the server read
		// (and decode) up to MaxMessageBytes per stream.
		creds = append(creds, grpc.InTapHandle(func(ctx context.Context, info *tap.Info) (context.Context, error) {
			if err := p.Authorize(metadata.NewIncomingContext(ctx, info.Header), info.FullMethodName); err != nil {
				// Counted by its code, as a handled call is; the name is the
				// caller's, so only a registered method is a label of its own.
				s.observe(s.label(info.FullMethodName), time.Now(), err)
				return nil, err
			}
			return ctx, nil
		}))
	}
	opts := append([]grpc.ServerOption{
		grpc.MaxRecvMsgSize(o.MaxMessageBytes),
		grpc.MaxSendMsgSize(o.MaxMessageBytes),
		grpc.MaxConcurrentStreams(o.MaxConcurrentStreams),
		// Headers are read and decoded before the tap can refuse a
		// caller: gRPC's default would take 16 MiB of them per request
		// from anyone who completes a handshake.
		grpc.MaxHeaderListSize(maxHeaderListBytes),
		grpc.ChainUnaryInterceptor(unary...),
		grpc.ChainStreamInterceptor(stream...),
		// Stop (after the grace period) waits for handlers to return, so
		// a tier never frees what a handler still uses.
		grpc.WaitForHandlers(true),
		// Prism's clients ping every 10 s (to notice lost peers); allow
		// that, where gRPC's default would answer GOAWAY too_many_pings.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}),
	}, append(append(creds, ServerOptions()...), extra...)...)
	s.GRPC = grpc.NewServer(opts...)
	s.Health = health.NewServer()
	healthpb.RegisterHealthServer(s.GRPC, s.Health)
	reflection.Register(s.GRPC)
	return s, nil
}

// LatencyBuckets are prism_rpc_latency_seconds' bucket bounds, from 50
// us to 10 s: at most 1.5 apart between 2 ms and 0.5 s, and the 60 ms
// SLO (loadgen --slo, tune --slo) one of them, so a p99 read from the
// histogram (the loan driver's p99= limit on the routers' Recommend, an
// alert on le="0.06") tells an answer inside the SLO from one past it.
// Powers of two from 50 us put 51.2 and 102.4 ms around it: a p99 of 55
// ms read as 102.4.
var LatencyBuckets = []float64{
	50e-6, 100e-6, 200e-6, 500e-6,
	0.001, 0.002, 0.003, 0.004, 0.005, 0.0075,
	0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.06, 0.075,
	0.1, 0.125, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.75,
	1, 2.5, 5, 10,
}

// maxHeaderListBytes bounds one request's headers (method, metadata,
// the bearer token): Prism's callers send well under a kilobyte.
const maxHeaderListBytes = 64 << 10

// unknownMethod labels the refused calls to a method the server does
// not serve.
const unknownMethod = "unknown"

// label is the method label of a call to method: method itself when it
// is registered, else unknownMethod.
func (s *Server) label(method string) string {
	if m := s.methods.Load(); m != nil && (*m)[method] {
		return method
	}
	return unknownMethod
}

// MetricsTLS is the configuration /metrics is served with next to a
// gRPC server serving with grpcTLS: the same certificate and CA, HTTP/2
// or HTTP/1.1, and a client certificate verified when given, required
// only with requireClientCert.
func MetricsTLS(grpcTLS *tls.Config, requireClientCert bool) *tls.Config {
	// The fields set in what each handshake takes too: the certificate
	// files are reloaded when rewritten (auth.ServerTLS).
	return auth.ServerConfigFor(grpcTLS, func(c *tls.Config) {
		c.NextProtos = []string{"h2", "http/1.1"}
		c.ClientAuth = tls.VerifyClientCertIfGiven
		if requireClientCert {
			c.ClientAuth = tls.RequireAndVerifyClientCert
		}
	})
}

// MetricsScheme is the scheme of a tier's /metrics URL: "https" when it
// serves gRPC over TLS, else "http".
func MetricsScheme(tlsOn bool) string {
	if tlsOn {
		return "https"
	}
	return "http"
}

// Addr is the gRPC address.
func (s *Server) Addr() string { return s.lis.Addr().String() }

// MetricsAddr is the /metrics address, "" when disabled.
func (s *Server) MetricsAddr() string {
	if s.mlis == nil {
		return ""
	}
	return s.mlis.Addr().String()
}

// Serve serves until ctx is cancelled, then stops taking new RPCs, marks
// itself not serving, and lets in-flight ones finish for ShutdownGrace.
func (s *Server) Serve(ctx context.Context) error {
	// Services are registered by now (gRPC refuses them after Serve).
	methods := map[string]bool{}
	// Health answers for each service by name as for the server (""):
	// a probe or a client's health checking configured with a service
	// name (grpc_health_probe -service, the kubelet's probe service,
	// a service config's healthCheckConfig.serviceName) was answered
	// NotFound ("unknown service") and took a serving tier for down.
	initial := healthpb.HealthCheckResponse_SERVING
	if s.ReadyGate != nil {
		initial = healthpb.HealthCheckResponse_NOT_SERVING
	}
	s.Health.SetServingStatus("", initial)
	for svc, info := range s.GRPC.GetServiceInfo() {
		for _, m := range info.Methods {
			methods["/"+svc+"/"+m.Name] = true
		}
		s.Health.SetServingStatus(svc, initial)
	}
	s.methods.Store(&methods)
	gate := s.ReadyGate
	errc := make(chan error, 3)
	go func() { errc <- s.GRPC.Serve(s.lis) }()
	if s.http != nil {
		go func() {
			if err := s.http.Serve(s.mlis); err != nil && !errors.Is(err, http.ErrServerClosed) {
				errc <- err
			}
		}()
	}
	if s.alis != nil {
		s.api = s.jsonServer()
		go func() {
			if err := s.api.Serve(s.alis); err != nil && !errors.Is(err, http.ErrServerClosed) {
				errc <- err
			}
		}()
	}
	attrs := []any{"addr", s.Addr(), "metrics", s.MetricsAddr()}
	if s.alis != nil {
		attrs = append(attrs, "http", s.HTTPAddr())
	}
	s.Log.Info("serving", attrs...)
	for waiting := true; waiting; {
		select {
		case err := <-errc:
			s.GRPC.Stop()
			if s.http != nil {
				s.http.Close()
			}
			if s.api != nil {
				s.api.Close()
				s.jsonCalls.Wait()
			}
			return fmt.Errorf("%s: serve: %w", s.name, err)
		case <-gate: // nil (never ready) without a gate
			s.Health.Resume()
			gate = nil
		case <-ctx.Done():
			waiting = false
		}
	}
	s.Log.Info("shutting down", "grace", s.opts.ShutdownGrace)
	s.Health.Shutdown()
	done := make(chan struct{})
	go func() {
		// The HTTP/JSON endpoint drains beside gRPC, in the same grace:
		// no new requests, the ones in flight answered.
		var wg sync.WaitGroup
		if s.api != nil {
			wg.Go(func() {
				_ = s.api.Shutdown(context.Background())
			})
		}
		s.GRPC.GracefulStop()
		wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(s.opts.ShutdownGrace):
		if in := s.inFlight(); in != "none" {
			s.Log.Warn("grace period over; stopping with requests in flight", "in_flight", in)
		} else {
			// A peer that stopped answering (its process stopped, its
			// link cut) never acknowledges the GOAWAY, and its
			// connection holds the graceful stop.
			s.Log.Warn("grace period over; closing the connections still open (no call in flight: a peer that does not answer holds its connection)")
		}
		s.GRPC.Stop()
		if s.api != nil {
			// Cuts the connections, which cancels their calls'
			// contexts.
			s.api.Close()
		}
	}
	// As WaitForHandlers does for gRPC: the tier frees nothing a
	// handler still uses.
	s.jsonCalls.Wait()
	if s.http != nil {
		sctx, cancel := context.WithTimeout(context.Background(), time.Second)
		s.http.Shutdown(sctx)
		cancel()
	}
	return nil
}

func (s *Server) unaryMetrics(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	start := time.Now()
	defer s.running(info.FullMethod)()
	resp, err := h(ctx, req)
	s.observeCtx(ctx, info.FullMethod, start, err)
	return resp, err
}

func (s *Server) streamMetrics(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	start := time.Now()
	defer s.running(info.FullMethod)()
	err := h(srv, ss)
	s.observeCtx(ss.Context(), info.FullMethod, start, err)
	return err
}

// running counts a call of method in flight until the returned func is
// called.
func (s *Server) running(method string) func() {
	c, ok := s.inflight.Load(method)
	if !ok {
		c, _ = s.inflight.LoadOrStore(method, new(atomic.Int64))
	}
	n := c.(*atomic.Int64)
	n.Add(1)
	return func() { n.Add(-1) }
}

// inFlight says which calls are in flight, "METHOD=N" by method,
// comma-separated; "none" when none is.
func (s *Server) inFlight() string {
	var out []string
	s.inflight.Range(func(k, v any) bool {
		if n := v.(*atomic.Int64).Load(); n > 0 {
			out = append(out, fmt.Sprintf("%s=%d", k, n))
		}
		return true
	})
	if len(out) == 0 {
		return "none"
	}
	slices.Sort(out)
	return strings.Join(out, ",")
}

func (s *Server) observe(method string, start time.Time, err error) {
	s.observeCtx(context.Background(), method, start, err)
}

// observeCtx is observe of a call whose context ctx may be traced: a
// sampled one's latency carries its trace id as an exemplar.
func (s *Server) observeCtx(ctx context.Context, method string, start time.Time, err error) {
	s.requests.WithLabelValues(method, status.Code(err).String()).Inc()
	tracing.Observe(ctx, s.latency.WithLabelValues(method), time.Since(start).Seconds())
}
