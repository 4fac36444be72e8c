package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/internal/auth"
	"github.com/prism-serve/prism/internal/modelrun"
	pb "github.com/prism-serve/prism/internal/onnxpb"
	"github.com/prism-serve/prism/internal/ort"
	"github.com/prism-serve/prism/internal/readyline"
	"github.com/prism-serve/prism/models"
	"github.com/prism-serve/prism/plan"
)

// TestUpModelNames: prism up waits for a model by the name its workers
// serve it under. A graph without a name (plan.json's model name empty)
// is served under its folder's name: up waited for a model "" that no
// worker announces and timed out ("workers did not all register"). Two
// --model folders of one model name are refused before anything is
// ingested: up ingested the second as another version of the first
// into the same stores (the sharded one's shard stores holding the
// whole model then), and only then did the workers refuse them.
func TestUpModelNames(t *testing.T) {
	t.Parallel()
	if err := ort.Init(); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	partitionOf := func(name string, m *pb.ModelProto) (string, string) {
		t.Helper()
		model := filepath.Join(dir, name, "model.onnx")
		if err := os.MkdirAll(filepath.Dir(model), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := pb.WriteModel(model, m, pb.WriteOptions{}); err != nil {
			t.Fatal(err)
		}
		part := filepath.Join(dir, name+"-part")
		if out, err := run(t, nil, "partition", model, "-o", part); err != nil {
			t.Fatalf("partition: %v\n%s", err, out)
		}
		return model, part
	}

	t.Run("one name twice", func(t *testing.T) {
		_, a := partitionOf("a", rowWiseModel(3))
		_, b := partitionOf("b", rowWiseModel(3))
		if out, err := run(t, nil, "shard", a, "--shards", "2", "--shard-bytes", "90000", "--zipf", "1.05"); err != nil {
			t.Fatalf("shard: %v\n%s", err, out)
		}
		db := filepath.Join(dir, "db-twice")
		out, err := run(t, nil, "up", "--model", a, "--model", b, "--db", db, "--addr", "127.0.0.1:0", "--insecure", "--ready-timeout", "30s")
		if err == nil || !strings.Contains(out, `are both model "main_graph"`) {
			t.Fatalf("prism up of two plans of model main_graph: %v, want it refused naming the model:\n%s", err, out)
		}
		if strings.Contains(out, "ingesting") {
			t.Fatalf("prism up ingested before refusing the plans:\n%s", out)
		}
	})

	t.Run("nameless graph", func(t *testing.T) {
		m := rowWiseModel(3)
		m.Graph.Name = ""
		model, part := partitionOf("nameless", m)
		p, err := plan.Read(part)
		if err != nil {
			t.Fatal(err)
		}
		if p.Model.Name != "" {
			t.Fatalf("plan of a nameless graph named %q: the test wants none", p.Model.Name)
		}
		name := filepath.Base(part)
		u := startCmd(t, exec.Command(prismBin, "up", "--model", part, "--db", filepath.Join(dir, "db-nameless"), "--addr", "127.0.0.1:0",
			"--insecure", "--dense-workers", "1", "--ready-timeout", "20s"), "up", readyline.Up, true, time.Minute)
		rec := prismv1.NewRecommenderClient(dial(t, u.addr, "", auth.Admin))
		mono, err := ort.NewSession(model, ort.SessionOptions{IntraOpThreads: 1})
		if err != nil {
			t.Fatal(err)
		}
		defer mono.Close()
		sig, err := models.PlanSignature(p)
		if err != nil {
			t.Fatal(err)
		}
		src, err := models.NewSynthetic(sig, models.SyntheticOptions{Seed: 3})
		if err != nil {
			t.Fatal(err)
		}
		b, err := src.Next(20)
		if err != nil {
			t.Fatal(err)
		}
		want, err := mono.Run(modelrun.Inputs(b))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		resp, err := rec.Recommend(ctx, toRequest(name, b, nil))
		if err != nil {
			t.Fatal(err)
		}
		if worst := maxAbsError(resp.GetScores(), want[0]); len(resp.GetScores()) != b.N || worst > 1e-5 {
			t.Fatalf("%d scores for %d candidates, max abs error %g against the monolith", len(resp.GetScores()), b.N, worst)
		}
	})
}
