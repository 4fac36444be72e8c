package loadgen

import (
	"cmp"
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
)

// Tracing a share of a run's requests (Options.TraceRatio): every
// Recommend carries a W3C trace context (a traceparent header) with a
// trace id of its own, sampled for that share and not for the others,
// so that the servers (which follow the caller's decision: Prism's
// tiers with tracing on, README "Tracing a request") trace exactly that
// share; the report names the slowest sampled requests' trace ids, to
// look up in the tracing backend.

// TracedSlowest is how many of the slowest sampled requests a report
// names.
const TracedSlowest = 10

// TracedRequest is one sampled request as the report names it.
type TracedRequest struct {
	TraceID   string  `json:"trace_id"`
	LatencyMs float64 `json:"latency_ms"` // from its intended send time
	Code      string  `json:"code"`
	// Model is the request's model in a run over a mix of models.
	Model string `json:"model,omitempty"`
}

// TraceStats is what a traced run sampled.
type TraceStats struct {
	Ratio   float64         `json:"ratio"`
	Sampled int64           `json:"sampled"`
	Slowest []TracedRequest `json:"slowest"` // slowest first
}

// tracer makes the requests' trace contexts and keeps the slowest
// sampled ones.
type tracer struct {
	ratio float64
	mu    sync.Mutex
	rng   *rand.Rand // draws which requests are sampled; ids come from crypto/rand
	stats TraceStats
}

func newTracer(ratio float64, seed uint64) *tracer {
	if ratio <= 0 {
		return nil
	}
	return &tracer{ratio: ratio, rng: rand.New(rand.NewPCG(seed, 0x7261636564)), stats: TraceStats{Ratio: ratio}}
}

// start puts a new trace context on ctx: a random trace id and parent
// span id, sampled with the tracer's ratio.
func (t *tracer) start(ctx context.Context) (_ context.Context, traceID string, sampled bool) {
	var id [24]byte // 16 of trace id, 8 of parent span id
	crand.Read(id[:])
	t.mu.Lock()
	sampled = t.rng.Float64() < t.ratio
	t.mu.Unlock()
	flags := "00"
	if sampled {
		flags = "01"
	}
	traceID = hex.EncodeToString(id[:16])
	return metadata.AppendToOutgoingContext(ctx, "traceparent", "00-"+traceID+"-"+hex.EncodeToString(id[16:])+"-"+flags), traceID, sampled
}

// done records a sampled request's outcome.
// model names the request's model in a mix ("" for one model).
func (t *tracer) done(traceID, model string, latency time.Duration, code codes.Code) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.stats.Sampled++
	r := TracedRequest{TraceID: traceID, LatencyMs: float64(latency) / 1e6, Code: code.String(), Model: model}
	s := t.stats.Slowest
	if len(s) == TracedSlowest && r.LatencyMs <= s[len(s)-1].LatencyMs {
		return
	}
	i, _ := slices.BinarySearchFunc(s, r, func(a, b TracedRequest) int { return cmp.Compare(b.LatencyMs, a.LatencyMs) })
	s = slices.Insert(s, i, r)
	if len(s) > TracedSlowest {
		s = s[:TracedSlowest]
	}
	t.stats.Slowest = s
}

func (t *tracer) summary() *TraceStats {
	if t == nil {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	st := t.stats
	st.Slowest = slices.Clone(st.Slowest)
	return &st
}

// writeText prints the sampled share and the slowest requests' ids.
func (s *TraceStats) writeText(w io.Writer, sent int64) {
	fmt.Fprintf(w, "traced      %d of %d requests sampled (traceparent, --trace-ratio %g)", s.Sampled, sent, s.Ratio)
	if len(s.Slowest) == 0 {
		fmt.Fprintln(w)
		return
	}
	fmt.Fprintln(w, "; the slowest, by trace id:")
	for _, r := range s.Slowest {
		if r.Model != "" {
			fmt.Fprintf(w, "            %s  %.3fms  %s  %s\n", r.TraceID, r.LatencyMs, r.Code, r.Model)
		} else {
			fmt.Fprintf(w, "            %s  %.3fms  %s\n", r.TraceID, r.LatencyMs, r.Code)
		}
	}
}
