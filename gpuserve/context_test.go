package gpuserve

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/internal/arrowframe"
	"github.com/prism-serve/prism/internal/ort"
	"github.com/prism-serve/prism/plan"
)

// recordRunner is a test double for ONNX Runtime that keeps a copy of
// every batch's inputs and answers each sample's first input value.
type recordRunner struct {
	mu      sync.Mutex
	batches [][][]float32
}

func (r *recordRunner) Run(in []ort.Input) ([][]float32, error) {
	n := int(in[0].Shape[0])
	cp := make([][]float32, len(in))
	for i, x := range in {
		if len(x.Float32) != n*int(x.Shape[1]) {
			return nil, fmt.Errorf("input %q: %d values for %d samples of shape %v", x.Name, len(x.Float32), n, x.Shape)
		}
		cp[i] = slices.Clone(x.Float32)
	}
	r.mu.Lock()
	r.batches = append(r.batches, cp)
	r.mu.Unlock()
	w := int(in[0].Shape[1])
	out := make([]float32, n)
	for s := range out {
		out[s] = in[0].Float32[s*w]
	}
	return [][]float32{out}, nil
}

// TestBatcherExpandsContext: requests with context inputs (one row for all
// their samples) and requests without, batched together, reach the runner
// as the samples they stand for, each request's rows in its place; a
// context request alone is expanded too.
func TestBatcherExpandsContext(t *testing.T) {
	r := &recordRunner{}
	b := NewBatcher(spec, []Runner{r}, BatchOptions{MaxBatch: 64, MaxDelay: time.Hour})
	defer b.Close()
	type sent struct {
		req  Request
		want [][]float32 // per input, expanded
	}
	mk := func(n int, v float32, ctxA, ctxB bool) sent {
		s := sent{req: Request{N: n, Inputs: make([][]float32, 2), Context: []bool{ctxA, ctxB}}, want: make([][]float32, 2)}
		for i, c := range []bool{ctxA, ctxB} {
			w := spec[i].Width
			rows := n
			if c {
				rows = 1
			}
			in := make([]float32, rows*w)
			for j := range in {
				in[j] = v + float32(100*i+j)
			}
			s.req.Inputs[i] = in
			s.want[i] = make([]float32, n*w)
			for k := range n {
				src := in[(k%rows)*w : (k%rows+1)*w]
				copy(s.want[i][k*w:], src)
			}
		}
		return s
	}
	// Five requests, 64 samples in all: one batch (MaxBatch).
	reqs := []sent{mk(10, 1000, true, false), mk(20, 2000, false, false), mk(7, 3000, true, true), mk(26, 4000, false, true), mk(1, 5000, true, true)}
	var wg sync.WaitGroup
	queued := 0
	for i, s := range reqs {
		wg.Go(func() {
			out, err := b.Submit(context.Background(), s.req)
			if err != nil {
				t.Errorf("request %d: %v", i, err)
				return
			}
			for k, v := range out[0] {
				if v != s.want[0][k*spec[0].Width] {
					t.Errorf("request %d sample %d: score %v, want %v", i, k, v, s.want[0][k*spec[0].Width])
					return
				}
			}
		})
		// Arrival order is the batch's order: the next request is sent
		// once this one is queued (a sleep between goroutines was not
		// enough on a loaded machine).
		// (The last completes the batch, which then runs and leaves.)
		queued += s.req.N
		if i == len(reqs)-1 {
			break
		}
		for deadline := time.Now().Add(10 * time.Second); b.QueueDepth() < queued; {
			if time.Now().After(deadline) {
				t.Fatalf("request %d: queue depth %d after 10 s, want %d", i, b.QueueDepth(), queued)
			}
			time.Sleep(100 * time.Microsecond)
		}
	}
	wg.Wait()
	if len(r.batches) != 1 {
		t.Fatalf("%d batches, want 1", len(r.batches))
	}
	for i := range spec {
		var want []float32
		for _, s := range reqs {
			want = append(want, s.want[i]...)
		}
		if !slices.Equal(r.batches[0][i], want) {
			t.Errorf("input %q: the batch is %v\nwant %v", spec[i].Name, r.batches[0][i], want)
		}
	}

	// Alone in its batch, a context request is expanded; a plain one is
	// passed as it is.
	r.batches = nil
	b2 := NewBatcher(spec, []Runner{r}, BatchOptions{MaxBatch: 64, MaxDelay: time.Microsecond})
	defer b2.Close()
	s := mk(5, 7000, true, false)
	if _, err := b2.Submit(context.Background(), s.req); err != nil {
		t.Fatal(err)
	}
	for i := range spec {
		if !slices.Equal(r.batches[0][i], s.want[i]) {
			t.Errorf("alone: input %q is %v, want %v", spec[i].Name, r.batches[0][i], s.want[i])
		}
	}

	// A context input must be one row; marks must cover every input.
	bad := mk(4, 0, true, false)
	bad.req.Inputs[0] = make([]float32, 4*spec[0].Width)
	if _, err := b2.Submit(context.Background(), bad.req); err == nil {
		t.Error("a context input of 4 rows accepted")
	}
	bad = mk(4, 0, false, false)
	bad.req.Context = []bool{false}
	if _, err := b2.Submit(context.Background(), bad.req); err == nil {
		t.Error("context marks for 1 of 2 inputs accepted")
	}
}

