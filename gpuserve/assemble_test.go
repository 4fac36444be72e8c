package gpuserve

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/internal/arrowframe"
	"github.com/prism-serve/prism/internal/ort"
	"github.com/prism-serve/prism/plan"
)

// splitParts deals the cut tensors round-robin over k parts.
func splitParts(ts []arrowframe.Tensor, k int) [][]arrowframe.Tensor {
	parts := make([][]arrowframe.Tensor, k)
	for i, x := range ts {
		parts[i%k] = append(parts[i%k], x)
	}
	return parts
}

type partResult struct {
	shard  int
	scores []float32
	err    error
}

// sendParts sends the given shards' parts of one fan-out, each once the
// server holds the one before (or has answered it), and collects every
// answer. The parts arrive in order: a part refused on arrival fails the
// fan-out, and a part after it waits anew, so a test that sends the
// refused part last relies on it. Spread by 2 ms sleeps instead, a
// loaded machine delivered them out of order, and a part waited for its
// fan-out forever (TestAssemblePartial's "stranger" hung).
func sendParts(t *testing.T, ts *testServer, ctx context.Context, model, key string, n, shards int, parts [][]arrowframe.Tensor, order []int) []partResult {
	t.Helper()
	a := ts.dense.models[model].assembly
	held := func(sh int) bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		f := a.pending[key]
		return f != nil && f.got[sh]
	}
	out := make([]partResult, len(order))
	var wg sync.WaitGroup
	for i, sh := range order {
		frame := encode(t, n, parts[sh])
		answered := make(chan struct{})
		wg.Go(func() {
			defer close(answered)
			resp, err := ts.client.Score(ctx, &prismv1.ScoreRequest{Model: model, Tensors: frame, NumSamples: int32(n), FanoutKey: key, Shard: int32(sh), Shards: int32(shards)})
			out[i] = partResult{shard: sh, scores: resp.GetScores(), err: err}
		})
	wait:
		for !held(sh) {
			select {
			case <-answered:
				break wait
			case <-time.After(time.Millisecond):
			}
		}
	}
	wg.Wait()
	return out
}

