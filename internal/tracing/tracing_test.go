package tracing

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/stats"
	"google.golang.org/protobuf/proto"
)

func TestConfigured(t *testing.T) {
	for _, c := range []struct {
		name string
		env  map[string]string
		want bool
	}{
		{"nothing set", nil, false},
		{"endpoint", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317"}, true},
		{"traces endpoint", map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4317"}, true},
		{"disabled", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_SDK_DISABLED": "TRUE "}, false},
		{"disabled false", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_SDK_DISABLED": "false"}, true},
		{"sampler alone", map[string]string{"OTEL_TRACES_SAMPLER": "always_on"}, false},
	} {
		if got := Configured(func(k string) string { return c.env[k] }); got != c.want {
			t.Errorf("%s: Configured %v, want %v", c.name, got, c.want)
		}
	}
}

// TestSetupOff: without an endpoint nothing is set up, and the options
// and stages are no-ops (a tier without a collector pays nothing).
func TestSetupOff(t *testing.T) {
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "")
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
	shutdown, on, err := Setup(context.Background(), "prism-test", slog.Default())
	if err != nil || on || Enabled() {
		t.Fatalf("Setup without an endpoint: on %v, enabled %v, err %v", on, Enabled(), err)
	}
	if err := shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if ServerOptions() != nil || DialOptions() != nil {
		t.Error("gRPC options while tracing is off")
	}
	if Recording(context.Background()) {
		t.Error("a context without a span is recording")
	}
}

// TestOffAllocs: what the request path calls on every request (the
// router's stream requests, the tiers' Recording checks) allocates
// nothing when the request is not traced.
func TestOffAllocs(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if a := testing.AllocsPerRun(100, func() {
		rctx, end := Span(ctx, "prism.recommend")
		if Recording(rctx) {
			t.Fatal("recording")
		}
		end(nil)
	}); a != 0 {
		t.Errorf("%v allocations a request without tracing, want 0", a)
	}
}

func TestTraced(t *testing.T) {
	for method, want := range map[string]bool{
		"/prism.v1.Recommender/Recommend":                           true,
		"/prism.v1.Recommender/RecommendStream":                     true,
		"/prism.v1.EmbeddingTier/Lookup":                            true,
		"/prism.v1.DenseTier/Score":                                 true,
		"/prism.v1.Embeddings/Update":                               true,
		"/prism.v1.Registry/Announce":                               false,
		"/prism.v1.Registry/List":                                   false,
		"/grpc.health.v1.Health/Check":                              false,
		"/grpc.reflection.v1.ServerReflection/ServerReflectionInfo": false,
	} {
		if got := traced(&stats.RPCTagInfo{FullMethodName: method}); got != want {
			t.Errorf("traced(%s) = %v, want %v", method, got, want)
		}
	}
}

// TestStage: a stage of a recorded request is a child span with the
// stage's own times; of an unrecorded one, nothing.
func TestStage(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(Use(tp))

	start := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	Stage(context.Background(), "nobody's", start, start.Add(time.Millisecond))
	ctx, parent := tp.Tracer("t").Start(context.Background(), "request")
	if !Recording(ctx) {
		t.Fatal("the request's span is not recording")
	}
	Stage(ctx, "embedding.lookup", start, start.Add(3*time.Millisecond))
	parent.End()
	spans := rec.Ended()
	if len(spans) != 2 {
		t.Fatalf("%d spans, want the stage and its request", len(spans))
	}
	s := spans[0]
	if s.Name() != "embedding.lookup" || s.Parent().SpanID() != parent.SpanContext().SpanID() ||
		!s.StartTime().Equal(start) || s.EndTime().Sub(s.StartTime()) != 3*time.Millisecond {
		t.Errorf("stage span %s parent %s from %v to %v", s.Name(), s.Parent().SpanID(), s.StartTime(), s.EndTime())
	}
}

// BenchmarkHandlers: what the handlers cost a unary call on loopback
// (a health check, both ends in this process): without tracing, traced
// but not sampled (the requests a 1% sampler passes over), and sampled
// (spans made and batched for export to a sink).
func BenchmarkHandlers(b *testing.B) {
	for _, mode := range []string{"off", "unsampled", "sampled"} {
		b.Run(mode, func(b *testing.B) {
			var sopts []grpc.ServerOption
			var dopts []grpc.DialOption
			if mode != "off" {
				sampler := sdktrace.NeverSample()
				if mode == "sampled" {
					sampler = sdktrace.AlwaysSample()
				}
				tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sampler), sdktrace.WithBatcher(tracetest.NewNoopExporter()))
				b.Cleanup(func() { tp.Shutdown(context.Background()) })
				prop := propagation.TraceContext{}
				sopts = append(sopts, grpc.StatsHandler(otelgrpc.NewServerHandler(otelgrpc.WithTracerProvider(tp), otelgrpc.WithPropagators(prop))))
				dopts = append(dopts, grpc.WithStatsHandler(otelgrpc.NewClientHandler(otelgrpc.WithTracerProvider(tp), otelgrpc.WithPropagators(prop))))
			}
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			srv := grpc.NewServer(sopts...)
			healthpb.RegisterHealthServer(srv, health.NewServer())
			go srv.Serve(lis)
			b.Cleanup(srv.Stop)
			cc, err := grpc.NewClient(lis.Addr().String(), append(dopts, grpc.WithTransportCredentials(insecure.NewCredentials()))...)
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { cc.Close() })
			hc := healthpb.NewHealthClient(cc)
			ctx := context.Background()
			if _, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				if _, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestCollectorDown: spans a collector that is down cannot take are
// dropped with one warning in the tier's log (the SDK's default wrote a
// line per failed batch to the standard logger), and shutdown returns.
func TestCollectorDown(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close() // nothing listens there now
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://"+addr)
	t.Setenv("OTEL_TRACES_SAMPLER", "always_on")
	t.Setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "200")
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "20")
	buf, shutdown := setupLogged(t)
	for range 5 {
		_, s := otel.Tracer("t").Start(context.Background(), "request")
		s.End()
		time.Sleep(100 * time.Millisecond) // a batch each, each export failing
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	shutdown(ctx) // its own error (the last flush failing) is the caller's to log
	out := buf.String()
	// One at once, and at most the count of the rest as the log closes.
	if n, all := strings.Count(out, `msg="tracing: spans not exported"`), strings.Count(out, "\n"); n != 1 || all > 2 {
		t.Errorf("%d warnings of spans not exported in %d lines, want one (the rest counted in one line):\n%s", n, all, out)
	}
	if !strings.Contains(out, "level=WARN") {
		t.Errorf("the warning is not at Warn:\n%s", out)
	}
}

// syncBuffer is a bytes.Buffer safe for the SDK's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestSetupSampler: the sampler the environment names is the one used;
// one the SDK cannot read (a name it lacks, a ratio out of range or not
// a number) is Prism's default, with a warning, not the SDK's fallback
// of sampling every request (parentbased_always_on, or a ratio of 1),
// which at thousands of requests a second exported every span while the
// tier's log named the sampler as if it were in use.
func TestSetupSampler(t *testing.T) {
	root := trace.SpanContextConfig{TraceID: trace.TraceID{1}, SpanID: trace.SpanID{1}}
	for _, c := range []struct {
		name, sampler, arg string
		// sampled: of 1000 root requests, how many are sampled (within
		// [lo, hi]).
		lo, hi int
		warn   bool
	}{
		{"unset: 1%", "", "", 1, 40, false},
		{"always_on", "always_on", "", 1000, 1000, false},
		{"parentbased_always_off", "parentbased_always_off", "", 0, 0, false},
		{"ratio 0.5", "parentbased_traceidratio", "0.5", 400, 600, false},
		{"ratio without its argument: the specification's 1", "traceidratio", "", 1000, 1000, false},
		{"ratio over 1", "parentbased_traceidratio", "10", 1, 40, true},
		{"ratio as a percentage", "parentbased_traceidratio", "1%", 1, 40, true},
		{"negative ratio", "traceidratio", "-0.5", 1, 40, true},
		{"no such sampler", "parentbased_ratio", "0.5", 1, 40, true},
		{"one the Go SDK lacks", "parentbased_jaeger_remote", "", 1, 40, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
			t.Setenv("OTEL_TRACES_SAMPLER", c.sampler)
			t.Setenv("OTEL_TRACES_SAMPLER_ARG", c.arg)
			buf, shutdown := setupLogged(t)
			sampled := 0
			tr := otel.Tracer("t")
			for i := range 1000 {
				// Root requests of trace ids spread over the ratio's range.
				cfg := root
				cfg.TraceID[8], cfg.TraceID[9] = byte(i*65521>>8), byte(i*65521)
				_, s := tr.Start(trace.ContextWithRemoteSpanContext(context.Background(), trace.NewSpanContext(cfg)), "r", trace.WithNewRoot())
				if s.SpanContext().IsSampled() {
					sampled++
				}
				s.End()
			}
			ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
			defer cancel()
			shutdown(ctx) // nothing listens at the endpoint: the spans are dropped
			if sampled < c.lo || sampled > c.hi {
				t.Errorf("%d of 1000 requests sampled, want %d to %d", sampled, c.lo, c.hi)
			}
			// The SDK's own complaint of a sampler it cannot read goes to
			// the tier's log too, not the standard logger.
			if got := strings.Contains(buf.String(), "tracing: the OpenTelemetry SDK reports an error"); c.warn && !got {
				t.Errorf("the SDK's complaint in the tier's log: %v; log:\n%s", got, buf.String())
			}
			if got := strings.Contains(buf.String(), "OTEL_TRACES_SAMPLER"); got != c.warn {
				t.Errorf("a warning naming OTEL_TRACES_SAMPLER: %v, want %v; log:\n%s", got, c.warn, buf.String())
			}
		})
	}
}

// TestProtocol: the OTLP protocol from the environment, the traces'
// own variable first; one Prism cannot send is an error at start (a
// warning before, while every export failed).
func TestProtocol(t *testing.T) {
	for _, c := range []struct {
		name, generic, traces string
		want, err             string
	}{
		{name: "unset", want: ProtocolGRPC},
		{name: "grpc", generic: "grpc", want: ProtocolGRPC},
		{name: "http/protobuf", generic: "http/protobuf", want: ProtocolHTTP},
		{name: "case and spaces", generic: " HTTP/Protobuf ", want: ProtocolHTTP},
		{name: "traces' own wins", generic: "grpc", traces: "http/protobuf", want: ProtocolHTTP},
		{name: "traces' own wins over http", generic: "http/protobuf", traces: "grpc", want: ProtocolGRPC},
		{name: "http/json", generic: "http/json", err: "OTEL_EXPORTER_OTLP_PROTOCOL is http/json, which the OpenTelemetry Go SDK does not send"},
		{name: "traces http/json", generic: "grpc", traces: "http/json", err: "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL is http/json"},
		{name: "typo", generic: "http", err: `OTEL_EXPORTER_OTLP_PROTOCOL "http": want grpc or http/protobuf`},
	} {
		t.Run(c.name, func(t *testing.T) {
			env := map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": c.generic, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": c.traces}
			got, err := Protocol(func(k string) string { return env[k] })
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("Protocol = %q, %v; want an error with %q", got, err, c.err)
				}
				return
			}
			if err != nil || got != c.want {
				t.Fatalf("Protocol = %q, %v; want %q", got, err, c.want)
			}
		})
	}
}

