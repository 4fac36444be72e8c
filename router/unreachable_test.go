package router

import (
	"context"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
)

// TestRegistryUnreachable: a worker marked unreachable (a call to it
// failed at the transport) takes no picks, router-wide, while another
// worker of its role serves the model, and takes them again after its
// next announcement or an answer from it; alone in its role, it is
// still picked (its calls fail fast). A shard's replica likewise.
func TestRegistryUnreachable(t *testing.T) {
	emb := func(id, addr string, load int64) *prismv1.WorkerInfo {
		return &prismv1.WorkerInfo{Id: id, Role: prismv1.Role_ROLE_EMBEDDING, Addr: addr, Models: []string{"m"}, Healthy: true, Outstanding: load}
	}
	dense := func(id, addr string, load int64) *prismv1.WorkerInfo {
		w := emb(id, addr, load)
		w.Role = prismv1.Role_ROLE_DENSE
		return w
	}
	shard := func(id, addr string, k int32, load int64) *prismv1.WorkerInfo {
		w := emb(id, addr, load)
		w.Shards = map[string]*prismv1.ShardRef{"m": {Shard: k, Shards: 2}}
		return w
	}
	for _, tc := range []struct {
		name    string
		workers []*prismv1.WorkerInfo
		// then runs on the registry once the workers announced.
		then func(r *Registry)
		// pick: the embedding (or, dense, the dense) worker picked;
		// shards: for a sharded model, the fan-out's workers.
		pick, dense, shards string
	}{
		{"none marked: the least loaded", []*prismv1.WorkerInfo{emb("a", "a:1", 0), emb("b", "b:1", 5)}, func(*Registry) {}, "a", "", ""},
		{"marked: the other, however loaded", []*prismv1.WorkerInfo{emb("a", "a:1", 0), emb("b", "b:1", 500)}, func(r *Registry) { r.Unreachable("a") }, "b", "", ""},
		{"the only worker of its role: still picked", []*prismv1.WorkerInfo{emb("a", "a:1", 0)}, func(r *Registry) { r.Unreachable("a") }, "a", "", ""},
		{"every worker marked: the least loaded", []*prismv1.WorkerInfo{emb("a", "a:1", 3), emb("b", "b:1", 5)}, func(r *Registry) { r.Unreachable("a"); r.Unreachable("b") }, "a", "", ""},
		{"announced again: back", []*prismv1.WorkerInfo{emb("a", "a:1", 0), emb("b", "b:1", 5)}, func(r *Registry) {
			r.Unreachable("a")
			announceW(r, context.Background(), emb("a", "a:1", 0))
		}, "a", "", ""},
		{"answered: back", []*prismv1.WorkerInfo{emb("a", "a:1", 0), emb("b", "b:1", 5)}, func(r *Registry) { r.Unreachable("a"); r.Reached("a", "") }, "a", "", ""},
		{"another's answer: still out", []*prismv1.WorkerInfo{emb("a", "a:1", 0), emb("b", "b:1", 5)}, func(r *Registry) { r.Unreachable("a"); r.Reached("b", "") }, "b", "", ""},
		{"dense worker by address", []*prismv1.WorkerInfo{emb("a", "a:1", 0), dense("g1", "g:1", 0), dense("g2", "g:2", 5)}, func(r *Registry) {
			r.UnreachableAt(prismv1.Role_ROLE_DENSE, "g:1")
		}, "a", "g2", ""},
		{"an embedding worker at a dense worker's address stays in", []*prismv1.WorkerInfo{emb("a", "g:1", 0), emb("b", "b:1", 5), dense("g1", "g:1", 0)}, func(r *Registry) {
			r.UnreachableAt(prismv1.Role_ROLE_DENSE, "g:1")
		}, "a", "g1", ""},
		{"dense worker answered through an embedding worker: back", []*prismv1.WorkerInfo{emb("a", "a:1", 0), dense("g1", "g:1", 0), dense("g2", "g:2", 5)}, func(r *Registry) {
			r.UnreachableAt(prismv1.Role_ROLE_DENSE, "g:1")
			r.Reached("a", "g:1")
		}, "a", "g1", ""},
		{"marked, then dropped and back: a fresh entry", []*prismv1.WorkerInfo{emb("a", "a:1", 0), emb("b", "b:1", 5)}, func(r *Registry) {
			r.Unreachable("a")
			r.Remove("a")
			announceW(r, context.Background(), emb("a", "a:1", 0))
		}, "a", "", ""},
		{"a shard's replica", []*prismv1.WorkerInfo{shard("s0", "s:0", 0, 0), shard("s1a", "s:1a", 1, 0), shard("s1b", "s:1b", 1, 500)}, func(r *Registry) { r.Unreachable("s1a") }, "", "", "s0,s1b"},
		{"a shard's only replica: still picked", []*prismv1.WorkerInfo{shard("s0", "s:0", 0, 0), shard("s1a", "s:1a", 1, 0)}, func(r *Registry) { r.Unreachable("s1a") }, "", "", "s0,s1a"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := NewRegistry(time.Second, nil)
			for _, w := range tc.workers {
				if err := announceW(r, context.Background(), w); err != nil {
					t.Fatal(err)
				}
			}
			tc.then(r)
			if tc.shards != "" {
				ws, release, err := r.PickShards("m", 2, 1, nil)
				if err != nil {
					t.Fatal(err)
				}
				defer release()
				var ids []string
				for _, w := range ws {
					ids = append(ids, w.GetId())
				}
				if got := strings.Join(ids, ","); got != tc.shards {
					t.Errorf("fan-out to %s, want %s", got, tc.shards)
				}
				return
			}
			w, release, err := r.Pick(prismv1.Role_ROLE_EMBEDDING, "m", 1, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer release()
			if w.GetId() != tc.pick {
				t.Errorf("picked %s, want %s", w.GetId(), tc.pick)
			}
			if tc.dense != "" {
				d, release, err := r.Pick(prismv1.Role_ROLE_DENSE, "m", 1, nil)
				if err != nil {
					t.Fatal(err)
				}
				defer release()
				if d.GetId() != tc.dense {
					t.Errorf("dense picked %s, want %s", d.GetId(), tc.dense)
				}
			}
			r.mu.Lock()
			marked := 0
			for _, e := range r.workers {
				if e.unreachable {
					marked++
				}
			}
			r.mu.Unlock()
			if n := r.unreachable.Load(); n != int64(marked) {
				t.Errorf("%d workers counted unreachable, %d marked", n, marked)
			}
		})
	}
}

