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
	"github.com/prism-serve/prism/models/exporters"
	"github.com/prism-serve/prism/plan"
)

// TestQuantizedExportersEndToEnd: models after ONNX Runtime's
// quantization tools and onnxconverter-common's float16 conversion
// (exporters.Quantized: a table dequantized before its Gather, the
// rows of an 8-bit table dequantized after it, float16 tables with the
// model's inputs and outputs kept float) partition with every table a
// lookup and verify, serve through prism up in micro-batches of 16, and
// score the same as prism score on the whole model within 1e-5.
// quantize_dynamic's models (DynamicQuantizeLinear: one scale for the
// whole batch) partition with --allow-batch-dependent only, and score
// the same as prism score at the batch they are served in: one request
// of 16 candidates, one micro-batch, alone in the dense tier.
func TestQuantizedExportersEndToEnd(t *testing.T) {
	t.Parallel()
	if err := ort.Init(); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	names := []string{"ort-dynamic-quant", "ort-dynamic-quant-per-channel", "ort-qdq-static", "ort-qdq-gather-int8", "fp16-keep-io-types"}
	args := []string{"up", "--addr", "127.0.0.1:0", "--db", filepath.Join(dir, "db"), "--dense-workers", "1", "--micro-batch", "16"}
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
		if dynamic(name) {
			if err == nil || !strings.Contains(out, "--allow-batch-dependent") || !strings.Contains(out, `DynamicQuantizeLinear "dense_QuantizeLinear"`) {
				t.Fatalf("partition %s without --allow-batch-dependent: %v\n%s", name, err, out)
			}
			out, err = run(t, nil, "partition", model, "-o", part, "--verify", "296", "--allow-batch-dependent")
		}
		if err != nil || !strings.Contains(out, "verified on 296 samples") {
			t.Fatalf("partition %s: %v\n%s", name, err, out)
		}
		p, err := plan.Read(part)
		if err != nil {
			t.Fatal(err)
		}
		if len(p.Tables) == 0 {
			t.Fatalf("partition %s: no lookups\n%s", name, out)
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
			n := 97
			if dynamic(name) {
				n = 16
			}
			scores := filepath.Join(dir, name+"-scores.txt")
			if out, err := run(t, nil, "score", model, "--plan", part, "--samples", strconv.Itoa(n), "--batch", strconv.Itoa(n),
				"--seed", "7", "--scores-out", scores); err != nil {
				t.Fatalf("score: %v\n%s", err, out)
			}
			want := readScores(t, scores)
			p, err := plan.Read(part)
			if err != nil {
				t.Fatal(err)
			}
			resp, err := rec.Recommend(ctx, toRequest(name, scoredSamples(t, p, n), nil))
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
			t.Logf("served scores differ from prism score by %g at most", worst)
			if worst > 1e-5 {
				t.Fatalf("served scores differ from prism score by %g", worst)
			}
		})
	}
}

// dynamic says whether the Quantized model name is quantize_dynamic's.
func dynamic(name string) bool { return strings.HasPrefix(name, "ort-dynamic-quant") }
