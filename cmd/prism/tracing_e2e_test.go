package main

import (
	"context"
	"encoding/hex"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/internal/auth"
	"github.com/prism-serve/prism/internal/readyline"
)

// collector is an OTLP/gRPC trace receiver, as an OpenTelemetry
// Collector's: it keeps every span it is sent, with its service's name.
type collector struct {
	collectortrace.UnimplementedTraceServiceServer
	addr  string
	mu    sync.Mutex
	spans []span
}

type span struct {
	service string
	*tracepb.Span
}

func (c *collector) Export(_ context.Context, req *collectortrace.ExportTraceServiceRequest) (*collectortrace.ExportTraceServiceResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, rs := range req.GetResourceSpans() {
		var service string
		for _, a := range rs.GetResource().GetAttributes() {
			if a.GetKey() == "service.name" {
				service = a.GetValue().GetStringValue()
			}
		}
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				c.spans = append(c.spans, span{service, s})
			}
		}
	}
	return &collectortrace.ExportTraceServiceResponse{}, nil
}

// of is every span received so far of the trace id (nil: of every trace).
func (c *collector) of(trace []byte) []span {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []span
	for _, s := range c.spans {
		if trace == nil || string(s.GetTraceId()) == string(trace) {
			out = append(out, s)
		}
	}
	return out
}

func startCollector(t *testing.T) *collector {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c := &collector{addr: lis.Addr().String()}
	s := grpc.NewServer()
	collectortrace.RegisterTraceServiceServer(s, c)
	go s.Serve(lis)
	t.Cleanup(s.Stop)
	return c
}

