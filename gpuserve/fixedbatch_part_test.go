package gpuserve

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/plan"
)

// TestFixedBatchPartsRefused: a model whose dense.onnx is fixed at a
// batch takes parts of sharded fan-outs of exactly that batch too, as it
// does whole frames; any other size is InvalidArgument, not a run that
// fails in ONNX Runtime (Internal) or two short requests merged.
func TestFixedBatchPartsRefused(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "part")
	if err := os.CopyFS(dir, os.DirFS(tinyPlan(t))); err != nil {
		t.Fatal(err)
	}
	p, err := plan.Read(dir)
	if err != nil {
		t.Fatal(err)
	}
	// As the partitioner writes a model exported at batch 4 that
	// dense.onnx cannot run at another size.
	p.FixedBatch = 4
	p.Batch = &plan.BatchInfo{Exported: 4, Blockers: []plan.BatchBlocker{{Node: "reshape", Op: "Reshape", Reason: "batch in a shape", Side: plan.GPU}}}
	if err := plan.Write(dir, p); err != nil {
		t.Fatal(err)
	}
	s, err := New(Options{Plans: []string{dir}, Threads: 1, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	frame := encode(t, 3, cutTensors(p, 3, rand.New(rand.NewPCG(1, 2))))
	for _, req := range []*prismv1.ScoreRequest{
		{Model: p.Model.Name, Tensors: frame, NumSamples: 3},
		{Model: p.Model.Name, Tensors: frame, NumSamples: 3, FanoutKey: "k", Shards: 1},
	} {
		_, err := s.Score(context.Background(), req)
		if st := status.Convert(err); st.Code() != codes.InvalidArgument {
			t.Errorf("3 samples to a model fixed at 4 (fan-out key %q): got %v %q, want InvalidArgument", req.FanoutKey, st.Code(), st.Message())
		}
	}
}
