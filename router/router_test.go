package router

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	"github.com/prism-serve/prism/api/prismv1"
)

func TestRegistryPickAndExpire(t *testing.T) {
	now := time.Unix(0, 0)
	r := NewRegistry(time.Second, func() time.Time { return now })
	ann := func(id string, role prismv1.Role, addr string, out int64) {
		if _, err := r.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: &prismv1.WorkerInfo{Id: id, Role: role, Addr: addr, Models: []string{"m"}, Outstanding: out, Healthy: true}}); err != nil {
			t.Fatal(err)
		}
	}
	ann("c1", prismv1.Role_ROLE_EMBEDDING, "a:1", 10)
	ann("c2", prismv1.Role_ROLE_EMBEDDING, "a:2", 0)
	ann("g1", prismv1.Role_ROLE_DENSE, "b:1", 0)
	w, rel, err := r.Pick(prismv1.Role_ROLE_EMBEDDING, "m", 64, nil)
	if err != nil || w.GetId() != "c2" {
		t.Fatalf("picked %v, %v; want the idle c2", w.GetId(), err)
	}
	// c2 now carries 64 in flight from this router: c1 (10) is lighter.
	w2, rel2, _ := r.Pick(prismv1.Role_ROLE_EMBEDDING, "m", 64, nil)
	if w2.GetId() != "c1" {
		t.Fatalf("second pick %s, want c1", w2.GetId())
	}
	rel()
	rel2()
	rel() // idempotent
	if w, _, _ := r.Pick(prismv1.Role_ROLE_EMBEDDING, "m", 1, []string{"c2"}); w.GetId() != "c1" {
		t.Fatal("exclusion ignored")
	}
	if _, _, err := r.Pick(prismv1.Role_ROLE_EMBEDDING, "other", 1, nil); err == nil {
		t.Fatal("picked a worker for a model nobody serves")
	}
	now = now.Add(2 * time.Second)
	ann("c1", prismv1.Role_ROLE_EMBEDDING, "a:1", 0) // c1 keeps heartbeating
	now = now.Add(2 * time.Second)
	gone := r.Expire()
	if len(gone) != 2 || gone[0] != "c2" || gone[1] != "g1" {
		t.Fatalf("expired %v, want c2 and g1", gone)
	}
	if _, err := r.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: &prismv1.WorkerInfo{Id: "x"}}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("bad announce: %v", err)
	}
}

// fakeCN is an embedding tier double: score = candidate's first id + its
// dense address's tag; it can fail.
type fakeCN struct {
	prismv1.UnimplementedEmbeddingTierServer
	calls atomic.Int64
	fail  bool
	tag   float32
	delay time.Duration
	// gate, when set, holds every Lookup until it is closed.
	gate chan struct{}
	// running and peak count concurrent Lookups.
	running, peak atomic.Int64
	// extra scores are answered beyond the samples asked for (a
	// misbehaving worker).
	extra int
	// tasks, when above 1, answers as a multi-task model's workers do:
	// tasks values a sample, task t's the one-task score + 1000*t.
	tasks int32
	// taskNames are answered with them (LookupResponse.task_names).
	taskNames []string
}

func (f *fakeCN) Lookup(ctx context.Context, req *prismv1.LookupRequest) (*prismv1.LookupResponse, error) {
	f.calls.Add(1)
	now := f.running.Add(1)
	defer f.running.Add(-1)
	for p := f.peak.Load(); now > p && !f.peak.CompareAndSwap(p, now); p = f.peak.Load() {
	}
	if f.fail {
		return nil, status.Error(codes.Unavailable, "down")
	}
	if f.gate != nil {
		select {
		case <-f.gate:
		case <-ctx.Done():
			return nil, status.FromContextError(ctx.Err()).Err()
		}
	}
	if f.delay > 0 {
		select {
		case <-time.After(f.delay):
		case <-ctx.Done():
			return nil, status.FromContextError(ctx.Err()).Err()
		}
	}
	ids := req.GetCandidates().GetInputs()[0].GetIds()
	k := max(int(f.tasks), 1)
	out := make([]float32, int(req.GetNumSamples())*k+f.extra)
	for i := range out {
		out[i] = float32(ids[(i/k)%len(ids)]) + f.tag + 1000*float32(i%k)
	}
	return &prismv1.LookupResponse{Scores: out, Tasks: f.tasks, TaskNames: f.taskNames}, nil
}

