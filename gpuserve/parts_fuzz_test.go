package gpuserve

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/internal/arrowframe"
	"github.com/prism-serve/prism/plan"
)

// FuzzScoreParts sends the three parts of one sharded fan-out, their
// frames and numbers built from arbitrary bytes, to a dense tier serving
// dlrm-tiny whose sharding sends cut tensor 1 in parts from shards 1 and
// 2 (a mean: sums and counts) and cut tensor 2 from shards 0 and 2 (a
// max with counts), as TestAssemblePartial does. The parts go one after
// the other, each once the server holds the one before or has answered
// it. Every part is answered with scores or a documented status, never
// a panic or Internal; the parts answered OK have the same scores, one
// per sample; and nothing of the fan-out stays behind.
func FuzzScoreParts(f *testing.F) {
	s, err := New(Options{Plans: []string{tinyPlan(f)}, Logger: slog.New(slog.DiscardHandler), Threads: 1})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(s.Close)
	p, err := plan.Read(tinyPlan(f))
	if err != nil {
		f.Fatal(err)
	}
	if len(p.Cut) < 3 {
		f.Fatalf("the tiny plan has %d cut tensors, want 3", len(p.Cut))
	}
	m := s.models[p.Model.Name]
	mean, mx := p.Cut[1].Name, p.Cut[2].Name
	m.assembly.partials = map[string]*partialSpec{
		mean: {index: 1, combine: plan.CombineSumCount, shards: []int{1, 2}, counts: true},
		mx:   {index: 2, combine: plan.CombineMaxCount, shards: []int{0, 2}, counts: true},
	}
	const shards = 3
	rng := rand.New(rand.NewPCG(3, 4))
	for _, n := range []int{1, 3} {
		x := cutTensors(p, n, rng)
		counts := func() []float32 {
			c := make([]float32, n)
			for i := range c {
				c[i] = float32(rng.IntN(3))
			}
			return c
		}
		parts := make([][]arrowframe.Tensor, shards)
		for i := range x {
			if i != 1 && i != 2 {
				parts[i%shards] = append(parts[i%shards], x[i])
			}
		}
		add := func(sh int, ts ...arrowframe.Tensor) { parts[sh] = append(parts[sh], ts...) }
		add(1, arrowframe.Tensor{Name: arrowframe.PartialName(mean), Width: x[1].Width, Data: x[1].Data}, arrowframe.Tensor{Name: arrowframe.CountName(mean), Width: 1, Data: counts()})
		add(2, arrowframe.Tensor{Name: arrowframe.PartialName(mean), Width: x[1].Width, Data: x[1].Data}, arrowframe.Tensor{Name: arrowframe.CountName(mean), Width: 1, Data: counts()})
		add(0, arrowframe.Tensor{Name: arrowframe.PartialName(mx), Width: x[2].Width, Data: x[2].Data}, arrowframe.Tensor{Name: arrowframe.CountName(mx), Width: 1, Data: counts()})
		add(2, arrowframe.Tensor{Name: arrowframe.PartialName(mx), Width: x[2].Width, Data: x[2].Data}, arrowframe.Tensor{Name: arrowframe.CountName(mx), Width: 1, Data: counts()})
		frames := make([][]byte, shards)
		for sh := range parts {
			if frames[sh], err = arrowframe.Encode(n, parts[sh]); err != nil {
				f.Fatal(err)
			}
		}
		f.Add(int8(n), uint8(shards), frames[0], frames[1], frames[2])
		f.Add(int8(n), uint8(2), frames[0], frames[1], frames[2])
		f.Add(int8(n+1), uint8(shards), frames[0], frames[1], frames[2])
		f.Add(int8(n), uint8(shards), frames[0], frames[0], frames[2])
		f.Add(int8(n), uint8(shards), frames[0], frames[1][:len(frames[1])/2], frames[2])
		// Shard 1 sends a part of the max, which is shards 0 and 2's.
		stranger, err := arrowframe.Encode(n, append(slices.Clone(parts[1]), parts[0][len(parts[0])-2:]...))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(int8(n), uint8(shards), frames[0], stranger, frames[2])
	}
	var key int
	f.Fuzz(func(t *testing.T, n int8, k uint8, f0, f1, f2 []byte) {
		key++
		fanout := fmt.Sprintf("fuzz-%d", key)
		// A fan-out missing a part (one refused, or shards beyond the
		// three sent) ends at its deadline: short, lest each such input
		// stall the fuzzer.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
		defer cancel()
		held := func(sh int) bool {
			m.assembly.mu.Lock()
			defer m.assembly.mu.Unlock()
			fo := m.assembly.pending[fanout]
			return fo != nil && sh < len(fo.got) && fo.got[sh]
		}
		type answer struct {
			scores []float32
			err    error
		}
		answers := make([]answer, shards)
		var wg sync.WaitGroup
		for sh, frame := range [][]byte{f0, f1, f2} {
			req := &prismv1.ScoreRequest{Model: m.name, NumSamples: int32(n), Tensors: frame, FanoutKey: fanout, Shard: int32(sh), Shards: int32(k)}
			answered := make(chan struct{})
			wg.Go(func() {
				defer close(answered)
				resp, err := s.Score(ctx, req)
				answers[sh] = answer{resp.GetScores(), err}
			})
		wait:
			for !held(sh) {
				select {
				case <-answered:
					break wait
				case <-time.After(100 * time.Microsecond):
				}
			}
		}
		wg.Wait()
		var ok []float32
		for sh, a := range answers {
			switch status.Code(a.err) {
			case codes.OK:
				if len(a.scores) != int(n)*m.tasks {
					t.Fatalf("shard %d: %d scores for %d samples", sh, len(a.scores), n)
				}
				if ok != nil && !slices.EqualFunc(ok, a.scores, func(a, b float32) bool { return math.Float32bits(a) == math.Float32bits(b) }) {
					t.Fatalf("shard %d: scores %v, another part's %v", sh, a.scores, ok)
				}
				ok = a.scores
			case codes.InvalidArgument, codes.ResourceExhausted, codes.FailedPrecondition, codes.DeadlineExceeded:
			default:
				t.Fatalf("shard %d: status %v: %v", sh, status.Code(a.err), a.err)
			}
		}
		m.assembly.mu.Lock()
		pending, samples := len(m.assembly.pending), m.assembly.samples
		m.assembly.mu.Unlock()
		if pending != 0 || samples != 0 {
			t.Fatalf("after the fan-out: %d fan-outs (%d samples) pending", pending, samples)
		}
	})
}