// TestSetupProtocol: Setup refuses a protocol it cannot send, and warns
// of an endpoint on the other protocol's default port (every export
// would fail, and the SDK's error does not say why).
func TestSetupProtocol(t *testing.T) {
	for _, c := range []struct {
		name, endpoint, protocol string
		warn                     string // in the log; "" none
	}{
		{"grpc on 4317", "http://127.0.0.1:4317", "", ""},
		{"grpc on 4318", "http://127.0.0.1:4318", "grpc", "is the collector's OTLP/HTTP port, but spans go over gRPC"},
		{"default on 4318", "http://127.0.0.1:4318", "", "set OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf"},
		{"http on 4318", "http://127.0.0.1:4318", "http/protobuf", ""},
		{"http on 4317", "http://127.0.0.1:4317", "http/protobuf", "is the collector's OTLP/gRPC port, but spans go over HTTP"},
		{"another port", "http://127.0.0.1:1", "http/protobuf", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", c.endpoint)
			t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", c.protocol)
			t.Setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "")
			buf, shutdown := setupLogged(t)
			shutdown(context.Background())
			if got := strings.Contains(buf.String(), "port"); got != (c.warn != "") || !strings.Contains(buf.String(), c.warn) {
				t.Errorf("log %q, want a warning with %q", buf.String(), c.warn)
			}
		})
	}
	t.Run("http/json refused", func(t *testing.T) {
		t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
		t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")
		_, on, err := Setup(context.Background(), "prism-test", slog.New(slog.DiscardHandler))
		if err == nil || on || !strings.Contains(err.Error(), "http/json") {
			t.Fatalf("Setup: on %v, err %v; want refused naming http/json", on, err)
		}
	})
}

