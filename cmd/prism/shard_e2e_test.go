package main

import (
	"context"
	"fmt"
	"math"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/internal/auth"
	"github.com/prism-serve/prism/internal/leview"
	"github.com/prism-serve/prism/internal/modelrun"
	"github.com/prism-serve/prism/internal/ort"
	"github.com/prism-serve/prism/internal/readyline"
	"github.com/prism-serve/prism/models"
	"github.com/prism-serve/prism/plan"
)

// TestShardedTableWise: dlrm-tiny sharded table-wise over three
// embedding workers (prism shard, prism ingest --shard K into three
// stores) scores as the monolith within 1e-5; an update of one table
// goes to the shard holding it and the others take its number; with
// one shard's only worker killed requests fail fast with Unavailable
// naming the shard, and serving resumes once it is back.
func TestShardedTableWise(t *testing.T) {
	if err := ort.Init(); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	model, part, cfg := partitioned(t, dir, "dlrm-tiny")
	// A budget far above the tables' 1 MiB keeps every table whole.
	if out, err := run(t, nil, "shard", part, "--shards", "3", "--shard-bytes", "1MiB", "--zipf", "1.05"); err != nil {
		t.Fatalf("shard: %v\n%s", err, out)
	}
	p, err := plan.Read(part)
	if err != nil {
		t.Fatal(err)
	}
	for _, tp := range p.Sharding.Tables {
		if tp.Placement != plan.TableWise {
			t.Fatalf("table %q placed %s; the test wants table-wise only", tp.Table, tp.Placement)
		}
	}
	for k := range 3 {
		if out, err := run(t, nil, "ingest", part, "--db", filepath.Join(dir, fmt.Sprintf("db%d", k)), "--shard", fmt.Sprint(k)); err != nil {
			t.Fatalf("ingest --shard %d: %v\n%s", k, err, out)
		}
	}
	certs := newCerts(t)
	router := startProc(t, readyline.Router, "serve", "router", "--certs", certs, "--addr", "127.0.0.1:0", "--heartbeat", "200ms", "--micro-batch", "64", "--update-quorum", "all")
	startProc(t, readyline.Dense, "serve", "dense", "--certs", certs, "--plan", part, "--router", router.addr)
	embedding := func(k int) *proc {
		return startProc(t, readyline.Embedding, "serve", "embedding", "--certs", certs, "--plan", part, "--db", filepath.Join(dir, fmt.Sprintf("db%d", k)), "--router", router.addr)
	}
	shards := []*proc{embedding(0), embedding(1), embedding(2)}
	conn := dial(t, router.addr, certs, auth.Admin)
	reg := prismv1.NewRegistryClient(conn)
	// waitShards waits until the registry lists exactly the shards in
	// want, each holding update seq.
	waitShards := func(want []int, seq int64) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		var last []string
		for time.Now().Before(deadline) {
			ws, err := reg.List(context.Background(), &prismv1.ListRequest{})
			if err == nil {
				got := map[int]bool{}
				last = last[:0]
				for _, w := range ws.GetWorkers() {
					ref := w.GetShards()[cfg.Name]
					if w.GetRole() != prismv1.Role_ROLE_EMBEDDING || ref == nil || ref.GetShards() != 3 {
						continue
					}
					last = append(last, fmt.Sprintf("shard %d seq %d", ref.GetShard(), w.GetUpdateSeq()[cfg.Name]))
					if w.GetUpdateSeq()[cfg.Name] == seq {
						got[int(ref.GetShard())] = true
					}
				}
				if len(got) == len(want) && len(last) == len(want) {
					ok := true
					for _, k := range want {
						ok = ok && got[k]
					}
					if ok {
						return
					}
				}
			}
			time.Sleep(50 * time.Millisecond)
		}
		t.Fatalf("never saw shards %v at update %d (last: %v)", want, seq, last)
	}
	waitShards([]int{0, 1, 2}, 0)
	rec := prismv1.NewRecommenderClient(conn)
	mono, err := ort.NewSession(model, ort.SessionOptions{IntraOpThreads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer mono.Close()
	sig := cfg.Signature()
	check := func(n int, context_ map[string]bool) *prismv1.RecommendRequest {
		t.Helper()
		src, _ := models.NewSynthetic(sig, models.SyntheticOptions{Seed: uint64(n)})
		b, _ := src.Next(n)
		broadcastContext(b, context_)
		want, err := mono.Run(modelrun.Inputs(b))
		if err != nil {
			t.Fatal(err)
		}
		req := toRequest(cfg.Name, b, context_)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		resp, err := rec.Recommend(ctx, req)
		if err != nil {
			t.Fatalf("n=%d: %v", n, err)
		}
		var worst float64
		for i, v := range resp.GetScores() {
			worst = max(worst, math.Abs(float64(v)-float64(want[0][i])))
		}
		if len(resp.GetScores()) != n || worst > 1e-5 {
			t.Fatalf("n=%d: %d scores, max abs error %g against the monolith", n, len(resp.GetScores()), worst)
		}
		return req
	}
	for _, tc := range []struct {
		n   int
		ctx map[string]bool
	}{{1, nil}, {150, nil}, {97, map[string]bool{"dense": true, "cat_0": true}}} {
		check(tc.n, tc.ctx)
	}

	req := check(150, nil)

	// Kill shard 1's only worker: requests fail at once with Unavailable.
	victim := shards[1]
	victim.cmd.Process.Kill()
	victim.cmd.Wait()
	deadline := time.Now().Add(10 * time.Second)
	for {
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := rec.Recommend(ctx, req)
		cancel()
		if el := time.Since(start); el > 3*time.Second {
			t.Fatalf("a request with shard 1 down took %s (%v): not fast", el, err)
		}
		if err == nil {
			t.Fatal("a request with shard 1 down was answered: a partial score")
		}
		if status.Code(err) != codes.Unavailable {
			t.Fatalf("with shard 1 down: %v, want Unavailable", err)
		}
		if strings.Contains(err.Error(), "shard(s) [1] of 3") {
			break // the registry has dropped it: the message names the shard
		}
		if time.Now().After(deadline) {
			t.Fatalf("with shard 1 down: %v; never named the shard", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// It comes back on its store: serving resumes.
	embedding(1)
	waitShards([]int{0, 1, 2}, 0)
	check(150, nil)

	// An update of a table goes to every worker: the shard holding the
	// table writes it, the other two take its number, rows unwritten
	// (one sequence per model). Candidate 0 looks up the updated row.
	table := p.Tables[0].Name
	if in := req.Candidates.Inputs[1]; in.Name != p.Tables[0].Lookups[0].Input {
		t.Fatalf("input 1 is %q, table 0 reads %q", in.Name, p.Tables[0].Lookups[0].Input)
	}
	req.Candidates.Inputs[1].Ids[0] = 1
	before, err := rec.Recommend(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	row := make([]float32, p.Tables[0].Dim)
	for i := range row {
		row[i] = 0.5
	}
	upd := prismv1.NewEmbeddingsClient(conn)
	var ur *prismv1.UpdateResponse
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if ur, err = upd.Update(context.Background(), &prismv1.UpdateRequest{Model: cfg.Name, Table: table, Ids: []int64{1}, Rows: leview.Bytes(row)}); err == nil {
			break
		}
		if status.Code(err) != codes.Unavailable || time.Now().After(deadline) {
			t.Fatalf("update: %v", err)
		}
	}
	if ur.GetWorkers() != 3 {
		t.Errorf("update acknowledged by %d workers, want 3", ur.GetWorkers())
	}
	waitShards([]int{0, 1, 2}, 1)
	after, err := rec.Recommend(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	if after.Scores[0] == before.Scores[0] {
		t.Errorf("candidate 0 scores %v before and after the update of its row", after.Scores[0])
	}
	for i := 1; i < len(after.Scores); i++ {
		if after.Scores[i] != before.Scores[i] && req.Candidates.Inputs[1].Ids[i] != 1 {
			t.Fatalf("candidate %d changed with an update of a row it does not read", i)
		}
	}
}
