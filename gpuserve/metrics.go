package gpuserve

import (
	"sort"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics exposes the batchers' counters per model. The batcher keeps
// its own counts (Snapshot); they are read at scrape time, so scoring
// pays nothing for them.
type metrics struct {
	s        *Server
	rejected *prometheus.CounterVec
	samples  *prometheus.Desc
	batches  *prometheus.Desc
	sizes    *prometheus.Desc
	depth    *prometheus.Desc
	overload *prometheus.Desc
	deadline *prometheus.Desc
}

var _ prometheus.Collector = (*metrics)(nil)

func newMetrics(s *Server) *metrics {
	lbl := []string{"model"}
	return &metrics{
		s: s,
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "prism", Subsystem: "dense", Name: "rejected_total",
			Help: "Score requests refused, by model and reason (not_found, content: another model of the name, invalid, overloaded, deadline, closed, error).",
		}, []string{"model", "reason"}),
		samples:  prometheus.NewDesc("prism_dense_samples_total", "Samples scored by dense.onnx.", lbl, nil),
		batches:  prometheus.NewDesc("prism_dense_batches_total", "ONNX Runtime runs (batches).", lbl, nil),
		sizes:    prometheus.NewDesc("prism_dense_batch_size", "Samples per ONNX Runtime run.", lbl, nil),
		depth:    prometheus.NewDesc("prism_dense_queue_depth", "Samples queued or running.", lbl, nil),
		overload: prometheus.NewDesc("prism_dense_batcher_overloaded_total", "Requests the batcher refused because its queue was full.", lbl, nil),
		deadline: prometheus.NewDesc("prism_dense_batcher_deadline_refused_total", "Requests the batcher answered DeadlineExceeded without running them, by model and why: expired (the deadline passed in the queue) or predicted (its run-time estimates said it would miss it).", []string{"model", "why"}, nil),
	}
}

// Register adds the dense tier's metrics to reg (the tier's /metrics).
func (s *Server) Register(reg prometheus.Registerer) error {
	if err := reg.Register(s.metrics.rejected); err != nil {
		return err
	}
	return reg.Register(s.metrics)
}

func (m *metrics) reject(model, reason string) {
	if model == "" {
		model = "unknown"
	}
	m.rejected.WithLabelValues(model, reason).Inc()
}

func (m *metrics) Describe(ch chan<- *prometheus.Desc) {
	ch <- m.samples
	ch <- m.batches
	ch <- m.sizes
	ch <- m.depth
	ch <- m.overload
	ch <- m.deadline
}

func (m *metrics) Collect(ch chan<- prometheus.Metric) {
	for _, name := range m.s.names {
		b := m.s.models[name].batcher
		batches, samples, rejected, sizes := b.Snapshot()
		ch <- prometheus.MustNewConstMetric(m.samples, prometheus.CounterValue, float64(samples), name)
		ch <- prometheus.MustNewConstMetric(m.batches, prometheus.CounterValue, float64(batches), name)
		ch <- prometheus.MustNewConstMetric(m.overload, prometheus.CounterValue, float64(rejected), name)
		ch <- prometheus.MustNewConstMetric(m.depth, prometheus.GaugeValue, float64(b.QueueDepth()), name)
		expired, late := b.DeadlineRefused()
		ch <- prometheus.MustNewConstMetric(m.deadline, prometheus.CounterValue, float64(expired), name, "expired")
		ch <- prometheus.MustNewConstMetric(m.deadline, prometheus.CounterValue, float64(late), name, "predicted")
		ch <- prometheus.MustNewConstHistogram(m.sizes, uint64(batches), float64(samples), cumulative(sizes, m.s.opts.Batch.MaxBatch), name)
	}
}

// cumulative turns the batcher's power-of-two size counts (a run of n
// samples counts under the least power of two >= n) into Prometheus'
// cumulative buckets, exact at every power of two up to maxBatch (and beyond, for requests run alone).
func cumulative(sizes map[int]int64, maxBatch int) map[float64]uint64 {
	bounds := map[int]bool{}
	for b := 1; b <= maxBatch; b *= 2 {
		bounds[b] = true
	}
	for k := range sizes {
		bounds[k] = true
	}
	keys := make([]int, 0, len(bounds))
	for k := range bounds {
		keys = append(keys, k)
	}
	sort.Ints(keys)
	out := make(map[float64]uint64, len(keys))
	var acc uint64
	for _, k := range keys {
		acc += uint64(sizes[k])
		out[float64(k)] = acc
	}
	return out
}
