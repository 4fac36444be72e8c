package gpuserve

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/plan"
)

// TestCloseAnswersWaitingParts: a part of a sharded fan-out waiting for
// its siblings when the server closes is answered Unavailable at once,
// not at its deadline (here none: it would wait for ever), and a part
// coming after Close is refused, not left waiting.
func TestCloseAnswersWaitingParts(t *testing.T) {
	dir := tinyPlan(t)
	p, err := plan.Read(dir)
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(Options{Plans: []string{dir}, Threads: 1, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	m := s.models[p.Model.Name]
	parts := splitParts(cutTensors(p, 2, rand.New(rand.NewPCG(7, 8))), 3)
	req := func(sh int) *prismv1.ScoreRequest {
		return &prismv1.ScoreRequest{Model: p.Model.Name, Tensors: encode(t, 2, parts[sh]), NumSamples: 2, FanoutKey: "k", Shard: int32(sh), Shards: 3}
	}
	waiting := make(chan error, 1)
	go func() {
		_, err := s.Score(context.Background(), req(0))
		waiting <- err
	}()
	for {
		m.assembly.mu.Lock()
		f := m.assembly.pending["k"]
		in := f != nil && f.count == 1
		m.assembly.mu.Unlock()
		if in {
			break
		}
		select {
		case err := <-waiting:
			t.Fatalf("part answered before Close: %v", err)
		case <-time.After(time.Millisecond):
		}
	}
	s.Close()
	select {
	case err := <-waiting:
		if status.Code(err) != codes.Unavailable {
			t.Errorf("waiting part: %v, want Unavailable", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a part waiting for its siblings was not answered 10 s after Close")
	}
	m.assembly.mu.Lock()
	pending, samples := len(m.assembly.pending), m.assembly.samples
	m.assembly.mu.Unlock()
	if pending != 0 || samples != 0 {
		t.Errorf("after Close: %d fan-outs, %d samples pending", pending, samples)
	}
	if _, err := s.Score(context.Background(), req(1)); status.Code(err) != codes.Unavailable {
		t.Errorf("part after Close: %v, want Unavailable", err)
	}
}
