package server_test

import (
	"context"
	"math"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/internal/modelrun"
)

// TestConcurrentLookupsOwnScores: concurrent Lookups of distinct batches
// of every model family, plain and dictionary-framed, some cancelled
// mid-flight, each get their own batch's scores (a frame or column buffer
// reused under another lookup would give it another's numbers), and
// nothing stays in flight. Run it with -race.
func TestConcurrentLookupsOwnScores(t *testing.T) {
	f := setup(t)
	type job struct {
		model string
		req   *prismv1.LookupRequest
		want  []float32
	}
	var jobs []job
	for i, name := range testModels {
		for k := range 4 {
			b := f.batch(t, name, 5+7*k, uint64(900+10*i+k))
			want, err := f.mono[name].Run(modelrun.Inputs(b))
			if err != nil {
				t.Fatal(err)
			}
			jobs = append(jobs, job{name, f.request(name, b), want[0]})
		}
	}
	var wg sync.WaitGroup
	for round := range 6 {
		for i, j := range jobs {
			client := f.client
			if (i+round)%2 == 1 {
				client = f.dictClient
			}
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				if (i+round)%4 == 0 {
					time.AfterFunc(time.Duration(rand.IntN(2000))*time.Microsecond, cancel)
				}
				resp, err := client.Lookup(ctx, j.req)
				if err != nil {
					if status.Code(err) != codes.Canceled {
						t.Errorf("%s job %d: %v", j.model, i, err)
					}
					return
				}
				for k, w := range j.want {
					if math.Abs(float64(resp.Scores[k]-w)) > 1e-5 {
						t.Errorf("%s job %d round %d sample %d: %v, want %v", j.model, i, round, k, resp.Scores[k], w)
						return
					}
				}
			})
		}
		wg.Wait()
	}
	// A client whose call was cancelled has its answer (Canceled) at
	// once, while the server's handler may still be finishing the
	// lookup: what it holds must be given back, soon, not at once.
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		n := f.srv.Outstanding()
		if n == 0 {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("%d samples still in flight 10 s after every answer", n)
		}
	}
}
