package server_test

import (
	"context"
	"math"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/prism-serve/prism/cpuserve/server"
	"github.com/prism-serve/prism/cpuserve/store"
	"github.com/prism-serve/prism/internal/ort"
	"github.com/prism-serve/prism/models"
	"github.com/prism-serve/prism/models/exporters"
	"github.com/prism-serve/prism/partitioner"
	"github.com/prism-serve/prism/plan"
)

// TestPreONNX: models whose ids come from integer work the native ops
// do not cover run their pre.onnx in the embedding tier and score as
// their float64 reference within 1e-5, at several batch sizes and with
// the inputs pre.onnx reads in the candidates, in the context (it runs
// once, on the context's sample), or some in each (it runs on every
// sample, the context repeated).
func TestPreONNX(t *testing.T) {
	f := setup(t)
	for _, tc := range []struct {
		model string
		ctx   [][]string // context inputs of each request
	}{
		{"ts-hash-mul-add-mod", [][]string{nil, {"ids"}, {"dense"}, {"ids", "dense"}}},
		{"ts-floor-div-bucket", [][]string{nil, {"user"}, {"items"}, {"user", "items"}}},
		{"ts-bitmask-shift", [][]string{nil, {"ids"}, {"x"}, {"ids", "delta"}, {"ids", "delta", "x"}}},
	} {
		t.Run(tc.model, func(t *testing.T) {
			m := f.corpus[tc.model]
			if p := f.dense.models[tc.model].plan; p.PreModel == "" {
				t.Fatalf("the plan has no pre_model: the corpus model no longer needs pre.onnx")
			}
			for i, ctxIn := range tc.ctx {
				for _, n := range []int{1, 7, 300} {
					src, err := models.NewSynthetic(m.Sig, models.SyntheticOptions{Seed: uint64(10*i + n), Uniform: true})
					if err != nil {
						t.Fatal(err)
					}
					b, _ := src.Next(n)
					shareContext(b, ctxIn...)
					want, err := m.Reference(b)
					if err != nil {
						t.Fatal(err)
					}
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					resp, err := f.client.Lookup(ctx, f.request(tc.model, b, ctxIn...))
					cancel()
					if err != nil {
						t.Fatalf("context %v, n=%d: %v", ctxIn, n, err)
					}
					if len(resp.Scores) != n {
						t.Fatalf("context %v: %d scores for %d candidates", ctxIn, len(resp.Scores), n)
					}
					for s, v := range resp.Scores {
						if d := math.Abs(float64(v) - want[s]); d > 1e-5 {
							t.Fatalf("context %v, n=%d: score %d differs from the reference by %g", ctxIn, n, s, d)
						}
					}
				}
			}
		})
	}
	t.Run("bad input", func(t *testing.T) {
		b := f.batch(t, "ts-floor-div-bucket", 3, 1)
		req := f.request("ts-floor-div-bucket", b)
		req.Candidates.Inputs[1].Ids = req.Candidates.Inputs[1].Ids[:5] // items: 5 ids for 3 x 3
		_, err := f.client.Lookup(context.Background(), req)
		expectStatus(t, err, codes.InvalidArgument, `input "items" has 5 values, want 3 x 3`)
	})
}

// TestPreONNXPlanMismatch: a plan whose lookup names a pre_output that
// its pre.onnx does not make is refused at load, naming both.
func TestPreONNXPlanMismatch(t *testing.T) {
	if err := ort.Init(); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	m := exporters.ByName("ts-hash-mul-add-mod", 1)
	path := filepath.Join(dir, "model.onnx")
	if err := m.Write(path); err != nil {
		t.Fatal(err)
	}
	part := filepath.Join(dir, "part")
	if _, err := partitioner.Partition(path, part, partitioner.Options{}); err != nil {
		t.Fatal(err)
	}
	p, err := plan.Read(part)
	if err != nil {
		t.Fatal(err)
	}
	p.Tables[0].Lookups[0].PreOutput = "nope"
	if err := plan.Write(part, p); err != nil {
		t.Fatal(err)
	}
	st, err := store.Open(filepath.Join(dir, "db"), &store.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	srv, err := server.New(context.Background(), st, server.Options{Plans: []string{part}, Threads: 1})
	if err == nil {
		srv.Close()
	}
	if err == nil || !strings.Contains(err.Error(), `pre_output "nope" is not one of its outputs`) {
		t.Fatalf("got %v, want the pre_output named", err)
	}
}
