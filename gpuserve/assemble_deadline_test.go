package gpuserve

import (
	"context"
	"math/rand/v2"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/internal/ort"
	"github.com/prism-serve/prism/plan"
)

// heldRunner blocks every run until release is closed.
type heldRunner struct{ started, release chan struct{} }

func (r heldRunner) Run(in []ort.Input) ([][]float32, error) {
	r.started <- struct{}{}
	<-r.release
	return [][]float32{make([]float32, in[0].Shape[0])}, nil
}

// TestAssembleDeadlineWhileScoring: every part came, and a waiting
// part's deadline passes while the assembled frame is being scored. Its
// error must not blame shards for not sending their parts (it names
// none: "shard(s) [] of 2 did not send their part in time").
//
// It runs in a synctest bubble: the waiting part's 300 ms deadline is
// fake time, which passes only once both parts are in and the frame's
// run holds, as the test means. On the wall clock a loaded machine could
// take the 300 ms before the last part was in (1 of 15 runs failed, 3
// copies at once: "last part: ... DeadlineExceeded").
func TestAssembleDeadlineWhileScoring(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ts := startServer(t, Options{Threads: 1})
		p, _ := plan.Read(tinyPlan(t))
		m := ts.dense.models[p.Model.Name]
		r := heldRunner{started: make(chan struct{}, 1), release: make(chan struct{})}
		old := m.batcher
		m.batcher = NewBatcher(m.spec, []Runner{r}, BatchOptions{MaxDelay: time.Microsecond})
		old.Close()
		parts := splitParts(cutTensors(p, 2, rand.New(rand.NewPCG(5, 6))), 2)
		req := func(sh int) *prismv1.ScoreRequest {
			return &prismv1.ScoreRequest{Model: p.Model.Name, Tensors: encode(t, 2, parts[sh]), NumSamples: 2, FanoutKey: "k", Shard: int32(sh), Shards: 2}
		}
		waiting := make(chan error, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			_, err := ts.dense.Score(ctx, req(0))
			waiting <- err
		}()
		time.Sleep(50 * time.Millisecond)
		last := make(chan error, 1)
		go func() {
			_, err := ts.dense.Score(context.Background(), req(1))
			last <- err
		}()
		<-r.started // both parts in: the frame is being scored
		err := <-waiting
		close(r.release)
		if err := <-last; err != nil {
			t.Errorf("last part: %v", err)
		}
		if status.Code(err) != codes.DeadlineExceeded || strings.Contains(err.Error(), "did not send") {
			t.Errorf("waiting part: %v; want DeadlineExceeded that blames no shard", err)
		}
	})
}
