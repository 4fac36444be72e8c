package router

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/prism-serve/prism/api/prismv1"
)

// probedHealth is a worker's health service whose every Check answers
// as answer does; checks counts them.
type probedHealth struct {
	healthpb.UnimplementedHealthServer
	answer func(ctx context.Context) (*healthpb.HealthCheckResponse, error)
	checks atomic.Int64
}

func (h *probedHealth) Check(ctx context.Context, _ *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	h.checks.Add(1)
	return h.answer(ctx)
}

func healthAnswer(s healthpb.HealthCheckResponse_ServingStatus) func(context.Context) (*healthpb.HealthCheckResponse, error) {
	return func(context.Context) (*healthpb.HealthCheckResponse, error) {
		return &healthpb.HealthCheckResponse{Status: s}, nil
	}
}

// hangs is a health check that never answers: a worker cut off (or a
// server accepting and answering nothing).
func hangs(ctx context.Context) (*healthpb.HealthCheckResponse, error) {
	<-ctx.Done()
	return nil, status.FromContextError(ctx.Err()).Err()
}

// TestOverdueWorkerProbed: a worker whose registration is overdue
// (three heartbeats without an announcement) with Lookups in flight is
// probed (a gRPC health check over the router's connection) before the
// sweep expires it. One that answers SERVING is live but late (a
// starved host): it stays registered, the only worker of its role
// still takes requests, and its calls complete; it is expired, its
// calls abandoned, once it has answered maxProbes probes without
// announcing. One whose probe hangs, answers NOT_SERVING or has no
// health service is expired and its calls abandoned (retried; here no
// other pair: Unavailable naming it), within the expiry plus the sweep
// period plus the probe's timeout. One that announces while its probe
// runs stays. Each worker alone in its role: an abandoned call has no
// other pair to retry on. Found on CI at load average 16: a live
// embedding worker late to announce had its calls abandoned (55 and 27
// Recommends failed in two drain tests).
func TestOverdueWorkerProbed(t *testing.T) {
	const hb = 200 * time.Millisecond
	never := time.Hour
	probe := probeTimeout(hb)
	for _, tc := range []struct {
		name string
		// dense: the overdue worker is the dense worker the Lookups
		// name (else the embedding worker they go to).
		dense bool
		// health answers the probes (nil: no health service); announce
		// announces the overdue worker again, as its process would.
		health func(announce func()) func(context.Context) (*healthpb.HealthCheckResponse, error)
		// lookup is how long each Lookup takes; back, when set, is when
		// the overdue worker announces again (after its first); requests
		// are sent until spread after its first (one request when 0).
		lookup, back, spread time.Duration
		want                 codes.Code
		// within bounds a failed request's time; after, when set, is
		// the least it took.
		within, after time.Duration
	}{
		{name: "embedding worker late, answering SERVING", health: func(func()) func(context.Context) (*healthpb.HealthCheckResponse, error) {
			return healthAnswer(healthpb.HealthCheckResponse_SERVING)
		}, lookup: 2 * hb, back: 6 * hb, spread: 7 * hb, want: codes.OK},
		{name: "dense worker late, answering SERVING", dense: true, health: func(func()) func(context.Context) (*healthpb.HealthCheckResponse, error) {
			return healthAnswer(healthpb.HealthCheckResponse_SERVING)
		}, lookup: 2 * hb, back: 6 * hb, spread: 7 * hb, want: codes.OK},
		{name: "embedding worker announcing while probed", health: func(announce func()) func(context.Context) (*healthpb.HealthCheckResponse, error) {
			var once sync.Once
			return func(ctx context.Context) (*healthpb.HealthCheckResponse, error) {
				once.Do(announce)
				return hangs(ctx)
			}
		}, lookup: 5 * hb, want: codes.OK},
		{name: "embedding worker answering SERVING, never announcing nor answering", health: func(func()) func(context.Context) (*healthpb.HealthCheckResponse, error) {
			return healthAnswer(healthpb.HealthCheckResponse_SERVING)
		}, lookup: never, want: codes.Unavailable, after: (3 + maxProbes - 1) * hb, within: (3+maxProbes+1)*hb + probe + hb},
		{name: "embedding worker whose probe hangs", health: func(func()) func(context.Context) (*healthpb.HealthCheckResponse, error) {
			return hangs
		}, lookup: never, want: codes.Unavailable, within: 4*hb + probe + hb},
		{name: "dense worker whose probe hangs", dense: true, health: func(func()) func(context.Context) (*healthpb.HealthCheckResponse, error) {
			return hangs
		}, lookup: never, want: codes.Unavailable, within: 4*hb + probe + hb},
		{name: "embedding worker NOT_SERVING", health: func(func()) func(context.Context) (*healthpb.HealthCheckResponse, error) {
			return healthAnswer(healthpb.HealthCheckResponse_NOT_SERVING)
		}, lookup: never, want: codes.Unavailable, within: 4*hb + probe + hb},
		{name: "dense worker NOT_SERVING", dense: true, health: func(func()) func(context.Context) (*healthpb.HealthCheckResponse, error) {
			return healthAnswer(healthpb.HealthCheckResponse_NOT_SERVING)
		}, lookup: never, want: codes.Unavailable, within: 4*hb + probe + hb},
		{name: "embedding worker without a health service", lookup: never, want: codes.Unavailable, within: 4*hb + probe + hb},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := testRouter(Options{MicroBatch: 10, Heartbeat: hb})
			defer r.Close()
			announce := func(ws ...*prismv1.WorkerInfo) {
				for _, w := range ws {
					if _, err := r.Reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: proto.Clone(w).(*prismv1.WorkerInfo)}); err != nil {
						t.Error(err)
					}
				}
			}
			var overdue, live *prismv1.WorkerInfo
			health := &probedHealth{}
			if tc.health != nil {
				health.answer = tc.health(func() { announce(overdue) })
			}
			cn := &fakeCN{delay: tc.lookup}
			register := func(s *grpc.Server) {
				if tc.health != nil {
					healthpb.RegisterHealthServer(s, health)
				}
			}
			if tc.dense {
				overdue = &prismv1.WorkerInfo{Id: "gpu", Role: prismv1.Role_ROLE_DENSE, Addr: serveInproc(t, register), Models: []string{"m"}, Healthy: true}
				live = &prismv1.WorkerInfo{Id: "cpu", Role: prismv1.Role_ROLE_EMBEDDING, Addr: startCN(t, cn), Models: []string{"m"}, Healthy: true}
			} else {
				overdue = &prismv1.WorkerInfo{Id: "cpu", Role: prismv1.Role_ROLE_EMBEDDING, Models: []string{"m"}, Healthy: true,
					Addr: serveInproc(t, func(s *grpc.Server) { register(s); prismv1.RegisterEmbeddingTierServer(s, cn) })}
				live = &prismv1.WorkerInfo{Id: "gpu", Role: prismv1.Role_ROLE_DENSE, Addr: "dense:a", Models: []string{"m"}, Healthy: true}
			}
			announce(live)
			announce(overdue)
			t0 := time.Now()
			ctx, stop := context.WithCancel(context.Background())
			var bg sync.WaitGroup
			defer bg.Wait()
			defer stop()
			bg.Go(func() { r.Run(ctx) })
			bg.Go(func() {
				// The live worker keeps announcing; the overdue one
				// again at back, if ever.
				var back <-chan time.Time
				if tc.back > 0 {
					back = time.After(time.Until(t0.Add(tc.back)))
				}
				for {
					select {
					case <-ctx.Done():
						return
					case <-back:
						announce(overdue)
					case <-time.After(hb / 4):
						announce(live)
					}
				}
			})
			var mu sync.Mutex
			failed := map[codes.Code]int{}
			var first error
			var took time.Duration
			n := 0
			var wg sync.WaitGroup
			for {
				n++
				wg.Go(func() {
					rctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					defer cancel()
					_, err := r.Recommend(rctx, request(4))
					mu.Lock()
					defer mu.Unlock()
					took = max(took, time.Since(t0))
					if err != nil {
						failed[status.Code(err)]++
						if first == nil {
							first = err
						}
					}
				})
				if time.Since(t0) >= tc.spread {
					break
				}
				time.Sleep(hb / 2)
			}
			wg.Wait()
			t.Logf("%d requests: failed %v (%v); the last answered %v after the overdue worker's first announcement; %d health checks", n, failed, first, took.Round(time.Millisecond), health.checks.Load())
			if tc.want == codes.OK {
				if len(failed) > 0 {
					t.Errorf("requests failed %v (first: %v), want every one answered by the live but late worker", failed, first)
				}
				if tc.health != nil && health.checks.Load() == 0 {
					t.Error("the overdue worker was never probed: the test proves nothing")
				}
				return
			}
			if failed[tc.want] != n {
				t.Fatalf("requests failed %v (first: %v), want all %d %v", failed, first, n, tc.want)
			}
			if !strings.Contains(first.Error(), "stopped announcing") {
				t.Errorf("the failure does not say the worker stopped announcing: %v", first)
			}
			if took > tc.within {
				t.Errorf("abandoned %v after the worker's last announcement, want within %v (expiry, sweep, probe)", took.Round(time.Millisecond), tc.within)
			}
			if took < tc.after {
				t.Errorf("abandoned %v after the worker's last announcement, want after %v (maxProbes probes answered SERVING)", took.Round(time.Millisecond), tc.after)
			}
		})
	}
}

