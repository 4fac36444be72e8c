// Package tracing sends each tier's spans of a request to an OpenTelemetry
// collector, so that one request's path (the router's Recommend, its
// micro-batches' lookups on the embedding tier, their scoring on the
// dense tier, and the stages inside each) reads as one trace. It is
// configured the way every OpenTelemetry SDK is, by the standard
// environment variables, so that an operator's existing set-up (the
// OpenTelemetry Operator's injection, a Deployment's env) applies
// unchanged:
//
//   - OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT
//     (e.g. http://otel-collector:4317) turns tracing on; unset, nothing
//     is set up and the tiers pay nothing for it.
//   - OTEL_EXPORTER_OTLP_PROTOCOL or OTEL_EXPORTER_OTLP_TRACES_PROTOCOL:
//     grpc (Prism's default, as it was before HTTP was sent) or
//     http/protobuf (the specification's default, and what the
//     OpenTelemetry Operator's injection names with port 4318). The Go
//     SDK has no http/json exporter: asking for it is an error at start.
//   - OTEL_TRACES_SAMPLER and OTEL_TRACES_SAMPLER_ARG choose the sampler;
//     unset, Prism samples 1% of the requests that arrive without a
//     sampling decision and follows the caller's decision otherwise
//     (parentbased_traceidratio, 0.01): every span costs a serving tier
//     CPU, and at thousands of requests a second 1% is plenty.
//   - OTEL_SERVICE_NAME names the tier (default prism-router,
//     prism-embedding, prism-dense); OTEL_RESOURCE_ATTRIBUTES,
//     OTEL_EXPORTER_OTLP_HEADERS, _CERTIFICATE, _INSECURE, _TIMEOUT and
//     OTEL_SDK_DISABLED as the specification says.
//
// Only the request path is traced: Recommend, Lookup, Score and the
// embedding updates. The registry's heartbeats (several a second from
// every worker) and health checks are not.
package tracing

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	otelcodes "go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/internal/lograte"
)

// DefaultRatio is the share of requests without a caller's sampling
// decision that are traced when OTEL_TRACES_SAMPLER is unset.
const DefaultRatio = 0.01

// on is whether Setup installed a tracer provider: the gRPC options and
// Stage do nothing otherwise.
var on atomic.Bool

// Enabled reports whether tracing was set up in this process.
func Enabled() bool { return on.Load() }

// Configured reports whether the environment asks for tracing: an OTLP
// endpoint is set and the SDK is not disabled.
func Configured(getenv func(string) string) bool {
	if strings.EqualFold(strings.TrimSpace(getenv("OTEL_SDK_DISABLED")), "true") {
		return false
	}
	return getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
}

// Setup starts exporting this process's spans when the environment asks
// for it (Configured), as service (the tier's default service name). It
// returns a shutdown that flushes the spans not yet sent
// (bounded by its context), and whether tracing is on. The exporter
// connects lazily: a collector that is down loses spans, never requests.
//
// The SDK's own errors (a collector down or refusing: every batch's
// export fails) go to log at Warn, one a minute with a count of the
// rest, instead of the standard logger's line per failure.
func Setup(ctx context.Context, service string, log *slog.Logger) (shutdown func(context.Context) error, enabled bool, err error) {
	none := func(context.Context) error { return nil }
	if !Configured(os.Getenv) {
		return none, false, nil
	}
	protocol, err := Protocol(os.Getenv)
	if err != nil {
		return none, false, fmt.Errorf("tracing: %w", err)
	}
	if err := checkEndpoint(os.Getenv); err != nil {
		return none, false, fmt.Errorf("tracing: %w", err)
	}
	if w := portHint(os.Getenv, protocol); w != "" {
		log.Warn("tracing: " + w)
	}
	// Each exporter reads the rest of the environment itself (endpoint,
	// headers, certificate, timeout; HTTP's adds /v1/traces to the
	// generic endpoint, as the specification says).
	var exp sdktrace.SpanExporter
	if protocol == ProtocolHTTP {
		exp, err = otlptracehttp.New(ctx)
	} else {
		exp, err = otlptracegrpc.New(ctx)
	}
	if err != nil {
		return none, false, fmt.Errorf("tracing: OTLP exporter (%s): %w (check OTEL_EXPORTER_OTLP_ENDPOINT)", protocol, err)
	}
	// The host and process tell apart the workers of one tier (on one
	// host, by their process ids); the environment's attributes
	// (OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES) last, so they win.
	res, err := resource.New(ctx, resource.WithAttributes(attribute.String("service.name", service)),
		resource.WithHost(), resource.WithProcessPID(), resource.WithFromEnv())
	if err != nil {
		return none, false, fmt.Errorf("tracing: resource: %w (check OTEL_RESOURCE_ATTRIBUTES)", err)
	}
	// The sampler is read here, not left to the SDK: one it cannot read
	// (a typo, a ratio of 10 or 1%) it replaces by its own default,
	// parentbased_always_on (or a ratio of 1), so that every request was
	// traced while the tier's log named the sampler asked for.
	sampler, _, serr := Sampler(os.Getenv)
	if serr != nil {
		log.Warn("tracing: "+serr.Error()+"; Prism's default sampler instead", "sampler", fmt.Sprintf("parentbased_traceidratio %g", DefaultRatio))
	}
	// Before the provider is made: it reports a sampler the environment
	// names and it cannot read through the handler, which printed it to
	// the standard logger, outside the tier's log.
	limit := lograte.New(log, time.Minute)
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		if strings.Contains(err.Error(), "export") {
			limit.Warn("tracing", "tracing: spans not exported", "err", err)
			return
		}
		limit.Warn("tracing-sdk", "tracing: the OpenTelemetry SDK reports an error", "err", err)
	}))
	// The counting processor before the batcher: it sees every sampled
	// span the batcher is handed, the exporter every one it sends, so
	// that the spans its full queue drops (silently, in the SDK) show as
	// the difference (SpanCounters).
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(endCounter{}), sdktrace.WithBatcher(countingExporter{exp}),
		sdktrace.WithResource(res), sdktrace.WithSampler(sampler))
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	on.Store(true)
	return func(ctx context.Context) error {
		on.Store(false)
		defer limit.Close()
		return tp.Shutdown(ctx)
	}, true, nil
}

