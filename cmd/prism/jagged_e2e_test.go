package main

import (
	"context"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/internal/auth"
	"github.com/prism-serve/prism/internal/ort"
	"github.com/prism-serve/prism/internal/readyline"
	"github.com/prism-serve/prism/models"
	"github.com/prism-serve/prism/models/exporters"
	"github.com/prism-serve/prism/plan"
)

// TestEmbeddingBagLoopEndToEnd: nn.EmbeddingBag with offsets as the
// TorchScript exporter writes it (a Loop over the bags; sum, mean, max,
// per-sample weights, include_last_offset both ways) and as the dynamo
// exporter decomposes it (rows gathered at once, a Loop carrying a
// sequence, ConcatFromSequence) partitions and
// verifies, serves through prism up with the model's own inputs (every
// candidate's ids concatenated, one offset per candidate, the weights
// one per id), cut by the router into micro-batches of 10 candidates by
// the offsets, scores equal to prism score on the whole model within
// 1e-5, pools empty bags to zeros (the float64 reference), refuses bad
// offsets with InvalidArgument, and takes prism
// loadgen --plan (bags of random length).
func TestEmbeddingBagLoopEndToEnd(t *testing.T) {
	t.Parallel()
	if err := ort.Init(); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	var names []string
	for _, m := range append(exporters.LoopBags(11), exporters.DynamoBags(11)...) {
		names = append(names, m.Name)
	}
	args := []string{"up", "--addr", "127.0.0.1:0", "--db", filepath.Join(dir, "db"), "--micro-batch", "10"}
	parts := map[string]string{}
	for _, name := range names {
		m := exporters.ByName(name, 11)
		model := filepath.Join(dir, name, "model.onnx")
		if err := os.MkdirAll(filepath.Dir(model), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := m.Write(model); err != nil {
			t.Fatal(err)
		}
		part := filepath.Join(dir, name+"-part")
		out, err := run(t, nil, "partition", model, "-o", part, "--verify", "296")
		if err != nil || !strings.Contains(out, "verified on 296 samples") {
			t.Fatalf("partition %s: %v\n%s", name, err, out)
		}
		parts[name] = part
		args = append(args, "--model", part)
	}
	up := startProc(t, readyline.Up, args...)
	certs := filepath.Join(dir, "certs")
	rec := prismv1.NewRecommenderClient(dial(t, up.addr, certs, auth.Admin))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			model, part := filepath.Join(dir, name, "model.onnx"), parts[name]
			const n = 97
			scores := filepath.Join(dir, name+"-scores.txt")
			if out, err := run(t, nil, "score", model, "--plan", part, "--samples", "97", "--batch", "97",
				"--seed", "7", "--scores-out", scores); err != nil {
				t.Fatalf("score: %v\n%s", err, out)
			}
			want := readScores(t, scores)
			p, err := plan.Read(part)
			if err != nil {
				t.Fatal(err)
			}
			if len(p.Jagged()) == 0 {
				t.Fatalf("plan has no jagged inputs: %+v", p.Inputs)
			}
			b := scoredSamples(t, p, n)
			req := toRequest(name, b, nil)
			resp, err := rec.Recommend(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			if len(resp.GetScores()) != n || len(want) != n {
				t.Fatalf("%d scores served, %d from prism score, want %d", len(resp.GetScores()), len(want), n)
			}
			var worst float64
			for i, v := range resp.GetScores() {
				worst = max(worst, math.Abs(float64(v)-want[i]))
			}
			if worst > 1e-5 {
				t.Fatalf("served scores differ from prism score by %g", worst)
			}
			// Empty bags pool to zeros, as torch.nn.EmbeddingBag makes them
			// (the whole model in ONNX Runtime does not for mean and max):
			// candidates 2 and 40 get none, their ids go to the bag
			// before, against the float64 reference.
			eb := models.Batch{N: b.N, Sig: b.Sig, Columns: slices.Clone(b.Columns)}
			off := slices.Clone(b.Columns[1].I64)
			off[2], off[40] = off[3], off[41]
			eb.Columns[1].I64 = off
			ref, err := exporters.ByName(name, 11).Reference(&eb)
			if err != nil {
				t.Fatal(err)
			}
			resp, err = rec.Recommend(ctx, toRequest(name, &eb, nil))
			if err != nil {
				t.Fatal(err)
			}
			worst = 0
			for i, v := range resp.GetScores() {
				worst = max(worst, math.Abs(float64(v)-ref[i]))
			}
			if worst > 1e-5 || len(resp.GetScores()) != n {
				t.Fatalf("with empty bags: %d scores differ from the float64 reference by %g", len(resp.GetScores()), worst)
			}
			// Offsets that decrease, and offsets that do not start at 0.
			for _, bad := range []struct {
				at   int
				v    int64
				want string
			}{{5, 0, "offsets never decrease"}, {0, 1, "the first offset is 1, want 0"}} {
				r := proto.Clone(req).(*prismv1.RecommendRequest)
				for _, in := range r.Candidates.Inputs {
					if in.Name == "offsets" {
						in.Ids[bad.at] = bad.v
					}
				}
				_, err := rec.Recommend(ctx, r)
				if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), bad.want) {
					t.Fatalf("bad offsets: got %v, want InvalidArgument saying %q", err, bad.want)
				}
			}
			out, err := run(t, nil, "loadgen", "--target", up.addr, "--model", name, "--plan", part, "--candidates", "uniform:5-40",
				"--rate", "200", "--max-requests", "20", "--duration", "5s", "--quiet", "--certs", certs)
			if err != nil || !strings.Contains(out, "ok 20  errors 0") {
				t.Errorf("loadgen: %v\n%s", err, out)
			}
		})
	}
}