// countCalls is a client interceptor counting the Lookups sent to each
// address, and those after a first failure at it.
type countCalls struct {
	mu     sync.Mutex
	failed map[string]bool
	after  map[string]int // Lookups sent after the address's first failure
}

func (c *countCalls) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	addr := cc.Target()
	c.mu.Lock()
	if c.failed[addr] {
		c.after[addr]++
	}
	c.mu.Unlock()
	err := invoker(ctx, method, req, reply, cc, opts...)
	if err != nil && ctx.Err() == nil {
		c.mu.Lock()
		c.failed[addr] = true
		c.mu.Unlock()
	}
	return err
}

// denseCN answers as fakeCN does, and a Lookup naming the dense worker
// at dead as an embedding worker that could not reach it.
type denseCN struct {
	fakeCN
	dead string
	seen *deadSeen
}

// deadSeen counts, over every embedding worker, the Lookups naming the
// dead dense worker after the first.
type deadSeen struct {
	mu    sync.Mutex
	first bool // one named it
	after int
}

func (f *denseCN) Lookup(ctx context.Context, req *prismv1.LookupRequest) (*prismv1.LookupResponse, error) {
	if req.GetDenseAddr() == f.dead {
		f.seen.mu.Lock()
		if f.seen.first {
			f.seen.after++
		}
		f.seen.first = true
		f.seen.mu.Unlock()
		return nil, prismv1.DenseUnreachableError(f.dead, status.Error(codes.Unavailable, "connection error: connect: connection refused"))
	}
	return f.fakeCN.Lookup(ctx, req)
}

