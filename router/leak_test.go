package router

import (
	"context"
	"fmt"
	"io"
	"runtime"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
)

// charged is every charge a request holds on a router: admission's
// samples and bytes, each model's samples in flight and requests its
// predictor counts busy, the streams open, and the registry's
// per-worker charges.
type charged struct {
	samples, bytes, streams, modelSamples, busy, workers int64
	negative                                             []string
}

func (c charged) zero() bool {
	return c.samples == 0 && c.bytes == 0 && c.streams == 0 && c.modelSamples == 0 && c.busy == 0 && c.workers == 0 && len(c.negative) == 0
}

// chargesOf reads r's charges (a test's accessor: the counters are
// unexported and a registry worker's charge is under its lock).
func chargesOf(r *Router) charged {
	var c charged
	c.samples, c.bytes, c.streams = r.inflight.Load(), r.inflightBytes.Load(), r.streams.Load()
	r.preds.m.Range(func(name, p any) bool {
		mp := p.(*modelPredictor)
		n := mp.inflight.Load()
		mp.mu.Lock()
		a := mp.active
		mp.mu.Unlock()
		c.modelSamples += n
		c.busy += a
		if n < 0 || a < 0 {
			c.negative = append(c.negative, fmt.Sprintf("model %v: %d samples, %d busy", name, n, a))
		}
		return true
	})
	r.Reg.mu.Lock()
	for id, e := range r.Reg.workers {
		c.workers += e.inflight
		if e.inflight < 0 {
			c.negative = append(c.negative, fmt.Sprintf("worker %s: %d", id, e.inflight))
		}
	}
	r.Reg.mu.Unlock()
	for name, v := range map[string]int64{"samples": c.samples, "bytes": c.bytes, "streams": c.streams} {
		if v < 0 {
			c.negative = append(c.negative, fmt.Sprintf("%s: %d", name, v))
		}
	}
	return c
}

