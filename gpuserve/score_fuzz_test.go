package gpuserve

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/internal/arrowframe"
)

// FuzzScore sends DenseTier.Score requests built from arbitrary bytes to
// a dense tier serving dlrm-tiny (the frame decoding itself is fuzzed in
// internal/arrowframe and the codec in internal/serve; this is the
// handler's checks against the plan). Every request gets scores or a
// status from the documented set, never a panic or Internal.
func FuzzScore(f *testing.F) {
	s, err := New(Options{Plans: []string{tinyPlan(f)}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(s.Close)
	m := s.models[s.names[0]]
	var cols, ctxCols []arrowframe.Column
	for i, sp := range m.spec {
		cols = append(cols, arrowframe.Column{Name: sp.Name, Width: sp.Width})
		ctxCols = append(ctxCols, arrowframe.Column{Name: sp.Name, Width: sp.Width, Context: i%2 == 0})
	}
	for _, n := range []int{1, 3, 5} {
		layout := cols
		if n == 5 {
			layout = ctxCols // context columns among the others
		}
		frame, _, err := arrowframe.AppendFrame(nil, n, layout)
		if err != nil {
			f.Fatal(err)
		}
		for _, req := range []*prismv1.ScoreRequest{
			{Model: m.name, NumSamples: int32(n), Tensors: frame},
			{Model: m.name, NumSamples: int32(n + 1), Tensors: frame},
			{Model: m.name, NumSamples: -1, Tensors: frame},
			{Model: m.name, NumSamples: int32(n), Tensors: frame[:len(frame)/2]},
			{Model: "other", NumSamples: int32(n), Tensors: frame},
			// A part of a fan-out whose siblings never come.
			{Model: m.name, NumSamples: int32(n), Tensors: frame, FanoutKey: "k", Shard: 0, Shards: 2},
			{Model: m.name, NumSamples: int32(n), Tensors: frame, FanoutKey: "k", Shard: 0, Shards: 1},
			// Another content of the model (Aborted); a part from a
			// worker of another sharding that this plan refuses
			// (FailedPrecondition).
			{Model: m.name, NumSamples: int32(n), Tensors: frame, Content: "0123456789abcdef"},
			{Model: m.name, NumSamples: int32(n), Tensors: frame[:len(frame)/2], FanoutKey: "k", Shard: 0, Shards: 1, Sharding: "9f86d081884c7d65"},
		} {
			b, err := proto.Marshal(req)
			if err != nil {
				f.Fatal(err)
			}
			f.Add(b)
		}
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var req prismv1.ScoreRequest
		if err := proto.Unmarshal(b, &req); err != nil {
			t.Skip()
		}
		timeout := 10 * time.Second
		// A part of a fan-out of two or more shards that passes the
		// checks waits for its siblings, which never come (inputs run
		// one at a time): it ends at its deadline, so that deadline is
		// short, lest each such input stall the fuzzer 10 s.
		parts := req.GetShards() >= 2
		if parts {
			timeout = 20 * time.Millisecond
		}
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		resp, err := s.Score(ctx, &req)
		switch status.Code(err) {
		case codes.OK:
			if len(resp.GetScores()) != int(req.GetNumSamples()) {
				t.Fatalf("%d scores for %d samples", len(resp.GetScores()), req.GetNumSamples())
			}
		// Aborted: another content of the model (ScoreRequest.content);
		// FailedPrecondition: a part from a worker of another sharding.
		case codes.InvalidArgument, codes.NotFound, codes.ResourceExhausted, codes.Aborted, codes.FailedPrecondition:
		case codes.DeadlineExceeded:
			if !parts {
				t.Fatalf("status %v: %v", status.Code(err), err)
			}
		default:
			t.Fatalf("status %v: %v", status.Code(err), err)
		}
		// Whatever the part, nothing of it stays behind waiting.
		m.assembly.mu.Lock()
		pending, samples := len(m.assembly.pending), m.assembly.samples
		m.assembly.mu.Unlock()
		if pending != 0 || samples != 0 {
			t.Fatalf("after the call: %d fan-outs (%d samples) pending", pending, samples)
		}
	})
}
