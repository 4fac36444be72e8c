package main

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Mend states, one-hot in prism_embedding_mend_state: idle (no model
// out for good), waiting (out, retrying: no router answers, no source
// in sync, every copy failed or refused), copying, held (out again
// within --mend-every of the last copy: the worker will not mend
// itself until then, and its log says why).
const (
	mendIdle    = "idle"
	mendWaiting = "waiting"
	mendCopying = "copying"
	mendHeld    = "held"
)

var mendStates = []string{mendIdle, mendWaiting, mendCopying, mendHeld}

// mendMetrics are an embedding worker's self-mend metrics (--mend). A
// mend ends the process, so its counters start again at each restart;
// the last mend's time is read from the store's record and survives it.
type mendMetrics struct {
	state       *prometheus.GaugeVec
	copied      prometheus.Gauge
	size        prometheus.Gauge
	attempts    *prometheus.CounterVec
	last        prometheus.Gauge
	collectorsL []prometheus.Collector
}

func newMendMetrics() *mendMetrics {
	m := &mendMetrics{
		state: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "prism", Subsystem: "embedding", Name: "mend_state",
			Help: "The self-mend's state (--mend), 1 for the current one: idle (no model out for good), waiting (out, trying again later: no router answers, no worker in sync to copy from, or every copy failed or was refused), copying, held (out again within --mend-every of the last copy: not mending until then; the log says why).",
		}, []string{"state"}),
		copied: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "prism", Subsystem: "embedding", Name: "mend_copy_bytes",
			Help: "Bytes of the store copy under way received so far (0 when none).",
		}),
		size: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "prism", Subsystem: "embedding", Name: "mend_copy_size_bytes",
			Help: "Bytes of the store copy under way, in all (0 when none).",
		}),
		attempts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "prism", Subsystem: "embedding", Name: "mend_copies_total",
			Help: "Store copies this process asked a worker for, by outcome: staged (the process then ends to be restarted), refused (the copy lacked a model, shard or update this worker must hold), busy (the worker asked was sending a copy already), failed.",
		}, []string{"outcome"}),
		last: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "prism", Subsystem: "embedding", Name: "last_mend_timestamp_seconds",
			Help: "When this worker last staged a copy of another worker's store to mend itself (Unix time; 0: never), from the store's record.",
		}),
	}
	for _, o := range []string{"staged", "refused", "busy", "failed"} {
		m.attempts.WithLabelValues(o)
	}
	m.set(mendIdle)
	m.collectorsL = []prometheus.Collector{m.state, m.copied, m.size, m.attempts, m.last}
	return m
}

func (m *mendMetrics) collectors() []prometheus.Collector { return m.collectorsL }

// set makes state the current one; nil-safe, as every method.
func (m *mendMetrics) set(state string) {
	if m == nil {
		return
	}
	for _, s := range mendStates {
		v := 0.0
		if s == state {
			v = 1
		}
		m.state.WithLabelValues(s).Set(v)
	}
}

func (m *mendMetrics) progress(done, total int64) {
	if m == nil {
		return
	}
	m.copied.Set(float64(done))
	m.size.Set(float64(total))
}

func (m *mendMetrics) attempt(outcome string) {
	if m == nil {
		return
	}
	m.attempts.WithLabelValues(outcome).Inc()
}

func (m *mendMetrics) mended(at time.Time, ok bool) {
	if m == nil || !ok {
		return
	}
	m.last.Set(float64(at.UnixNano()) / 1e9)
}
