package loan

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/capacity"
	"github.com/prism-serve/prism/internal/serve"
)

// TestP99AcrossBucketLayouts: routers of two releases behind one
// headless Service (a rolling upgrade that changed
// prism_rpc_latency_seconds' buckets) expose histograms with different
// bounds. Summed bound by bound, no bound but +Inf held both routers'
// counts, so every request answered in 10 ms read as a p99 of the
// highest finite bound, 102.4 ms, over a 60 ms p99= limit: the driver
// borrowed for a service well inside its SLO. Each router's count at a
// bound is its count at its own highest bound below it.
func TestP99AcrossBucketLayouts(t *testing.T) {
	old := prometheus.ExponentialBuckets(50e-6, 2, 18) // the layout before serve.LatencyBuckets
	var lats []prometheus.ObserverVec
	var urls []string
	for _, buckets := range [][]float64{old, serve.LatencyBuckets} {
		reg := prometheus.NewRegistry()
		lat := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "prism_rpc_latency_seconds", Help: "RPC latency, by method.", Buckets: buckets}, []string{"method"})
		reqs := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "prism_rpc_requests_total", Help: "RPCs handled."}, []string{"method", "code"})
		reqs.WithLabelValues(recommendMethod, "OK").Add(0)
		lat.WithLabelValues(recommendMethod)
		reg.MustRegister(lat, reqs)
		lats = append(lats, observeCounting{lat, reqs})
		srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		t.Cleanup(srv.Close)
		urls = append(urls, srv.URL)
	}
	now := time.Unix(1000, 0)
	lender := &fakeLender{max: 2, workers: map[string]*capacity.LentWorker{}, reclaims: make(chan capacity.ProviderReclaim, 4)}
	d, err := New(Options{
		Provider: lender, Model: "m", CapacityPerWorker: 1000, Controller: capacity.Options{MaxBorrowed: 2, P99Limit: 60 * time.Millisecond},
		Registry: func(context.Context) ([]*prismv1.WorkerInfo, error) {
			return []*prismv1.WorkerInfo{{Id: "owned", Role: prismv1.Role_ROLE_DENSE, Addr: "addr-owned"}}, nil
		},
		RouterMetrics: func() string { return strings.Join(urls, ",") },
		Now:           func() time.Time { return now },
		Logf:          func(string, ...any) {},
	})
	if err != nil {
		t.Fatal(err)
	}
	for tick := range 3 {
		for _, lat := range lats {
			for range 100 * tick {
				lat.WithLabelValues(recommendMethod).Observe(0.010)
			}
		}
		now = now.Add(time.Second)
		if err := d.Step(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	d.mu.Lock()
	dem := d.lastDemand
	d.mu.Unlock()
	if dem.offered == 0 || dem.p99 > 15*time.Millisecond {
		t.Errorf("every request answered in 10 ms by two routers of different bucket layouts: demand %.0f requests/s, p99 %v, want about 10 ms", dem.offered, dem.p99)
	}
	if n := len(lender.Workers()); n != 0 {
		t.Errorf("%d workers borrowed for a service inside its p99 limit", n)
	}
}

// observeCounting observes a latency and counts the request with it.
type observeCounting struct {
	prometheus.ObserverVec
	reqs *prometheus.CounterVec
}

func (o observeCounting) WithLabelValues(lvs ...string) prometheus.Observer {
	return prometheus.ObserverFunc(func(v float64) {
		o.reqs.WithLabelValues(recommendMethod, "OK").Inc()
		o.ObserverVec.WithLabelValues(lvs...).Observe(v)
	})
}