// The OTLP protocols Prism sends spans over.
const (
	ProtocolGRPC = "grpc"
	ProtocolHTTP = "http/protobuf"
)

// Protocol is the OTLP protocol the environment names for traces
// (OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, else OTEL_EXPORTER_OTLP_PROTOCOL);
// unset, gRPC, Prism's default since it first traced (the
// specification's is http/protobuf: an operator who relied on Prism's
// default keeps it). One Prism cannot send is an error: with a warning
// instead, every export failed against a collector that could not read
// it, while the tier served on.
func Protocol(getenv func(string) string) (string, error) {
	for _, k := range []string{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"} {
		switch p := strings.ToLower(strings.TrimSpace(getenv(k))); p {
		case "":
			continue
		case ProtocolGRPC, ProtocolHTTP:
			return p, nil
		case "http/json":
			return "", fmt.Errorf("%s is http/json, which the OpenTelemetry Go SDK does not send: use http/protobuf (the collector's port 4318 takes both) or grpc (port 4317)", k)
		default:
			return "", fmt.Errorf("%s %q: want grpc or http/protobuf", k, p)
		}
	}
	return ProtocolGRPC, nil
}

// checkEndpoint refuses an endpoint that names no collector (a typo,
// a stray value): the exporter took it, every export failed, and the
// SDK's error, once a minute, did not say the endpoint was at fault. A
// URL with scheme http or https and a host passes, as does HOST:PORT
// (what gRPC users write).
func checkEndpoint(getenv func(string) string) error {
	for _, k := range []string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"} {
		endpoint := strings.TrimSpace(getenv(k))
		if endpoint == "" {
			continue
		}
		if u, err := url.Parse(endpoint); err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != "" {
			return nil
		}
		if host, port, err := net.SplitHostPort(endpoint); err == nil && host != "" && port != "" && !strings.Contains(endpoint, "/") {
			return nil
		}
		return fmt.Errorf("%s=%s names no collector: want a URL such as http://collector:4317 (https:// for TLS), or HOST:PORT", k, endpoint)
	}
	return nil
}

// portHint is a warning when the endpoint's port is the collector's
// default for the other protocol (4317 gRPC, 4318 HTTP): every export
// would fail, and the SDK's error does not say why.
func portHint(getenv func(string) string, protocol string) string {
	k := "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
	endpoint := getenv(k)
	if endpoint == "" {
		k, endpoint = "OTEL_EXPORTER_OTLP_ENDPOINT", getenv("OTEL_EXPORTER_OTLP_ENDPOINT")
	}
	u, err := url.Parse(strings.TrimSpace(endpoint))
	if err != nil {
		return ""
	}
	switch {
	case protocol == ProtocolGRPC && u.Port() == "4318":
		return fmt.Sprintf("%s %s is the collector's OTLP/HTTP port, but spans go over gRPC: set OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf, or name port 4317", k, endpoint)
	case protocol == ProtocolHTTP && u.Port() == "4317":
		return fmt.Sprintf("%s %s is the collector's OTLP/gRPC port, but spans go over HTTP (http/protobuf): set OTEL_EXPORTER_OTLP_PROTOCOL=grpc, or name port 4318", k, endpoint)
	}
	return ""
}