// TestScoreCountChecked: a micro-batch answered with another count of
// scores than its samples is Internal, more as well as fewer (more were
// cut silently: the extra ones, whose samples no one knows, dropped).
func TestScoreCountChecked(t *testing.T) {
	for _, extra := range []int{-1, 1} {
		r := newRouter(t, Options{MicroBatch: 8}, &fakeCN{extra: extra})
		if _, err := r.Recommend(context.Background(), request(8)); status.Code(err) != codes.Internal {
			t.Errorf("%+d scores a micro-batch: %v, want Internal", extra, err)
		}
	}
}

// inproc is the in-process network the tests' servers listen on
// (bufconn: no ports, nothing outside the test process).
var inproc = struct {
	sync.Mutex
	n   int
	lis map[string]*bufconn.Listener
}{lis: map[string]*bufconn.Listener{}}

// listen opens an in-process listener and returns the address that
// reaches it through dialInproc.
func listen(t testing.TB) (string, *bufconn.Listener) {
	t.Helper()
	lis := bufconn.Listen(1 << 20)
	inproc.Lock()
	inproc.n++
	name := fmt.Sprintf("inproc-%d", inproc.n)
	inproc.lis[name] = lis
	inproc.Unlock()
	t.Cleanup(func() {
		inproc.Lock()
		delete(inproc.lis, name)
		inproc.Unlock()
	})
	// passthrough: the name goes to the dialer as it is, not to DNS.
	return "passthrough:///" + name, lis
}

// dialInproc connects to an in-process listener by name.
func dialInproc(ctx context.Context, name string) (net.Conn, error) {
	inproc.Lock()
	lis := inproc.lis[name]
	inproc.Unlock()
	if lis == nil {
		return nil, fmt.Errorf("dial %q: no in-process server", name)
	}
	return lis.DialContext(ctx)
}

// testRouter is a router that dials the in-process servers.
func testRouter(o Options) *Router {
	r := New(o, nil)
	r.opts.DialOptions = []grpc.DialOption{grpc.WithContextDialer(dialInproc)}
	// Past the start-up window (TestUnknownModelJustAfterStart is about it).
	r.started = r.started.Add(-time.Hour)
	return r
}

// TestUnknownModelJustAfterStart: a router that has just (re)started and
// heard from no worker yet answers a model it does not know with
// Unavailable (its workers are still announcing), and NotFound once they
// have had the time: workers that resolve the routers' name find a new
// router only at their next resolution, every 30 s, so three heartbeats
// are not that time.
func TestUnknownModelJustAfterStart(t *testing.T) {
	r := New(Options{Heartbeat: time.Second}, nil)
	req := &prismv1.RecommendRequest{Model: "later", NumCandidates: 1}
	for _, c := range []struct {
		after time.Duration
		want  codes.Code
	}{
		{0, codes.Unavailable},
		{3 * time.Second, codes.Unavailable},
		{35 * time.Second, codes.Unavailable},
		{41 * time.Second, codes.NotFound},
	} {
		r.started = r.Reg.now().Add(-c.after)
		if _, err := r.Recommend(context.Background(), req); status.Code(err) != c.want {
			t.Errorf("%v after start: %v, want %v", c.after, err, c.want)
		}
	}
}

// serveInproc serves what register registers on an in-process listener
// until the test ends, and returns its address.
func serveInproc(t testing.TB, register func(*grpc.Server)) string {
	t.Helper()
	addr, lis := listen(t)
	s := grpc.NewServer()
	register(s)
	go s.Serve(lis)
	t.Cleanup(s.Stop)
	return addr
}

func startCN(t *testing.T, f prismv1.EmbeddingTierServer) string {
	t.Helper()
	return serveInproc(t, func(s *grpc.Server) { prismv1.RegisterEmbeddingTierServer(s, f) })
}

// dialTest is a client connection to an in-process server.
func dialTest(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithContextDialer(dialInproc))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func request(n int) *prismv1.RecommendRequest {
	ids := make([]int64, n)
	for i := range ids {
		ids[i] = int64(i)
	}
	return &prismv1.RecommendRequest{Model: "m", NumCandidates: int32(n), Candidates: &prismv1.Features{Inputs: []*prismv1.Input{{Name: "cat_0", Ids: ids}}}}
}

