package gpuserve

import (
	"context"
	"fmt"
	"github.com/prism-serve/prism/plan"
	"log/slog"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/internal/arrowframe"
	"github.com/prism-serve/prism/internal/grpctest"
	"github.com/prism-serve/prism/internal/ort"
	"github.com/prism-serve/prism/internal/serve"
	"github.com/prism-serve/prism/models"
	"github.com/prism-serve/prism/partitioner"
)

var (
	fixtureOnce sync.Once
	fixtureDir  string
	fixtureErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if fixtureDir != "" {
		os.RemoveAll(fixtureDir)
	}
	os.Exit(code)
}

// tinyPlan builds dlrm-tiny and partitions it once per test binary.
func tinyPlan(t testing.TB) string {
	t.Helper()
	if err := ort.Init(); err != nil {
		t.Fatal(err)
	}
	fixtureOnce.Do(func() {
		if fixtureDir, fixtureErr = os.MkdirTemp("", "gpuserve-test-"); fixtureErr != nil {
			return
		}
		p, err := models.Lookup("dlrm-tiny")
		if err != nil {
			fixtureErr = err
			return
		}
		m, err := models.New(p.Config, 5)
		if err != nil {
			fixtureErr = err
			return
		}
		if _, fixtureErr = m.Write(filepath.Join(fixtureDir, "model"), models.WriteOptions{}); fixtureErr != nil {
			return
		}
		_, fixtureErr = partitioner.Partition(filepath.Join(fixtureDir, "model", models.ModelFile), filepath.Join(fixtureDir, "part"), partitioner.Options{})
	})
	if fixtureErr != nil {
		t.Fatal(fixtureErr)
	}
	return filepath.Join(fixtureDir, "part")
}

type testServer struct {
	dense  *Server
	srv    *serve.Server
	client prismv1.DenseTierClient
	net    *grpctest.Net
}

// startServer serves the dense tier in process over bufconn until the
// test ends.
func startServer(t *testing.T, o Options) *testServer {
	t.Helper()
	o.Plans = []string{tinyPlan(t)}
	o.Logger = slog.New(slog.DiscardHandler)
	dense, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	bn := &grpctest.Net{}
	srv, err := serve.New("dense", serve.Options{Listener: bn.MustListen(t, "dense"), MetricsAddr: "off", Logger: o.Logger})
	if err != nil {
		t.Fatal(err)
	}
	if err := dense.Register(srv.Registry); err != nil {
		t.Fatal(err)
	}
	prismv1.RegisterDenseTierServer(srv.GRPC, dense)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx) }()
	conn, err := grpc.NewClient(srv.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()), bn.DialOption())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
		dense.Close()
	})
	return &testServer{dense: dense, srv: srv, client: prismv1.NewDenseTierClient(conn), net: bn}
}

// cutTensors draws n samples of every cut tensor of the plan.
// benchPlan is the partition the benchmarks run: PRISM_BENCH_PLAN (for
// example out/demo/dlrm-kaggle-part after make demo) or dlrm-tiny.
func benchPlan(b *testing.B) string {
	if dir := os.Getenv("PRISM_BENCH_PLAN"); dir != "" {
		if err := ort.Init(); err != nil {
			b.Fatal(err)
		}
		return dir
	}
	return tinyPlan(b)
}

func cutTensors(plan *plan.Plan, n int, rng *rand.Rand) []arrowframe.Tensor {
	ts := make([]arrowframe.Tensor, len(plan.Cut))
	for i, ct := range plan.Cut {
		w := 1
		for _, d := range ct.Shape {
			w *= int(d)
		}
		data := make([]float32, n*w)
		for j := range data {
			data[j] = float32(rng.NormFloat64())
		}
		ts[i] = arrowframe.Tensor{Name: ct.Name, Width: w, Data: data}
	}
	return ts
}

