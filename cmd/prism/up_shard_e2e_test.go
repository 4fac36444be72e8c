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
	pb "github.com/prism-serve/prism/internal/onnxpb"
	"github.com/prism-serve/prism/internal/readyline"
	"github.com/prism-serve/prism/internal/up"
	"github.com/prism-serve/prism/plan"
)

// TestUpSharded: prism up on a sharded plan ingests each shard into
// its own stores under --db, starts --replicas workers of each shard,
// and serves scores equal to prism score's within 1e-5: dlrm-tiny over
// two shards (every table whole) with two replicas each, and a model
// over three shards with row-wise tables (every partial pooling) and a
// whole one.
func TestUpSharded(t *testing.T) {
	t.Parallel()
	t.Run("table-wise", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		model, part, _ := partitioned(t, dir, "dlrm-tiny")
		upSharded(t, dir, model, part, []string{"--shards", "2", "--shard-bytes", "1MiB", "--zipf", "1.05"}, 2, 2, 0)
	})
	t.Run("row-wise", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		model := filepath.Join(dir, "rowwise", "model.onnx")
		if err := os.MkdirAll(filepath.Dir(model), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := pb.WriteModel(model, rowWiseModel(3), pb.WriteOptions{}); err != nil {
			t.Fatal(err)
		}
		part := filepath.Join(dir, "rowwise-part")
		if out, err := run(t, nil, "partition", model, "-o", part); err != nil {
			t.Fatalf("partition: %v\n%s", err, out)
		}
		// 50 KB a shard: emb_w and emb_m go row-wise (TestShardedRowWise).
		u, fp := upSharded(t, dir, model, part, []string{"--shards", "3", "--shard-bytes", "50000", "--zipf", "1.05"}, 3, 1, 2)
		// Sharded again, as many shards placed otherwise: prism up on the
		// same --db ingests each shard anew (the stores hold the other
		// sharding's rows, which the workers would refuse, or serve as
		// rows they are not) and scores as before.
		u.cmd.Process.Signal(os.Interrupt)
		u.cmd.Wait()
		u2, fp2 := upSharded(t, dir, model, part, []string{"--shards", "3", "--shard-bytes", "45000", "--zipf", "1.05"}, 3, 1, 2)
		if fp2 == fp {
			t.Fatalf("sharded again with one fingerprint %s: the test wants another layout", fp)
		}
		if got := strings.Count(u2.log.String(), "up: ingesting shard"); got != 3 {
			t.Fatalf("after the reshard prism up ingested %d shards, want 3:\n%s", got, u2.log.String())
		}
	})
}

// upSharded shards part (prism shard with shardArgs), runs prism up on
// it with replicas per shard, checks that each of the shards has its
// replicas registered (and at least rowWise tables are row-wise), and
// compares the served scores of 270 candidates with prism score's.
// It returns the prism up process and the sharding's fingerprint.
func upSharded(t *testing.T, dir, model, part string, shardArgs []string, shards, replicas, rowWise int) (*proc, string) {
	if out, err := run(t, nil, append([]string{"shard", part}, shardArgs...)...); err != nil {
		t.Fatalf("shard: %v\n%s", err, out)
	}
	p, err := plan.Read(part)
	if err != nil {
		t.Fatal(err)
	}
	name := p.Model.Name
	if name == "" {
		name = filepath.Base(part)
	}
	rows := 0
	for _, tp := range p.Sharding.Tables {
		if tp.Placement == plan.RowWise {
			rows++
		}
	}
	if rows < rowWise {
		t.Fatalf("%d row-wise tables, want at least %d", rows, rowWise)
	}
	db := filepath.Join(dir, "db")
	u := startProc(t, readyline.Up, "up", "--model", part, "--addr", "127.0.0.1:0", "--db", db,
		"--replicas", strconv.Itoa(replicas), "--dense-workers", "1", "--micro-batch", "64")
	conn := dial(t, u.addr, filepath.Join(dir, "certs"), auth.Admin)
	ws, err := prismv1.NewRegistryClient(conn).List(context.Background(), &prismv1.ListRequest{})
	if err != nil {
		t.Fatal(err)
	}
	perShard := map[int32]int{}
	for _, w := range ws.GetWorkers() {
		if ref := w.GetShards()[name]; ref != nil && int(ref.GetShards()) == shards {
			perShard[ref.GetShard()]++
		}
	}
	for k := range shards {
		if perShard[int32(k)] != replicas {
			t.Fatalf("embedding workers per shard %v, want %d of each of %d shards", perShard, replicas, shards)
		}
		for r := range replicas {
			if m, _ := filepath.Glob(filepath.Join(up.ShardDB(db, k, r), "OPTIONS-*")); len(m) == 0 {
				t.Fatalf("replica %d of shard %d has no store in %s", r, k, up.ShardDB(db, k, r))
			}
		}
	}

	const n, batch = 270, 90
	scores := filepath.Join(dir, "scores.txt")
	if out, err := run(t, nil, "score", model, "--plan", part, "--samples", strconv.Itoa(n), "--batch", strconv.Itoa(batch), "--seed", "7", "--scores-out", scores); err != nil {
		t.Fatalf("score: %v\n%s", err, out)
	}
	want := readScores(t, scores)
	b := scoredSamples(t, p, n)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := prismv1.NewRecommenderClient(conn).Recommend(ctx, toRequest(name, b, nil))
	if err != nil {
		t.Fatal(err)
	}
	// A multi-task model: prism score wrote tasks values a sample, and
	// every task is served (task_scores), task 0's in scores.
	tasks, err := p.Tasks()
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.GetScores()) != n || len(want) != n*tasks {
		t.Fatalf("%d scores served, %d from prism score, want %d of %d tasks", len(resp.GetScores()), len(want), n, tasks)
	}
	var worst float64
	for i, v := range resp.GetScores() {
		worst = max(worst, math.Abs(float64(v)-want[i*tasks]))
	}
	if tasks > 1 {
		if resp.GetTasks() != int32(tasks) || len(resp.GetTaskScores()) != n*tasks {
			t.Fatalf("tasks %d, %d task scores; want %d, %d", resp.GetTasks(), len(resp.GetTaskScores()), tasks, n*tasks)
		}
		for i, v := range resp.GetTaskScores() {
			worst = max(worst, math.Abs(float64(v)-want[i]))
		}
	}
	if worst > 1e-5 {
		t.Fatalf("sharded prism up scores differ from prism score by %g", worst)
	}
	t.Logf("%d candidates over %d shards x %d replicas (%d tables row-wise): max abs error %g against prism score", n, shards, replicas, rows, worst)
	return u, p.Sharding.Fingerprint()
}
