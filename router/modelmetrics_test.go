package router

import (
	"context"
	"fmt"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
)

// TestModelMetrics: every Recommend request is counted by its model and
// answer's code, and timed by model; a model no worker announced (any
// name a client sends) is counted as "(other)", and so is one past
// maxModelLabels, so clients cannot grow the label's values.
func TestModelMetrics(t *testing.T) {
	r := testRouter(Options{MicroBatch: 8})
	for i, m := range []string{"m", "m2"} {
		addr := startCN(t, &fakeCN{})
		r.Reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: &prismv1.WorkerInfo{Id: "c-" + m, Role: prismv1.Role_ROLE_EMBEDDING, Addr: addr, Models: []string{m}, Healthy: true}})
		r.Reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: &prismv1.WorkerInfo{Id: "g-" + m, Role: prismv1.Role_ROLE_DENSE, Addr: fmt.Sprintf("d%d", i), Models: []string{m}, Healthy: true}})
	}
	for range 3 {
		if _, err := r.Recommend(context.Background(), request(20)); err != nil {
			t.Fatal(err)
		}
	}
	bad := request(4)
	bad.Model = "no-such-model"
	if _, err := r.Recommend(context.Background(), bad); status.Code(err) != codes.NotFound {
		t.Fatalf("a model no worker serves: %v, want NotFound", err)
	}
	for _, tc := range []struct {
		model, code string
		want        float64
	}{{"m", "OK", 3}, {otherModel, "NotFound", 1}, {"no-such-model", "NotFound", 0}, {"m2", "OK", 0}} {
		if got := counterValue(t, r.m.models.requests.WithLabelValues(tc.model, tc.code)); got != tc.want {
			t.Errorf("model_requests_total{model=%q,code=%q} = %v, want %v", tc.model, tc.code, got, tc.want)
		}
	}
	if n := seriesCount(r.m.models.seconds); n != 2 {
		t.Errorf("model_request_seconds has %d series, want 2 (m and (other))", n)
	}
	// Past maxModelLabels known models, the rest count as "(other)".
	known := map[string]bool{}
	m := newModelMetrics(func(string) bool { return true })
	for i := range maxModelLabels + 10 {
		known[m.label(fmt.Sprintf("model-%d", i))] = true
	}
	if len(known) != maxModelLabels+1 || !known[otherModel] {
		t.Errorf("%d label values for %d known models, want %d and %q", len(known), maxModelLabels+10, maxModelLabels+1, otherModel)
	}
}

// counterValue reads c's value.
func counterValue(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// seriesCount is how many series c collects.
func seriesCount(c prometheus.Collector) int {
	ch := make(chan prometheus.Metric, 64)
	go func() { c.Collect(ch); close(ch) }()
	n := 0
	for range ch {
		n++
	}
	return n
}
