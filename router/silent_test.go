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
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/prism-serve/prism/api/prismv1"
)

// silentCN is an embedding worker double that never answers a Lookup
// naming the dense worker at dense (every Lookup when dense is ""), as
// one cut off without a reset (or whose dense worker is) does: the call
// waits until the caller gives it up. Other Lookups are answered.
type silentCN struct {
	fakeCN
	dense string
	held  atomic.Int64
}

func (f *silentCN) Lookup(ctx context.Context, req *prismv1.LookupRequest) (*prismv1.LookupResponse, error) {
	if f.dense == "" || req.GetDenseAddr() == f.dense {
		f.held.Add(1)
		<-ctx.Done()
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	return f.fakeCN.Lookup(ctx, req)
}

// TestSilentWorkerCallsRetried: a worker that goes silent (no answer,
// no reset: its link cut) with Lookups in flight, an embedding worker,
// a dense worker, or a shard's replica, while a replica of it is live.
// Once it expires (three heartbeats without an announcement) the calls
// waiting on it are abandoned and retried on the live replica: every
// request is answered, none waits out its deadline. Found by the
// partition campaign: every call in flight to a silently cut worker
// ended DeadlineExceeded (4 with a 2 s deadline and 2 without one in
// TestNetPartitionDense), though the other dense worker could answer.
func TestSilentWorkerCallsRetried(t *testing.T) {
	const (
		heartbeat = 100 * time.Millisecond
		requests  = 6
		deadline  = 3 * time.Second
	)
	emb := func(id, addr string, load int64, shard int32) *prismv1.WorkerInfo {
		w := &prismv1.WorkerInfo{Id: id, Role: prismv1.Role_ROLE_EMBEDDING, Addr: addr, Models: []string{"m"}, Healthy: true, Outstanding: load}
		if shard >= 0 {
			w.Shards = map[string]*prismv1.ShardRef{"m": {Shard: shard, Shards: 2}}
		}
		return w
	}
	dense := func(id, addr string, load int64) *prismv1.WorkerInfo {
		return &prismv1.WorkerInfo{Id: id, Role: prismv1.Role_ROLE_DENSE, Addr: addr, Models: []string{"m"}, Healthy: true, Outstanding: load}
	}
	for _, tc := range []struct {
		name string
		// workers makes the workers: silent announces once (then goes
		// silent), live keeps announcing; held counts the Lookups the
		// silent one holds.
		workers func(t *testing.T) (silent, live []*prismv1.WorkerInfo, held func() int64)
	}{
		{"an embedding worker", func(t *testing.T) ([]*prismv1.WorkerInfo, []*prismv1.WorkerInfo, func() int64) {
			s := &silentCN{}
			// The silent one is the least loaded: every request goes there first.
			return []*prismv1.WorkerInfo{emb("cpu-silent", startCN(t, s), 0, -1)},
				[]*prismv1.WorkerInfo{emb("cpu-live", startCN(t, &fakeCN{}), 100, -1), dense("gpu", "dense:a", 0)}, s.held.Load
		}},
		{"a dense worker", func(t *testing.T) ([]*prismv1.WorkerInfo, []*prismv1.WorkerInfo, func() int64) {
			s := &silentCN{dense: "dense:silent"}
			return []*prismv1.WorkerInfo{dense("gpu-silent", "dense:silent", 0)},
				[]*prismv1.WorkerInfo{emb("cpu", startCN(t, s), 0, -1), dense("gpu-live", "dense:live", 100)}, s.held.Load
		}},
		{"a shard's replica", func(t *testing.T) ([]*prismv1.WorkerInfo, []*prismv1.WorkerInfo, func() int64) {
			s := &silentCN{}
			return []*prismv1.WorkerInfo{emb("s1-silent", startCN(t, s), 0, 1)},
				[]*prismv1.WorkerInfo{emb("s0", startCN(t, &shardCN{}), 0, 0), emb("s1-live", startCN(t, &shardCN{}), 100, 1), dense("gpu", "dense:a", 0)}, s.held.Load
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := testRouter(Options{MicroBatch: 10, Heartbeat: heartbeat})
			defer r.Close()
			silent, live, held := tc.workers(t)
			announce := func(ws []*prismv1.WorkerInfo) {
				for _, w := range ws {
					// A fresh message each time, as off the wire: the
					// registry keeps it.
					w = proto.Clone(w).(*prismv1.WorkerInfo)
					if _, err := r.Reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: w}); err != nil {
						t.Error(err)
					}
				}
			}
			announce(silent)
			announce(live)
			ctx, stop := context.WithCancel(context.Background())
			var bg sync.WaitGroup
			defer bg.Wait()
			defer stop()
			bg.Go(func() { r.Run(ctx) })
			bg.Go(func() {
				// The live workers keep announcing; the silent one does not.
				for {
					select {
					case <-ctx.Done():
						return
					case <-time.After(heartbeat / 4):
						announce(live)
					}
				}
			})
			began := time.Now()
			errs := make([]error, requests)
			took := make([]time.Duration, requests)
			var wg sync.WaitGroup
			for i := range requests {
				wg.Go(func() {
					rctx, cancel := context.WithTimeout(context.Background(), deadline)
					defer cancel()
					start := time.Now()
					_, errs[i] = r.Recommend(rctx, request(4))
					took[i] = time.Since(start)
				})
			}
			wg.Wait()
			failed := map[codes.Code]int{}
			for _, err := range errs {
				if err != nil {
					failed[status.Code(err)]++
				}
			}
			t.Logf("%d requests, %d Lookups held by the silent worker: failed %v; took %v (all in %v)", requests, held(), failed, took, time.Since(began).Round(time.Millisecond))
			if held() == 0 {
				t.Fatal("no Lookup went to the silent worker: the test proves nothing")
			}
			if len(failed) > 0 {
				t.Errorf("requests failed %v, want every one answered by the live replica once the silent one expired", failed)
			}
		})
	}
}

