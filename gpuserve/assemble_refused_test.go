package gpuserve

import (
	"context"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/internal/arrowframe"
	"github.com/prism-serve/prism/plan"
)

// TestAssembleRefusedPartFailsFanout: a part its frame gets refused
// (here a tensor of another width, as from an embedding worker of
// another plan) fails the fan-out's waiting parts at once, naming the
// refused shard and why, as a part refused once it has joined does. They
// waited for their deadline instead and were told the shard "did not
// send its part in time", though it had, and the fan-out held its
// samples against the assembly bound all that while.
func TestAssembleRefusedPartFailsFanout(t *testing.T) {
	ts := startServer(t, Options{Threads: 1})
	p, err := plan.Read(tinyPlan(t))
	if err != nil {
		t.Fatal(err)
	}
	model := p.Model.Name
	const n = 3
	parts := splitParts(cutTensors(p, n, rand.New(rand.NewPCG(9, 10))), 2)
	bad := append([]arrowframe.Tensor(nil), parts[1]...)
	w := bad[0].Width + 1
	bad[0] = arrowframe.Tensor{Name: bad[0].Name, Width: w, Data: make([]float32, n*w)}
	// The waiting part's deadline is far enough that only the refusal
	// can end it before the test reads its answer's code.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	waiting := make(chan error, 1)
	go func() {
		_, err := ts.dense.Score(ctx, &prismv1.ScoreRequest{Model: model, Tensors: encode(t, n, parts[0]), NumSamples: n, FanoutKey: "k", Shard: 0, Shards: 2})
		waiting <- err
	}()
	a := ts.dense.models[model].assembly
	for {
		a.mu.Lock()
		f := a.pending["k"]
		a.mu.Unlock()
		if f != nil {
			break
		}
		time.Sleep(time.Millisecond)
	}
	_, err = ts.dense.Score(ctx, &prismv1.ScoreRequest{Model: model, Tensors: encode(t, n, bad), NumSamples: n, FanoutKey: "k", Shard: 1, Shards: 2})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("the refused part: %v, want InvalidArgument", err)
	}
	err = <-waiting
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "shard 1") || !strings.Contains(err.Error(), "width") {
		t.Errorf("the waiting part: %v, want InvalidArgument naming shard 1's refusal", err)
	}
	a.mu.Lock()
	if len(a.pending) != 0 || a.samples != 0 {
		t.Errorf("left pending: %d fan-outs, %d samples", len(a.pending), a.samples)
	}
	a.mu.Unlock()

	// A part looked up for another model content (a retrained plan's
	// embedding worker) is refused Aborted before it is decoded: its
	// waiting siblings are failed at once too, and a bad shard index on
	// it panics nothing.
	go func() {
		_, err := ts.dense.Score(ctx, &prismv1.ScoreRequest{Model: model, Tensors: encode(t, n, parts[0]), NumSamples: n, FanoutKey: "k2", Shard: 0, Shards: 2})
		waiting <- err
	}()
	for {
		a.mu.Lock()
		f := a.pending["k2"]
		a.mu.Unlock()
		if f != nil {
			break
		}
		time.Sleep(time.Millisecond)
	}
	for _, shard := range []int32{7, 1} {
		_, err = ts.dense.Score(ctx, &prismv1.ScoreRequest{Model: model, Tensors: encode(t, n, parts[1]), NumSamples: n, FanoutKey: "k2", Shard: shard, Shards: 2, Content: "0123456789abcdef"})
		if status.Code(err) != codes.Aborted {
			t.Fatalf("a part of another content (shard %d): %v, want Aborted", shard, err)
		}
	}
	err = <-waiting
	if status.Code(err) != codes.Aborted || !strings.Contains(err.Error(), "content") {
		t.Errorf("the part waiting beside another content's: %v, want Aborted naming the content", err)
	}

	// Parts arriving after their fan-out failed (a sibling refused first,
	// or the fan-out answered): refused at once with the cause. They
	// started a fan-out of their own and waited to their deadline.
	late, lateCancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer lateCancel()
	_, err = ts.dense.Score(ctx, &prismv1.ScoreRequest{Model: model, Tensors: encode(t, n, parts[1]), NumSamples: n, FanoutKey: "k3", Shard: 1, Shards: 2, Content: "0123456789abcdef"})
	if status.Code(err) != codes.Aborted {
		t.Fatalf("a lone part of another content: %v, want Aborted", err)
	}
	for _, c := range []struct {
		key   string
		shard int32
		code  codes.Code
	}{{"k3", 0, codes.Aborted}, {"k", 1, codes.InvalidArgument}} {
		_, err = ts.dense.Score(late, &prismv1.ScoreRequest{Model: model, Tensors: encode(t, n, parts[c.shard]), NumSamples: n, FanoutKey: c.key, Shard: c.shard, Shards: 2})
		if status.Code(err) != c.code || !strings.Contains(err.Error(), "failed before") {
			t.Errorf("shard %d's part of fan-out %q after it failed: %v, want %v at once, saying it failed before", c.shard, c.key, err, c.code)
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.pending) != 0 || a.samples != 0 {
		t.Errorf("left pending: %d fan-outs, %d samples", len(a.pending), a.samples)
	}
}