func encode(t *testing.T, n int, ts []arrowframe.Tensor) []byte {
	t.Helper()
	b, err := arrowframe.Encode(n, ts)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// direct scores the tensors with dense.onnx in a session of its own.
func direct(t *testing.T, sess *ort.Session, plan *plan.Plan, n int, ts []arrowframe.Tensor) []float32 {
	t.Helper()
	in := make([]ort.Input, len(ts))
	for i, x := range ts {
		in[i] = ort.Input{Name: x.Name, Shape: append([]int64{int64(n)}, plan.Cut[i].Shape...), Float32: x.Data}
	}
	out, err := sess.Run(in)
	if err != nil {
		t.Fatal(err)
	}
	return out[0]
}

// TestScoreMatchesDenseModel: concurrent requests of many sizes, batched
// together by the server (and one larger than a batch, run alone), get
// the scores dense.onnx gives each of them alone.
func TestScoreMatchesDenseModel(t *testing.T) {
	for _, sessions := range []int{1, 3} {
		t.Run(fmt.Sprintf("sessions=%d", sessions), func(t *testing.T) { scoreMatchesDenseModel(t, sessions) })
	}
}

// scoreMatchesDenseModel: concurrent requests through a server whose
// model has the given number of sessions (batching loops) score as the
// dense model run directly.
func scoreMatchesDenseModel(t *testing.T, sessions int) {
	ts := startServer(t, Options{Threads: 1, Sessions: sessions, Batch: BatchOptions{MaxBatch: 128, MaxDelay: 5 * time.Millisecond}})
	if n := len(ts.dense.models["dlrm-tiny"].sessions); n != sessions {
		t.Fatalf("%d sessions, want %d", n, sessions)
	}
	dir := tinyPlan(t)
	plan, err := plan.Read(dir)
	if err != nil {
		t.Fatal(err)
	}
	sess, err := ort.NewSession(filepath.Join(dir, plan.DenseModel), ort.SessionOptions{IntraOpThreads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	sizes := []int{1, 3, 7, 16, 33, 64, 100, 270}
	type job struct {
		n     int
		frame []byte
		want  []float32
	}
	var jobs []job
	total := 0
	rng := rand.New(rand.NewPCG(1, 2))
	for range 3 {
		for _, n := range sizes {
			x := cutTensors(plan, n, rng)
			jobs = append(jobs, job{n: n, frame: encode(t, n, x), want: direct(t, sess, plan, n, x)})
			total += n
		}
	}
	var wg sync.WaitGroup
	errs := make(chan error, len(jobs))
	for _, j := range jobs {
		wg.Go(func() {
			resp, err := ts.client.Score(context.Background(), &prismv1.ScoreRequest{Model: plan.Model.Name, Tensors: j.frame, NumSamples: int32(j.n)})
			if err != nil {
				errs <- fmt.Errorf("n=%d: %v", j.n, err)
				return
			}
			if len(resp.Scores) != j.n {
				errs <- fmt.Errorf("n=%d: %d scores", j.n, len(resp.Scores))
				return
			}
			var worst float64
			for i := range j.want {
				worst = max(worst, math.Abs(float64(resp.Scores[i]-j.want[i])))
			}
			if worst > 1e-5 {
				errs <- fmt.Errorf("n=%d: max abs error %g", j.n, worst)
			}
			if resp.DenseUs <= 0 {
				errs <- fmt.Errorf("n=%d: dense_us %d", j.n, resp.DenseUs)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	batches, samples, _, _ := ts.dense.models[plan.Model.Name].batcher.Snapshot()
	if samples != int64(total) {
		t.Errorf("samples scored %d, sent %d", samples, total)
	}
	t.Logf("%d requests, %d samples in %d batches", len(jobs), samples, batches)

	got := gather(t, ts.srv)
	if v := got["prism_dense_samples_total"]; v != float64(total) {
		t.Errorf("prism_dense_samples_total = %v, want %d", v, total)
	}
	if v := got["prism_dense_batch_size_count"]; v != float64(batches) {
		t.Errorf("prism_dense_batch_size count = %v, want %d", v, batches)
	}
	if v, ok := got["prism_dense_queue_depth"]; !ok || v != 0 {
		t.Errorf("prism_dense_queue_depth = %v (present %v), want 0", v, ok)
	}
}

// gather flattens the dense tier's metrics (model dlrm-tiny) by name.
func gather(t *testing.T, srv *serve.Server) map[string]float64 {
	t.Helper()
	mfs, err := srv.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if !strings.HasPrefix(mf.GetName(), "prism_dense_") {
			continue
		}
		for _, m := range mf.GetMetric() {
			name := mf.GetName()
			for _, l := range m.GetLabel() {
				if l.GetName() == "reason" || l.GetName() == "why" {
					name += "{" + l.GetValue() + "}"
				}
			}
			switch mf.GetType() {
			case dto.MetricType_COUNTER:
				out[name] += m.GetCounter().GetValue()
			case dto.MetricType_GAUGE:
				out[name] += m.GetGauge().GetValue()
			case dto.MetricType_HISTOGRAM:
				out[name+"_count"] += float64(m.GetHistogram().GetSampleCount())
				out[name+"_sum"] += m.GetHistogram().GetSampleSum()
			}
		}
	}
	return out
}

// TestScoreBadInput: every malformed request gets its status code and a
// message naming the problem, and the server keeps serving.
func TestScoreBadInput(t *testing.T) {
	ts := startServer(t, Options{Threads: 1, MaxSamples: 50})
	plan, err := plan.Read(tinyPlan(t))
	if err != nil {
		t.Fatal(err)
	}
	name := plan.Model.Name
	rng := rand.New(rand.NewPCG(3, 4))
	good := cutTensors(plan, 4, rng)
	goodFrame := encode(t, 4, good)
	clone := func() []arrowframe.Tensor { return append([]arrowframe.Tensor(nil), good...) }

	wrongWidth := clone()
	wrongWidth[1] = arrowframe.Tensor{Name: good[1].Name, Width: good[1].Width + 1, Data: make([]float32, 4*(good[1].Width+1))}
	renamed := clone()
	renamed[2].Name = "not_a_cut_tensor"
	dup := clone()
	dup[2] = good[1]
	big := cutTensors(plan, 51, rng)

	cases := []struct {
		name string
		req  *prismv1.ScoreRequest
		ctx  func() (context.Context, context.CancelFunc)
		code codes.Code
		msg  string
	}{
		{"unknown model", &prismv1.ScoreRequest{Model: "nope", Tensors: goodFrame, NumSamples: 4}, nil, codes.NotFound, `"nope" is not served`},
		{"zero samples", &prismv1.ScoreRequest{Model: name, Tensors: goodFrame, NumSamples: 0}, nil, codes.InvalidArgument, "num_samples is 0"},
		{"empty request", &prismv1.ScoreRequest{Model: name}, nil, codes.InvalidArgument, "num_samples is 0"},
		{"num_samples mismatch", &prismv1.ScoreRequest{Model: name, Tensors: goodFrame, NumSamples: 5}, nil, codes.InvalidArgument, "hold 4 samples, num_samples says 5"},
		{"malformed buffer", &prismv1.ScoreRequest{Model: name, Tensors: []byte("definitely not arrow"), NumSamples: 4}, nil, codes.InvalidArgument, "malformed tensor frame"},
		{"truncated buffer", &prismv1.ScoreRequest{Model: name, Tensors: goodFrame[:len(goodFrame)/2], NumSamples: 4}, nil, codes.InvalidArgument, "malformed tensor frame"},
		{"missing tensor", &prismv1.ScoreRequest{Model: name, Tensors: encode(t, 4, good[:len(good)-1]), NumSamples: 4}, nil, codes.InvalidArgument, "missing tensors " + good[len(good)-1].Name},
		{"wrong width", &prismv1.ScoreRequest{Model: name, Tensors: encode(t, 4, wrongWidth), NumSamples: 4}, nil, codes.InvalidArgument, fmt.Sprintf("has width %d; the plan says %d", good[1].Width+1, good[1].Width)},
		{"unknown tensor", &prismv1.ScoreRequest{Model: name, Tensors: encode(t, 4, renamed), NumSamples: 4}, nil, codes.InvalidArgument, `"not_a_cut_tensor" is not a cut tensor`},
		{"duplicate tensor", &prismv1.ScoreRequest{Model: name, Tensors: encode(t, 4, dup), NumSamples: 4}, nil, codes.InvalidArgument, "appears twice"},
		{"over max samples", &prismv1.ScoreRequest{Model: name, Tensors: encode(t, 51, big), NumSamples: 51}, nil, codes.InvalidArgument, "at most 50"},
		{"another content", &prismv1.ScoreRequest{Model: name, Tensors: goodFrame, NumSamples: 4, Content: "0123456789abcdef"}, nil, codes.Aborted, `looked up content "0123456789abcdef"`},
		{"deadline passed", &prismv1.ScoreRequest{Model: name, Tensors: goodFrame, NumSamples: 4},
			func() (context.Context, context.CancelFunc) {
				return context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
			}, codes.DeadlineExceeded, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.Background(), context.CancelFunc(func() {})
			if c.ctx != nil {
				ctx, cancel = c.ctx()
			}
			_, err := ts.client.Score(ctx, c.req)
			cancel()
			st := status.Convert(err)
			if st.Code() != c.code || !strings.Contains(st.Message(), c.msg) {
				t.Errorf("got %v %q, want %v containing %q", st.Code(), st.Message(), c.code, c.msg)
			}
			resp, err := ts.client.Score(context.Background(), &prismv1.ScoreRequest{Model: name, Tensors: goodFrame, NumSamples: 4})
			if err != nil || len(resp.Scores) != 4 {
				t.Fatalf("good request after it: %v", err)
			}
		})
	}
	got := gather(t, ts.srv)
	if v := got["prism_dense_rejected_total{invalid}"]; v != 10 {
		t.Errorf("rejected{invalid} = %v, want 10", v)
	}
	if v := got["prism_dense_rejected_total{not_found}"]; v != 1 {
		t.Errorf("rejected{not_found} = %v, want 1", v)
	}
	if v := got["prism_dense_rejected_total{content}"]; v != 1 {
		t.Errorf("rejected{content} = %v, want 1", v)
	}
	// Its own content, as announced, scores.
	content := ts.dense.WorkerInfo("gpu", "addr").GetContent()[name]
	if want, err := plan.Content(tinyPlan(t)); err != nil || content != want || content == "" {
		t.Fatalf("announced content %q; the plan's is %q (%v)", content, want, err)
	}
	if _, err := ts.client.Score(context.Background(), &prismv1.ScoreRequest{Model: name, Tensors: goodFrame, NumSamples: 4, Content: content}); err != nil {
		t.Fatalf("its own content: %v", err)
	}
}

// TestScoreOverloadDeadlineShutdown: a full queue answers
// ResourceExhausted at once, a deadline that passes while queued answers
// DeadlineExceeded, the queued request still gets its scores, and after
// Close the tier answers Unavailable.
func TestScoreOverloadDeadlineShutdown(t *testing.T) {
	// The first request's run is held, so the queue fills behind it and
	// a request queued behind it meets its deadline there (an idle
	// batcher no longer holds a request past its deadline for MaxDelay).
	ts := startServer(t, Options{Threads: 1, Batch: BatchOptions{MaxBatch: 1024, MaxQueue: 64}})
	plan, err := plan.Read(tinyPlan(t))
	if err != nil {
		t.Fatal(err)
	}
	name := plan.Model.Name
	m := ts.dense.models[name]
	held := &holdFirst{Runner: m.sessions[0], release: make(chan struct{})}
	old := m.batcher
	m.batcher = NewBatcher(m.spec, []Runner{held}, BatchOptions{MaxBatch: 1024, MaxDelay: time.Millisecond, MaxQueue: 64})
	old.Close()
	rng := rand.New(rand.NewPCG(5, 6))
	req := func(n int) *prismv1.ScoreRequest {
		return &prismv1.ScoreRequest{Model: name, Tensors: encode(t, n, cutTensors(plan, n, rng)), NumSamples: int32(n)}
	}
	first := make(chan error, 1)
	go func() {
		resp, err := ts.client.Score(context.Background(), req(40))
		if err == nil && len(resp.Scores) != 40 {
			err = fmt.Errorf("%d scores", len(resp.Scores))
		}
		first <- err
	}()
	for deadline := time.Now().Add(5 * time.Second); ts.dense.Outstanding() != 40; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("first request never queued (outstanding %d)", ts.dense.Outstanding())
		}
	}
	_, err = ts.client.Score(context.Background(), req(40))
	if st := status.Convert(err); st.Code() != codes.ResourceExhausted || !strings.Contains(st.Message(), "queue full") {
		t.Errorf("over the queue: got %v %q, want ResourceExhausted", st.Code(), st.Message())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	_, err = ts.client.Score(ctx, req(10))
	cancel()
	if st := status.Convert(err); st.Code() != codes.DeadlineExceeded {
		t.Errorf("deadline while queued: got %v %q, want DeadlineExceeded", st.Code(), st.Message())
	}
	close(held.release)
	if err := <-first; err != nil {
		t.Errorf("queued request: %v", err)
	}
	got := gather(t, ts.srv)
	if v := got["prism_dense_rejected_total{overloaded}"]; v != 1 {
		t.Errorf("rejected{overloaded} = %v, want 1", v)
	}
	if !ts.dense.Healthy() {
		t.Error("unhealthy before Close")
	}
	ts.dense.Close()
	_, err = ts.client.Score(context.Background(), req(2))
	if st := status.Convert(err); st.Code() != codes.Unavailable {
		t.Errorf("after Close: got %v %q, want Unavailable", st.Code(), st.Message())
	}
	if ts.dense.Healthy() {
		t.Error("healthy after Close")
	}
}

// holdFirst runs Runner, its first run only once release is closed.
type holdFirst struct {
	Runner
	release chan struct{}
	once    sync.Once
}

func (r *holdFirst) Run(in []ort.Input) ([][]float32, error) {
	r.once.Do(func() { <-r.release })
	return r.Runner.Run(in)
}

// TestNew: configuration errors are caught at start, and NVML discovery
// without a driver falls back to the CPU.
func TestNew(t *testing.T) {
	dir := tinyPlan(t)
	quiet := slog.New(slog.DiscardHandler)
	if _, err := New(Options{Logger: quiet}); err == nil || !strings.Contains(err.Error(), "no models to serve") {
		t.Errorf("no plans: %v", err)
	}
	if _, err := New(Options{Plans: []string{dir, dir}, Logger: quiet}); err == nil || !strings.Contains(err.Error(), "served twice") {
		t.Errorf("same model twice: %v", err)
	}
	if _, err := New(Options{Plans: []string{t.TempDir()}, Logger: quiet}); err == nil || !strings.Contains(err.Error(), "read plan") {
		t.Errorf("empty folder: %v", err)
	}
	if _, err := New(Options{Plans: []string{dir}, Sessions: 65, Logger: quiet}); err == nil || !strings.Contains(err.Error(), "sessions 65") {
		t.Errorf("65 sessions: %v", err)
	}
	var logs strings.Builder
	s, err := New(Options{Plans: []string{dir}, NVML: noDriver{}, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.Device() != "cpu" || !strings.Contains(logs.String(), "no NVIDIA driver (NVML init: ERROR_LIBRARY_NOT_FOUND): serving on the CPU execution provider") {
		t.Errorf("device %q, logs:\n%s", s.Device(), logs.String())
	}
	// No driver: the CPU's batch size.
	if s.opts.Batch.MaxBatch != DefaultMaxBatch(false) || s.opts.Sessions != 1 {
		t.Errorf("max batch %d, sessions %d; want %d, 1", s.opts.Batch.MaxBatch, s.opts.Sessions, DefaultMaxBatch(false))
	}
	if got := s.Models(); len(got) != 1 || got[0] != "dlrm-tiny" {
		t.Errorf("models %v", got)
	}
}

// noDriver is NVML on a machine without the driver: Init fails, and any
// other call would be a bug (on real NVML it can kill the process).
type noDriver struct{ nvml.Interface }

func (noDriver) Init() nvml.Return { return nvml.ERROR_LIBRARY_NOT_FOUND }

// fakeRegistry records announcements, as the router's registry would.
type fakeRegistry struct {
	prismv1.UnimplementedRegistryServer
	mu     sync.Mutex
	seen   []*prismv1.WorkerInfo
	leaves []string
}

func (r *fakeRegistry) Announce(_ context.Context, req *prismv1.AnnounceRequest) (*prismv1.AnnounceResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seen = append(r.seen, req.GetWorker())
	return &prismv1.AnnounceResponse{HeartbeatMs: 20}, nil
}

func (r *fakeRegistry) Leave(_ context.Context, req *prismv1.LeaveRequest) (*prismv1.LeaveResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.leaves = append(r.leaves, req.GetId())
	return &prismv1.LeaveResponse{}, nil
}

// TestAnnounce: the worker registers with role, address, models, device
// and load, heartbeats, and leaves when its context ends.
func TestAnnounce(t *testing.T) {
	ts := startServer(t, Options{Threads: 1})
	quiet := slog.New(slog.DiscardHandler)
	reg := &fakeRegistry{}
	rs, err := serve.New("router", serve.Options{Listener: ts.net.MustListen(t, "router"), MetricsAddr: "off", Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	prismv1.RegisterRegistryServer(rs.GRPC, reg)
	rctx, rcancel := context.WithCancel(context.Background())
	defer rcancel()
	go rs.Serve(rctx)

	ctx, cancel := context.WithCancel(context.Background())
	done := serve.Announce(ctx, rs.Addr(), func() *prismv1.WorkerInfo { return ts.dense.WorkerInfo("gpu/test/1", ts.srv.Addr()) }, quiet, ts.net.DialOption())
	// Heartbeats are timed by the registry's interval: wait for them.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		reg.mu.Lock()
		n := len(reg.seen)
		reg.mu.Unlock()
		if n >= 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d announcements in 5s", n)
		}
	}
	cancel()
	<-done
	reg.mu.Lock()
	defer reg.mu.Unlock()
	w := reg.seen[0]
	if w.Id != "gpu/test/1" || w.Role != prismv1.Role_ROLE_DENSE || w.Addr != ts.srv.Addr() || len(w.Models) != 1 || w.Models[0] != "dlrm-tiny" || w.Device != "cpu" || !w.Healthy || w.Outstanding != 0 {
		t.Errorf("announced %v", w)
	}
	if len(reg.leaves) != 1 || reg.leaves[0] != "gpu/test/1" {
		t.Errorf("leaves %v", reg.leaves)
	}
}

// BenchmarkScore: Score over loopback gRPC, 270-sample requests (MLPerf
// DLRMv2's average candidates), from parallel clients. Real TCP, unlike
// the tests: the kernel's loopback copy of each 463 KB frame is part of
// what it measures against BenchmarkDenseDirect.
func BenchmarkScore(b *testing.B) {
	dir := benchPlan(b)
	plan, err := plan.Read(dir)
	if err != nil {
		b.Fatal(err)
	}
	dense, err := New(Options{Plans: []string{dir}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	srv, err := serve.New("dense", serve.Options{MetricsAddr: "off", Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	prismv1.RegisterDenseTierServer(srv.GRPC, dense)
	ctx, cancel := context.WithCancel(context.Background())
	go srv.Serve(ctx)
	defer func() { cancel(); dense.Close() }()
	conn, err := grpc.NewClient(srv.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	client := prismv1.NewDenseTierClient(conn)
	const n = 270
	frame, err := arrowframe.Encode(n, cutTensors(plan, n, rand.New(rand.NewPCG(7, 8))))
	if err != nil {
		b.Fatal(err)
	}
	// Warm, outside the timed region: the connection (NewClient dials
	// on the first call), the session's first runs, the batcher's pools.
	for range 20 {
		if _, err := client.Score(context.Background(), &prismv1.ScoreRequest{Model: plan.Model.Name, Tensors: frame, NumSamples: n}); err != nil {
			b.Fatal(err)
		}
	}
	b.SetParallelism(4)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := client.Score(context.Background(), &prismv1.ScoreRequest{Model: plan.Model.Name, Tensors: frame, NumSamples: n}); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N*n)/b.Elapsed().Seconds(), "samples/s")
	b.SetBytes(int64(len(frame)))
}

// BenchmarkDenseDirect is BenchmarkScore's baseline: dense.onnx on the
// same 270-sample batches in this process, no gRPC, no batcher.
func BenchmarkDenseDirect(b *testing.B) {
	dir := benchPlan(b)
	plan, err := plan.Read(dir)
	if err != nil {
		b.Fatal(err)
	}
	sess, err := ort.NewSession(filepath.Join(dir, plan.DenseModel), ort.SessionOptions{})
	if err != nil {
		b.Fatal(err)
	}
	defer sess.Close()
	const n = 270
	ts := cutTensors(plan, n, rand.New(rand.NewPCG(7, 8)))
	in := make([]ort.Input, len(ts))
	for i, x := range ts {
		in[i] = ort.Input{Name: x.Name, Shape: append([]int64{n}, plan.Cut[i].Shape...), Float32: x.Data}
	}
	// Warm, outside the timed region, as BenchmarkScore: a session's
	// first runs allocate its arenas and pick its kernels.
	for range 20 {
		if _, err := sess.Run(in); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	for b.Loop() {
		if _, err := sess.Run(in); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*n)/b.Elapsed().Seconds(), "samples/s")
}