// Span counters: a full export queue (a collector slower than the
// sampled share, or down) drops spans in the SDK without a word, so an
// operator sees the spans ended against those exported.
var (
	spansEnded = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: "prism", Name: "tracing_spans_ended_total",
		Help: "Sampled spans this process ended and handed to its export queue. Those not in prism_tracing_spans_exported_total (less the queue's 2,048 and a batch in flight) were dropped by a full queue.",
	})
	spansExported = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "prism", Name: "tracing_spans_exported_total",
		Help: "Spans the OTLP exporter sent, by result (ok, or failed: the collector refused them or could not be reached).",
	}, []string{"result"})
	spansOK, spansFailed = spansExported.WithLabelValues("ok"), spansExported.WithLabelValues("failed")
)

// SpanCounters are the tracing span counters for a tier's /metrics
// registry; zero when tracing is off.
func SpanCounters() []prometheus.Collector {
	return []prometheus.Collector{spansEnded, spansExported}
}

// endCounter counts the sampled spans ended, the ones the batcher
// queues.
type endCounter struct{}

func (endCounter) OnStart(context.Context, sdktrace.ReadWriteSpan) {}
func (endCounter) OnEnd(s sdktrace.ReadOnlySpan) {
	if s.SpanContext().IsSampled() {
		spansEnded.Inc()
	}
}
func (endCounter) Shutdown(context.Context) error   { return nil }
func (endCounter) ForceFlush(context.Context) error { return nil }

// countingExporter counts the spans its exporter sent or failed to.
type countingExporter struct{ sdktrace.SpanExporter }

func (e countingExporter) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	err := e.SpanExporter.ExportSpans(ctx, spans)
	if err != nil {
		spansFailed.Add(float64(len(spans)))
	} else {
		spansOK.Add(float64(len(spans)))
	}
	return err
}

// Sampler is the sampler OTEL_TRACES_SAMPLER and OTEL_TRACES_SAMPLER_ARG
// name, as the specification reads them (a ratio sampler without its
// argument samples every request), with its name for the log; unset,
// Prism's default (parentbased_traceidratio, DefaultRatio). One that
// cannot be read is Prism's default too, with the error.
func Sampler(getenv func(string) string) (s sdktrace.Sampler, name string, err error) {
	def := sdktrace.ParentBased(sdktrace.TraceIDRatioBased(DefaultRatio))
	defName := fmt.Sprintf("parentbased_traceidratio %g (the default)", DefaultRatio)
	name = strings.ToLower(strings.TrimSpace(getenv("OTEL_TRACES_SAMPLER")))
	switch name {
	case "":
		return def, defName, nil
	case "always_on":
		return sdktrace.AlwaysSample(), name, nil
	case "always_off":
		return sdktrace.NeverSample(), name, nil
	case "parentbased_always_on":
		return sdktrace.ParentBased(sdktrace.AlwaysSample()), name, nil
	case "parentbased_always_off":
		return sdktrace.ParentBased(sdktrace.NeverSample()), name, nil
	case "traceidratio", "parentbased_traceidratio":
		ratio := 1.0
		if arg := strings.TrimSpace(getenv("OTEL_TRACES_SAMPLER_ARG")); arg != "" {
			ratio, err = strconv.ParseFloat(arg, 64)
			if err != nil || !(ratio >= 0 && ratio <= 1) {
				return def, defName, fmt.Errorf("OTEL_TRACES_SAMPLER_ARG %q: want the share of requests to trace, from 0 to 1", arg)
			}
		}
		s = sdktrace.TraceIDRatioBased(ratio)
		if name == "parentbased_traceidratio" {
			s = sdktrace.ParentBased(s)
		}
		return s, fmt.Sprintf("%s %g", name, ratio), nil
	}
	return def, defName, fmt.Errorf("OTEL_TRACES_SAMPLER %q: want always_on, always_off, traceidratio, or one of those after parentbased_", name)
}

// Use installs tp as this process's tracer provider, with the W3C
// trace context propagator, and turns tracing on as Setup does with its
// exporter's; restore puts back what was there. For tests that record
// spans in memory (sdk/trace/tracetest).
func Use(tp trace.TracerProvider) (restore func()) {
	oldTP, oldProp, wasOn := otel.GetTracerProvider(), otel.GetTextMapPropagator(), on.Load()
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.TraceContext{})
	on.Store(true)
	return func() {
		otel.SetTracerProvider(oldTP)
		otel.SetTextMapPropagator(oldProp)
		on.Store(wasOn)
	}
}

// traced says whether an RPC is on the request path (see the package
// comment): the registry's heartbeats and health checks are not.
func traced(info *stats.RPCTagInfo) bool {
	m := info.FullMethodName
	return !strings.HasPrefix(m, "/prism.v1.Registry/") && !strings.HasPrefix(m, "/grpc.health.") && !strings.HasPrefix(m, "/grpc.reflection.")
}