// backlog starts a request of n samples on r and returns once cn (a
// gated fake worker) holds it, so later requests find n samples in
// flight ahead of them; the request's outcome arrives on the channel
// when the gate opens.
func backlog(r *Router, cn *fakeCN, n int) <-chan error {
	done := make(chan error, 1)
	go func() { _, err := r.Recommend(context.Background(), request(n)); done <- err }()
	for cn.running.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	return done
}

func newRouter(t *testing.T, o Options, cns ...*fakeCN) *Router {
	r := testRouter(o)
	for i, f := range cns {
		addr := startCN(t, f)
		r.Reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: &prismv1.WorkerInfo{Id: "cpu" + addr, Role: prismv1.Role_ROLE_EMBEDDING, Addr: addr, Models: []string{"m"}, Healthy: true}})
		r.Reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: &prismv1.WorkerInfo{Id: "gpu" + string(rune('a'+i)), Role: prismv1.Role_ROLE_DENSE, Addr: "dense:" + string(rune('a'+i)), Models: []string{"m"}, Healthy: true}})
	}
	return r
}

func TestMicroBatchesReassembleInOrder(t *testing.T) {
	cn := &fakeCN{}
	r := newRouter(t, Options{MicroBatch: 7}, cn)
	resp, err := r.Recommend(context.Background(), request(50))
	if err != nil {
		t.Fatal(err)
	}
	for i, s := range resp.GetScores() {
		if s != float32(i) {
			t.Fatalf("score %d = %v", i, s)
		}
	}
	if got := cn.calls.Load(); got != 8 {
		t.Errorf("%d micro-batches, want ceil(50/7) = 8", got)
	}
}

func TestRetryOnOtherReplica(t *testing.T) {
	bad, good := &fakeCN{fail: true}, &fakeCN{}
	r := newRouter(t, Options{MicroBatch: 10}, bad, good)
	for range 5 {
		if _, err := r.Recommend(context.Background(), request(30)); err != nil {
			t.Fatalf("a failed replica was not retried around: %v", err)
		}
	}
	// Three micro-batches at once spread over both replicas (the second
	// pick sees the first one's charge), so the failing one was tried.
	if bad.calls.Load() == 0 {
		t.Fatal("the failing replica was never picked: the retry path went untested")
	}
	// With every replica failing the error comes back, never a hang.
	r2 := newRouter(t, Options{}, &fakeCN{fail: true})
	if _, err := r2.Recommend(context.Background(), request(3)); status.Code(err) != codes.Unavailable {
		t.Fatalf("all down: %v", err)
	}
}

