package router

import (
	"context"
	"math"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
)

// TestLimiter drives the adaptive limit with a logical clock, one
// window at a time: each step admits requests up to a peak in flight
// (marking the limit bound if one was refused) and then answers a
// window of requests whose latencies are the given shares of a 60 ms
// budget (-1: a miss).
func TestLimiter(t *testing.T) {
	type step struct {
		peak   int64     // samples in flight seen by allow
		refuse bool      // one request refused by the limit in the window
		shares []float64 // latency / budget per answer; -1 a miss
		want   float64   // the limit after the window
	}
	const budget = 60 * time.Millisecond
	fill := func(n int, share float64) []float64 {
		s := make([]float64, n)
		for i := range s {
			s[i] = share
		}
		return s
	}
	mixed := func(n, misses int, share float64) []float64 {
		s := fill(n, share)
		for i := range misses {
			s[i] = -1
		}
		return s
	}
	cases := []struct {
		name  string
		steps []step
	}{
		{"first window: the most in flight", []step{{peak: 2700, shares: fill(16, 0.3), want: 2700}}},
		{"first window: never below one micro-batch", []step{{peak: 10, shares: fill(16, 0.3), want: limitMin}}},
		{"grows while it binds and latencies are low", []step{
			{peak: 1000, shares: fill(16, 0.3), want: 1000},
			{peak: 1000, refuse: true, shares: fill(16, 0.3), want: 1060},
			{peak: 1060, refuse: true, shares: fill(16, 0.3), want: 1060 * 1.06},
		}},
		{"does not grow when it does not bind", []step{
			{peak: 1000, shares: fill(16, 0.3), want: 1000},
			{peak: 500, shares: fill(16, 0.1), want: 1000},
		}},
		{"holds between the thresholds", []step{
			{peak: 1000, shares: fill(16, 0.3), want: 1000},
			{peak: 1000, refuse: true, shares: fill(16, 0.7), want: 1000},
		}},
		{"shrinks from the peak when latencies near the deadline", []step{
			{peak: 4000, shares: fill(16, 0.3), want: 4000},
			{peak: 2000, shares: fill(16, 0.8), want: 2000 * limitShrink},
		}},
		{"the quantile, not the mean: two slow answers in sixteen", []step{
			{peak: 1000, shares: fill(16, 0.3), want: 1000},
			{peak: 1000, refuse: true, shares: append(fill(14, 0.1), 0.95, 0.95), want: 900},
		}},
		{"collapses when a tenth misses", []step{
			{peak: 4320, shares: fill(16, 0.001), want: 4320},
			{peak: 4320, shares: mixed(16, 2, 0.5), want: 4320 * limitCollapse},
		}},
		{"one miss in sixteen is a slow answer, not a collapse", []step{
			{peak: 1000, shares: fill(16, 0.3), want: 1000},
			{peak: 1000, shares: mixed(16, 1, 0.3), want: 1000},
		}},
		{"never below one micro-batch", []step{
			{peak: 100, shares: fill(16, 0.3), want: 100},
			{peak: 100, shares: mixed(16, 16, 0), want: limitMin},
			{peak: 100, shares: mixed(16, 16, 0), want: limitMin},
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var l limiter
			now := time.Unix(0, 0)
			for i, s := range tc.steps {
				// Requests of 10 samples: one at the peak (allowed as
				// long as the limit is at least the peak), and, with
				// refuse, one over it.
				l.allow(s.peak, 10)
				if s.refuse {
					if ok, known := l.allow(int64(l.limitNow())+10, 10); ok || !known {
						t.Fatalf("step %d: a request over the limit %.0f was allowed (known %v)", i, l.limitNow(), known)
					}
				}
				for _, share := range s.shares {
					now = now.Add(limitWindowT/time.Duration(len(s.shares)-1) + time.Microsecond)
					lat := time.Duration(share * float64(budget))
					l.record(now, lat, budget, share < 0)
				}
				if got := l.limitNow(); got < s.want-1e-6 || got > s.want+1e-6 {
					t.Fatalf("step %d: limit %.2f, want %.2f", i, got, s.want)
				}
			}
		})
	}
}