// httpCollector is an OTLP/HTTP collector's traces endpoint: it decodes
// each export as the OpenTelemetry Collector does (protobuf at
// /v1/traces) and keeps the spans' names; status, when not 200, refuses.
type httpCollector struct {
	mu     sync.Mutex
	names  []string
	status int
	hold   chan struct{} // when set, each export waits for it to close
}

func (c *httpCollector) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/v1/traces" || r.Method != http.MethodPost || r.Header.Get("Content-Type") != "application/x-protobuf" {
		http.Error(w, "want a protobuf POST to /v1/traces", http.StatusNotFound)
		return
	}
	if c.hold != nil {
		<-c.hold
	}
	body, err := io.ReadAll(r.Body)
	var req coltracepb.ExportTraceServiceRequest
	if err == nil {
		err = proto.Unmarshal(body, &req)
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.status != 0 {
		http.Error(w, "refused", c.status)
		return
	}
	for _, rs := range req.GetResourceSpans() {
		for _, ss := range rs.GetScopeSpans() {
			for _, sp := range ss.GetSpans() {
				c.names = append(c.names, sp.GetName())
			}
		}
	}
	w.Header().Set("Content-Type", "application/x-protobuf")
	out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
	w.Write(out)
}

func (c *httpCollector) spans() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.names...)
}

