package gpuserve

import (
	"context"
	"log/slog"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/internal/arrowframe"
	"github.com/prism-serve/prism/plan"
)

// TestDecodeRefusalsReturnPooled: a frame whose dictionary columns were
// expanded into serve.Pool buffers, then refused by the handler's checks
// against the plan, gives the buffers back (refused frames under load
// otherwise cost fresh expansion memory each).
func TestDecodeRefusalsReturnPooled(t *testing.T) {
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
	// The schema's first frame goes through arrow-go (no pool); the fast
	// path reads the ones after.
	if _, _, err := arrowframe.Decode(dictRequest(t, p, 4, 7).Tensors); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name   string
		modify func(r *prismv1.ScoreRequest)
	}{
		{name: "num_samples disagrees", modify: func(r *prismv1.ScoreRequest) { r.NumSamples = 3 }},
		{name: "closed", modify: nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			pool := usePool(t)
			r := dictRequest(t, p, 4, 7)
			want := codes.InvalidArgument
			if c.modify != nil {
				c.modify(r)
			} else {
				s.Close()
				want = codes.Unavailable
			}
			_, err := s.Score(context.Background(), r)
			if got := status.Code(err); got != want {
				t.Fatalf("Score: %v, want %v", err, want)
			}
			out, gets, bad := pool.state()
			if gets == 0 {
				t.Fatal("no buffer taken from the pool: the case tests nothing")
			}
			if out != 0 || bad != 0 {
				t.Errorf("%d of %d pooled buffers not given back (%d put back twice)", out, gets, bad)
			}
		})
	}
}
