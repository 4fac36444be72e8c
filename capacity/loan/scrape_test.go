package loan

import (
	"bytes"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
)

// TestRouterSampleFromClientLibrary reads the exposition the Prometheus
// client library writes (HELP and TYPE lines, a real histogram with its
// implicit +Inf bucket), as the router's /metrics serves it.
func TestRouterSampleFromClientLibrary(t *testing.T) {
	reg := prometheus.NewRegistry()
	reqs := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "prism_rpc_requests_total", Help: "RPCs handled."}, []string{"method", "code"})
	lat := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "prism_rpc_latency_seconds", Help: "RPC latency.", Buckets: []float64{0.01, 0.1}}, []string{"method"})
	inflight := prometheus.NewGauge(prometheus.GaugeOpts{Name: "prism_router_inflight_samples", Help: "Samples in flight."})
	reg.MustRegister(reqs, lat, inflight)
	expose := func() sample {
		t.Helper()
		fams, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		var buf bytes.Buffer
		enc := expfmt.NewEncoder(&buf, expfmt.NewFormat(expfmt.TypeTextPlain))
		for _, f := range fams {
			if err := enc.Encode(f); err != nil {
				t.Fatal(err)
			}
		}
		lines, err := parseText(&buf)
		if err != nil {
			t.Fatalf("%v\n%s", err, buf.String())
		}
		return routerSample(lines)
	}
	a := expose()
	for range 190 {
		reqs.WithLabelValues(recommendMethod, "OK").Inc()
		lat.WithLabelValues(recommendMethod).Observe(0.005)
	}
	for range 10 {
		reqs.WithLabelValues(recommendMethod, "ResourceExhausted").Inc()
		lat.WithLabelValues(recommendMethod).Observe(0.05)
	}
	reqs.WithLabelValues("/prism.v1.Registry/List", "OK").Add(99)
	lat.WithLabelValues("/prism.v1.Registry/List").Observe(5)
	inflight.Set(32)
	b := expose()
	d, ok := between(a, b, 2*time.Second)
	if !ok || d.offered != 100 || d.shed != 5 || d.queue != 32 || d.p99 != 100*time.Millisecond {
		t.Errorf("demand %+v, want 100 offered, 5 shed, queue 32, p99 100ms", d)
	}
}

func TestParseTextRejectsGarbage(t *testing.T) {
	if _, err := parseText(bytes.NewBufferString("prism_router_inflight_samples{ 3\n")); err == nil {
		t.Error("a malformed line parsed")
	}
}