// counts reads the span counters: ended, exported ok, exported failed.
func counts(t *testing.T) (ended, ok, failed float64) {
	t.Helper()
	read := func(c prometheus.Counter) float64 {
		var m dto.Metric
		if err := c.Write(&m); err != nil {
			t.Fatal(err)
		}
		return m.GetCounter().GetValue()
	}
	return read(spansEnded), read(spansOK), read(spansFailed)
}

// TestHTTPExport: with OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf the
// spans reach an OTLP/HTTP collector at the generic endpoint's
// /v1/traces (before, they went over gRPC to its HTTP port and every
// export failed), and the span counters say what was ended, sent and
// refused.
func TestHTTPExport(t *testing.T) {
	for _, c := range []struct {
		name   string
		status int
		want   []string // spans the collector keeps
	}{
		{"accepted", 0, []string{"one", "two"}},
		{"refused", http.StatusBadRequest, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			col := &httpCollector{status: c.status}
			srv := httptest.NewServer(col)
			defer srv.Close()
			t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", srv.URL)
			t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
			t.Setenv("OTEL_TRACES_SAMPLER", "always_on")
			ended0, ok0, failed0 := counts(t)
			_, shutdown := setupLogged(t)
			for _, name := range []string{"one", "two"} {
				_, span := otel.Tracer("test").Start(context.Background(), name)
				span.End()
			}
			if err := shutdown(context.Background()); err != nil && c.status == 0 {
				t.Fatalf("shutdown: %v", err)
			}
			if got := col.spans(); strings.Join(got, ",") != strings.Join(c.want, ",") {
				t.Errorf("collector got spans %q, want %q", got, c.want)
			}
			ended, ok, failed := counts(t)
			wantOK, wantFailed := 2.0, 0.0
			if c.status != 0 {
				wantOK, wantFailed = 0, 2
			}
			if ended-ended0 != 2 || ok-ok0 != wantOK || failed-failed0 != wantFailed {
				t.Errorf("spans ended %v, exported ok %v, failed %v; want 2, %v, %v", ended-ended0, ok-ok0, failed-failed0, wantOK, wantFailed)
			}
		})
	}
}