// A window closes on both counts: limitWindowN answers and
// limitWindowT of time.
func TestLimiterWindow(t *testing.T) {
	var l limiter
	now := time.Unix(0, 0)
	l.allow(1000, 10)
	for range 4 * limitWindowN {
		l.record(now, time.Millisecond, time.Second, false) // all at one instant
	}
	if l.limitNow() != 0 {
		t.Fatalf("a window closed within no time: limit %.0f", l.limitNow())
	}
	l.record(now.Add(limitWindowT), time.Millisecond, time.Second, false)
	if l.limitNow() != 1000 {
		t.Fatalf("limit %.0f after %d answers over %s, want the peak 1000", l.limitNow(), 4*limitWindowN+1, limitWindowT)
	}
}

// A request with nothing ahead of it is allowed whatever the limit;
// before the first window there is no limit (known false).
func TestLimiterAllow(t *testing.T) {
	var l limiter
	if ok, known := l.allow(1_000_000, 10); !ok || known {
		t.Fatalf("before any window: ok %v known %v, want allowed and unknown", ok, known)
	}
	l.limit = 100
	for _, c := range []struct {
		cur, n int64
		ok     bool
	}{{100, 10, true}, {101, 10, false}, {500, 500, true}, {501, 500, false}} {
		if ok, known := l.allow(c.cur, c.n); ok != c.ok || !known {
			t.Errorf("allow(%d, %d) = %v, %v; want %v", c.cur, c.n, ok, known, c.ok)
		}
	}
}

// With Options.AdmitLimit the router refuses a request over the limit
// at once with ResourceExhausted, admits one under it, and learns from
// answers and deadline misses (not from other failures).
func TestRecommendAdmitsByLimit(t *testing.T) {
	cn := &fakeCN{gate: make(chan struct{})}
	r := newRouter(t, Options{AdmitLimit: true}, cn)
	r.lim.limit = 150
	held := backlog(r, cn, 100)
	// 100 in flight + 100 is over 150: refused at once, deadline or not.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := r.Recommend(ctx, request(100)); status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "admission limit: 100 samples in flight, 200 with this request's, limit 150") {
		t.Fatalf("over the limit: %v, want ResourceExhausted", err)
	}
	if !r.lim.bound {
		t.Fatal("the refusal did not mark the limit bound")
	}
	var m dto.Metric
	if err := r.m.rejected.WithLabelValues("limit").Write(&m); err != nil || m.GetCounter().GetValue() != 1 {
		t.Fatalf("rejected_total{reason=\"limit\"} = %v (%v), want 1", m.GetCounter().GetValue(), err)
	}
	// 100 + 50 fits.
	fits := make(chan error, 1)
	go func() { _, err := r.Recommend(ctx, request(50)); fits <- err }()
	for cn.calls.Load() < 2 {
		time.Sleep(time.Millisecond)
	}
	close(cn.gate)
	for _, ch := range []<-chan error{held, fits} {
		if err := <-ch; err != nil {
			t.Fatal(err)
		}
	}
	if got := len(r.lim.win.shares); got != 2 {
		t.Fatalf("%d answers recorded, want 2", got)
	}
	// A miss of the deadline is learned, as infinitely late.
	cn2 := &fakeCN{gate: make(chan struct{})}
	r2 := newRouter(t, Options{AdmitLimit: true}, cn2)
	short, cancel2 := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel2()
	if _, err := r2.Recommend(short, request(10)); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("held past its deadline: %v, want DeadlineExceeded", err)
	}
	if got := r2.lim.win.shares; len(got) != 1 || !math.IsInf(got[0], 1) {
		t.Fatalf("recorded %v after a miss, want one infinite share", got)
	}
	// A request that failed otherwise (the client gone) is not.
	gone, cancel3 := context.WithCancel(context.Background())
	go func() { time.Sleep(20 * time.Millisecond); cancel3() }()
	if _, err := r2.Recommend(gone, request(10)); status.Code(err) != codes.Canceled {
		t.Fatalf("cancelled by its client: %v, want Canceled", err)
	}
	if got := len(r2.lim.win.shares); got != 1 {
		t.Fatalf("%d entries after a cancelled request, want still 1", got)
	}
	close(cn2.gate)
	if r.inflight.Load() != 0 {
		t.Fatalf("%d samples still in flight", r.inflight.Load())
	}
}