// settled waits for r's charges to be back to zero and the goroutines
// to be no more than base, and fails the test naming what stayed.
func settled(t *testing.T, r *Router, base int) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second) // a leak stays; a loaded host (CI) only settles late
	for {
		c, g := chargesOf(r), runtime.NumGoroutine()
		if c.zero() && g <= base {
			return
		}
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			buf = buf[:runtime.Stack(buf, true)]
			var routerStacks []string
			for _, s := range strings.Split(string(buf), "\n\n") {
				if strings.Contains(s, "prism/router.") {
					routerStacks = append(routerStacks, s)
				}
			}
			t.Fatalf("not given back: %+v; %d goroutines, %d before; router goroutines:\n%s", c, g, base, strings.Join(routerStacks, "\n\n"))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// warmConns connects r to every embedding worker registered, so the
// connections' goroutines are there before a test counts them.
func warmConns(t *testing.T, r *Router) {
	t.Helper()
	ws, _ := r.Reg.List(context.Background(), nil)
	for _, w := range ws.GetWorkers() {
		if w.GetRole() != prismv1.Role_ROLE_EMBEDDING {
			continue
		}
		c, err := r.conn(w.GetAddr())
		if err != nil {
			t.Fatal(err)
		}
		c.Connect()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		for s := c.GetState(); s != connectivity.Ready; s = c.GetState() {
			if !c.WaitForStateChange(ctx, s) {
				cancel()
				t.Fatalf("connecting to %s: %v", w.GetAddr(), s)
			}
		}
		cancel()
	}
}

// goroutines is runtime.NumGoroutine once it has stopped falling
// (connections and servers started by a warm-up settle first).
func goroutines() int {
	g := runtime.NumGoroutine()
	for range 50 {
		time.Sleep(10 * time.Millisecond)
		h := runtime.NumGoroutine()
		if h >= g {
			return h
		}
		g = h
	}
	return g
}

// TestChargesGivenBack drives Recommend through each way a request
// ends (answered, a worker's failure, a retry, the client gone mid
// micro-batch, its deadline passing at a worker, refused after part of
// admission was charged, a sharded fan-out failing or missing a shard,
// a micro-batch scored again pinned to a version) and checks that every
// charge is back to zero, none below it, and no goroutine is left.
func TestChargesGivenBack(t *testing.T) {
	type env struct {
		r    *Router
		gate chan struct{}
	}
	plain := func(o Options, cns ...*fakeCN) func(t *testing.T) env {
		return func(t *testing.T) env { return env{r: newRouter(t, o, cns...)} }
	}
	gated := func(o Options) func(t *testing.T) env {
		return func(t *testing.T) env {
			cn := &fakeCN{gate: make(chan struct{})}
			return env{r: newRouter(t, o, cn), gate: cn.gate}
		}
	}
	sharded := func(fail bool, missing bool, gate chan struct{}) func(t *testing.T) env {
		return func(t *testing.T) env {
			r := testRouter(Options{MicroBatch: 4})
			r.Reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: &prismv1.WorkerInfo{Id: "gpu", Role: prismv1.Role_ROLE_DENSE, Addr: "dense:a", Models: []string{"m"}, Healthy: true}})
			announceShard(t, r, "s0", &shardCN{fakeCN: fakeCN{gate: gate}}, 0, 3, 0)
			announceShard(t, r, "s1", &shardCN{fakeCN: fakeCN{fail: fail}}, 1, 3, 0)
			announceShard(t, r, "s1b", &shardCN{}, 1, 3, 5)
			if !missing {
				announceShard(t, r, "s2", &shardCN{}, 2, 3, 0)
			}
			return env{r: r, gate: gate}
		}
	}
	versions := func(t *testing.T) env {
		r := testRouter(Options{MicroBatch: 2})
		for i, v := range []int64{1, 2} {
			addr := startCN(t, &versionCN{v: v})
			r.Reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: &prismv1.WorkerInfo{Id: "cpu" + addr, Role: prismv1.Role_ROLE_EMBEDDING, Addr: addr, Models: []string{"m"}, Healthy: true}})
			r.Reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: &prismv1.WorkerInfo{Id: "gpu" + string(rune('a'+i)), Role: prismv1.Role_ROLE_DENSE, Addr: "dense:" + string(rune('a'+i)), Models: []string{"m"}, Healthy: true}})
		}
		return env{r: r}
	}
	cases := []struct {
		name  string
		setup func(t *testing.T) env
		// drive runs the path; want is its code.
		drive func(t *testing.T, e env) error
		want  codes.Code
	}{
		{"answered", plain(Options{MicroBatch: 7}, &fakeCN{}), func(t *testing.T, e env) error {
			_, err := e.r.Recommend(context.Background(), request(50))
			return err
		}, codes.OK},
		{"retried on another replica", plain(Options{MicroBatch: 10}, &fakeCN{fail: true}, &fakeCN{}), func(t *testing.T, e env) error {
			var err error
			for range 5 {
				if _, err = e.r.Recommend(context.Background(), request(30)); err != nil {
					break
				}
			}
			return err
		}, codes.OK},
		{"every replica fails", plain(Options{MicroBatch: 10}, &fakeCN{fail: true}, &fakeCN{fail: true}), func(t *testing.T, e env) error {
			_, err := e.r.Recommend(context.Background(), request(30))
			return err
		}, codes.Unavailable},
		{"client cancels mid micro-batch", gated(Options{MicroBatch: 4}), func(t *testing.T, e env) error {
			ctx, cancel := context.WithCancel(context.Background())
			go func() {
				for chargesOf(e.r).workers == 0 {
					time.Sleep(time.Millisecond)
				}
				cancel()
			}()
			_, err := e.r.Recommend(ctx, request(16))
			return err
		}, codes.Canceled},
		{"deadline passes at a worker", gated(Options{MicroBatch: 4}), func(t *testing.T, e env) error {
			ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
			defer cancel()
			_, err := e.r.Recommend(ctx, request(16))
			return err
		}, codes.DeadlineExceeded},
		{"default deadline", gated(Options{MicroBatch: 4, DefaultTimeout: 50 * time.Millisecond}), func(t *testing.T, e env) error {
			_, err := e.r.Recommend(context.Background(), request(16))
			return err
		}, codes.DeadlineExceeded},
		{"bytes charged, then refused", gated(Options{MaxInflightBytes: 3 << 20, MaxContextBytes: 4 << 20}), func(t *testing.T, e env) error {
			done := make(chan error, 1)
			go func() { _, err := e.r.Recommend(context.Background(), withContext(1, 2<<20)); done <- err }()
			for e.r.inflight.Load() == 0 {
				time.Sleep(time.Millisecond)
			}
			_, err := e.r.Recommend(context.Background(), withContext(1, 2<<20))
			close(e.gate)
			if err2 := <-done; err2 != nil {
				t.Errorf("the request admitted: %v", err2)
			}
			return err
		}, codes.ResourceExhausted},
		{"samples refused", gated(Options{MaxInflight: 10, MicroBatch: 4}), func(t *testing.T, e env) error {
			done := make(chan error, 1)
			go func() { _, err := e.r.Recommend(context.Background(), request(8)); done <- err }()
			for e.r.inflight.Load() == 0 {
				time.Sleep(time.Millisecond)
			}
			_, err := e.r.Recommend(context.Background(), request(8))
			close(e.gate)
			if err2 := <-done; err2 != nil {
				t.Errorf("the request admitted: %v", err2)
			}
			return err
		}, codes.ResourceExhausted},
		{"predicted late", gated(Options{MicroBatch: 4}), func(t *testing.T, e env) error {
			mp := e.r.preds.get("m")
			mp.mu.Lock()
			mp.rate = 100 // samples/s: 8 behind 8 take 160 ms
			mp.mu.Unlock()
			done := make(chan error, 1)
			go func() { _, err := e.r.Recommend(context.Background(), request(8)); done <- err }()
			for e.r.inflight.Load() == 0 {
				time.Sleep(time.Millisecond)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
			defer cancel()
			_, err := e.r.Recommend(ctx, request(8))
			close(e.gate)
			if err2 := <-done; err2 != nil {
				t.Errorf("the request admitted: %v", err2)
			}
			return err
		}, codes.ResourceExhausted},
		{"over the adaptive limit", gated(Options{MicroBatch: 4, AdmitLimit: true}), func(t *testing.T, e env) error {
			e.r.lim.mu.Lock()
			e.r.lim.limit = 10
			e.r.lim.mu.Unlock()
			done := make(chan error, 1)
			go func() { _, err := e.r.Recommend(context.Background(), request(8)); done <- err }()
			for e.r.inflight.Load() == 0 {
				time.Sleep(time.Millisecond)
			}
			_, err := e.r.Recommend(context.Background(), request(8))
			close(e.gate)
			if err2 := <-done; err2 != nil {
				t.Errorf("the request admitted: %v", err2)
			}
			return err
		}, codes.ResourceExhausted},
		{"sharded answered", sharded(false, false, nil), func(t *testing.T, e env) error {
			_, err := e.r.Recommend(context.Background(), request(10))
			return err
		}, codes.OK},
		{"sharded retried around a failing shard", sharded(true, false, nil), func(t *testing.T, e env) error {
			_, err := e.r.Recommend(context.Background(), request(10))
			return err
		}, codes.OK},
		{"sharded shard missing", sharded(false, true, nil), func(t *testing.T, e env) error {
			_, err := e.r.Recommend(context.Background(), request(10))
			return err
		}, codes.Unavailable},
		{"sharded client cancels mid fan-out", sharded(false, false, make(chan struct{})), func(t *testing.T, e env) error {
			ctx, cancel := context.WithCancel(context.Background())
			go func() {
				for chargesOf(e.r).workers == 0 {
					time.Sleep(time.Millisecond)
				}
				time.Sleep(10 * time.Millisecond)
				cancel()
			}()
			_, err := e.r.Recommend(ctx, request(10))
			return err
		}, codes.Canceled},
		{"no dense worker", func(t *testing.T) env {
			r := testRouter(Options{MicroBatch: 4})
			addr := startCN(t, &fakeCN{})
			r.Reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: &prismv1.WorkerInfo{Id: "cpu", Role: prismv1.Role_ROLE_EMBEDDING, Addr: addr, Models: []string{"m"}, Healthy: true}})
			return env{r: r}
		}, func(t *testing.T, e env) error {
			_, err := e.r.Recommend(context.Background(), request(10))
			return err
		}, codes.Unavailable},
		{"sharded, no dense worker", func(t *testing.T) env {
			r := testRouter(Options{MicroBatch: 4})
			announceShard(t, r, "s0", &shardCN{}, 0, 2, 0)
			announceShard(t, r, "s1", &shardCN{}, 1, 2, 0)
			return env{r: r}
		}, func(t *testing.T, e env) error {
			_, err := e.r.Recommend(context.Background(), request(10))
			return err
		}, codes.Unavailable},
		{"fixed batch", func(t *testing.T) env {
			r := testRouter(Options{})
			addr := startCN(t, &fakeCN{})
			r.Reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: &prismv1.WorkerInfo{Id: "cpu", Role: prismv1.Role_ROLE_EMBEDDING, Addr: addr, Models: []string{"m"}, Healthy: true, FixedBatch: map[string]int64{"m": 4}}})
			r.Reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: &prismv1.WorkerInfo{Id: "gpu", Role: prismv1.Role_ROLE_DENSE, Addr: "dense:a", Models: []string{"m"}, Healthy: true}})
			return env{r: r}
		}, func(t *testing.T, e env) error {
			_, err := e.r.Recommend(context.Background(), request(10))
			return err
		}, codes.OK},
		{"worker re-registered mid-call", gated(Options{MicroBatch: 4}), func(t *testing.T, e env) error {
			done := make(chan error, 1)
			go func() { _, err := e.r.Recommend(context.Background(), request(8)); done <- err }()
			for chargesOf(e.r).workers == 0 {
				time.Sleep(time.Millisecond)
			}
			ws, _ := e.r.Reg.List(context.Background(), nil)
			for _, w := range ws.GetWorkers() {
				e.r.Reg.Remove(w.GetId())
				e.r.Reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: w})
			}
			close(e.gate)
			return <-done
		}, codes.OK},
		{"scored again pinned to a version", versions, func(t *testing.T, e env) error {
			for range 20 {
				if _, err := e.r.Recommend(context.Background(), request(8)); err != nil {
					return err
				}
			}
			return nil
		}, codes.OK},
		{"pinned to a version no replica serves", versions, func(t *testing.T, e env) error {
			req := request(8)
			req.Version = 3
			_, err := e.r.Recommend(context.Background(), req)
			return err
		}, codes.NotFound},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := tc.setup(t)
			warmConns(t, e.r)
			base := goroutines()
			if err := tc.drive(t, e); status.Code(err) != tc.want {
				t.Fatalf("%v, want %v", err, tc.want)
			}
			settled(t, e.r, base)
			if e.gate != nil {
				select {
				case <-e.gate:
				default:
					close(e.gate)
				}
			}
		})
	}
}

