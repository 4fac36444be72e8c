package router

import (
	"context"
	"io"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
)

// TestStreamRequestsCounted: the requests of a RecommendStream are
// counted by their answers' codes. The stream is one RPC to the tier's
// prism_rpc_requests_total, OK when it ends cleanly, so an offline job
// whose every request failed (a model not served, a worker down) left
// nothing on /metrics but a successful stream.
func TestStreamRequestsCounted(t *testing.T) {
	reg := prometheus.NewRegistry()
	r := New(Options{MicroBatch: 8}, reg)
	r.opts.DialOptions = []grpc.DialOption{grpc.WithContextDialer(dialInproc)}
	r.started = r.started.Add(-r.opts.Heartbeat * 10)
	addr := startCN(t, &fakeCN{})
	ctx := context.Background()
	r.Reg.Announce(ctx, &prismv1.AnnounceRequest{Worker: &prismv1.WorkerInfo{Id: "cpu", Role: prismv1.Role_ROLE_EMBEDDING, Addr: addr, Models: []string{"m"}, Healthy: true}})
	r.Reg.Announce(ctx, &prismv1.AnnounceRequest{Worker: &prismv1.WorkerInfo{Id: "gpu", Role: prismv1.Role_ROLE_DENSE, Addr: "dense:a", Models: []string{"m"}, Healthy: true}})
	srv := serveInproc(t, func(s *grpc.Server) { prismv1.RegisterRecommenderServer(s, r) })
	st, err := prismv1.NewRecommenderClient(dialTest(t, srv)).RecommendStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		req := request(10)
		if i%2 == 1 {
			req.Model = "nope"
		}
		if err := st.Send(req); err != nil {
			t.Fatal(err)
		}
	}
	st.CloseSend()
	for {
		if _, err := st.Recv(); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "prism_router_stream_requests_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			got[m.GetLabel()[0].GetValue()] = m.GetCounter().GetValue()
		}
	}
	if got["OK"] != 3 || got["NotFound"] != 2 {
		t.Errorf("prism_router_stream_requests_total by code %v, want OK 3 and NotFound 2 (three requests answered, two for a model not served)", got)
	}
}

// leavingCN fails its lookups as a worker going down does, and leaves
// the registry first, so the router's retry finds no embedding worker.
type leavingCN struct {
	prismv1.UnimplementedEmbeddingTierServer
	leave func()
}

func (f *leavingCN) Lookup(context.Context, *prismv1.LookupRequest) (*prismv1.LookupResponse, error) {
	f.leave()
	return nil, status.Error(codes.Unavailable, "shutting down")
}

// TestFailedMicroBatchCounted: a micro-batch that failed on its worker
// and found no other to retry on is counted under its outcome, as one
// that failed on its retry is. It was counted nowhere (only its retry
// was, in prism_router_retries_total): the outcomes summed to fewer
// micro-batches than were sent.
func TestFailedMicroBatchCounted(t *testing.T) {
	reg := prometheus.NewRegistry()
	r := New(Options{MicroBatch: 8}, reg)
	r.opts.DialOptions = []grpc.DialOption{grpc.WithContextDialer(dialInproc)}
	r.started = r.started.Add(-r.opts.Heartbeat * 10)
	ctx := context.Background()
	addr := startCN(t, &leavingCN{leave: func() { r.Reg.Leave(ctx, &prismv1.LeaveRequest{Id: "cpu"}) }})
	r.Reg.Announce(ctx, &prismv1.AnnounceRequest{Worker: &prismv1.WorkerInfo{Id: "cpu", Role: prismv1.Role_ROLE_EMBEDDING, Addr: addr, Models: []string{"m"}, Healthy: true}})
	r.Reg.Announce(ctx, &prismv1.AnnounceRequest{Worker: &prismv1.WorkerInfo{Id: "gpu", Role: prismv1.Role_ROLE_DENSE, Addr: "dense:a", Models: []string{"m"}, Healthy: true}})
	if _, err := r.Recommend(ctx, request(8)); status.Code(err) != codes.Unavailable {
		t.Fatalf("Recommend: %v, want Unavailable", err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		switch mf.GetName() {
		case "prism_router_micro_batches_total":
			for _, m := range mf.GetMetric() {
				got[m.GetLabel()[0].GetValue()] = m.GetCounter().GetValue()
			}
		case "prism_router_retries_total":
			got["retries"] = mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	if got["Unavailable"] != 1 || got["ok"] != 0 {
		t.Errorf("one micro-batch failed Unavailable with no replica left to retry on: counters %v, want micro_batches_total{outcome=\"Unavailable\"} 1", got)
	}
	if got["retries"] != 0 {
		// No worker was left to retry on: nothing was retried.
		t.Errorf("prism_router_retries_total %v after a micro-batch found no worker for its retry, want 0", got["retries"])
	}
}