// silentSequencer is a sequencing router double: its Update answers
// after takes (0: never), and once silent it answers nothing, List
// included, as a router cut off without a reset; cut makes it silent
// at its first Update.
type silentSequencer struct {
	prismv1.UnimplementedEmbeddingsServer
	prismv1.UnimplementedRegistryServer
	takes   time.Duration
	cut     bool
	silent  atomic.Bool
	updates atomic.Int64
}

func (s *silentSequencer) Update(ctx context.Context, _ *prismv1.UpdateRequest) (*prismv1.UpdateResponse, error) {
	s.updates.Add(1)
	if s.cut {
		s.silent.Store(true)
	}
	if s.takes == 0 || s.silent.Load() {
		<-ctx.Done()
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	select {
	case <-time.After(s.takes):
		return &prismv1.UpdateResponse{}, nil
	case <-ctx.Done():
		return nil, status.FromContextError(ctx.Err()).Err()
	}
}

func (s *silentSequencer) List(ctx context.Context, _ *prismv1.ListRequest) (*prismv1.ListResponse, error) {
	if s.silent.Load() {
		<-ctx.Done()
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	return &prismv1.ListResponse{}, nil
}

// TestForwardToSilentSequencer: an update forwarded to a sequencer that
// goes silent (cut off without a reset: no answer, no error) is
// answered Unavailable, naming it, once silentPolls polls of it in a
// row failed, as README promises for a sequencer that cannot be
// reached, so a client retrying on Unavailable retries; not held to
// its deadline. A sequencer that is slow to answer an update but
// answers its polls is waited for. Found by the partition campaign:
// the forward ended DeadlineExceeded, every time, for as long as the
// path was cut (the connection to the sequencer has no keepalive).
func TestForwardToSilentSequencer(t *testing.T) {
	const (
		heartbeat = 100 * time.Millisecond
		deadline  = 3 * time.Second
	)
	for _, tc := range []struct {
		name string
		seq  *silentSequencer
		// silentFirst: silent, and its polls failing, before the update.
		silentFirst bool
		want        codes.Code
	}{
		{"cut with the update in flight", &silentSequencer{cut: true}, false, codes.Unavailable},
		{"cut before the update", &silentSequencer{}, true, codes.Unavailable},
		{"slow to answer the update, answering its polls", &silentSequencer{takes: 8 * heartbeat}, false, codes.OK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr := serveInproc(t, func(s *grpc.Server) {
				prismv1.RegisterEmbeddingsServer(s, tc.seq)
				prismv1.RegisterRegistryServer(s, tc.seq)
			})
			r := testRouter(Options{Sequencer: addr, Heartbeat: heartbeat})
			r.opts.SequencerDialOptions = []grpc.DialOption{grpc.WithContextDialer(dialInproc)}
			defer r.Close()
			ctx, stop := context.WithCancel(context.Background())
			var bg sync.WaitGroup
			defer bg.Wait()
			defer stop()
			bg.Go(func() { r.Run(ctx) })
			if tc.silentFirst {
				tc.seq.silent.Store(true)
				time.Sleep(4 * heartbeat) // two polls failed
			}
			uctx, cancel := context.WithTimeout(context.Background(), deadline)
			defer cancel()
			start := time.Now()
			_, err := r.Updater().Update(uctx, &prismv1.UpdateRequest{Model: "m", Table: "t", Ids: []int64{1}, Rows: []byte{0, 0, 0, 0}})
			took := time.Since(start)
			t.Logf("forwarded update: %v after %v (%d reached the sequencer)", status.Code(err), took.Round(time.Millisecond), tc.seq.updates.Load())
			if status.Code(err) != tc.want {
				t.Fatalf("forwarded update: %v, want %v", err, tc.want)
			}
			if err != nil && !strings.Contains(err.Error(), addr) {
				t.Errorf("the answer does not name the sequencer %s: %v", addr, err)
			}
			if tc.want != codes.OK && took > deadline/2 {
				t.Errorf("answered after %v: the silent sequencer held it most of its deadline (%v)", took, deadline)
			}
		})
	}
}

// TestInflightCallsAbandon: a sweep cancels the calls waiting on the
// workers it expired, an embedding worker by id and a dense worker by
// the address calls name it by, and no other; a call registered just
// after the sweep that expired its worker (picked before it) is
// cancelled at once; the next sweep forgets the expiry (a worker back
// by then takes calls).
func TestInflightCallsAbandon(t *testing.T) {
	var c inflightCalls
	live := func(ctx context.Context) bool { return ctx.Err() == nil }
	bg := context.Background()
	onA, doneA := c.watch(bg, "cpu-a", "dense:1")
	onB, doneB := c.watch(bg, "cpu-b", "dense:2")
	defer doneA()
	defer doneB()
	gone := []*prismv1.WorkerInfo{
		{Id: "gpu-2", Role: prismv1.Role_ROLE_DENSE, Addr: "dense:2"},
		// An embedding worker at the address a call names its dense
		// worker by is not that dense worker.
		{Id: "cpu-x", Role: prismv1.Role_ROLE_EMBEDDING, Addr: "dense:1"},
	}
	if n := c.abandon(gone); n["gpu-2"] != 1 || len(n) != 1 {
		t.Fatalf("abandoned %v, want the one call naming dense:2", n)
	}
	if !live(onA) || live(onB) {
		t.Fatalf("after the sweep: call to cpu-a live %v, call naming dense:2 live %v; want true, false", live(onA), live(onB))
	}
	if s := abandoned(bg, onB); s == nil || s.name != "dense:2" || s.role != prismv1.Role_ROLE_DENSE {
		t.Fatalf("the abandoned call's cause: %v", s)
	}
	late, doneLate := c.watch(bg, "cpu-c", "dense:2")
	defer doneLate()
	if live(late) {
		t.Fatal("a call naming dense:2 registered after its expiry is live")
	}
	c.abandon(nil)
	again, doneAgain := c.watch(bg, "cpu-c", "dense:2")
	defer doneAgain()
	if !live(again) {
		t.Fatal("a call naming dense:2 after the next sweep was cancelled")
	}
	doneA()
	if n := c.abandon([]*prismv1.WorkerInfo{{Id: "cpu-a", Role: prismv1.Role_ROLE_EMBEDDING}}); len(n) != 0 {
		t.Fatalf("a finished call abandoned: %v", n)
	}
	if s := abandoned(bg, onA); s != nil {
		t.Fatalf("a call that finished has an abandonment cause: %v", s)
	}
	// The caller's own end is not the worker's.
	cctx, cancel := context.WithCancel(bg)
	onD, doneD := c.watch(cctx, "cpu-d", "")
	defer doneD()
	cancel()
	c.abandon([]*prismv1.WorkerInfo{{Id: "cpu-d", Role: prismv1.Role_ROLE_EMBEDDING}})
	if s := abandoned(cctx, onD); s != nil {
		t.Fatalf("a call its caller cancelled reads as abandoned: %v", s)
	}
	// Finished calls leave nothing behind.
	for _, done := range []func(){doneB, doneLate, doneAgain, doneD} {
		done()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.calls) > 0 {
		t.Errorf("%d calls still registered once every one finished", len(c.calls))
	}
}

// TestRestartedDenseWorkerCallsNotAbandoned: a dense worker restarted
// at its address under a new id (ids are per process; a crash leaves
// the old one to expire three heartbeats later) serves the calls naming
// that address; the old id's expiry does not abandon them. They were:
// those in flight at the sweep, and for the heartbeat after it every
// call picking that address was cancelled at once, so with no other
// dense worker the retry failed too and requests failed Unavailable
// though the worker answered every call.
func TestRestartedDenseWorkerCallsNotAbandoned(t *testing.T) {
	const heartbeat = 100 * time.Millisecond
	// Each Lookup takes most of a heartbeat: some are in flight at
	// every sweep.
	cn := &fakeCN{delay: heartbeat * 3 / 4}
	addr := startCN(t, cn)
	r := testRouter(Options{MicroBatch: 10, Heartbeat: heartbeat})
	defer r.Close()
	announce := func(ws ...*prismv1.WorkerInfo) {
		for _, w := range ws {
			if _, err := r.Reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: proto.Clone(w).(*prismv1.WorkerInfo)}); err != nil {
				t.Error(err)
			}
		}
	}
	dense := func(id string) *prismv1.WorkerInfo {
		return &prismv1.WorkerInfo{Id: id, Role: prismv1.Role_ROLE_DENSE, Addr: "dense:a", Models: []string{"m"}, Healthy: true}
	}
	live := []*prismv1.WorkerInfo{
		{Id: "cpu", Role: prismv1.Role_ROLE_EMBEDDING, Addr: addr, Models: []string{"m"}, Healthy: true},
		dense("gpu-new"),
	}
	// The old process announced last; the new one announces from now on.
	announce(dense("gpu-old"))
	announce(live...)
	ctx, stop := context.WithCancel(context.Background())
	var bg sync.WaitGroup
	defer bg.Wait()
	defer stop()
	bg.Go(func() { r.Run(ctx) })
	bg.Go(func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(heartbeat / 4):
				announce(live...)
			}
		}
	})
	// Requests throughout the old id's expiry (three heartbeats) and
	// the heartbeat after it.
	var wg sync.WaitGroup
	var mu sync.Mutex
	failed := map[codes.Code]int{}
	var first error
	n := 0
	for end := time.Now().Add(6 * heartbeat); time.Now().Before(end); time.Sleep(heartbeat / 10) {
		n++
		wg.Go(func() {
			rctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			if _, err := r.Recommend(rctx, request(4)); err != nil {
				mu.Lock()
				defer mu.Unlock()
				failed[status.Code(err)]++
				if first == nil {
					first = err
				}
			}
		})
	}
	wg.Wait()
	r.Reg.mu.Lock()
	_, old := r.Reg.workers["gpu-old"]
	r.Reg.mu.Unlock()
	if old {
		t.Fatal("the old registration did not expire: the test proves nothing")
	}
	t.Logf("%d requests, failed %v", n, failed)
	if len(failed) > 0 {
		t.Errorf("requests failed %v (first: %v), want every one answered by the restarted dense worker", failed, first)
	}
}

