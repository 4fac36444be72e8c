package gpuserve

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/internal/arrowframe"
	"github.com/prism-serve/prism/internal/ort"
	"github.com/prism-serve/prism/plan"
)

// Each combine rule on hand-made parts: 2 samples of width 2.
func TestCombinePartial(t *testing.T) {
	for _, tc := range []struct {
		name   string
		c      plan.Combine
		parts  [][]float32
		counts [][]float32
		want   []float32
	}{
		{"sum", plan.CombineSum, [][]float32{{1, 2, 3, 4}, {10, 20, 0, 0}, {0, 0, -3, 1}}, nil, []float32{11, 22, 0, 5}},
		{"sum one part", plan.CombineSum, [][]float32{{1, 2, 3, 4}}, nil, []float32{1, 2, 3, 4}},
		// mean = summed sums / summed counts; a bag empty everywhere: zeros.
		{"sum_count", plan.CombineSumCount, [][]float32{{3, 6, 0, 0}, {1, 2, 0, 0}}, [][]float32{{3, 0}, {1, 0}}, []float32{1, 2, 0, 0}},
		{"sum_count one shard empty", plan.CombineSumCount, [][]float32{{0, 0, 4, -8}, {9, 3, 2, 2}}, [][]float32{{0, 2}, {3, 1}}, []float32{3, 1, 2, -2}},
		// max over the parts with a count; a part with count 0 (zeros) is
		// left out even where every other value is negative.
		{"max_count", plan.CombineMaxCount, [][]float32{{-1, -5, 0, 0}, {0, 0, 0, 0}, {-2, -3, 7, -1}}, [][]float32{{2, 0}, {0, 0}, {1, 1}}, []float32{-1, -3, 7, -1}},
		{"max_count empty everywhere", plan.CombineMaxCount, [][]float32{{0, 0, 1, 1}, {0, 0, 2, 0}}, [][]float32{{0, 1}, {0, 1}}, []float32{0, 0, 2, 1}},
	} {
		out := []float32{9, 9, 9, 9}
		combinePartial(tc.c, out, tc.parts, tc.counts, 2, 2)
		if !slices.Equal(out, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, out, tc.want)
		}
	}
}

