package main

import (
	"context"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/internal/auth"
	"github.com/prism-serve/prism/internal/ort"
	"github.com/prism-serve/prism/internal/readyline"
	"github.com/prism-serve/prism/models"
	"github.com/prism-serve/prism/models/exporters"
	"github.com/prism-serve/prism/plan"
)

// TestExporterPatternsEndToEnd: models written the way exporters write
// them (a packed id tensor with TorchRec offsets into a fused table, one
// float input carrying dense values and ids, ids hashed, 1-based,
// clamped and defaulted) partition and verify with prism partition
// --verify, serve through prism up with their inputs as the model
// declares them (a packed input is one input of F values per
// candidate), score the same as prism score on the whole model within
// 1e-5, and take prism loadgen --plan.
func TestExporterPatternsEndToEnd(t *testing.T) {
	if err := ort.Init(); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	names := []string{"torchrec-fused-offsets", "dlrm-single-float-input", "ts-id-arithmetic"}
	args := []string{"up", "--addr", "127.0.0.1:0", "--db", filepath.Join(dir, "db")}
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
		out, err := run(t, nil, "partition", model, "-o", part, "--verify", "300")
		if err != nil || !strings.Contains(out, "verified on 300 samples") {
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
			if out, err := run(t, nil, "score", model, "--plan", part, "--samples", strconv.Itoa(n), "--batch", strconv.Itoa(n),
				"--seed", "7", "--scores-out", scores); err != nil {
				t.Fatalf("score: %v\n%s", err, out)
			}
			want := readScores(t, scores)
			// The same samples prism score drew, sent as the plan says.
			p, err := plan.Read(part)
			if err != nil {
				t.Fatal(err)
			}
			sig, err := models.PlanSignature(p)
			if err != nil {
				t.Fatal(err)
			}
			src, err := models.NewSynthetic(sig, models.SyntheticOptions{Seed: 7, ZipfS: 1.05})
			if err != nil {
				t.Fatal(err)
			}
			b, _ := src.Next(n)
			req := toRequest(name, b, nil)
			if len(req.Candidates.Inputs) != len(p.Inputs) {
				t.Fatalf("%d request inputs for the plan's %d", len(req.Candidates.Inputs), len(p.Inputs))
			}
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
			out, err := run(t, nil, "loadgen", "--target", up.addr, "--model", name, "--plan", part, "--candidates", "8",
				"--rate", "200", "--max-requests", "20", "--duration", "5s", "--quiet", "--certs", certs)
			if err != nil || !strings.Contains(out, "ok 20  errors 0") {
				t.Errorf("loadgen: %v\n%s", err, out)
			}
		})
	}
}

func readScores(t *testing.T, path string) []float64 {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []float64
	for _, line := range strings.Fields(string(b)) {
		v, err := strconv.ParseFloat(line, 64)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, v)
	}
	return out
}
