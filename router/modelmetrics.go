package router

import (
	"context"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/internal/tracing"
)

// Per-model request metrics: prism_rpc_requests_total counts RPCs by
// method and code, one stream as one RPC, so a fleet serving several
// models could not tell which model's requests failed or slowed.
// Each Recommend request, on its own or on a stream, is counted by its
// model and answer's code, and its time observed by model. Model names
// come from clients, so a label is a model some worker announced
// (Registry.Known), up to maxModelLabels of them; any other request is
// counted under otherModel.

// maxModelLabels bounds the model label's values (each model adds a
// histogram's series and a counter's per code).
const maxModelLabels = 256

// otherModel is the label of a request for a model not labelled: never
// announced (NotFound), or past maxModelLabels.
const otherModel = "(other)"

type modelMetrics struct {
	requests *prometheus.CounterVec
	seconds  *prometheus.HistogramVec
	known    func(model string) bool
	// labelled holds the models labelled (read without a lock on every
	// request); mu guards adding one, n counting them.
	labelled sync.Map
	mu       sync.Mutex
	n        int
}

func newModelMetrics(known func(string) bool) *modelMetrics {
	return &modelMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "prism", Subsystem: "router", Name: "model_requests_total",
			Help: "Recommend requests (on their own or on a RecommendStream) by model and the gRPC code of their answer; a model no worker announced, or past the first 256, counts as \"(other)\"."}, []string{"model", "code"}),
		seconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: "prism", Subsystem: "router", Name: "model_request_seconds",
			Help: "Time from a Recommend request's arrival at the router to its answer, by model (every answer, failures too).", Buckets: prometheus.ExponentialBuckets(0.5e-3, 2, 15)}, []string{"model"}),
		known: known,
	}
}

// label is model's label value.
func (m *modelMetrics) label(model string) string {
	if _, ok := m.labelled.Load(model); ok {
		return model
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.labelled.Load(model); ok {
		return model
	}
	if m.n < maxModelLabels && model != otherModel && m.known(model) {
		m.labelled.Store(model, true)
		m.n++
		return model
	}
	return otherModel
}

// observe counts a request for model answered with err after took; a
// sampled request's (ctx's) trace id goes with it as an exemplar.
func (m *modelMetrics) observe(ctx context.Context, model string, err error, took time.Duration) {
	l := m.label(model)
	m.requests.WithLabelValues(l, status.Code(err).String()).Inc()
	tracing.Observe(ctx, m.seconds.WithLabelValues(l), took.Seconds())
}