func TestBadRequests(t *testing.T) {
	r := newRouter(t, Options{MaxCandidates: 100, MaxInflight: 150, MicroBatch: 100}, &fakeCN{delay: 200 * time.Millisecond})
	cases := []struct {
		name string
		req  *prismv1.RecommendRequest
		want codes.Code
	}{
		{"unknown model", &prismv1.RecommendRequest{Model: "nope", NumCandidates: 1}, codes.NotFound},
		{"no model", &prismv1.RecommendRequest{NumCandidates: 1}, codes.InvalidArgument},
		{"empty", &prismv1.RecommendRequest{Model: "m"}, codes.InvalidArgument},
		{"too big", request(101), codes.InvalidArgument},
		{"ragged", &prismv1.RecommendRequest{Model: "m", NumCandidates: 3, Candidates: &prismv1.Features{Inputs: []*prismv1.Input{{Name: "x", Ids: []int64{1, 2}}}}}, codes.InvalidArgument},
		{"negative version", &prismv1.RecommendRequest{Model: "m", Version: -3, NumCandidates: 1}, codes.InvalidArgument},
		{"name longer than any served", &prismv1.RecommendRequest{Model: strings.Repeat("m", 1<<20), NumCandidates: 1}, codes.InvalidArgument},
	}
	for _, tc := range cases {
		_, err := r.Recommend(context.Background(), tc.req)
		if status.Code(err) != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
		if err != nil && len(err.Error()) > 1024 {
			t.Errorf("%s: a message of %d bytes", tc.name, len(err.Error()))
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := r.Recommend(ctx, request(1)); status.Code(err) != codes.Canceled {
		t.Errorf("cancelled: %v", err)
	}
	dctx, dcancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer dcancel()
	if _, err := r.Recommend(dctx, request(1)); status.Code(err) != codes.DeadlineExceeded {
		t.Errorf("deadline: %v", err)
	}
	// Overload: 100 samples in flight, another 100 exceed 150.
	done := make(chan error)
	go func() { _, err := r.Recommend(context.Background(), request(100)); done <- err }()
	for r.inflight.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	if _, err := r.Recommend(context.Background(), request(100)); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("overload: %v", err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// And it keeps serving.
	if _, err := r.Recommend(context.Background(), request(5)); err != nil {
		t.Fatal(err)
	}
}

// TestDefaultTimeoutAndKnownModels: a request without a deadline gets the
// router's own; a model whose workers all left is Unavailable, not NotFound.
func TestDefaultTimeoutAndKnownModels(t *testing.T) {
	stuck := &fakeCN{delay: time.Hour}
	r := newRouter(t, Options{DefaultTimeout: 100 * time.Millisecond}, stuck)
	start := time.Now()
	if _, err := r.Recommend(context.Background(), request(2)); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("no client deadline, stuck worker: %v", err)
	}
	if el := time.Since(start); el > 5*time.Second {
		t.Fatalf("took %s", el)
	}
	if n := r.inflight.Load(); n != 0 {
		t.Fatalf("%d samples still admitted", n)
	}
	ws, _ := r.Reg.List(context.Background(), nil)
	for _, w := range ws.GetWorkers() {
		r.Reg.Remove(w.GetId())
	}
	if _, err := r.Recommend(context.Background(), request(1)); status.Code(err) != codes.Unavailable {
		t.Fatalf("known model, no workers: %v", err)
	}
	if _, err := r.Recommend(context.Background(), &prismv1.RecommendRequest{Model: "never", NumCandidates: 1}); status.Code(err) != codes.NotFound {
		t.Fatalf("unknown model: %v", err)
	}
}

// TestLeavingWorkerDrains: a worker that leaves the registry while a call
// is running on it still answers that call: its connection is retired,
// not closed under the call.
func TestLeavingWorkerDrains(t *testing.T) {
	slow := &fakeCN{delay: 300 * time.Millisecond}
	r := newRouter(t, Options{}, slow)
	done := make(chan error)
	go func() { _, err := r.Recommend(context.Background(), request(4)); done <- err }()
	for slow.calls.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	ws, _ := r.Reg.List(context.Background(), nil)
	for _, w := range ws.GetWorkers() {
		r.Reg.Remove(w.GetId())
	}
	r.dropConns()
	if err := <-done; err != nil {
		t.Fatalf("the call in flight on a leaving worker failed: %v", err)
	}
}

// streamClient serves r's Recommender in process and opens a stream.
func streamClient(t *testing.T, r *Router) grpc.BidiStreamingClient[prismv1.RecommendRequest, prismv1.RecommendResponse] {
	t.Helper()
	conn := dialTest(t, serveInproc(t, func(s *grpc.Server) { prismv1.RegisterRecommenderServer(s, r) }))
	st, err := prismv1.NewRecommenderClient(conn).RecommendStream(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// TestRecommendStream: answers come back in request order, several
// requests are worked on at once (never more than the window), and a
// failing request gets its status in its response while the stream goes on.
func TestRecommendStream(t *testing.T) {
	cn := &fakeCN{delay: 20 * time.Millisecond}
	r := newRouter(t, Options{StreamWindow: 4}, cn)
	st := streamClient(t, r)
	const n = 40
	bad := func(i int) codes.Code {
		switch i % 10 {
		case 3:
			return codes.NotFound
		case 7:
			return codes.InvalidArgument
		}
		return codes.OK
	}
	go func() {
		for i := range n {
			req := request(5 + i%3)
			switch bad(i) {
			case codes.NotFound:
				req.Model = "nope"
			case codes.InvalidArgument:
				req.NumCandidates = 0
			}
			req.RequestId = fmt.Sprint("r", i)
			if err := st.Send(req); err != nil {
				t.Error(err)
				return
			}
		}
		st.CloseSend()
	}()
	for i := range n {
		resp, err := st.Recv()
		if err != nil {
			t.Fatalf("response %d: %v", i, err)
		}
		if resp.GetRequestId() != fmt.Sprint("r", i) {
			t.Fatalf("response %d answers %q: out of order", i, resp.GetRequestId())
		}
		if want := bad(i); want != codes.OK {
			if resp.GetError() == nil || codes.Code(resp.GetError().GetCode()) != want || resp.GetError().GetMessage() == "" || len(resp.GetScores()) != 0 {
				t.Fatalf("response %d: %v, want error %v", i, resp, want)
			}
			continue
		}
		if resp.GetError() != nil || len(resp.GetScores()) != 5+i%3 {
			t.Fatalf("response %d: %v", i, resp)
		}
		for j, sc := range resp.GetScores() {
			if sc != float32(j) {
				t.Fatalf("response %d score %d = %v", i, j, sc)
			}
		}
	}
	if _, err := st.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("after the last answer: %v, want the stream's end", err)
	}
	if p := cn.peak.Load(); p < 2 || p > 4 {
		t.Errorf("%d lookups at once, want 2..4 (window 4)", p)
	}
}

// TestRecommendStreamCancel: a client that goes away mid-stream ends the
// handler; the requests in flight are abandoned, not waited out.
func TestRecommendStreamCancel(t *testing.T) {
	cn := &fakeCN{delay: 10 * time.Second}
	r := newRouter(t, Options{StreamWindow: 2}, cn)
	conn := dialTest(t, serveInproc(t, func(s *grpc.Server) { prismv1.RegisterRecommenderServer(s, r) }))
	ctx, cancel := context.WithCancel(context.Background())
	st, err := prismv1.NewRecommenderClient(conn).RecommendStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for range 5 {
		if err := st.Send(request(3)); err != nil {
			t.Fatal(err)
		}
	}
	for cn.running.Load() < 2 {
		time.Sleep(time.Millisecond)
	}
	cancel()
	deadline := time.Now().Add(5 * time.Second)
	for cn.running.Load() > 0 || r.inflight.Load() > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("after the client left: %d lookups running, %d samples admitted", cn.running.Load(), r.inflight.Load())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestStreamRequestTimeout: a stream's deadline is its whole job's, not
// each request's: a request of a stream with a long deadline is bounded
// by DefaultTimeout as a request without one is, so a stalled worker
// fails that request (its response carries DeadlineExceeded) and the
// stream goes on with the next. It held the request, and every answer
// after it (answers go out in order), to the stream's deadline.
func TestStreamRequestTimeout(t *testing.T) {
	stuck := &fakeCN{gate: make(chan struct{})}
	r := newRouter(t, Options{DefaultTimeout: 100 * time.Millisecond, StreamWindow: 2}, stuck)
	conn := dialTest(t, serveInproc(t, func(s *grpc.Server) { prismv1.RegisterRecommenderServer(s, r) }))
	// The job's deadline: far past DefaultTimeout. Held to it, the
	// stalled request is answered when it passes, and the stream is over.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := prismv1.NewRecommenderClient(conn).RecommendStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	req := request(3)
	req.RequestId = "stalled"
	if err := st.Send(req); err != nil {
		t.Fatal(err)
	}
	resp, err := st.Recv()
	if err != nil {
		t.Fatalf("the stream ended (%v): the stalled request was held to the stream's deadline", err)
	}
	if resp.GetRequestId() != "stalled" || codes.Code(resp.GetError().GetCode()) != codes.DeadlineExceeded {
		t.Fatalf("answer %v, want the stalled request's DeadlineExceeded", resp)
	}
	// The stream goes on: the next request, the worker unstuck, is answered.
	close(stuck.gate)
	if err := st.Send(request(3)); err != nil {
		t.Fatal(err)
	}
	if resp, err := st.Recv(); err != nil || resp.GetError() != nil || len(resp.GetScores()) != 3 {
		t.Fatalf("the next request: %v, %v (the stalled one was held to the stream's deadline)", resp, err)
	}
	st.CloseSend()
	if _, err := st.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("after the last answer: %v, want the stream's end", err)
	}
}