// TestDroppedCounted: spans a full export queue drops (the SDK says
// nothing of them) show as ended and not exported.
func TestDroppedCounted(t *testing.T) {
	col := &httpCollector{hold: make(chan struct{})}
	srv := httptest.NewServer(col)
	defer srv.Close()
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", srv.URL)
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
	t.Setenv("OTEL_TRACES_SAMPLER", "always_on")
	t.Setenv("OTEL_BSP_MAX_QUEUE_SIZE", "4")
	t.Setenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "1")
	ended0, ok0, failed0 := counts(t)
	_, shutdown := setupLogged(t)
	const n = 100
	for range n {
		_, span := otel.Tracer("test").Start(context.Background(), "s")
		span.End()
	}
	close(col.hold) // the collector answers again
	shutdown(context.Background())
	ended, ok, failed := counts(t)
	exported := ok - ok0 + failed - failed0
	if ended-ended0 != n || exported >= n || exported != float64(len(col.spans())) {
		t.Errorf("spans ended %v, exported %v (the collector kept %d); want %d ended and fewer exported (a queue of 4 held the rest back)", ended-ended0, exported, len(col.spans()), n)
	}
}

// TestExemplar: a sampled request's latency carries its trace id as an
// exemplar; an unsampled one's, or any with tracing off, none.
func TestExemplar(t *testing.T) {
	hist := func() prometheus.Histogram {
		return prometheus.NewHistogram(prometheus.HistogramOpts{Name: "h", Buckets: []float64{0.01, 0.1}})
	}
	exemplars := func(h prometheus.Histogram) []string {
		var m dto.Metric
		if err := h.Write(&m); err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, b := range m.GetHistogram().GetBucket() {
			for _, l := range b.GetExemplar().GetLabel() {
				out = append(out, l.GetName()+"="+l.GetValue())
			}
		}
		return out
	}
	ctx, span := sdktrace.NewTracerProvider().Tracer("t").Start(context.Background(), "request")
	defer span.End()
	h := hist()
	Observe(ctx, h, 0.05) // tracing off
	if ex := exemplars(h); len(ex) != 0 {
		t.Errorf("tracing off: exemplars %v", ex)
	}

	defer Use(sdktrace.NewTracerProvider())()
	h = hist()
	Observe(ctx, h, 0.05)
	want := "trace_id=" + span.SpanContext().TraceID().String()
	if ex := exemplars(h); len(ex) != 1 || ex[0] != want {
		t.Errorf("a sampled request: exemplars %v, want [%s]", ex, want)
	}
	unsampled, s2 := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.NeverSample())).Tracer("t").Start(context.Background(), "request")
	defer s2.End()
	h = hist()
	Observe(unsampled, h, 0.05)
	Observe(context.Background(), h, 0.05)
	if ex := exemplars(h); len(ex) != 0 {
		t.Errorf("unsampled and untraced requests: exemplars %v", ex)
	}
}

// setupLogged runs Setup from the test's environment, which must turn
// tracing on, with a log the test reads; the process's tracer provider
// and propagator are put back when the test ends.
func setupLogged(t *testing.T) (*syncBuffer, func(context.Context) error) {
	t.Helper()
	buf := &syncBuffer{}
	oldTP, oldProp := otel.GetTracerProvider(), otel.GetTextMapPropagator()
	t.Cleanup(func() { otel.SetTracerProvider(oldTP); otel.SetTextMapPropagator(oldProp) })
	shutdown, on, err := Setup(context.Background(), "prism-test", slog.New(slog.NewTextHandler(buf, nil)))
	if err != nil || !on {
		t.Fatalf("Setup: on %v, err %v", on, err)
	}
	return buf, shutdown
}

// TestCheckEndpoint: an endpoint naming no collector is refused at
// start, naming the variable (the exporter took "10xb" and every export
// failed); URLs and HOST:PORT pass, and the traces endpoint, which
// wins, is the one judged.
func TestCheckEndpoint(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		want string // "" to pass
	}{
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317"}, ""},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "https://collector.example"}, ""},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4317"}, ""},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "[::1]:4317"}, ""},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "10xb"}, "OTEL_EXPORTER_OTLP_ENDPOINT=10xb names no collector"},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "grpc://collector:4317"}, "names no collector"},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://"}, "names no collector"},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4317/v1/traces"}, "names no collector"},
		{map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "oops", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317"}, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=oops"},
		{map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces", "OTEL_EXPORTER_OTLP_ENDPOINT": "oops"}, ""},
	} {
		err := checkEndpoint(func(k string) string { return tc.env[k] })
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%v: %v, want %q", tc.env, err, tc.want)
		}
	}
}