// TestTracing: with the OpenTelemetry environment pointing at a
// collector, a Recommend sent with a sampled trace context (W3C
// traceparent) is one trace across the tiers: the router's Recommend,
// its Lookup on the embedding worker, the Score on the dense worker,
// each a child of the one before through the client's span, with the
// stages inside each tier; a request whose caller decided not to sample
// leaves no span, and the registry's heartbeats none either.
func TestTracing(t *testing.T) {
	t.Parallel()
	col := startCollector(t)
	dir := t.TempDir()
	_, part, cfg := partitioned(t, dir, "dlrm-tiny")
	cmd := exec.Command(prismBin, "up", "--addr", "127.0.0.1:0", "--db", "db", "--model", part)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(),
		"OTEL_EXPORTER_OTLP_ENDPOINT=http://"+col.addr,
		"OTEL_BSP_SCHEDULE_DELAY=100",                // export within 0.1 s
		"OTEL_TRACES_SAMPLER=parentbased_always_off", // only what the caller samples
	)
	up := startCmd(t, cmd, "up", readyline.Up, true, 3*time.Minute)
	certs := filepath.Join(dir, "certs")
	if !strings.Contains(up.log.String(), "tracing: spans to the OTLP collector") {
		t.Errorf("no tier said it traces:\n%s", up.log.String())
	}

	req := printedRequest(t, cfg.Name, 5)
	rec := prismv1.NewRecommenderClient(dial(t, up.addr, certs, auth.Admin))
	send := func(traceparent string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if traceparent != "" {
			ctx = metadata.AppendToOutgoingContext(ctx, "traceparent", traceparent)
		}
		if _, err := rec.Recommend(ctx, req); err != nil {
			t.Fatalf("Recommend (traceparent %q): %v", traceparent, err)
		}
	}
	const (
		sampledTrace = "4bf92f3577b34da6a3ce929d0e0e4736"
		callerSpan   = "00f067aa0ba902b7"
		droppedTrace = "5bf92f3577b34da6a3ce929d0e0e4736"
	)
	send("")                                              // no context: the sampler's own decision (off)
	send("00-" + droppedTrace + "-" + callerSpan + "-00") // the caller did not sample
	send("00-" + sampledTrace + "-" + callerSpan + "-01") // sampled

	want := map[string]string{ // span name: service
		"prism.v1.Recommender/Recommend": "prism-router",
		"prism.v1.EmbeddingTier/Lookup":  "prism-embedding",
		"prism.v1.DenseTier/Score":       "prism-dense",
		"embedding.lookup":               "prism-embedding",
		"embedding.encode":               "prism-embedding",
		"dense.queue":                    "prism-dense",
		"dense.run":                      "prism-dense",
	}
	id, _ := hex.DecodeString(sampledTrace)
	var spans []span
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		spans = col.of(id)
		found := 0
		for _, s := range spans {
			if want[s.GetName()] == s.service {
				found++
			}
		}
		if found >= len(want) {
			break
		}
	}
	byName := map[string]span{}
	byID := map[string]span{}
	for _, s := range spans {
		if s.GetKind() == tracepb.Span_SPAN_KIND_SERVER || s.GetKind() == tracepb.Span_SPAN_KIND_INTERNAL {
			byName[s.GetName()] = s
		}
		byID[string(s.GetSpanId())] = s
	}
	for name, service := range want {
		if s, ok := byName[name]; !ok || s.service != service {
			var got []string
			for _, s := range spans {
				got = append(got, s.service+":"+s.GetName()+":"+s.GetKind().String())
			}
			t.Fatalf("trace %s has no %s span of %s; it has %v", sampledTrace, name, service, got)
		}
	}
	// Each tier's server span is a child of the one before, through the
	// calling tier's client span.
	parentServer := func(name string) string {
		p, ok := byID[string(byName[name].GetParentSpanId())]
		if !ok {
			return "(none)"
		}
		if p.GetKind() == tracepb.Span_SPAN_KIND_CLIENT {
			if pp, ok := byID[string(p.GetParentSpanId())]; ok {
				return pp.GetName()
			}
		}
		return p.GetName()
	}
	if p := hex.EncodeToString(byName["prism.v1.Recommender/Recommend"].GetParentSpanId()); p != callerSpan {
		t.Errorf("the router's Recommend span's parent is %s, want the caller's %s", p, callerSpan)
	}
	if p := parentServer("prism.v1.EmbeddingTier/Lookup"); p != "prism.v1.Recommender/Recommend" {
		t.Errorf("Lookup's parent: %s, want the router's Recommend (through its client span)", p)
	}
	if p := parentServer("prism.v1.DenseTier/Score"); p != "prism.v1.EmbeddingTier/Lookup" {
		t.Errorf("Score's parent: %s, want the embedding worker's Lookup (through its client span)", p)
	}
	for _, stage := range []string{"embedding.lookup", "embedding.encode"} {
		if p := parentServer(stage); p != "prism.v1.EmbeddingTier/Lookup" {
			t.Errorf("%s's parent: %s, want the Lookup", stage, p)
		}
	}
	for _, stage := range []string{"dense.queue", "dense.run"} {
		if p := parentServer(stage); p != "prism.v1.DenseTier/Score" {
			t.Errorf("%s's parent: %s, want the Score", stage, p)
		}
	}
	// Each span lies within its parent's time when both are of one
	// process: a stage recorded with wrong times would not. (Across
	// processes a server span may end a moment after its client's: the
	// server's end is stamped after its answer is on the wire.)
	for _, s := range spans {
		p, ok := byID[string(s.GetParentSpanId())]
		if !ok || p.service != s.service {
			continue
		}
		if s.GetStartTimeUnixNano() < p.GetStartTimeUnixNano() || s.GetEndTimeUnixNano() > p.GetEndTimeUnixNano() || s.GetEndTimeUnixNano() < s.GetStartTimeUnixNano() {
			t.Errorf("%s (%s) runs %d..%d ns, outside its parent %s (%s) %d..%d", s.GetName(), s.service, s.GetStartTimeUnixNano(), s.GetEndTimeUnixNano(),
				p.GetName(), p.service, p.GetStartTimeUnixNano(), p.GetEndTimeUnixNano())
		}
	}
	attr := func(s span, key string) string {
		for _, a := range s.GetAttributes() {
			if a.GetKey() == key {
				if v := a.GetValue().GetStringValue(); v != "" {
					return v
				}
				return strings.TrimSpace(protojson.Format(a.GetValue()))
			}
		}
		return ""
	}
	if m := attr(byName["prism.v1.Recommender/Recommend"], "prism.model"); m != cfg.Name {
		t.Errorf("the Recommend span's prism.model is %q, want %q", m, cfg.Name)
	}
	// The router's latency histograms carry the sampled request's trace
	// id as an exemplar, for a scraper asking for OpenMetrics.
	if m := regexp.MustCompile(`\[router\] .*msg=serving tier=router .*metrics=(\S+)`).FindStringSubmatch(up.log.String()); m == nil {
		t.Errorf("no router metrics address in the log")
	} else {
		c, err := auth.ClientTLS(auth.FilesFor(certs, auth.Admin))
		if err != nil {
			t.Fatal(err)
		}
		hc := &http.Client{Transport: &http.Transport{TLSClientConfig: c}, Timeout: 10 * time.Second}
		hreq, _ := http.NewRequest("GET", "https://"+m[1]+"/metrics", nil)
		hreq.Header.Set("Accept", "application/openmetrics-text; version=1.0.0")
		resp, err := hc.Do(hreq)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		for _, metric := range []string{"prism_router_model_request_seconds_bucket", "prism_rpc_latency_seconds_bucket"} {
			if !regexp.MustCompile(`(?m)^` + metric + `\{[^}]*\} \d+ # \{trace_id="` + sampledTrace + `"\}`).Match(body) {
				t.Errorf("no %s bucket with the sampled request's exemplar (trace_id %s) in the router's OpenMetrics", metric, sampledTrace)
			}
		}
		if regexp.MustCompile(droppedTrace).Match(body) {
			t.Errorf("the unsampled request's trace id is an exemplar")
		}
		// The router's span counters: the spans it ended reached the
		// collector (its Recommend span at least), none failed.
		ended := regexp.MustCompile(`(?m)^prism_tracing_spans_ended_total ([1-9]\d*)`).FindSubmatch(body)
		ok := regexp.MustCompile(`(?m)^prism_tracing_spans_exported_total\{result="ok"\} ([1-9]\d*)`).FindSubmatch(body)
		if ended == nil || ok == nil || !regexp.MustCompile(`(?m)^prism_tracing_spans_exported_total\{result="failed"\} 0`).Match(body) {
			t.Errorf("the router's span counters: want spans ended and exported, none failed; /metrics:\n%s", regexp.MustCompile(`(?m)^prism_tracing.*$`).FindAll(body, -1))
		}
	}

	// Nothing of the other requests, nor of the heartbeats, a second on.
	time.Sleep(time.Second)
	for _, s := range col.of(nil) {
		if string(s.GetTraceId()) != string(id) {
			t.Errorf("a span of another trace: %s %s (%s)", s.service, s.GetName(), hex.EncodeToString(s.GetTraceId()))
		}
	}

	// prism loadgen --trace-ratio: the trace ids it names are traces the
	// tiers recorded.
	lg := exec.Command(prismBin, "loadgen", "--target", up.addr, "--certs", certs, "--model", cfg.Name,
		"--duration", "1s", "--rate", "20", "--candidates", "5", "--quiet", "--trace-ratio", "1") // 20: a Poisson second sends none e^-20 of the time
	lgOut, err := lg.CombinedOutput()
	m := regexp.MustCompile(`(?m)^ {12}([0-9a-f]{32})  `).FindSubmatch(lgOut)
	if err != nil || m == nil {
		t.Fatalf("prism loadgen --trace-ratio 1: %v, no trace id named:\n%s", err, lgOut)
	}
	slowest, _ := hex.DecodeString(string(m[1]))
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		var names []string
		for _, s := range col.of(slowest) {
			names = append(names, s.GetName())
		}
		if slices.Contains(names, "prism.v1.Recommender/Recommend") && slices.Contains(names, "dense.run") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("loadgen's slowest trace %s: spans %v, want the router's Recommend through the dense run", m[1], names)
		}
	}

	// A traced RecommendStream: each of its requests is a subtree of the
	// stream's span (prism.recommend), its lookups under it.
	const streamTrace = "6bf92f3577b34da6a3ce929d0e0e4736"
	sctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(context.Background(), "traceparent", "00-"+streamTrace+"-"+callerSpan+"-01"), 30*time.Second)
	defer cancel()
	stream, err := rec.RecommendStream(sctx)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := stream.Send(req); err != nil {
			t.Fatal(err)
		}
	}
	stream.CloseSend()
	for range 2 {
		if resp, err := stream.Recv(); err != nil || resp.GetError() != nil {
			t.Fatalf("stream answer: %v %v", resp.GetError(), err)
		}
	}
	sid, _ := hex.DecodeString(streamTrace)
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		spans := col.of(sid)
		ids := map[string]span{}
		for _, s := range spans {
			ids[string(s.GetSpanId())] = s
		}
		requests, lookups := 0, 0
		for _, s := range spans {
			switch s.GetName() {
			case "prism.recommend":
				if p := ids[string(s.GetParentSpanId())]; p.GetName() == "prism.v1.Recommender/RecommendStream" {
					requests++
				}
			case "prism.v1.EmbeddingTier/Lookup":
				if s.GetKind() != tracepb.Span_SPAN_KIND_CLIENT {
					continue
				}
				if p := ids[string(s.GetParentSpanId())]; p.GetName() == "prism.recommend" {
					lookups++
				}
			}
		}
		if requests == 2 && lookups == 2 {
			break
		}
		if time.Now().After(deadline) {
			var got []string
			for _, s := range spans {
				got = append(got, s.service+":"+s.GetName()+":"+s.GetKind().String())
			}
			t.Fatalf("stream trace: %d requests under the stream, %d lookups under a request, want 2 and 2; spans %v", requests, lookups, got)
		}
	}
}