// The limit is exported as a gauge when AdmitLimit is set, and not
// otherwise.
func TestLimiterGauge(t *testing.T) {
	for _, on := range []bool{false, true} {
		reg := prometheus.NewRegistry()
		r := New(Options{AdmitLimit: on}, reg)
		if on {
			r.lim.limit = 1234
		}
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		var found bool
		for _, mf := range mfs {
			if mf.GetName() == "prism_router_admission_limit_samples" {
				found = true
				if v := mf.GetMetric()[0].GetGauge().GetValue(); v != 1234 {
					t.Errorf("limit gauge %v, want 1234", v)
				}
			}
		}
		if found != on {
			t.Errorf("AdmitLimit %v: gauge exported %v", on, found)
		}
	}
}

// delayCN answers a Lookup after as many milliseconds as its first id.
type delayCN struct {
	prismv1.UnimplementedEmbeddingTierServer
}

func (delayCN) Lookup(ctx context.Context, req *prismv1.LookupRequest) (*prismv1.LookupResponse, error) {
	select {
	case <-time.After(time.Duration(req.GetCandidates().GetInputs()[0].GetIds()[0]) * time.Millisecond):
	case <-ctx.Done():
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	return &prismv1.LookupResponse{Scores: make([]float32, req.GetNumSamples())}, nil
}

// TestLimitShrinksFromWorkInFlight: a window of slow answers with no
// arrivals in it (the tail of a burst) shrinks the limit to a share of
// the samples in flight during it, not to its floor. 32 requests of 100
// samples arrive at once under a limit of 4000; 16 are answered fast
// (a window that leaves the limit be), then 16 slow, near their
// deadline, with 1600 samples in flight as the window starts: the limit
// becomes 0.9 of those. Its peak counted from arrivals only, the window
// read 0 in flight and the limit fell to limitMin (64).
func TestLimitShrinksFromWorkInFlight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := testRouter(Options{AdmitLimit: true})
		t.Cleanup(r.Close)
		addr := serveInproc(t, func(s *grpc.Server) { prismv1.RegisterEmbeddingTierServer(s, delayCN{}) })
		r.Reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: &prismv1.WorkerInfo{Id: "cpu", Role: prismv1.Role_ROLE_EMBEDDING, Addr: addr, Models: []string{"m"}, Healthy: true}})
		r.Reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: &prismv1.WorkerInfo{Id: "gpu", Role: prismv1.Role_ROLE_DENSE, Addr: "dense:a", Models: []string{"m"}, Healthy: true}})
		r.lim.limit = 4000
		var wg sync.WaitGroup
		errs := make([]error, 32)
		for i := range 32 {
			delay := 10 + 4*i // fast: 10 to 70 ms
			if i >= 16 {
				delay = 310 + 5*(i-16) // slow: 310 to 385 ms of 400
			}
			req := request(100)
			for j := range req.Candidates.Inputs[0].Ids {
				req.Candidates.Inputs[0].Ids[j] += int64(delay)
			}
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 400*time.Millisecond)
				defer cancel()
				_, errs[i] = r.Recommend(ctx, req)
			})
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("request %d: %v", i, err)
			}
		}
		if got := r.lim.limitNow(); got < 0.9*1500 || got > 0.9*1600 {
			t.Fatalf("limit %.0f after a window of slow answers with 1600 samples in flight, want about %.0f", got, 0.9*1600)
		}
	})
}
