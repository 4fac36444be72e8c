package router

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"

	"github.com/prism-serve/prism/api/prismv1"
)

// TestOpsMetrics: the router's /metrics says which model has no worker
// of a tier (prism_router_workers counted by role only: model b losing
// its last dense worker left it at 1, model a's) and how full the queue
// of embedding updates is against its bound. A worker a call found
// unreachable (killed, not yet expired) does not count.
func TestOpsMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	r := New(Options{MicroBatch: 8, MaxUpdateQueueBytes: 1000}, reg)
	ctx := context.Background()
	for _, w := range []*prismv1.WorkerInfo{
		{Id: "e1", Role: prismv1.Role_ROLE_EMBEDDING, Addr: "e:1", Models: []string{"a", "b"}, Healthy: true},
		{Id: "e2", Role: prismv1.Role_ROLE_EMBEDDING, Addr: "e:2", Models: []string{"a"}, Healthy: true},
		{Id: "d1", Role: prismv1.Role_ROLE_DENSE, Addr: "d:1", Models: []string{"a"}, Healthy: true},
		{Id: "d2", Role: prismv1.Role_ROLE_DENSE, Addr: "d:2", Models: []string{"b"}, Healthy: true},
		{Id: "d3", Role: prismv1.Role_ROLE_DENSE, Addr: "d:3", Models: []string{"a"}, Healthy: true},
	} {
		if _, err := r.Reg.Announce(ctx, &prismv1.AnnounceRequest{Worker: w}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := r.Reg.Leave(ctx, &prismv1.LeaveRequest{Id: "d2"}); err != nil {
		t.Fatal(err)
	}
	r.Reg.Unreachable("d3") // killed: still registered, sent nothing
	r.updateBytes.Store(640)
	want := `
# HELP prism_router_model_workers Live workers serving each model, by role (embedding, dense), less those a call found unreachable (left out of picks until they answer or announce again); 0 for a model some worker announced since the router started and none of that role serves now (the model is Unavailable); left out for a role whose last worker announced again without the model (retired: a model retired from both tiers is NotFound). At most 256 models are listed.
# TYPE prism_router_model_workers gauge
prism_router_model_workers{model="a",role="dense"} 1
prism_router_model_workers{model="a",role="embedding"} 2
prism_router_model_workers{model="b",role="dense"} 0
prism_router_model_workers{model="b",role="embedding"} 1
# HELP prism_router_update_queue_bytes Bytes of this router's memory held by the embedding updates it took and has not answered yet (waiting for their model's turn, or being written): each one's decoded message and about 14 KiB for its call (handler stack, gRPC stream); against prism_router_update_queue_limit_bytes.
# TYPE prism_router_update_queue_bytes gauge
prism_router_update_queue_bytes 640
# HELP prism_router_update_queue_limit_bytes --max-update-queue-bytes: past it, updates are refused ResourceExhausted (prism_router_rejected_total{reason="updates"}).
# TYPE prism_router_update_queue_limit_bytes gauge
prism_router_update_queue_limit_bytes 1000
`
	if got := gatherText(t, reg, "prism_router_model_workers", "prism_router_update_queue_bytes", "prism_router_update_queue_limit_bytes"); got != strings.TrimLeft(want, "\n") {
		t.Errorf("/metrics:\n%s\nwant:\n%s", got, want)
	}
	// The model label is bounded.
	if got := len(r.Reg.modelWorkers(1)); got != 1 {
		t.Errorf("modelWorkers(1) listed %d models, want 1", got)
	}
}

// gatherText is the exposition text of reg's families named.
func gatherText(t *testing.T, reg prometheus.Gatherer, names ...string) string {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, mf := range mfs {
		if slices.Contains(names, mf.GetName()) {
			if _, err := expfmt.MetricFamilyToText(&b, mf); err != nil {
				t.Fatal(err)
			}
		}
	}
	return b.String()
}
