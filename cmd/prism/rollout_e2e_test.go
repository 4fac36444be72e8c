package main

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/internal/auth"
	"github.com/prism-serve/prism/internal/modelrun"
	"github.com/prism-serve/prism/internal/ort"
	"github.com/prism-serve/prism/internal/readyline"
	"github.com/prism-serve/prism/models"
	"github.com/prism-serve/prism/plan"
)

// TestRetrainedRollout: a retrained model (same name, shapes and
// inputs; other weights) rolls out tier by tier on real processes. Every
// response is the monolith's of the content it names, within 1e-5: the
// new plan's embedding worker takes no lookup before a dense worker of
// its plan is live (its rows through the old dense.onnx would score
// garbage), no request mixes the two models, and once the old pair is
// gone a request pinned to the old content is NotFound.
func TestRetrainedRollout(t *testing.T) {
	t.Parallel()
	if err := ort.Init(); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	type trained struct {
		part    string
		content string
		mono    *ort.Session
	}
	var plans [2]trained
	var cfg models.Config
	for i, seed := range []string{"5", "6"} {
		mdir := filepath.Join(dir, "model-"+seed)
		if out, err := run(t, nil, "models", "build", "dlrm-tiny", "-o", mdir, "--seed", seed); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		part := filepath.Join(dir, "part-"+seed)
		if out, err := run(t, nil, "partition", filepath.Join(mdir, "model.onnx"), "-o", part); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		p, err := plan.Read(part)
		if err != nil {
			t.Fatal(err)
		}
		c, err := p.Content(part)
		if err != nil || c == "" {
			t.Fatalf("content of %s: %q, %v", part, c, err)
		}
		mono, err := ort.NewSession(filepath.Join(mdir, "model.onnx"), ort.SessionOptions{IntraOpThreads: 1})
		if err != nil {
			t.Fatal(err)
		}
		defer mono.Close()
		plans[i] = trained{part, c, mono}
	}
	if plans[0].content == plans[1].content {
		t.Fatal("two trainings of the model have one content")
	}
	lookup, err := models.Lookup("dlrm-tiny")
	if err != nil {
		t.Fatal(err)
	}
	cfg = lookup.Config
	certs := newCerts(t)
	router := startProc(t, readyline.Router, "serve", "router", "--certs", certs, "--addr", "127.0.0.1:0", "--heartbeat", "200ms", "--micro-batch", "16")
	embedding := func(i int) *proc {
		return startProc(t, readyline.Embedding, "serve", "embedding", "--certs", certs, "--plan", plans[i].part,
			"--db", filepath.Join(dir, "db", string(rune('a'+i))), "--router", router.addr)
	}
	dense := func(i int) *proc {
		return startProc(t, readyline.Dense, "serve", "dense", "--certs", certs, "--plan", plans[i].part, "--router", router.addr)
	}
	conn := dial(t, router.addr, certs, auth.Admin)
	reg := prismv1.NewRegistryClient(conn)
	rec := prismv1.NewRecommenderClient(conn)
	// waitContents waits until the healthy workers of each role announce
	// exactly the contents given.
	waitContents := func(emb, den []string) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			ws, err := reg.List(context.Background(), &prismv1.ListRequest{})
			if err == nil {
				got := map[prismv1.Role]map[string]bool{prismv1.Role_ROLE_EMBEDDING: {}, prismv1.Role_ROLE_DENSE: {}}
				for _, w := range ws.GetWorkers() {
					if w.GetHealthy() {
						got[w.GetRole()][w.GetContent()[cfg.Name]] = true
					}
				}
				same := func(have map[string]bool, want []string) bool {
					if len(have) != len(want) {
						return false
					}
					for _, c := range want {
						if !have[c] {
							return false
						}
					}
					return true
				}
				if same(got[prismv1.Role_ROLE_EMBEDDING], emb) && same(got[prismv1.Role_ROLE_DENSE], den) {
					return
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("the registry never listed embedding contents %v and dense contents %v", emb, den)
			}
		}
	}
	src, _ := models.NewSynthetic(cfg.Signature(), models.SyntheticOptions{Seed: 9})
	b, _ := src.Next(64) // four micro-batches of 16
	want := map[string][]float32{}
	for _, p := range plans {
		out, err := p.mono.Run(modelrun.Inputs(b))
		if err != nil {
			t.Fatal(err)
		}
		want[p.content] = out[0]
	}
	// score sends n requests and counts the responses by content, each
	// checked against its content's monolith.
	score := func(n int, content string) map[string]int {
		t.Helper()
		seen := map[string]int{}
		for range n {
			req := toRequest(cfg.Name, b, nil)
			req.Content = content
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			resp, err := rec.Recommend(ctx, req)
			cancel()
			if err != nil {
				t.Fatalf("Recommend: %v", err)
			}
			w, ok := want[resp.GetContent()]
			if !ok {
				t.Fatalf("response names content %q, neither plan's (%s, %s)", resp.GetContent(), plans[0].content, plans[1].content)
			}
			if worst := maxAbsError(resp.GetScores(), w); worst > 1e-5 {
				t.Fatalf("content %s: max abs error %g against its monolith: two models in one response, or rows through another plan's dense.onnx", resp.GetContent(), worst)
			}
			seen[resp.GetContent()]++
		}
		return seen
	}
	c0, c1 := plans[0].content, plans[1].content

	e0 := embedding(0)
	d0 := dense(0)
	waitContents([]string{c0}, []string{c0})
	if seen := score(10, ""); seen[c0] != 10 {
		t.Fatalf("the first plan alone: %v", seen)
	}
	// The retrained plan's embedding worker first: idle, it would win
	// every pick by load, but no dense worker scores for it yet.
	embedding(1)
	waitContents([]string{c0, c1}, []string{c0})
	if seen := score(20, ""); seen[c0] != 20 {
		t.Fatalf("with only the new embedding worker up: %v, want every request by the first plan", seen)
	}
	// Its dense worker: both pairs serve, each request by one plan, and
	// a pin to either content is served by it.
	dense(1)
	waitContents([]string{c0, c1}, []string{c0, c1})
	score(20, "")
	for _, c := range []string{c0, c1} {
		if seen := score(5, c); seen[c] != 5 {
			t.Fatalf("pinned to %s: %v", c, seen)
		}
	}
	// The old pair goes: the new plan alone, and a pin to the old
	// content is NotFound.
	e0.cmd.Process.Kill()
	d0.cmd.Process.Kill()
	waitContents([]string{c1}, []string{c1})
	if seen := score(10, ""); seen[c1] != 10 {
		t.Fatalf("the new plan alone: %v", seen)
	}
	req := toRequest(cfg.Name, b, nil)
	req.Content = c0
	if _, err := rec.Recommend(context.Background(), req); status.Code(err) != codes.NotFound {
		t.Fatalf("pinned to the content gone: %v, want NotFound", err)
	}
}