// TestStreamChargesGivenBack: a RecommendStream gives back its stream,
// its requests' admission and worker charges, and its goroutines however
// it ends: answered to the end, the client gone with the window full
// (requests at a worker, one waiting for a slot), the client gone with
// answers unread, and a stream refused over MaxStreams.
func TestStreamChargesGivenBack(t *testing.T) {
	cases := []struct {
		name string
		// drive uses the stream on conn; cn's gate holds every lookup.
		drive func(t *testing.T, r *Router, cn *fakeCN, open func(context.Context) prismv1.Recommender_RecommendStreamClient)
	}{
		{"answered to the end", func(t *testing.T, r *Router, cn *fakeCN, open func(context.Context) prismv1.Recommender_RecommendStreamClient) {
			close(cn.gate)
			st := open(context.Background())
			for i := range 10 {
				req := request(5)
				if i%3 == 0 {
					req.Model = "nope"
				}
				if err := st.Send(req); err != nil {
					t.Fatal(err)
				}
			}
			st.CloseSend()
			for i := range 10 {
				if _, err := st.Recv(); err != nil {
					t.Fatalf("response %d: %v", i, err)
				}
			}
			if _, err := st.Recv(); err != io.EOF {
				t.Fatalf("after the last answer: %v, want the stream's end", err)
			}
		}},
		{"client gone, window full", func(t *testing.T, r *Router, cn *fakeCN, open func(context.Context) prismv1.Recommender_RecommendStreamClient) {
			ctx, cancel := context.WithCancel(context.Background())
			st := open(ctx)
			sendN(t, st, 8)
			for cn.running.Load() < 2 {
				time.Sleep(time.Millisecond)
			}
			cancel()
		}},
		{"client gone, answers unread", func(t *testing.T, r *Router, cn *fakeCN, open func(context.Context) prismv1.Recommender_RecommendStreamClient) {
			close(cn.gate)
			ctx, cancel := context.WithCancel(context.Background())
			st := open(ctx)
			sendN(t, st, 8)
			for cn.calls.Load() < 4 {
				time.Sleep(time.Millisecond)
			}
			cancel()
		}},
		{"client half-closes, then goes", func(t *testing.T, r *Router, cn *fakeCN, open func(context.Context) prismv1.Recommender_RecommendStreamClient) {
			ctx, cancel := context.WithCancel(context.Background())
			st := open(ctx)
			sendN(t, st, 3)
			st.CloseSend()
			for cn.running.Load() < 2 {
				time.Sleep(time.Millisecond)
			}
			cancel()
		}},
		{"over MaxStreams", func(t *testing.T, r *Router, cn *fakeCN, open func(context.Context) prismv1.Recommender_RecommendStreamClient) {
			close(cn.gate)
			first := open(context.Background())
			for r.streams.Load() == 0 {
				time.Sleep(time.Millisecond)
			}
			second := open(context.Background())
			if _, err := second.Recv(); status.Code(err) != codes.ResourceExhausted {
				t.Fatalf("a stream over the limit: %v, want ResourceExhausted", err)
			}
			first.CloseSend()
			if _, err := first.Recv(); err != io.EOF {
				t.Fatalf("the stream admitted: %v, want its end", err)
			}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cn := &fakeCN{gate: make(chan struct{})}
			r := newRouter(t, Options{StreamWindow: 2, MaxStreams: 1}, cn)
			conn := dialTest(t, serveInproc(t, func(s *grpc.Server) { prismv1.RegisterRecommenderServer(s, r) }))
			warmConns(t, r)
			// The client's connection is up before the count.
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			conn.Connect()
			for s := conn.GetState(); s != connectivity.Ready && conn.WaitForStateChange(ctx, s); s = conn.GetState() {
			}
			cancel()
			base := goroutines()
			tc.drive(t, r, cn, func(ctx context.Context) prismv1.Recommender_RecommendStreamClient {
				st, err := prismv1.NewRecommenderClient(conn).RecommendStream(ctx)
				if err != nil {
					t.Fatal(err)
				}
				return st
			})
			settled(t, r, base)
			select {
			case <-cn.gate:
			default:
				close(cn.gate)
			}
		})
	}
}

// sendN sends n requests of 3 candidates on st.
func sendN(t *testing.T, st prismv1.Recommender_RecommendStreamClient, n int) {
	t.Helper()
	for range n {
		if err := st.Send(request(3)); err != nil {
			t.Fatal(err)
		}
	}
}
