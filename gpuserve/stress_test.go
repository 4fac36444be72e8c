package gpuserve

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/internal/arrowframe"
	"github.com/prism-serve/prism/internal/ort"
	"github.com/prism-serve/prism/models"
	"github.com/prism-serve/prism/partitioner"
	"github.com/prism-serve/prism/plan"
)

// otherWeightsPlan partitions dlrm-tiny built with other weights (seed),
// named name: a second model whose scores differ from tinyPlan's.
func otherWeightsPlan(t *testing.T, seed uint64, name string) string {
	t.Helper()
	tinyPlan(t)
	dir := t.TempDir()
	p, err := models.Lookup("dlrm-tiny")
	if err != nil {
		t.Fatal(err)
	}
	m, err := models.New(p.Config, seed)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Write(filepath.Join(dir, "model"), models.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	part := filepath.Join(dir, "part")
	if _, err := partitioner.Partition(filepath.Join(dir, "model", models.ModelFile), part, partitioner.Options{}); err != nil {
		t.Fatal(err)
	}
	pl, err := plan.Read(part)
	if err != nil {
		t.Fatal(err)
	}
	pl.Model.Name = name
	if err := plan.Write(part, pl); err != nil {
		t.Fatal(err)
	}
	return part
}

// TestConcurrentMixedRequestsOwnScores: many concurrent Score calls of
// two models of different weights sharing one run gate, two sessions
// each, of many sizes, as plain, context, dictionary-encoded frames and
// sharded fan-outs (parts in any order), some cancelled or given short
// deadlines: every answered request gets the scores its model's
// dense.onnx gives its own samples alone (never rows of another request
// or model, however the batches were merged and split), and the queues
// and the assembly settle empty. Run it with -race.
func TestConcurrentMixedRequestsOwnScores(t *testing.T) {
	dirA := tinyPlan(t)
	dirB := otherWeightsPlan(t, 11, "dlrm-tiny-b")
	s, err := New(Options{Plans: []string{dirA, dirB}, Threads: 1, Sessions: 2, Batch: BatchOptions{MaxBatch: 96, MaxDelay: time.Millisecond, MaxQueue: 1 << 16}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	type model struct {
		p    *plan.Plan
		sess *ort.Session
	}
	var ms []model
	for _, dir := range []string{dirA, dirB} {
		p, err := plan.Read(dir)
		if err != nil {
			t.Fatal(err)
		}
		sess, err := ort.NewSession(filepath.Join(dir, p.DenseModel), ort.SessionOptions{IntraOpThreads: 1})
		if err != nil {
			t.Fatal(err)
		}
		defer sess.Close()
		ms = append(ms, model{p, sess})
	}
	type job struct {
		model  int
		n      int
		parts  [][]arrowframe.Tensor // one: whole
		want   []float32
		cancel bool
		short  bool
	}
	rng := rand.New(rand.NewPCG(3, 4))
	var jobs []job
	for k := range 120 {
		mi := k % 2
		m := ms[mi]
		n := []int{1, 2, 5, 17, 40, 95, 96, 130}[rng.IntN(8)]
		x := cutTensors(m.p, n, rng)
		expanded := x
		frame := x
		switch k % 4 {
		case 1: // context columns
			expanded, frame = contextSplit(x, n, 0, len(x)-1)
		case 2: // a dictionary column
			rows := 1 + rng.IntN(min(3, n))
			frame = append([]arrowframe.Tensor(nil), x...)
			expanded = append([]arrowframe.Tensor(nil), x...)
			d := x[1]
			idx := make([]int32, n)
			ex := make([]float32, n*d.Width)
			for i := range idx {
				idx[i] = int32(rng.IntN(rows))
				copy(ex[i*d.Width:], d.Data[int(idx[i])*d.Width:(int(idx[i])+1)*d.Width])
			}
			frame[1] = arrowframe.Tensor{Name: d.Name, Width: d.Width, Data: d.Data[:rows*d.Width], Index: idx}
			expanded[1] = arrowframe.Tensor{Name: d.Name, Width: d.Width, Data: ex}
		}
		parts := [][]arrowframe.Tensor{frame}
		if k%3 == 0 {
			parts = splitParts(frame, 2+rng.IntN(2))
		}
		jobs = append(jobs, job{model: mi, n: n, parts: parts, want: direct(t, m.sess, m.p, n, expanded), cancel: k%7 == 3, short: k%11 == 5})
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	answered := 0
	for k, j := range jobs {
		name := ms[j.model].p.Model.Name
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		if j.short {
			ctx, cancel = context.WithTimeout(context.Background(), time.Duration(rng.IntN(3000))*time.Microsecond)
		}
		if j.cancel {
			time.AfterFunc(time.Duration(rng.IntN(2000))*time.Microsecond, cancel)
		}
		order := rng.Perm(len(j.parts))
		var pw sync.WaitGroup
		for _, sh := range order {
			frame := encode(t, j.n, j.parts[sh])
			pw.Add(1)
			wg.Go(func() {
				defer pw.Done()
				req := &prismv1.ScoreRequest{Model: name, Tensors: frame, NumSamples: int32(j.n)}
				if len(j.parts) > 1 {
					req.FanoutKey, req.Shard, req.Shards = fmt.Sprintf("key-%d", k), int32(sh), int32(len(j.parts))
				}
				resp, err := s.Score(ctx, req)
				if err != nil {
					if c := status.Code(err); (j.cancel || j.short) && (c == codes.Canceled || c == codes.DeadlineExceeded) {
						return
					}
					t.Errorf("job %d (%s, n=%d, part %d of %d): %v", k, name, j.n, sh, len(j.parts), err)
					return
				}
				if len(resp.Scores) != j.n {
					t.Errorf("job %d (%s): %d scores for %d samples", k, name, len(resp.Scores), j.n)
					return
				}
				for i, v := range resp.Scores {
					if math.Abs(float64(v-j.want[i])) > 1e-5 {
						t.Errorf("job %d (%s, n=%d, part %d of %d) sample %d: %v, want %v", k, name, j.n, sh, len(j.parts), i, v, j.want[i])
						return
					}
				}
				mu.Lock()
				answered++
				mu.Unlock()
			})
		}
		go func() { pw.Wait(); cancel() }()
		if k%10 == 9 {
			time.Sleep(time.Millisecond)
		}
	}
	wg.Wait()
	t.Logf("%d answers", answered)
	for _, m := range s.models {
		waitDepth(t, m.batcher, 0)
		m.assembly.mu.Lock()
		if len(m.assembly.pending) != 0 || m.assembly.samples != 0 {
			t.Errorf("model %s: %d fan-outs of %d samples left waiting", m.name, len(m.assembly.pending), m.assembly.samples)
		}
		m.assembly.mu.Unlock()
	}
}