// contextSplit marks the cut tensors at the given positions as context:
// every sample gets sample 0's row (expanded, for dense.onnx alone) and
// the frame carries that row once (ctx).
func contextSplit(ts []arrowframe.Tensor, n int, at ...int) (expanded, ctx []arrowframe.Tensor) {
	expanded, ctx = slices.Clone(ts), slices.Clone(ts)
	for _, i := range at {
		x := ts[i]
		row := slices.Clone(x.Data[:x.Width])
		expanded[i].Data = make([]float32, n*x.Width)
		arrowframe.Repeat(expanded[i].Data, row)
		ctx[i] = arrowframe.Tensor{Name: x.Name, Width: x.Width, Data: row, Context: true}
	}
	return expanded, ctx
}

// TestScoreContextColumns: frames with context columns, whole or as the
// parts of a sharded fan-out, sent concurrently with plain frames so the
// server batches them together, score as dense.onnx scores the expanded
// tensors.
func TestScoreContextColumns(t *testing.T) {
	ts := startServer(t, Options{Threads: 1, Batch: BatchOptions{MaxBatch: 256, MaxDelay: 5 * time.Millisecond}})
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
	if len(p.Cut) < 3 {
		t.Fatalf("dlrm-tiny's cut has %d tensors; the test marks 2 of them context", len(p.Cut))
	}
	rng := rand.New(rand.NewPCG(7, 8))
	type job struct {
		name   string
		n      int
		ctx    []arrowframe.Tensor // the frame's tensors
		shards int                 // 0: whole
		want   []float32
	}
	var jobs []job
	last := len(p.Cut) - 1
	for k, n := range []int{1, 5, 33, 64, 100} {
		x := cutTensors(p, n, rng)
		expanded, ctx := contextSplit(x, n, 0, last)
		want := direct(t, sess, p, n, expanded)
		jobs = append(jobs,
			job{name: fmt.Sprintf("context n=%d", n), n: n, ctx: ctx, want: want},
			job{name: fmt.Sprintf("plain n=%d", n), n: n, ctx: expanded, want: want},
		)
		if k%2 == 0 {
			// Every column context, and a fan-out of 2 parts with
			// context columns in both.
			all := make([]int, len(x))
			for i := range all {
				all[i] = i
			}
			exAll, ctxAll := contextSplit(x, n, all...)
			jobs = append(jobs,
				job{name: fmt.Sprintf("all context n=%d", n), n: n, ctx: ctxAll, want: direct(t, sess, p, n, exAll)},
				job{name: fmt.Sprintf("fan-out n=%d", n), n: n, ctx: ctx, shards: 2, want: want},
			)
		}
	}
	var wg sync.WaitGroup
	for k, j := range jobs {
		parts := [][]arrowframe.Tensor{j.ctx}
		if j.shards > 0 {
			parts = splitParts(j.ctx, j.shards)
		}
		for sh, part := range parts {
			frame := encode(t, j.n, part)
			wg.Go(func() {
				req := &prismv1.ScoreRequest{Model: p.Model.Name, Tensors: frame, NumSamples: int32(j.n)}
				if j.shards > 0 {
					req.FanoutKey, req.Shard, req.Shards = fmt.Sprintf("ctx-%d", k), int32(sh), int32(j.shards)
				}
				resp, err := ts.client.Score(context.Background(), req)
				if err != nil {
					t.Errorf("%s part %d: %v", j.name, sh, err)
					return
				}
				var worst float64
				for i := range j.want {
					worst = max(worst, math.Abs(float64(resp.Scores[i]-j.want[i])))
				}
				if len(resp.Scores) != j.n || worst > 1e-5 {
					t.Errorf("%s part %d: %d scores, max abs error %g", j.name, sh, len(resp.Scores), worst)
				}
			})
		}
	}
	wg.Wait()
	batches, samples, _, _ := ts.dense.models[p.Model.Name].batcher.Snapshot()
	t.Logf("%d requests, %d samples in %d batches", len(jobs), samples, batches)
	if batches >= int64(len(jobs)) {
		t.Logf("no two requests shared a batch: the mixed batches went untested this run")
	}
}