// TestOverdueIdleWorkerProbed: an overdue worker no call in flight
// waits on is probed too, and kept while it answers SERVING, up to
// maxProbes answers (then expired: it answers but cannot announce).
// Expired unprobed at the sweep that found it overdue, a live worker
// late to announce that happened to have no call in flight then was
// dropped, and with no other worker of its role every request failed
// until it announced (CI: TestLateWorkerKeepsCalls/embedding, 9,492
// Unavailable).
func TestOverdueIdleWorkerProbed(t *testing.T) {
	const hb = 100 * time.Millisecond
	r := testRouter(Options{Heartbeat: hb})
	defer r.Close()
	health := &probedHealth{answer: healthAnswer(healthpb.HealthCheckResponse_SERVING)}
	addr := serveInproc(t, func(s *grpc.Server) { healthpb.RegisterHealthServer(s, health) })
	w := &prismv1.WorkerInfo{Id: "cpu", Role: prismv1.Role_ROLE_EMBEDDING, Addr: addr, Models: []string{"m"}, Healthy: true}
	if _, err := r.Reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: w}); err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); r.Run(ctx) }()
	// Overdue after three heartbeats; at the fifth it is still
	// registered (probed, SERVING).
	time.Sleep(5 * hb)
	kept := r.Reg.registered(prismv1.Role_ROLE_EMBEDDING, "cpu")
	deadline := time.Now().Add(20 * hb)
	for r.Reg.registered(prismv1.Role_ROLE_EMBEDDING, "cpu") && time.Now().Before(deadline) {
		time.Sleep(hb / 10)
	}
	stop()
	<-done
	if !kept {
		t.Errorf("the idle overdue worker answering SERVING was expired within 5 heartbeats")
	}
	if r.Reg.registered(prismv1.Role_ROLE_EMBEDDING, "cpu") {
		t.Errorf("the idle worker that never announced again is still registered %v after its only announcement", 25*hb)
	}
	if n := health.checks.Load(); n < 1 || n > maxProbes+1 {
		t.Errorf("the idle overdue worker was probed %d times, want 1 to %d", n, maxProbes+1)
	}
}