// A dense worker takes the parts of outputs sent in parts by row-wise
// shards, combines them by the plan's rule and scores what the whole
// tensors score; a shard of the output that sends no part, or a shard
// that is not one of the output's, fails the fan-out.
func TestAssemblePartial(t *testing.T) {
	ts := startServer(t, Options{Threads: 1})
	dir := tinyPlan(t)
	p, err := plan.Read(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Cut) < 3 {
		t.Fatalf("the tiny plan has %d cut tensors, want 3", len(p.Cut))
	}
	sess, err := ort.NewSession(filepath.Join(dir, p.DenseModel), ort.SessionOptions{IntraOpThreads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	m := ts.dense.models[p.Model.Name]
	// Cut tensors 1 and 2 come in parts: a mean from shards 1 and 2, a
	// max from shards 0 and 2; tensor 0 whole from shard 0, the rest
	// whole round-robin.
	mean, mx := p.Cut[1].Name, p.Cut[2].Name
	m.assembly.partials = map[string]*partialSpec{
		mean: {index: 1, combine: plan.CombineSumCount, shards: []int{1, 2}, counts: true},
		mx:   {index: 2, combine: plan.CombineMaxCount, shards: []int{0, 2}, counts: true},
	}
	t.Cleanup(func() { m.assembly.partials = nil })
	const n, shards = 7, 3
	rng := rand.New(rand.NewPCG(8, 9))
	x := cutTensors(p, n, rng)
	wm, wx := x[1].Width, x[2].Width
	parts := make([][]arrowframe.Tensor, shards)
	for i := range x {
		if i != 1 && i != 2 {
			parts[i%shards] = append(parts[i%shards], x[i])
		}
	}
	// mean: sample s has count s%3 on shard 1 and (s+1)%2 on shard 2
	// (0 on both for some samples: the whole is zeros there).
	m1, m2 := make([]float32, n*wm), make([]float32, n*wm)
	c1, c2 := make([]float32, n), make([]float32, n)
	for s := range n {
		c1[s], c2[s] = float32(s%3), float32((s+1)%2)
		total := c1[s] + c2[s]
		for k := range wm {
			i := s*wm + k
			if total == 0 {
				x[1].Data[i] = 0
				continue
			}
			r := float32(rng.NormFloat64())
			m1[i], m2[i] = r, x[1].Data[i]*total-r
			if c2[s] == 0 {
				m1[i], m2[i] = x[1].Data[i]*total, 0
			}
			if c1[s] == 0 {
				m1[i], m2[i] = 0, x[1].Data[i]*total
			}
		}
	}
	// max: shard 0 has the max where its count is not 0 and sample is
	// even; shard 2 otherwise; a part with count 0 holds junk.
	x0, x2 := make([]float32, n*wx), make([]float32, n*wx)
	k0, k2 := make([]float32, n), make([]float32, n)
	for s := range n {
		k0[s], k2[s] = float32(s%2), float32((s+1)%3)
		for k := range wx {
			i := s*wx + k
			lower := x[2].Data[i] - 1 - float32(rng.Float64())
			switch {
			case k0[s] == 0 && k2[s] == 0:
				x[2].Data[i] = 0
				x0[i], x2[i] = 5, 5
			case k0[s] == 0:
				x0[i], x2[i] = 100, x[2].Data[i]
			case k2[s] == 0:
				x0[i], x2[i] = x[2].Data[i], 100
			case s%2 == 0:
				x0[i], x2[i] = x[2].Data[i], lower
			default:
				x0[i], x2[i] = lower, x[2].Data[i]
			}
		}
	}
	add := func(sh int, ts ...arrowframe.Tensor) { parts[sh] = append(parts[sh], ts...) }
	add(1, arrowframe.Tensor{Name: arrowframe.PartialName(mean), Width: wm, Data: m1}, arrowframe.Tensor{Name: arrowframe.CountName(mean), Width: 1, Data: c1})
	add(2, arrowframe.Tensor{Name: arrowframe.PartialName(mean), Width: wm, Data: m2}, arrowframe.Tensor{Name: arrowframe.CountName(mean), Width: 1, Data: c2})
	add(0, arrowframe.Tensor{Name: arrowframe.PartialName(mx), Width: wx, Data: x0}, arrowframe.Tensor{Name: arrowframe.CountName(mx), Width: 1, Data: k0})
	add(2, arrowframe.Tensor{Name: arrowframe.PartialName(mx), Width: wx, Data: x2}, arrowframe.Tensor{Name: arrowframe.CountName(mx), Width: 1, Data: k2})
	want := direct(t, sess, p, n, x)
	for _, order := range [][]int{{0, 1, 2}, {2, 1, 0}} {
		for _, r := range sendParts(t, ts, context.Background(), p.Model.Name, "partial", n, shards, parts, order) {
			if r.err != nil {
				t.Fatalf("shard %d: %v", r.shard, r.err)
			}
			for i := range want {
				if d := math.Abs(float64(r.scores[i] - want[i])); d > 1e-5 {
					t.Fatalf("shard %d: score %d: %v, want %v", r.shard, i, r.scores[i], want[i])
				}
			}
		}
	}
	// Shard 1 leaves out its counts: the fan-out fails.
	bad := slices.Clone(parts)
	bad[1] = slices.DeleteFunc(slices.Clone(parts[1]), func(x arrowframe.Tensor) bool { return x.Name == arrowframe.CountName(mean) })
	for _, r := range sendParts(t, ts, context.Background(), p.Model.Name, "lacking", n, shards, bad, []int{0, 1, 2}) {
		if status.Code(r.err) != codes.InvalidArgument {
			t.Fatalf("a part without its counts: shard %d: %v, want InvalidArgument", r.shard, r.err)
		}
	}
	// Shard 1 sends a part of the max, which is shards 0 and 2's.
	bad[1] = append(slices.Clone(parts[1]), arrowframe.Tensor{Name: arrowframe.PartialName(mx), Width: wx, Data: x0})
	for _, r := range sendParts(t, ts, context.Background(), p.Model.Name, "stranger", n, shards, bad, []int{0, 2, 1}) {
		if status.Code(r.err) != codes.InvalidArgument {
			t.Fatalf("a part from a shard not the output's: shard %d: %v, want InvalidArgument", r.shard, r.err)
		}
	}
	// Parts from embedding workers naming a sharding: this plan's is
	// combined; another's, where a part carries partial pools, is
	// refused with FailedPrecondition (and the fan-out with it): its
	// rows may be placed otherwise. A part naming none is taken.
	m.assembly.sharding = "aaaa"
	t.Cleanup(func() { m.assembly.sharding = "" })
	// got waits until the fan-out key holds shard sh's part.
	got := func(key string, sh int) {
		t.Helper()
		for range 1000 {
			m.assembly.mu.Lock()
			f := m.assembly.pending[key]
			ok := f != nil && f.got[sh]
			m.assembly.mu.Unlock()
			if ok {
				return
			}
			time.Sleep(2 * time.Millisecond)
		}
		t.Fatalf("fan-out %q: shard %d's part never held", key, sh)
	}
	for _, tc := range []struct {
		fps     [shards]string
		order   [shards]int // the refused part last: one refused first fails the fan-out, and the later parts would wait for it anew
		refused bool
	}{
		{fps: [shards]string{"aaaa", "aaaa", "aaaa"}, order: [shards]int{0, 1, 2}},
		{fps: [shards]string{"", "aaaa", ""}, order: [shards]int{2, 0, 1}},
		{fps: [shards]string{"bbbb", "aaaa", "aaaa"}, order: [shards]int{1, 2, 0}, refused: true}, // shard 0 sends a part of the max
		{fps: [shards]string{"aaaa", "aaaa", "bbbb"}, order: [shards]int{0, 1, 2}, refused: true},
	} {
		key := fmt.Sprintf("named-%v", tc.fps)
		results := make(chan partResult, shards)
		for i, sh := range tc.order {
			frame := encode(t, n, parts[sh])
			go func() {
				resp, err := ts.client.Score(context.Background(), &prismv1.ScoreRequest{Model: p.Model.Name, Tensors: frame, NumSamples: n, FanoutKey: key, Shard: int32(sh), Shards: shards, Sharding: tc.fps[sh]})
				results <- partResult{shard: sh, scores: resp.GetScores(), err: err}
			}()
			if i < shards-1 {
				got(key, sh)
			}
		}
		for range shards {
			r := <-results
			switch {
			case tc.refused && status.Code(r.err) != codes.FailedPrecondition:
				t.Fatalf("shardings %q: shard %d: %v, want FailedPrecondition", tc.fps, r.shard, r.err)
			case !tc.refused && (r.err != nil || math.Abs(float64(r.scores[0]-want[0])) > 1e-5):
				t.Fatalf("shardings %q: shard %d: %v %v, want %v", tc.fps, r.shard, r.err, r.scores, want)
			}
		}
	}
	if got := len(m.assembly.pending); got != 0 {
		t.Errorf("%d fan-outs left pending", got)
	}
}
