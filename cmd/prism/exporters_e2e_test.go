package main

import (
	"context"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/internal/auth"
	"github.com/prism-serve/prism/internal/modelrun"
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
// 1e-5, and take prism loadgen --plan. Among them: ids the model
// declares int32, a model exported with a fixed batch that partition
// rewrites to a symbolic one (served at 96 candidates, exported at 8),
// and one whose fixed batch stays, on the embedding side and (the same
// model partitioned with the blocking node forced to dense.onnx, as
// ts-fixed-batch-row-bias-dense) on the dense side: served in
// micro-batches of exactly its 4, the last padded by the router, so a
// request of 13 candidates scores as the first 13 of prism score's; and ids
// made by integer work the native pre-lookup ops do not cover (hashing,
// floor division, shifts and masks), which the embedding tier runs as
// pre.onnx through ONNX Runtime; and NVIDIA HugeCTR's models
// (hugectr2onnx: [batch, slots, nnz] hash keys through one key map
// shared by every table), whose samples are drawn among the keys
// plan.json lists for each key input.
func TestExporterPatternsEndToEnd(t *testing.T) {
	t.Parallel()
	exportersServed(t, []string{"torchrec-fused-offsets", "dlrm-single-float-input", "ts-id-arithmetic",
		"torchrec-int32-ids", "ts-fixed-batch-view", "ts-fixed-batch-row-bias", "ts-fixed-batch-row-bias-dense",
		"ts-hash-mul-add-mod", "ts-floor-div-bucket", "ts-bitmask-shift", "hugectr-wdl", "hugectr-dlrm",
		"hugectr-dcn", "hugectr-deepfm", "hugectr-deepfm-v32"})
}

// TestExporterPaddleEndToEnd: PaddleRec's Wide&Deep and DeepFM as
// Paddle2ONNX writes them (one int64 [-1, 1] input per slot, weights as
// Constant nodes, DeepFM's padding_idx as a Mul by a mask before each
// Gather, the slots concatenated into one id tensor by pre.onnx)
// partition and verify, serve through prism up with one input per slot,
// score as prism score does on the whole model within 1e-5, and take
// prism loadgen --plan.
func TestExporterPaddleEndToEnd(t *testing.T) {
	t.Parallel()
	exportersServed(t, []string{"paddle-wide-deep", "paddle-wide-deep-lookup-v1", "paddle-deepfm"})
}

// exportersServed partitions the corpus models names, serves them all
// from one prism up and checks each (TestExporterPatternsEndToEnd).
func exportersServed(t *testing.T, names []string) {
	if err := ort.Init(); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	// NAME-dense: the model NAME under that name, its blocking node
	// forced to the dense side.
	corpus := func(name string) (*exporters.Model, []string) {
		base, dense := strings.CutSuffix(name, "-dense")
		m := exporters.ByName(base, 11)
		if !dense {
			return m, nil
		}
		m.Proto.Graph.Name = name
		for _, kv := range m.Proto.MetadataProps {
			if kv.GetKey() == "prism.model" {
				kv.Value = name
			}
		}
		for _, nd := range m.Proto.Graph.Node {
			if slices.Contains(nd.Output, m.BlockedBy) {
				return m, []string{"--force-gpu", nd.GetName()}
			}
		}
		panic("no node makes " + m.BlockedBy)
	}
	args := []string{"up", "--addr", "127.0.0.1:0", "--db", filepath.Join(dir, "db")}
	parts := map[string]string{}
	for _, name := range names {
		m, force := corpus(name)
		model := filepath.Join(dir, name, "model.onnx")
		if err := os.MkdirAll(filepath.Dir(model), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := m.Write(model); err != nil {
			t.Fatal(err)
		}
		part := filepath.Join(dir, name+"-part")
		out, err := run(t, nil, append([]string{"partition", model, "-o", part, "--verify", "296"}, force...)...)
		if err != nil || !strings.Contains(out, "verified on 296 samples") {
			t.Fatalf("partition %s: %v\n%s", name, err, out)
		}
		if m.Batch > 0 && !strings.Contains(out, "verified at batch sizes") {
			t.Fatalf("partition %s: exported at batch %d, but verify did not say at which sizes it ran\n%s", name, m.Batch, out)
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
			n, batch, candidates := 97, 97, "8"
			m, _ := corpus(name)
			if m.Batch > 0 {
				// prism score runs the whole model at its exported batch.
				batch = int(m.Batch)
				n = 12 * batch
				if m.BlockedBy != "" {
					// Kept at its batch: the router cuts any request into
					// micro-batches of exactly that size.
					n, candidates = 4*batch, "7"
				}
			}
			scores := filepath.Join(dir, name+"-scores.txt")
			if out, err := run(t, nil, "score", model, "--plan", part, "--samples", strconv.Itoa(n), "--batch", strconv.Itoa(batch),
				"--seed", "7", "--scores-out", scores); err != nil {
				t.Fatalf("score: %v\n%s", err, out)
			}
			want := readScores(t, scores)
			// The same samples prism score drew, sent as the plan says.
			p, err := plan.Read(part)
			if err != nil {
				t.Fatal(err)
			}
			b := scoredSamples(t, p, n)
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
			if p.FixedBatch > 0 {
				if wantDense := strings.HasSuffix(name, "-dense"); (p.DenseFixedBatch() > 0) != wantDense {
					t.Fatalf("dense.onnx fixed at %d, want it fixed: %v", p.DenseFixedBatch(), wantDense)
				}
				// Not a multiple of the batch: the last micro-batch padded.
				k := 3*int(p.FixedBatch) + 1
				resp, err := rec.Recommend(ctx, toRequest(name, b.Slice(0, k), nil))
				if err != nil {
					t.Fatalf("a request of %d candidates for a model fixed at %d: %v", k, p.FixedBatch, err)
				}
				if len(resp.GetScores()) != k {
					t.Fatalf("%d scores for %d candidates", len(resp.GetScores()), k)
				}
				for i, v := range resp.GetScores() {
					if d := math.Abs(float64(v) - want[i]); d > 1e-5 {
						t.Fatalf("padded request: score %d differs from prism score by %g", i, d)
					}
				}
			}
			out, err := run(t, nil, "loadgen", "--target", up.addr, "--model", name, "--plan", part, "--candidates", candidates,
				"--rate", "200", "--max-requests", "20", "--duration", "5s", "--quiet", "--certs", certs)
			if err != nil || !strings.Contains(out, "ok 20  errors 0") {
				t.Errorf("loadgen: %v\n%s", err, out)
			}
		})
	}
}

// TestExporterMultiTaskServed: a multi-task model (HugeCTR's label_dim
// 2: one output [batch, 2], a sigmoid per task; and HugeCTR's
// shared-bottom sample, one output per task; and a PyTorch module
// returning a tuple (ctr [batch, 1], cvr [batch]); and PaddleRec's ESMM
// through Paddle2ONNX, its CTR softmax head [batch, 2] served, the
// padded bags pooled from a table with padding_idx) partitions and verifies,
// and prism up serves it: every candidate's two scores, in
// RecommendResponse.task_scores (tasks 2, candidate-major) and task 0's
// in scores, equal prism score's on the whole model within 1e-5, over
// several micro-batches, on Recommend and RecommendStream; prism
// loadgen, which reads scores only, runs on it.
func TestExporterMultiTaskServed(t *testing.T) {
	t.Parallel()
	if err := ort.Init(); err != nil {
		t.Fatal(err)
	}
	for _, m := range []*exporters.Model{exporters.HugeCTRMultiTask(11), exporters.HugeCTRSharedBottom(11), exporters.TorchTupleHeads(11), exporters.PaddleMultiTask(11)} {
		t.Run(m.Name, func(t *testing.T) {
			t.Parallel()
			multiTaskServed(t, m)
		})
	}
}

func multiTaskServed(t *testing.T, m *exporters.Model) {
	dir := t.TempDir()
	model := filepath.Join(dir, "mt", "model.onnx")
	if err := os.MkdirAll(filepath.Dir(model), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := m.Write(model); err != nil {
		t.Fatal(err)
	}
	part := filepath.Join(dir, "mt-part")
	if out, err := run(t, nil, "partition", model, "-o", part, "--verify", "64"); err != nil || !strings.Contains(out, "verified on 64 samples") {
		t.Fatalf("partition: %v\n%s", err, out)
	}
	p, err := plan.Read(part)
	if err != nil {
		t.Fatal(err)
	}
	const n, tasks = 97, 2
	if k, err := p.Tasks(); err != nil || k != tasks {
		t.Fatalf("plan tasks %d, %v; want %d", k, err, tasks)
	}
	scoresOut := filepath.Join(dir, "mt-scores.txt")
	if out, err := run(t, nil, "score", model, "--plan", part, "--samples", strconv.Itoa(n), "--batch", strconv.Itoa(n),
		"--seed", "7", "--scores-out", scoresOut); err != nil || !strings.Contains(out, "sample 0: scores ") {
		t.Fatalf("score: %v\n%s", err, out)
	}
	want := readScores(t, scoresOut)
	if len(want) != n*tasks {
		t.Fatalf("prism score wrote %d values for %d samples of %d tasks", len(want), n, tasks)
	}
	up := startProc(t, readyline.Up, "up", "--addr", "127.0.0.1:0", "--db", filepath.Join(dir, "db"), "--dense-workers", "1", "--micro-batch", "16", "--model", part)
	certs := filepath.Join(dir, "certs")
	rec := prismv1.NewRecommenderClient(dial(t, up.addr, certs, auth.Admin))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	name := p.Model.Name
	req := toRequest(name, scoredSamples(t, p, n), nil)
	names, err := p.TaskNames()
	if err != nil {
		t.Fatal(err)
	}
	check := func(how string, resp *prismv1.RecommendResponse) {
		t.Helper()
		if resp.GetTasks() != tasks || len(resp.GetTaskScores()) != n*tasks || len(resp.GetScores()) != n {
			t.Fatalf("%s: tasks %d, %d task scores, %d scores; want %d, %d, %d", how, resp.GetTasks(), len(resp.GetTaskScores()), len(resp.GetScores()), tasks, n*tasks, n)
		}
		if !slices.Equal(resp.GetTaskNames(), names) {
			t.Errorf("%s: task names %q, want the plan's %q", how, resp.GetTaskNames(), names)
		}
		var worst float64
		for i, v := range resp.GetTaskScores() {
			worst = max(worst, math.Abs(float64(v)-want[i]))
		}
		for i, v := range resp.GetScores() {
			worst = max(worst, math.Abs(float64(v)-want[i*tasks]))
		}
		if worst > 1e-5 {
			t.Fatalf("%s: served scores differ from prism score by %g", how, worst)
		}
	}
	resp, err := rec.Recommend(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	check("Recommend", resp)
	stream, err := rec.RecommendStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(req); err != nil {
		t.Fatal(err)
	}
	sresp, err := stream.Recv()
	if err != nil || sresp.GetError() != nil {
		t.Fatalf("RecommendStream: %v, %v", err, sresp.GetError())
	}
	check("RecommendStream", sresp)
	stream.CloseSend()
	out, err := run(t, nil, "loadgen", "--target", up.addr, "--model", name, "--plan", part, "--candidates", "8",
		"--rate", "200", "--max-requests", "20", "--duration", "5s", "--quiet", "--certs", certs)
	if err != nil || !strings.Contains(out, "ok 20  errors 0") {
		t.Errorf("loadgen: %v\n%s", err, out)
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

// scoredSamples are the n samples prism score --plan --seed 7 draws for
// plan p (all at once, whatever its --batch), to send as the plan says
// and compare with its scores.
func scoredSamples(t *testing.T, p *plan.Plan, n int) *models.Batch {
	t.Helper()
	sig, err := models.PlanSignature(p)
	if err != nil {
		t.Fatal(err)
	}
	src, err := models.NewSynthetic(sig, models.SyntheticOptions{Seed: 7, ZipfS: 1.05})
	if err != nil {
		t.Fatal(err)
	}
	b, err := src.Next(n)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestTasksRollout: a multi-task model partitioned twice from one
// export, serving both tasks (ctr, cvr) and, with --tasks ctr, one,
// runs side by side (as while a rollout switches between them) on real
// processes: a worker of each plan in each tier. The plans have other
// contents, so every request is scored by the workers of one plan, and
// answered with that plan's tasks; before, both announced one content,
// the router split a request's micro-batches over both dense workers,
// and the request failed (Internal: micro-batches answered 2 and 1
// tasks a candidate).
func TestTasksRollout(t *testing.T) {
	t.Parallel()
	if err := ort.Init(); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	model := filepath.Join(dir, "mt", "model.onnx")
	if err := os.MkdirAll(filepath.Dir(model), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := exporters.TorchTupleHeads(11).Write(model); err != nil {
		t.Fatal(err)
	}
	var parts [2]string
	contents := map[string]int{} // content: tasks
	for i, tasks := range []string{"ctr,cvr", "ctr"} {
		parts[i] = filepath.Join(dir, "part-"+strconv.Itoa(i))
		if out, err := run(t, nil, "partition", model, "-o", parts[i], "--tasks", tasks); err != nil {
			t.Fatalf("partition --tasks %s: %v\n%s", tasks, err, out)
		}
		p, err := plan.Read(parts[i])
		if err != nil {
			t.Fatal(err)
		}
		c, err := p.Content(parts[i])
		if err != nil {
			t.Fatal(err)
		}
		k, _ := p.Tasks()
		contents[c] = k
	}
	if len(contents) != 2 {
		t.Errorf("the plans serving 2 and 1 tasks have one content: %v", contents)
	}
	p, err := plan.Read(parts[0])
	if err != nil {
		t.Fatal(err)
	}
	mono, err := ort.NewSession(model, ort.SessionOptions{IntraOpThreads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer mono.Close()
	const n = 97
	b := scoredSamples(t, p, n)
	want, err := mono.Run(modelrun.Inputs(b))
	if err != nil {
		t.Fatal(err)
	}
	certs := newCerts(t)
	router := startProc(t, readyline.Router, "serve", "router", "--certs", certs, "--addr", "127.0.0.1:0", "--heartbeat", "200ms", "--micro-batch", "16")
	for i, part := range parts {
		startProc(t, readyline.Embedding, "serve", "embedding", "--certs", certs, "--plan", part,
			"--db", filepath.Join(dir, "db-"+strconv.Itoa(i)), "--router", router.addr)
		startProc(t, readyline.Dense, "serve", "dense", "--certs", certs, "--plan", part, "--router", router.addr)
	}
	conn := dial(t, router.addr, certs, auth.Admin)
	reg := prismv1.NewRegistryClient(conn)
	rec := prismv1.NewRecommenderClient(conn)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		healthy := 0
		if ws, err := reg.List(context.Background(), &prismv1.ListRequest{}); err == nil {
			for _, w := range ws.GetWorkers() {
				if w.GetHealthy() {
					healthy++
				}
			}
		}
		if healthy == 4 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d workers healthy, want 4", healthy)
		}
	}
	seen := map[int32]int{}
	for range 12 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		resp, err := rec.Recommend(ctx, toRequest(p.Model.Name, b, nil))
		cancel()
		if err != nil {
			t.Fatalf("Recommend: %v", err)
		}
		k, ok := contents[resp.GetContent()]
		if !ok || max(int(resp.GetTasks()), 1) != k {
			t.Fatalf("answered %d tasks a candidate for content %q; the plans' contents: %v", resp.GetTasks(), resp.GetContent(), contents)
		}
		if worst := maxAbsError(resp.GetScores(), want[0]); worst > 1e-5 {
			t.Fatalf("ctr differs from the whole model's by %g", worst)
		}
		for i, v := range resp.GetTaskScores() {
			if i%2 == 1 && math.Abs(float64(v-want[1][i/2])) > 1e-5 {
				t.Fatalf("candidate %d: cvr %g, the whole model's %g", i/2, v, want[1][i/2])
			}
		}
		seen[resp.GetTasks()]++
	}
	t.Logf("responses by tasks: %v", seen)
}