// TestDeadWorkerUnderLoad: a worker killed under load (its server
// stopped, its port closed: calls refused) gets, after the first call
// that failed, at most the micro-batches picked before that failure
// marked it (one per concurrent client), not every pick until its
// heartbeats expire (2,734 at 300 requests/s before); and no client
// request fails, another replica being live. The same for a dense
// worker that the embedding workers answer they cannot reach.
func TestDeadWorkerUnderLoad(t *testing.T) {
	const clients = 8
	for _, tc := range []struct {
		name    string
		killCN  bool // else a dense worker dies
		sharded bool
	}{
		{name: "embedding worker", killCN: true},
		{name: "embedding worker of a shard", killCN: true, sharded: true},
		{name: "dense worker"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cc := &countCalls{failed: map[string]bool{}, after: map[string]int{}}
			// No heartbeat expires during the test: only the marks keep
			// the dead worker out.
			r := New(Options{MicroBatch: 10, Heartbeat: time.Hour, DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(cc.intercept)}}, nil)
			r.started = r.started.Add(-time.Hour)
			defer r.Close()
			announce := func(w *prismv1.WorkerInfo) {
				t.Helper()
				if _, err := r.Reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: w}); err != nil {
					t.Fatal(err)
				}
			}
			for _, g := range []string{"dense:live", "dense:dead"} {
				announce(&prismv1.WorkerInfo{Id: g, Role: prismv1.Role_ROLE_DENSE, Addr: g, Models: []string{"m"}, Healthy: true})
			}
			dead := "dense:none" // killCN: every CN answers
			if !tc.killCN {
				dead = "dense:dead"
			}
			seen := &deadSeen{}
			var stops []func()
			var addrs []string
			for i := range 2 {
				f := &denseCN{fakeCN: fakeCN{delay: time.Millisecond}, dead: dead, seen: seen}
				lis, err := net.Listen("tcp", "127.0.0.1:0")
				if err != nil {
					t.Fatal(err)
				}
				s := grpc.NewServer()
				prismv1.RegisterEmbeddingTierServer(s, f)
				go s.Serve(lis)
				defer s.Stop()
				w := &prismv1.WorkerInfo{Id: lis.Addr().String(), Role: prismv1.Role_ROLE_EMBEDDING, Addr: lis.Addr().String(), Models: []string{"m"}, Healthy: true}
				if tc.sharded {
					// Shard 0 is the first; the second and third replicate shard 1.
					w.Shards = map[string]*prismv1.ShardRef{"m": {Shard: int32(min(i, 1)), Shards: 2}}
				}
				announce(w)
				stops, addrs = append(stops, s.Stop), append(addrs, w.GetAddr())
			}
			if tc.sharded {
				f := &denseCN{fakeCN: fakeCN{delay: time.Millisecond}, dead: dead, seen: seen}
				lis, err := net.Listen("tcp", "127.0.0.1:0")
				if err != nil {
					t.Fatal(err)
				}
				s := grpc.NewServer()
				prismv1.RegisterEmbeddingTierServer(s, f)
				go s.Serve(lis)
				defer s.Stop()
				announce(&prismv1.WorkerInfo{Id: lis.Addr().String(), Role: prismv1.Role_ROLE_EMBEDDING, Addr: lis.Addr().String(), Models: []string{"m"}, Healthy: true,
					Shards: map[string]*prismv1.ShardRef{"m": {Shard: 1, Shards: 2}}})
			}
			// The CN that dies: the second (a replica of shard 1 when sharded).
			victim := 1
			var failed, ok atomic.Int64
			var errs sync.Map
			stop := make(chan struct{})
			var wg sync.WaitGroup
			for range clients {
				wg.Go(func() {
					for {
						select {
						case <-stop:
							return
						default:
						}
						if _, err := r.Recommend(context.Background(), request(10)); err != nil {
							failed.Add(1)
							errs.Store(status.Code(err), err)
						} else {
							ok.Add(1)
						}
					}
				})
			}
			time.Sleep(100 * time.Millisecond)
			if tc.killCN {
				stops[victim]()
			}
			before := ok.Load()
			time.Sleep(400 * time.Millisecond)
			close(stop)
			wg.Wait()
			if ok.Load()-before < 50 {
				t.Fatalf("only %d requests served after the kill: no load to judge", ok.Load()-before)
			}
			var after int
			if tc.killCN {
				cc.mu.Lock()
				after = cc.after[addrs[victim]]
				if !cc.failed[addrs[victim]] {
					t.Errorf("the killed worker never failed a call: %v", cc.failed)
				}
				cc.mu.Unlock()
			} else {
				seen.mu.Lock()
				after = seen.after
				if !seen.first {
					t.Errorf("no micro-batch named the dead dense worker")
				}
				seen.mu.Unlock()
			}
			// After the first failure, only micro-batches picked before it
			// marked the worker may still go there: one per client.
			if after > clients {
				t.Errorf("%d micro-batches sent to the dead worker after its first failure, want at most %d (the requests in flight then)", after, clients)
			}
			if n := failed.Load(); n > 0 {
				errs.Range(func(k, v any) bool { t.Logf("%v: %v", k, v); return true })
				t.Errorf("%d client requests failed, with another replica live", n)
			}
			t.Logf("%d requests served, %d micro-batches to the dead worker after its first failure", ok.Load(), after)
		})
	}
}

