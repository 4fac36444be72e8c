package server

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/prism-serve/prism/api/prismv1"
)

// metrics are the tier's own Prometheus metrics; the RPC counts and
// latency come from internal/serve, the store's from store.Collector.
type metrics struct {
	stage                                    *prometheus.HistogramVec
	decode, lookup, cpu, encode, xfer, dense prometheus.Observer
	samples                                  prometheus.Histogram
	outstanding                              prometheus.GaugeFunc
	// frameBytes and frameSamples count the cut-tensor frames sent to
	// dense workers (ScoreRequest.tensors) and their samples: bytes per
	// sample on the wire, which context columns cut.
	frameBytes, frameSamples prometheus.Counter
	// unknownDense counts Lookups naming a dense worker this worker had
	// not been told of, by outcome: served once its routers' answer
	// named it (awaitDense), or refused.
	unknownDense *prometheus.CounterVec
}

func newMetrics(s *Server) *metrics {
	m := &metrics{}
	m.stage = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: "prism", Subsystem: "embedding", Name: "stage_seconds",
		Help:    "Time of one micro-batch in each stage: decode, lookup, cpu_model, encode, transfer (the Score call minus dense), dense.",
		Buckets: prometheus.ExponentialBuckets(10e-6, 2, 20),
	}, []string{"stage"})
	m.decode = m.stage.WithLabelValues("decode")
	m.lookup = m.stage.WithLabelValues("lookup")
	m.cpu = m.stage.WithLabelValues("cpu_model")
	m.encode = m.stage.WithLabelValues("encode")
	m.xfer = m.stage.WithLabelValues("transfer")
	m.dense = m.stage.WithLabelValues("dense")
	m.samples = prometheus.NewHistogram(prometheus.HistogramOpts{
		Namespace: "prism", Subsystem: "embedding", Name: "batch_samples",
		Help:    "Samples per Lookup request.",
		Buckets: prometheus.ExponentialBuckets(1, 2, 14),
	})
	m.outstanding = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "prism", Subsystem: "embedding", Name: "outstanding_samples",
		Help: "Samples in flight in this embedding tier.",
	}, func() float64 { return float64(s.Outstanding()) })
	m.frameBytes = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: "prism", Subsystem: "embedding", Name: "frame_bytes_total",
		Help: "Bytes of the cut-tensor frames (Arrow IPC) sent to dense workers in Score calls that succeeded.",
	})
	m.frameSamples = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: "prism", Subsystem: "embedding", Name: "frame_samples_total",
		Help: "Samples of the frames counted in prism_embedding_frame_bytes_total.",
	})
	m.unknownDense = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "prism", Subsystem: "embedding", Name: "unknown_dense_lookups_total",
		Help: "Lookups naming a dense worker this worker had not been told of: served (it asked its routers out of turn and their answer named it) or refused (PermissionDenied).",
	}, []string{"outcome"})
	return m
}

func (m *metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.stage, m.samples, m.outstanding, m.frameBytes, m.frameSamples, m.unknownDense}
}

// frame counts a frame of n samples sent in a successful Score call.
func (m *metrics) frame(bytes, n int) {
	m.frameBytes.Add(float64(bytes))
	m.frameSamples.Add(float64(n))
}

func (m *metrics) observe(t *prismv1.StageTimes) {
	m.decode.Observe(float64(t.DecodeUs) / 1e6)
	m.lookup.Observe(float64(t.LookupUs) / 1e6)
	m.cpu.Observe(float64(t.CpuModelUs) / 1e6)
	m.encode.Observe(float64(t.EncodeUs) / 1e6)
	m.xfer.Observe(float64(t.TransferUs) / 1e6)
	m.dense.Observe(float64(t.DenseUs) / 1e6)
}