// Parts in any order assemble into the frame dense.onnx scores whole,
// and every part gets the scores.
func TestAssembleAnyOrder(t *testing.T) {
	ts := startServer(t, Options{Threads: 1})
	dir := tinyPlan(t)
	p, err := plan.Read(dir)
	if err != nil {
		t.Fatal(err)
	}
	sess, err := ort.NewSession(filepath.Join(dir, p.DenseModel), ort.SessionOptions{IntraOpThreads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	rng := rand.New(rand.NewPCG(3, 4))
	for _, tc := range []struct {
		n, shards int
		order     []int
	}{{5, 3, []int{0, 1, 2}}, {17, 3, []int{2, 0, 1}}, {1, 2, []int{1, 0}}, {40, 1, []int{0}}, {9, 4, []int{3, 1, 2, 0}}} {
		x := cutTensors(p, tc.n, rng)
		want := direct(t, sess, p, tc.n, x)
		key := "k-" + strings.Repeat("x", tc.n)
		for _, r := range sendParts(t, ts, context.Background(), p.Model.Name, key, tc.n, tc.shards, splitParts(x, tc.shards), tc.order) {
			if r.err != nil {
				t.Fatalf("n=%d shard %d: %v", tc.n, r.shard, r.err)
			}
			var worst float64
			for i := range want {
				worst = max(worst, math.Abs(float64(r.scores[i]-want[i])))
			}
			if len(r.scores) != tc.n || worst > 1e-5 {
				t.Fatalf("n=%d shard %d: %d scores, max abs error %g", tc.n, r.shard, len(r.scores), worst)
			}
		}
	}
	if got := len(ts.dense.models[p.Model.Name].assembly.pending); got != 0 {
		t.Errorf("%d fan-outs left pending", got)
	}
}

// A part missing at the deadline fails every part that came, with
// DeadlineExceeded naming the missing shard; nothing is left pending.
func TestAssembleMissingPart(t *testing.T) {
	ts := startServer(t, Options{Threads: 1})
	p, _ := plan.Read(tinyPlan(t))
	x := cutTensors(p, 4, rand.New(rand.NewPCG(5, 6)))
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	res := sendParts(t, ts, ctx, p.Model.Name, "missing", 4, 3, splitParts(x, 3), []int{0, 2})
	for _, r := range res {
		// The deadline ends every call; the server may see one of them
		// as a cancellation first (the client's reset of the stream
		// outrunning the server's own timer) and fail the fan-out with
		// Canceled.
		if c := status.Code(r.err); c != codes.DeadlineExceeded && c != codes.Canceled {
			t.Fatalf("shard %d: %v, want DeadlineExceeded", r.shard, r.err)
		}
	}
	if el := time.Since(start); el > 2*time.Second {
		t.Errorf("took %s", el)
	}
	// The client's deadline may return before the server's handlers
	// settle the fan-out: give them a moment.
	a := ts.dense.models[p.Model.Name].assembly
	var pending, samples int
	for range 100 {
		a.mu.Lock()
		pending, samples = len(a.pending), a.samples
		a.mu.Unlock()
		if pending == 0 && samples == 0 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if pending != 0 || samples != 0 {
		t.Errorf("left pending: %d fan-outs, %d samples", pending, samples)
	}
}

// A missing part's message names it (the handler's own error; the
// client above sees its own deadline first).
func TestAssembleMissingNamed(t *testing.T) {
	ts := startServer(t, Options{Threads: 1})
	p, _ := plan.Read(tinyPlan(t))
	x := cutTensors(p, 2, rand.New(rand.NewPCG(5, 6)))
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	frame := encode(t, 2, splitParts(x, 3)[0])
	_, err := ts.client.Score(ctx, &prismv1.ScoreRequest{Model: p.Model.Name, Tensors: frame, NumSamples: 2, FanoutKey: "k", Shard: 0, Shards: 3})
	if status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("%v, want DeadlineExceeded", err)
	}
	m := ts.dense.models[p.Model.Name]
	// The server side may settle just after the client's deadline.
	for range 100 {
		m.assembly.mu.Lock()
		n := len(m.assembly.pending)
		m.assembly.mu.Unlock()
		if n == 0 {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	// Named through the server-side error: call the handler directly.
	ctx2, cancel2 := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel2()
	_, err = ts.dense.Score(ctx2, &prismv1.ScoreRequest{Model: p.Model.Name, Tensors: frame, NumSamples: 2, FanoutKey: "k2", Shard: 0, Shards: 3})
	if status.Code(err) != codes.DeadlineExceeded || !strings.Contains(err.Error(), "shard(s) [1 2] of 3") {
		t.Fatalf("%v, want DeadlineExceeded naming shards [1 2]", err)
	}
}

// A duplicate part is refused alone (the fan-out completes with the
// first); parts that disagree on the shard count fail the fan-out; a
// tensor sent by two shards or by none fails it too.
func TestAssembleBadParts(t *testing.T) {
	ts := startServer(t, Options{Threads: 1})
	p, _ := plan.Read(tinyPlan(t))
	x := cutTensors(p, 3, rand.New(rand.NewPCG(7, 8)))
	parts := splitParts(x, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	model := p.Model.Name
	score := func(key string, sh, shards int, ts2 []arrowframe.Tensor) chan partResult {
		ch := make(chan partResult, 1)
		frame := encode(t, 3, ts2)
		go func() {
			resp, err := ts.client.Score(ctx, &prismv1.ScoreRequest{Model: model, Tensors: frame, NumSamples: 3, FanoutKey: key, Shard: int32(sh), Shards: int32(shards)})
			ch <- partResult{shard: sh, scores: resp.GetScores(), err: err}
		}()
		return ch
	}
	waitPending := func(key string) {
		for range 200 {
			a := ts.dense.models[model].assembly
			a.mu.Lock()
			f := a.pending[key]
			a.mu.Unlock()
			if f != nil {
				return
			}
			time.Sleep(2 * time.Millisecond)
		}
		t.Fatalf("fan-out %q never pending", key)
	}

	// Duplicate.
	first := score("dup", 0, 2, parts[0])
	waitPending("dup")
	if r := <-score("dup", 0, 2, parts[0]); status.Code(r.err) != codes.InvalidArgument || !strings.Contains(r.err.Error(), "twice") {
		t.Fatalf("duplicate: %v", r.err)
	}
	second := score("dup", 1, 2, parts[1])
	for _, ch := range []chan partResult{first, second} {
		if r := <-ch; r.err != nil || len(r.scores) != 3 {
			t.Fatalf("after a duplicate, shard %d: %v (%d scores)", r.shard, r.err, len(r.scores))
		}
	}

	// Shard counts that disagree.
	a := score("count", 0, 2, parts[0])
	waitPending("count")
	b := <-score("count", 1, 3, parts[1])
	if status.Code(b.err) != codes.InvalidArgument || !strings.Contains(b.err.Error(), "disagree") {
		t.Fatalf("mismatched count: %v", b.err)
	}
	if r := <-a; status.Code(r.err) != codes.InvalidArgument {
		t.Fatalf("the waiting part after a mismatch: %v", r.err)
	}

	// A tensor from two shards.
	a = score("twice", 0, 2, parts[0])
	waitPending("twice")
	if r := <-score("twice", 1, 2, x); status.Code(r.err) != codes.InvalidArgument || !strings.Contains(r.err.Error(), "sent by shards") {
		t.Fatalf("tensor twice: %v", r.err)
	}
	if r := <-a; status.Code(r.err) != codes.InvalidArgument {
		t.Fatalf("the waiting part: %v", r.err)
	}

	// A tensor from none.
	a = score("none", 0, 2, parts[0][:1])
	waitPending("none")
	if r := <-score("none", 1, 2, parts[1]); status.Code(r.err) != codes.InvalidArgument || !strings.Contains(r.err.Error(), "no shard sent") {
		t.Fatalf("tensor from none: %v", r.err)
	}
	if r := <-a; status.Code(r.err) != codes.InvalidArgument {
		t.Fatalf("the waiting part: %v", r.err)
	}

	// Bad part headers.
	for _, req := range []*prismv1.ScoreRequest{
		{Model: model, NumSamples: 3, Shards: 2, Shard: 0},                 // no key
		{Model: model, NumSamples: 3, Shards: 2, Shard: 2, FanoutKey: "k"}, // shard out of range
		{Model: model, NumSamples: 3, Shards: -1, FanoutKey: "k"},          // count
		{Model: model, NumSamples: 3, Shards: 2, FanoutKey: strings.Repeat("k", 300)},
	} {
		req.Tensors = encode(t, 3, parts[0])
		if _, err := ts.client.Score(ctx, req); status.Code(err) != codes.InvalidArgument {
			t.Errorf("%v: %v, want InvalidArgument", req.GetShards(), err)
		}
	}
	as := ts.dense.models[model].assembly
	as.mu.Lock()
	defer as.mu.Unlock()
	if len(as.pending) != 0 || as.samples != 0 {
		t.Errorf("left pending: %d fan-outs, %d samples", len(as.pending), as.samples)
	}
}

// TestAssembleWholeAnySharding: parts holding whole tensors only are
// the same in every sharding: taken whatever sharding their embedding
// workers name (ScoreRequest.sharding) and this worker's plan has (a
// table-wise reshard rolling out keeps serving).
func TestAssembleWholeAnySharding(t *testing.T) {
	ts := startServer(t, Options{Threads: 1})
	p, _ := plan.Read(tinyPlan(t))
	parts := splitParts(cutTensors(p, 3, rand.New(rand.NewPCG(7, 9))), 2)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	model := p.Model.Name
	a := ts.dense.models[model].assembly
	a.sharding = "aaaa"
	defer func() { a.sharding = "" }()
	results := make(chan partResult, 2)
	for sh, fp := range []string{"bbbb", "cccc"} {
		frame := encode(t, 3, parts[sh])
		go func() {
			resp, err := ts.client.Score(ctx, &prismv1.ScoreRequest{Model: model, Tensors: frame, NumSamples: 3, FanoutKey: "whole", Shard: int32(sh), Shards: 2, Sharding: fp})
			results <- partResult{shard: sh, scores: resp.GetScores(), err: err}
		}()
	}
	for range 2 {
		if r := <-results; r.err != nil || len(r.scores) != 3 {
			t.Fatalf("shard %d: %v (%d scores)", r.shard, r.err, len(r.scores))
		}
	}
}

// TestAssembleOtherShardingNamed: a part this plan's sharding does not
// send in parts, from an embedding worker of another sharding, is
// refused FailedPrecondition naming both shardings (not only the part's
// InvalidArgument); and the worker announces its plan's sharding
// (WorkerInfo.sharding), by which the router pairs fan-outs with it.
func TestAssembleOtherShardingNamed(t *testing.T) {
	ts := startServer(t, Options{Threads: 1})
	p, _ := plan.Read(tinyPlan(t))
	x := cutTensors(p, 3, rand.New(rand.NewPCG(7, 9)))
	x[0].Name = arrowframe.PartialName(x[0].Name)
	a := ts.dense.models[p.Model.Name].assembly
	a.sharding = "aaaa"
	defer func() { a.sharding = "" }()
	if got := ts.dense.WorkerInfo("id", "addr").GetSharding()[p.Model.Name]; got != "aaaa" {
		t.Errorf("announces sharding %q for its model, want its plan's", got)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, tc := range []struct {
		fp   string
		code codes.Code
	}{{"bbbb", codes.FailedPrecondition}, {"aaaa", codes.InvalidArgument}, {"", codes.InvalidArgument}} {
		_, err := ts.client.Score(ctx, &prismv1.ScoreRequest{Model: p.Model.Name, Tensors: encode(t, 3, x[:1]), NumSamples: 3, FanoutKey: "k" + tc.fp, Shard: 0, Shards: 2, Sharding: tc.fp})
		if status.Code(err) != tc.code || tc.code == codes.FailedPrecondition && !strings.Contains(err.Error(), "sharding bbbb, this dense worker's plan sharding aaaa") {
			t.Errorf("a stray part from sharding %q: %v, want %v", tc.fp, err, tc.code)
		}
	}
}

// TestAssembleUnshardedPlanNamed: a dense worker serving a plan without
// sharding (one started before prism shard ran) announces so
// (prismv1.NoSharding), not nothing: the router reads nothing as a
// worker of an earlier release that may combine row-wise parts, and
// paired it with row-wise fan-outs, whose parts it refused
// InvalidArgument (the request failed, not retried). Such a part is
// refused FailedPrecondition, naming the sender's sharding and none.
func TestAssembleUnshardedPlanNamed(t *testing.T) {
	ts := startServer(t, Options{Threads: 1})
	p, _ := plan.Read(tinyPlan(t))
	if p.Sharding != nil {
		t.Fatal("the tiny plan has a sharding; the test wants one without")
	}
	if got, ok := ts.dense.WorkerInfo("id", "addr").GetSharding()[p.Model.Name]; !ok || got != prismv1.NoSharding {
		t.Errorf("announces sharding %q (present %v) for a model of a plan without sharding, want %q", got, ok, prismv1.NoSharding)
	}
	x := cutTensors(p, 3, rand.New(rand.NewPCG(7, 9)))
	x[0].Name = arrowframe.PartialName(x[0].Name)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := ts.client.Score(ctx, &prismv1.ScoreRequest{Model: p.Model.Name, Tensors: encode(t, 3, x[:1]), NumSamples: 3, FanoutKey: "k", Shard: 0, Shards: 2, Sharding: "bbbb"})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "sharding bbbb, this dense worker's plan sharding none") {
		t.Errorf("a row-wise part from sharding bbbb at a dense worker whose plan has none: %v, want FailedPrecondition naming both", err)
	}
}

// TestAssembleDictionaryParts: parts whose whole columns come
// dictionary-encoded (each distinct row once and an index per sample, as
// a shard's embedding worker sends them) score bit for bit as the same
// parts sent plain: the assembler hands the rows and indices to the
// batcher, which gathers them into the batch (Request.Index).
func TestAssembleDictionaryParts(t *testing.T) {
	ts := startServer(t, Options{Threads: 1})
	dir := tinyPlan(t)
	p, err := plan.Read(dir)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(5, 6))
	for _, n := range []int{5, 17, 40} {
		plain := cutTensors(p, n, rng)
		dict := make([]arrowframe.Tensor, len(plain))
		for j, x := range plain {
			k := max(1, n/3) // distinct rows: samples repeat them
			index := make([]int32, n)
			full := make([]float32, n*x.Width)
			for i := range index {
				index[i] = int32(i % k)
				copy(full[i*x.Width:(i+1)*x.Width], x.Data[(i%k)*x.Width:(i%k+1)*x.Width])
			}
			plain[j].Data = full
			dict[j] = arrowframe.Tensor{Name: x.Name, Width: x.Width, Data: x.Data[:k*x.Width], Index: index}
		}
		scores := map[string][]float32{}
		for name, ts2 := range map[string][]arrowframe.Tensor{"plain": plain, "dict": dict} {
			for _, r := range sendParts(t, ts, context.Background(), p.Model.Name, fmt.Sprintf("%s-%d", name, n), n, 3, splitParts(ts2, 3), []int{2, 0, 1}) {
				if r.err != nil {
					t.Fatalf("n=%d %s shard %d: %v", n, name, r.shard, r.err)
				}
				scores[name] = r.scores
			}
		}
		if len(scores["dict"]) != n {
			t.Fatalf("n=%d: %d scores", n, len(scores["dict"]))
		}
		for i := range scores["plain"] {
			if math.Float32bits(scores["dict"][i]) != math.Float32bits(scores["plain"][i]) {
				t.Fatalf("n=%d sample %d: %v from dictionary parts, %v plain", n, i, scores["dict"][i], scores["plain"][i])
			}
		}
	}
}