// TestRetryAvoidsUnreachable: a micro-batch's retry takes a worker this
// request failed on over one marked unreachable (whose call can only
// fail), as a fan-out's retry does (pickShards ranks an unreachable
// replica after a failed one). The first attempt goes to the live
// embedding worker, which answers that it could not reach the dense
// worker named; the retry must not go to the dead embedding worker
// (marked, its port closed) but to the live one again, with the other
// dense worker.
func TestRetryAvoidsUnreachable(t *testing.T) {
	for _, tc := range []struct {
		name string
		// deadCN: a dead embedding worker, marked before the request.
		deadCN bool
	}{
		{name: "no other embedding worker: the failed one again"},
		{name: "the other marked unreachable: the failed one again", deadCN: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := New(Options{MicroBatch: 10, Heartbeat: time.Hour}, nil)
			r.started = r.started.Add(-time.Hour)
			defer r.Close()
			announce := func(w *prismv1.WorkerInfo) {
				t.Helper()
				if _, err := r.Reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: w}); err != nil {
					t.Fatal(err)
				}
			}
			// The dead dense worker sorts first: the first attempt names it.
			for _, g := range []string{"dense:a-dead", "dense:b-live"} {
				announce(&prismv1.WorkerInfo{Id: g, Role: prismv1.Role_ROLE_DENSE, Addr: g, Models: []string{"m"}, Healthy: true})
			}
			f := &denseCN{fakeCN: fakeCN{}, dead: "dense:a-dead", seen: &deadSeen{}}
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			s := grpc.NewServer()
			prismv1.RegisterEmbeddingTierServer(s, f)
			go s.Serve(lis)
			defer s.Stop()
			announce(&prismv1.WorkerInfo{Id: "live", Role: prismv1.Role_ROLE_EMBEDDING, Addr: lis.Addr().String(), Models: []string{"m"}, Healthy: true, Outstanding: 5})
			if tc.deadCN {
				// A closed port, and less loaded.
				gone, err := net.Listen("tcp", "127.0.0.1:0")
				if err != nil {
					t.Fatal(err)
				}
				gone.Close()
				announce(&prismv1.WorkerInfo{Id: "dead", Role: prismv1.Role_ROLE_EMBEDDING, Addr: gone.Addr().String(), Models: []string{"m"}, Healthy: true})
				r.Reg.Unreachable("dead")
			}
			if _, err := r.Recommend(context.Background(), request(10)); err != nil {
				t.Fatalf("Recommend: %v (Lookups scored by the live worker: %d)", err, f.calls.Load())
			}
		})
	}
}