// ServerOptions are a tier's server options for tracing: nil when it is
// off, so that a process without a collector runs no handler at all.
func ServerOptions() []grpc.ServerOption {
	if !Enabled() {
		return nil
	}
	return []grpc.ServerOption{grpc.StatsHandler(otelgrpc.NewServerHandler(otelgrpc.WithFilter(traced)))}
}

// DialOptions are the tracing options of a tier's client connections
// (the router's to the workers, the embedding worker's to the dense
// workers): they carry the trace to the next tier. Nil when off.
func DialOptions() []grpc.DialOption {
	if !Enabled() {
		return nil
	}
	return []grpc.DialOption{grpc.WithStatsHandler(otelgrpc.NewClientHandler(otelgrpc.WithFilter(traced)))}
}

// HTTPServerSpan starts the server span of an HTTP/JSON call named name
// ("POST /v1/recommend"), the child of the W3C trace context in h
// (traceparent, through the process's propagator) when the caller sent
// one, as otelgrpc's server handler does for a gRPC call; end records
// err's gRPC code and ends it. When tracing is off: ctx itself and an
// end that does nothing.
func HTTPServerSpan(ctx context.Context, name string, h http.Header) (_ context.Context, end func(err error)) {
	if !Enabled() {
		return ctx, func(error) {}
	}
	ctx = otel.GetTextMapPropagator().Extract(ctx, propagation.HeaderCarrier(h))
	ctx, span := tracer().Start(ctx, name, trace.WithSpanKind(trace.SpanKindServer))
	return ctx, func(err error) {
		c := status.Code(err)
		span.SetAttributes(attribute.Int64("rpc.grpc.status_code", int64(c)))
		if err != nil {
			span.SetStatus(otelcodes.Error, err.Error())
		}
		span.End()
	}
}

// tracer makes the stages' spans.
func tracer() trace.Tracer { return otel.Tracer("github.com/prism-serve/prism") }

// Stage records a finished stage of ctx's request, from start to end, as
// a child span of the request's span: a tier's lookup, cut-model run or
// encoding, a dense worker's queue and batch. Nothing when ctx's span is
// not recorded (tracing off, or the request not sampled): the request
// path then pays one context lookup.
func Stage(ctx context.Context, name string, start, end time.Time, attrs ...attribute.KeyValue) {
	if !Recording(ctx) {
		return
	}
	_, span := tracer().Start(ctx, name, trace.WithTimestamp(start), trace.WithAttributes(attrs...))
	span.End(trace.WithTimestamp(end))
}

// Span starts a child span of ctx's recorded span for a part of the
// request worth a subtree of its own (one request of a RecommendStream,
// whose lookups would otherwise all hang off the stream's one span);
// end records err as the span's status. When ctx's span is not
// recorded: ctx itself and an end that does nothing.
func Span(ctx context.Context, name string) (_ context.Context, end func(err error)) {
	if !Recording(ctx) {
		return ctx, func(error) {}
	}
	ctx, span := tracer().Start(ctx, name)
	return ctx, func(err error) {
		if err != nil {
			span.SetStatus(otelcodes.Error, err.Error())
		}
		span.End()
	}
}

// Recording reports whether ctx's request is traced: callers that
// record several stages check once.
// Off, it answers without looking into ctx (a walk up its chain of
// values) on every request.
func Recording(ctx context.Context) bool {
	return on.Load() && trace.SpanFromContext(ctx).IsRecording()
}

// Exemplar is the exemplar labels of ctx's request for a latency
// histogram (its trace id), when the request is traced and sampled:
// Prometheus keeps them with the bucket the request fell in, so a
// dashboard's slow bucket links to one of its traces. Nil otherwise.
func Exemplar(ctx context.Context) prometheus.Labels {
	if !on.Load() {
		return nil
	}
	if sc := trace.SpanContextFromContext(ctx); sc.IsSampled() {
		return prometheus.Labels{"trace_id": sc.TraceID().String()}
	}
	return nil
}

// Observe records v in o, with ctx's exemplar (Exemplar) when it has one.
func Observe(ctx context.Context, o prometheus.Observer, v float64) {
	if ex := Exemplar(ctx); ex != nil {
		if eo, ok := o.(prometheus.ExemplarObserver); ok {
			eo.ObserveWithExemplar(v, ex)
			return
		}
	}
	o.Observe(v)
}

// Annotate adds attributes to ctx's request span (the model, the
// candidates, a micro-batch's samples) when it is recorded.
func Annotate(ctx context.Context, attrs ...attribute.KeyValue) {
	if Recording(ctx) {
		trace.SpanFromContext(ctx).SetAttributes(attrs...)
	}
}
