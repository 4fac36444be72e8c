package router

import (
	"context"
	"fmt"
	"io"
	"testing"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/internal/tracing"
)

// TestTracingStream: each request of a traced RecommendStream is a span
// of its own under the stream's, with its own attributes (its model,
// candidates and request id), and its micro-batches' Lookups under it.
// The stream's one span took every request's attributes in turn (the
// last request's were what a trace showed, for every request of a
// job), and every Lookup of the job hung from it, no telling whose.
func TestTracingStream(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	t.Cleanup(tracing.Use(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))))

	r := newRouter(t, Options{StreamWindow: 2}, &fakeCN{})
	// The router's connections to its workers trace by serve.DialOptions
	// (tracing.Use turned tracing on).
	addr, lis := listen(t)
	s := grpc.NewServer(grpc.StatsHandler(otelgrpc.NewServerHandler()))
	prismv1.RegisterRecommenderServer(s, r)
	go s.Serve(lis)
	t.Cleanup(s.Stop)
	st, err := prismv1.NewRecommenderClient(dialTest(t, addr)).RecommendStream(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	const n = 4
	for i := range n {
		req := request(3 + i)
		req.RequestId = fmt.Sprint("r", i)
		if err := st.Send(req); err != nil {
			t.Fatal(err)
		}
	}
	st.CloseSend()
	for i := range n {
		if resp, err := st.Recv(); err != nil || resp.GetError() != nil {
			t.Fatalf("response %d: %v %v", i, resp, err)
		}
	}
	if _, err := st.Recv(); err != io.EOF {
		t.Fatalf("after the last answer: %v", err)
	}
	s.Stop() // the stream's server span ends with its handler

	var stream trace.SpanID
	byID := map[trace.SpanID]sdktrace.ReadOnlySpan{}
	for _, sp := range rec.Ended() {
		byID[sp.SpanContext().SpanID()] = sp
		if sp.Name() == "prism.v1.Recommender/RecommendStream" && sp.SpanKind() == trace.SpanKindServer {
			stream = sp.SpanContext().SpanID()
		}
	}
	if !stream.IsValid() {
		t.Fatal("no server span of the stream")
	}
	attr := func(sp sdktrace.ReadOnlySpan, key string) string {
		for _, a := range sp.Attributes() {
			if string(a.Key) == key {
				return a.Value.Emit()
			}
		}
		return ""
	}
	requests := map[string]trace.SpanID{} // request id: its span
	for _, sp := range rec.Ended() {
		if id := attr(sp, "prism.request_id"); id != "" {
			if sp.Parent().SpanID() != stream {
				t.Errorf("request %s's span %s is not a child of the stream's", id, sp.Name())
			}
			var i int
			fmt.Sscanf(id, "r%d", &i)
			if c := attr(sp, "prism.candidates"); c != fmt.Sprint(3+i) {
				t.Errorf("request %s's span says %s candidates, want %d", id, c, 3+i)
			}
			requests[id] = sp.SpanContext().SpanID()
		}
	}
	if len(requests) != n {
		t.Fatalf("spans of %d requests (%v), want one for each of %d", len(requests), requests, n)
	}
	lookups := 0
	for _, sp := range rec.Ended() {
		if sp.Name() != "prism.v1.EmbeddingTier/Lookup" || sp.SpanKind() != trace.SpanKindClient {
			continue
		}
		lookups++
		if p, ok := byID[sp.Parent().SpanID()]; !ok || attr(p, "prism.request_id") == "" {
			t.Errorf("a Lookup's parent is not a request's span")
		}
	}
	if lookups != n {
		t.Errorf("%d Lookups traced, want %d", lookups, n)
	}
}

// TestTracingUpdate: a traced update's span says what it updated and
// the number it took in its sequence, so that one merged with another
// (group commit, sent under the first one's trace) can be matched to
// the fan-out that carried it.
func TestTracingUpdate(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(tracing.Use(tp))
	rig := newUpdateRig(t, Options{}, &seqCN{}, &seqCN{})
	ctx, span := tp.Tracer("t").Start(context.Background(), "Embeddings/Update")
	resp, err := rig.updateCtx(ctx, "t", 7, 1.5)
	span.End()
	if err != nil {
		t.Fatal(err)
	}
	var got sdktrace.ReadOnlySpan
	for _, sp := range rec.Ended() {
		if sp.Name() == "Embeddings/Update" {
			got = sp
		}
	}
	attrs := map[string]string{}
	for _, a := range got.Attributes() {
		attrs[string(a.Key)] = a.Value.Emit()
	}
	want := map[string]string{"prism.model": "m", "prism.table": "t", "prism.rows": "1", "prism.update.workers": "2",
		"prism.update.seq.m": fmt.Sprint(resp.GetHeld()["m"].GetSeq())}
	for k, v := range want {
		if attrs[k] != v {
			t.Errorf("%s = %q, want %q (attributes %v)", k, attrs[k], v, attrs)
		}
	}
}