// TestInflightCallsSpareRegistered: an expired worker's marks spare a
// worker registered again (an embedding worker announcing under its id
// since the sweep, a dense worker registered at the address under
// another id): its calls, in flight at the sweep or begun after it, are
// live; those of a worker still gone are abandoned.
func TestInflightCallsSpareRegistered(t *testing.T) {
	reg := map[string]bool{}
	var c inflightCalls
	c.registered = func(role prismv1.Role, name string) bool { return reg[role.String()+" "+name] }
	bg := context.Background()
	// dense:b is registered under another id than the one that expires.
	reg[prismv1.Role_ROLE_DENSE.String()+" dense:b"] = true
	onB, doneB := c.watch(bg, "cpu-b", "dense:b")
	defer doneB()
	onA, doneA := c.watch(bg, "cpu-a", "")
	defer doneA()
	n := c.abandon([]*prismv1.WorkerInfo{
		{Id: "cpu-a", Role: prismv1.Role_ROLE_EMBEDDING},
		{Id: "gpu-b-old", Role: prismv1.Role_ROLE_DENSE, Addr: "dense:b"},
	})
	if onB.Err() != nil || onA.Err() == nil || n["cpu-a"] != 1 || len(n) != 1 {
		t.Fatalf("abandoned %v: the call naming the registered dense:b live %v, the call to the expired cpu-a live %v; want only cpu-a's", n, onB.Err() == nil, onA.Err() == nil)
	}
	late, doneLate := c.watch(bg, "cpu-a", "")
	defer doneLate()
	if late.Err() == nil {
		t.Fatal("a call to cpu-a, expired and not back, is live")
	}
	// cpu-a announces again before the next sweep.
	reg[prismv1.Role_ROLE_EMBEDDING.String()+" cpu-a"] = true
	back, doneBack := c.watch(bg, "cpu-a", "dense:b")
	defer doneBack()
	if back.Err() != nil {
		t.Fatal("a call to cpu-a, announced again since its expiry, was cancelled")
	}
}
