package server_test

import (
	"context"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/cpuserve/server"
	"github.com/prism-serve/prism/models"
	"google.golang.org/grpc/status"
)

// TestDictionaryFrames: with Options.DictionaryFrames every model family
// scores as model.onnx does within 1e-5, bit for bit as with plain
// frames, and for the models whose lookups qualify the frame is smaller
// where ids repeat; with the small tables' distinct ids found by direct
// indexing (the default) and by hashing alike.
func TestDictionaryFrames(t *testing.T) {
	f := setup(t)
	for _, bound := range []int64{server.DirectMaxRows(), 0} {
		restore := server.SetDirectMaxRows(bound)
		for i, name := range testModels {
			t.Run(fmt.Sprintf("%s/direct<=%d", name, bound), func(t *testing.T) {
				for _, n := range []int{1, 7, 32, 300} {
					b := f.batch(t, name, n, uint64(900+i*10+n))
					want := f.checkScores(t, name, b, f.request(name, b)).GetScores()
					plain, _ := f.dense.lastFrame()
					got := f.checkScoresVia(t, f.dictClient, name, b, f.request(name, b)).GetScores()
					dict, _ := f.dense.lastFrame()
					if n == 300 {
						t.Logf("direct indexing up to %d rows, n=%d: frame %d bytes plain, %d with dictionaries", bound, n, plain, dict)
					}
					if dict > plain+4096 {
						t.Errorf("n=%d: frame %d bytes with dictionaries, %d plain", n, dict, plain)
					}
					for s := range want {
						if math.Float32bits(got[s]) != math.Float32bits(want[s]) {
							t.Fatalf("n=%d: sample %d scores %v with dictionaries, %v plain", n, s, got[s], want[s])
						}
					}
				}
			})
		}
		restore()
	}
}

// TestDictionaryFramesBadID: an id outside its table is refused as it is
// with plain frames (direct indexing declines the column, the store
// refuses the id) and named at its position in the request, and the
// server serves the next micro-batch.
func TestDictionaryFramesBadID(t *testing.T) {
	f := setup(t)
	name := testModels[0]
	b := f.batch(t, name, 64, 77)
	for _, bad := range []int64{1 << 40, -1} {
		errs := make([]error, 2)
		for k, c := range []prismv1.EmbeddingTierClient{f.client, f.dictClient} {
			req := f.request(name, b)
			for _, in := range req.Candidates.Inputs {
				if in.Ids != nil && in.Name != models.DenseInput {
					in.Ids = append([]int64(nil), in.Ids...)
					for j := 1; j < 5; j++ { // repeats: the bad id is the 2nd distinct
						in.Ids[j] = in.Ids[0]
					}
					in.Ids[5] = bad
					break
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			_, errs[k] = c.Lookup(ctx, req)
			cancel()
		}
		// The same error: the id's position among the request's ids, not
		// among the distinct ids looked up.
		if errs[0] == nil || status.Code(errs[1]) != status.Code(errs[0]) || status.Convert(errs[1]).Message() != status.Convert(errs[0]).Message() {
			t.Errorf("id %d: plain %v, with dictionaries %v", bad, errs[0], errs[1])
		}
	}
	f.checkScoresVia(t, f.dictClient, name, b, f.request(name, b))
}
