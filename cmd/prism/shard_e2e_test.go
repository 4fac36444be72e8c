package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/internal/auth"
	"github.com/prism-serve/prism/internal/leview"
	"github.com/prism-serve/prism/internal/modelrun"
	pb "github.com/prism-serve/prism/internal/onnxpb"
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
	t.Parallel()
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
	dense := startProc(t, readyline.Dense, "serve", "dense", "--certs", certs, "--plan", part, "--router", router.addr)
	embedding := func(k int) *proc {
		return startProc(t, readyline.Embedding, "serve", "embedding", "--certs", certs, "--plan", part, "--db", filepath.Join(dir, fmt.Sprintf("db%d", k)), "--router", router.addr)
	}
	shards := []*proc{embedding(0), embedding(1), embedding(2)}
	conn := dial(t, router.addr, certs, auth.Admin)
	reg := prismv1.NewRegistryClient(conn)
	// waitShards waits until the registry lists exactly the shards in
	// want, each holding update seq.
	// waitShards waits until the live embedding workers are one per
	// shard of want, each holding update want[shard] of its shard's
	// sequence.
	waitShards := func(want map[int]int64) {
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
					if seq, ok := want[int(ref.GetShard())]; ok && w.GetUpdateSeq()[cfg.Name] == seq {
						got[int(ref.GetShard())] = true
					}
				}
				if len(got) == len(want) && len(last) == len(want) {
					return
				}
			}
			time.Sleep(50 * time.Millisecond)
		}
		t.Fatalf("never saw shards at updates %v (last: %v)", want, last)
	}
	waitShards(map[int]int64{0: 0, 1: 0, 2: 0})
	// Each shard reads only its lookups' inputs (shard 0 also the dense
	// features it passes on), so the router sends it only those; the
	// scores below are the monolith's all the same.
	ws, err := reg.List(context.Background(), &prismv1.ListRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range ws.GetWorkers() {
		ref := w.GetShards()[cfg.Name]
		if ref == nil {
			continue
		}
		if in := ref.GetInputs(); len(in) == 0 || len(in) >= len(cfg.Signature().Inputs) {
			t.Errorf("shard %d announces inputs %v: want a proper subset of the model's %d", ref.GetShard(), in, len(cfg.Signature().Inputs))
		}
	}
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
		worst := maxAbsError(resp.GetScores(), want[0])
		if len(resp.GetScores()) != n || worst > 1e-5 {
			t.Fatalf("n=%d: %d scores, max abs error %g against the monolith", n, len(resp.GetScores()), worst)
		}
		return req
	}
	// Half the sparse features in the context: every shard's part
	// carries context columns (one row for all samples), some parts
	// nothing else.
	half := map[string]bool{}
	for k, in := range sig.Inputs {
		if in.Kind == models.SparseKind && k%2 == 1 {
			half[in.Name] = true
		}
	}
	for _, tc := range []struct {
		n   int
		ctx map[string]bool
	}{{1, nil}, {150, nil}, {97, map[string]bool{"dense": true, "cat_0": true}}, {270, half}} {
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
	shards[1] = embedding(1)
	waitShards(map[int]int64{0: 0, 1: 0, 2: 0})
	check(150, nil)

	// An update of a table goes to the shard holding it alone, numbered
	// in that shard's sequence. Candidate 0 looks up the updated row.
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
	update := func(table string, row []float32) (*prismv1.UpdateResponse, error) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			ur, err := upd.Update(context.Background(), &prismv1.UpdateRequest{Model: cfg.Name, Table: table, Ids: []int64{1}, Rows: leview.Bytes(row)})
			if err == nil || status.Code(err) != codes.Unavailable || time.Now().After(deadline) {
				return ur, err
			}
		}
	}
	ur, err := update(table, row)
	if err != nil {
		t.Fatalf("update: %v", err)
	}
	holder := p.Sharding.Placement(table).Shards[0]
	if ur.GetWorkers() != 1 {
		t.Errorf("update acknowledged by %d workers, want 1 (the holding shard's)", ur.GetWorkers())
	}
	if len(ur.GetShards()) != 1 || int(ur.GetShards()[0]) != holder {
		t.Errorf("update acknowledged with rows on shards %v, the table is on shard %d", ur.GetShards(), holder)
	}
	at := map[int]int64{0: 0, 1: 0, 2: 0}
	at[holder] = 1
	waitShards(at)
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

	// The holder down: an update of its table is refused at once,
	// naming the shard, and nothing is numbered; the other shards take
	// updates of their tables meanwhile (one shard holds up no other).
	var another string
	for _, tb := range p.Tables {
		if tp := p.Sharding.Placement(tb.Name); tp.Placement == plan.TableWise && tp.Shards[0] != holder {
			another = tb.Name
			break
		}
	}
	if another == "" {
		t.Fatalf("no table-wise table off shard %d in %v", holder, p.Sharding)
	}
	shards[holder].cmd.Process.Kill()
	shards[holder].cmd.Wait()
	delete(at, holder)
	waitShards(at)
	_, err = upd.Update(context.Background(), &prismv1.UpdateRequest{Model: cfg.Name, Table: table, Ids: []int64{1}, Rows: leview.Bytes(row)})
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), fmt.Sprintf("shard %d of 3", holder)) {
		t.Fatalf("update of table %q with its shard %d down: %v, want Unavailable naming the shard", table, holder, err)
	}
	arow := make([]float32, p.Tables[slices.IndexFunc(p.Tables, func(tb plan.Table) bool { return tb.Name == another })].Dim)
	if ur, err := update(another, arow); err != nil {
		t.Fatalf("update of table %q on shard %d while shard %d is down: %v", another, p.Sharding.Placement(another).Shards[0], holder, err)
	} else if ur.GetWorkers() != 1 {
		t.Errorf("update of table %q acknowledged by %d workers, want 1", another, ur.GetWorkers())
	}
	at[p.Sharding.Placement(another).Shards[0]] = 1
	waitShards(at)
	// Back on its store, the holder serves again at its update 1.
	shards[holder] = embedding(holder)
	at[holder] = 1
	waitShards(at)
	if _, err := rec.Recommend(context.Background(), req); err != nil {
		t.Fatalf("after shard %d came back: %v", holder, err)
	}
	// A new replica of the holder's shard seeds its store from the worker
	// the router names for that shard (prism store copy --router --seed,
	// the chart's first init step): the holder's, update 1 included; a
	// shard never updated has nothing to copy (its ingest is as good).
	seed := func(k int, db string) string {
		t.Helper()
		out, err := run(t, nil, "store", "copy", "--router", router.addr, "--model", cfg.Name, "--shard", fmt.Sprint(k), "--shards", "3",
			"--db", filepath.Join(dir, db), "--seed", "--seed-wait", "5s", "--certs", filepath.Join(certs, "embedding"))
		if err != nil {
			t.Fatalf("seed shard %d: %v\n%s", k, err, out)
		}
		return out
	}
	if out := seed(holder, "db-seed"); !strings.Contains(out, "names "+shards[holder].addr+" ") || !strings.Contains(out, fmt.Sprintf("updates applied 1, shard %d/3", holder)) || !strings.Contains(out, "swapped in") {
		t.Fatalf("seeding a replica of shard %d (its worker at %s):\n%s", holder, shards[holder].addr, out)
	}
	for k := range 3 {
		if _, updated := at[k]; k != holder && at[k] == 0 && updated {
			out := seed(k, fmt.Sprintf("db-seed-%d", k))
			if !strings.Contains(out, "no update of") {
				t.Fatalf("seeding a replica of shard %d, never updated:\n%s", k, out)
			}
			t.Logf("seeding shard %d, never updated: %s", k, out)
			break
		}
	}

	// A reshard under the same router: the model sharded in two, its
	// workers on stores ingested for it, replace the three. Their stores
	// lack the updates the old shards acknowledged, so they serve no
	// lookups and take no updates (README: switching means starting the
	// routers afresh).
	part2 := filepath.Join(dir, "part-2shards")
	if err := os.CopyFS(part2, os.DirFS(part)); err != nil {
		t.Fatal(err)
	}
	if out, err := run(t, nil, "shard", part2, "--shards", "2", "--shard-bytes", "1MiB", "--zipf", "1.05"); err != nil {
		t.Fatalf("shard in two: %v\n%s", err, out)
	}
	p2, err := plan.Read(part2)
	if err != nil {
		t.Fatal(err)
	}
	if p2.Sharding.Fingerprint() == p.Sharding.Fingerprint() {
		t.Fatal("two shardings with one fingerprint")
	}
	// The dense worker replaced by one on the plan sharded in two (a
	// reshard rolling out): the three shards' parts name their sharding,
	// but are whole tables (table-wise), the same in every sharding, so
	// it scores them as the other did. (Parts of row-wise tables it
	// would refuse: gpuserve TestAssemblePartial.)
	base, err := rec.Recommend(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	other := startProc(t, readyline.Dense, "serve", "dense", "--certs", certs, "--plan", part2, "--router", router.addr)
	dense.cmd.Process.Kill()
	dense.cmd.Wait()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		ws, err := reg.List(context.Background(), &prismv1.ListRequest{})
		if err == nil && slices.ContainsFunc(ws.GetWorkers(), func(w *prismv1.WorkerInfo) bool { return w.GetAddr() == other.addr }) &&
			!slices.ContainsFunc(ws.GetWorkers(), func(w *prismv1.WorkerInfo) bool { return w.GetAddr() == dense.addr }) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("never saw the dense worker of two shards alone: %v", err)
		}
	}
	for range 5 {
		resp, err := rec.Recommend(context.Background(), req)
		if err != nil {
			t.Fatalf("with a dense worker of another table-wise sharding: %v", err)
		}
		if worst := maxAbsError(resp.Scores, base.Scores); worst > 1e-6 {
			t.Fatalf("with a dense worker of another table-wise sharding: scores differ by %g", worst)
		}
	}
	for k := range 2 {
		if out, err := run(t, nil, "ingest", part2, "--db", filepath.Join(dir, fmt.Sprintf("db2-%d", k)), "--shard", fmt.Sprint(k)); err != nil {
			t.Fatalf("ingest --shard %d of two: %v\n%s", k, err, out)
		}
	}
	for _, sh := range shards {
		sh.cmd.Process.Kill()
		sh.cmd.Wait()
	}
	for k := range 2 {
		startProc(t, readyline.Embedding, "serve", "embedding", "--certs", certs, "--plan", part2, "--db", filepath.Join(dir, fmt.Sprintf("db2-%d", k)), "--router", router.addr)
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		ws, err := reg.List(context.Background(), &prismv1.ListRequest{})
		var twos int
		old := false
		for _, w := range ws.GetWorkers() {
			switch ref := w.GetShards()[cfg.Name]; {
			case ref.GetShards() == 2 && ref.GetSharding() == p2.Sharding.Fingerprint():
				if c := ref.GetContent(); c != p2.TablesFingerprint() || c == "" {
					t.Fatalf("shard %d announces content %q, want its plan's tables %q", ref.GetShard(), c, p2.TablesFingerprint())
				}
				twos++
			case ref.GetShards() == 3:
				old = true
			}
		}
		if err == nil && twos == 2 && !old {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("never saw the two new shards alone: %v %v", ws.GetWorkers(), err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	_, lerr := rec.Recommend(ctx, req)
	cancel()
	if status.Code(lerr) != codes.Unavailable {
		t.Fatalf("a lookup served by the reshard's workers, whose stores lack the acknowledged updates: %v, want Unavailable", lerr)
	}
	_, uerr := upd.Update(context.Background(), &prismv1.UpdateRequest{Model: cfg.Name, Table: another, Ids: []int64{1}, Rows: leview.Bytes(arow)})
	if status.Code(uerr) != codes.Unavailable || !strings.Contains(uerr.Error(), "of its layout") {
		t.Fatalf("an update numbered for the reshard's workers: %v, want Unavailable: no worker of the model's layout", uerr)
	}
	t.Logf("after the reshard: lookup %q; update %q", status.Convert(lerr).Message(), status.Convert(uerr).Message())
}

// rowWiseModel builds a small model in the style of a PyTorch export
// whose lookups are every pooling a row-wise shard answers in part:
//
//	sparse_0 [s0]      one-hot Gather on table "emb_a" (small)
//	sparse_1 [s0,4]    weighted sum bag: Mul(Gather, Unsqueeze(sparse_1_w)) + ReduceSum on "emb_w"
//	sparse_2 [s0,3]    ReduceMean bag on "emb_m"
//	sparse_3 [s0]      one-hot Gather on "emb_m" again (unpooled)
//	sparse_4 [s0,4]    ReduceMax bag on "emb_x"
//	sparse_5 [s0,3]    weighted mean bag: Mul(Gather, Unsqueeze(sparse_5_w)) + ReduceMean on "emb_m"
//
// with dense features through a Gemm, everything concatenated into a
// two-layer MLP and a sigmoid.
func rowWiseModel(seed uint64) *pb.ModelProto {
	r := rand.New(rand.NewPCG(seed, 1))
	g := &pb.GraphProto{Name: "main_graph"}
	seq := 0
	const d = 8
	initF := func(name string, dims ...int64) string {
		n := int64(1)
		for _, x := range dims {
			n *= x
		}
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(r.NormFloat64() * 0.3)
		}
		g.Initializer = append(g.Initializer, pb.NewFloatTensor(name, dims, v))
		return name
	}
	ints := func(vals ...int64) string {
		seq++
		n := fmt.Sprintf("/Constant_%d_output_0", seq)
		g.Initializer = append(g.Initializer, pb.NewInt64Tensor(n, []int64{int64(len(vals))}, vals))
		return n
	}
	node := func(op, name string, ins []string, attrs ...*pb.AttributeProto) string {
		out := name + "_output_0"
		g.Node = append(g.Node, &pb.NodeProto{Name: name, OpType: op, Input: ins, Output: []string{out}, Attribute: attrs})
		return out
	}
	intA := func(n string, v int64) *pb.AttributeProto {
		return &pb.AttributeProto{Name: n, Type: pb.AttributeProto_INT, I: v}
	}
	input := func(name string, elem pb.TensorProto_DataType, dims ...int) *pb.ValueInfoProto {
		shape := &pb.TensorShapeProto{Dim: []*pb.TensorShapeProto_Dimension{{Value: &pb.TensorShapeProto_Dimension_DimParam{DimParam: "s0"}}}}
		for _, x := range dims {
			shape.Dim = append(shape.Dim, &pb.TensorShapeProto_Dimension{Value: &pb.TensorShapeProto_Dimension_DimValue{DimValue: int64(x)}})
		}
		return &pb.ValueInfoProto{Name: name, Type: &pb.TypeProto{Value: &pb.TypeProto_TensorType{TensorType: &pb.TypeProto_Tensor{ElemType: int32(elem), Shape: shape}}}}
	}
	i64, f32 := pb.TensorProto_INT64, pb.TensorProto_FLOAT
	g.Input = []*pb.ValueInfoProto{
		input("dense_features", f32, 13),
		input("sparse_0", i64),
		input("sparse_1", i64, 4), input("sparse_1_w", f32, 4),
		input("sparse_2", i64, 3),
		input("sparse_3", i64),
		input("sparse_4", i64, 4),
		input("sparse_5", i64, 3), input("sparse_5_w", f32, 3),
	}
	x := node("Gemm", "/dense_arch/Gemm", []string{"dense_features", initF("dense_arch.weight", d, 13), initF("dense_arch.bias", d)}, intA("transB", 1))
	parts := []string{node("Relu", "/dense_arch/Relu", []string{x})}
	gather := func(k int, table, ids string) string {
		return node("Gather", fmt.Sprintf("/embeddings.%d/Gather", k), []string{table, ids})
	}
	parts = append(parts, gather(0, initF("emb_a", 50, d), "sparse_0"))
	w := node("Unsqueeze", "/embeddings.1/Unsqueeze", []string{"sparse_1_w", ints(2)})
	g1 := node("Mul", "/embeddings.1/Mul", []string{gather(1, initF("emb_w", 1700, d), "sparse_1"), w})
	parts = append(parts, node("ReduceSum", "/embeddings.1/ReduceSum", []string{g1, ints(1)}, intA("keepdims", 0)))
	tm := initF("emb_m", 1800, d)
	parts = append(parts, node("ReduceMean", "/embeddings.2/ReduceMean", []string{gather(2, tm, "sparse_2"), ints(1)}, intA("keepdims", 0)))
	parts = append(parts, gather(3, tm, "sparse_3"))
	parts = append(parts, node("ReduceMax", "/embeddings.4/ReduceMax", []string{gather(4, initF("emb_x", 300, d), "sparse_4"), ints(-2)}, intA("keepdims", 0)))
	w5 := node("Unsqueeze", "/embeddings.5/Unsqueeze", []string{"sparse_5_w", ints(2)})
	g5 := node("Mul", "/embeddings.5/Mul", []string{gather(5, tm, "sparse_5"), w5})
	parts = append(parts, node("ReduceMean", "/embeddings.5/ReduceMean", []string{g5, ints(1)}, intA("keepdims", 0)))
	z := node("Concat", "/Concat", parts, intA("axis", 1))
	z = node("Gemm", "/over_arch/Gemm", []string{z, initF("over_arch.0.weight", 16, int64(len(parts)*d)), initF("over_arch.0.bias", 16)}, intA("transB", 1))
	z = node("Relu", "/over_arch/Relu", []string{z})
	node("Gemm", "/over_arch/Gemm_1", []string{z, initF("over_arch.1.weight", 1, 16), initF("over_arch.1.bias", 1)}, intA("transB", 1))
	g.Node = append(g.Node, &pb.NodeProto{Name: "/Sigmoid", OpType: "Sigmoid", Input: []string{"/over_arch/Gemm_1_output_0"}, Output: []string{"output"}})
	g.Output = []*pb.ValueInfoProto{input("output", f32, 1)}
	return &pb.ModelProto{IrVersion: 8, ProducerName: "pytorch", ProducerVersion: "2.5.0", OpsetImport: []*pb.OperatorSetIdProto{{Version: 18}}, Graph: g}
}

// TestShardedRowWise: a model sharded over three embedding workers with
// row-wise tables (a weighted sum bag; a mean bag, a weighted mean bag
// and an unpooled lookup of one table; a max bag; forced row-wise by a
// small --shard-bytes, and prism shard says so) and a table-wise one
// scores as the monolith within 1e-5: each shard pools its rows' part
// of every bag, sends partial sums, maxima and counts, and the dense
// worker combines them; lookups from the user context and candidates
// alike. One shard's hot tier holds a few rows, so its part is read
// from Pebble.
func TestShardedRowWise(t *testing.T) {
	t.Parallel()
	if err := ort.Init(); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	model := filepath.Join(dir, "rowwise", "model.onnx")
	if err := os.MkdirAll(filepath.Dir(model), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := pb.WriteModel(model, rowWiseModel(3), pb.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	part := filepath.Join(dir, "rowwise-part")
	if out, err := run(t, nil, "partition", model, "-o", part, "--verify", "100"); err != nil {
		t.Fatalf("partition: %v\n%s", err, out)
	}
	// 50 KB a shard: emb_w (54 KB) and emb_m (58 KB) must go row-wise;
	// the planner makes the hot emb_x row-wise too, and keeps emb_a whole.
	out, err := run(t, nil, "shard", part, "--shards", "3", "--shard-bytes", "45000", "--zipf", "1.05")
	if err != nil {
		t.Fatalf("shard: %v\n%s", err, out)
	}
	t.Logf("prism shard:\n%s", out)
	p, err := plan.Read(part)
	if err != nil {
		t.Fatal(err)
	}
	weightedMean := false
	for _, tb := range p.Tables {
		for _, l := range tb.Lookups {
			weightedMean = weightedMean || tb.Name == "emb_m" && l.Input == "sparse_5" && l.Pooling == plan.PoolMean && l.Weights == "sparse_5_w"
		}
	}
	if !weightedMean {
		t.Fatal("the weighted mean bag on sparse_5 is not a lookup of the plan: the test wants it pooled in part by the row-wise shards")
	}
	for _, table := range []string{"emb_w", "emb_m"} {
		if pl := p.Sharding.Placement(table); pl == nil || pl.Placement != plan.RowWise {
			t.Fatalf("table %q placed %+v, want row-wise", table, pl)
		}
		if !strings.Contains(out, "row-wise "+table) {
			t.Fatalf("prism shard's output does not say %q is row-wise:\n%s", table, out)
		}
	}
	combines := map[plan.Combine]bool{}
	for _, sh := range p.Sharding.Shard {
		for _, po := range sh.Partial {
			combines[po.Combine] = true
		}
	}
	if len(combines) != 3 {
		t.Fatalf("partial outputs combine by %v, want sum, sum_count and max_count", combines)
	}
	if pl := p.Sharding.Placement("emb_a"); pl == nil || pl.Placement != plan.TableWise {
		t.Fatalf("table emb_a placed %+v, want table-wise (the test wants both placements)", pl)
	}
	for k := range 3 {
		if out, err := run(t, nil, "ingest", part, "--db", filepath.Join(dir, fmt.Sprintf("db%d", k)), "--shard", fmt.Sprint(k)); err != nil {
			t.Fatalf("ingest --shard %d: %v\n%s", k, err, out)
		}
	}
	name := p.Model.Name
	if name == "" {
		name = filepath.Base(part)
	}
	certs := newCerts(t)
	router := startProc(t, readyline.Router, "serve", "router", "--certs", certs, "--addr", "127.0.0.1:0", "--heartbeat", "200ms", "--micro-batch", "64")
	startProc(t, readyline.Dense, "serve", "dense", "--certs", certs, "--plan", part, "--router", router.addr)
	var missMetrics string
	for k := range 3 {
		args := []string{"serve", "embedding", "--certs", certs, "--plan", part, "--db", filepath.Join(dir, fmt.Sprintf("db%d", k)), "--router", router.addr}
		if k == 1 {
			// Shard 1's hot tier holds a few rows: most of its lookups'
			// rows, partial pools included, are read from Pebble.
			args = append(args, "--hot-bytes", "8KiB", "--preload", "off", "--metrics-addr", "127.0.0.1:0")
		}
		p := startProc(t, readyline.Embedding, args...)
		if k == 1 {
			missMetrics = servingMetrics(t, p)
		}
	}
	conn := dial(t, router.addr, certs, auth.Admin)
	reg := prismv1.NewRegistryClient(conn)
	deadline := time.Now().Add(20 * time.Second)
	for {
		ws, err := reg.List(context.Background(), &prismv1.ListRequest{})
		got := map[int32]bool{}
		for _, w := range ws.GetWorkers() {
			if ref := w.GetShards()[name]; ref != nil && ref.GetShards() == 3 {
				got[ref.GetShard()] = true
			}
		}
		if err == nil && len(got) == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("never saw three shards registered: %v %v", got, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	rec := prismv1.NewRecommenderClient(conn)
	mono, err := ort.NewSession(model, ort.SessionOptions{IntraOpThreads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer mono.Close()
	sig, err := models.PlanSignature(p)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		n       int
		uniform bool
		ctx     map[string]bool
	}{{1, true, nil}, {150, true, nil}, {150, false, nil}, {97, true, map[string]bool{"dense_features": true, "sparse_2": true, "sparse_1": true, "sparse_1_w": true}}} {
		src, err := models.NewSynthetic(sig, models.SyntheticOptions{Seed: uint64(tc.n), Uniform: tc.uniform})
		if err != nil {
			t.Fatal(err)
		}
		b, err := src.Next(tc.n)
		if err != nil {
			t.Fatal(err)
		}
		broadcastContext(b, tc.ctx)
		want, err := mono.Run(modelrun.Inputs(b))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		resp, err := rec.Recommend(ctx, toRequest(name, b, tc.ctx))
		cancel()
		if err != nil {
			t.Fatalf("n=%d: %v", tc.n, err)
		}
		worst := maxAbsError(resp.GetScores(), want[0])
		if len(resp.GetScores()) != tc.n || worst > 1e-5 {
			t.Fatalf("n=%d uniform=%v context %v: %d scores, max abs error %g against the monolith", tc.n, tc.uniform, tc.ctx, len(resp.GetScores()), worst)
		}
		t.Logf("n=%d uniform=%v context %v: max abs error %g", tc.n, tc.uniform, tc.ctx, worst)
	}
	// An update of row-wise emb_w is split by shard: the rows sample 0
	// reads (sparse_1's bag) go each to the shard holding it, numbered
	// in that shard's sequence, and the scores are then the monolith's
	// with the same rows.
	b, err := func() (*models.Batch, error) {
		src, err := models.NewSynthetic(sig, models.SyntheticOptions{Seed: 7, Uniform: true})
		if err != nil {
			return nil, err
		}
		return src.Next(40)
	}()
	if err != nil {
		t.Fatal(err)
	}
	in := slices.IndexFunc(sig.Inputs, func(in models.InputSpec) bool { return in.Name == "sparse_1" })
	if in < 0 {
		t.Fatalf("no input sparse_1 in %v", sig.Inputs)
	}
	var ids []int64
	for _, id := range b.Columns[in].I64[:sig.Inputs[in].Width] {
		if !slices.Contains(ids, id) {
			ids = append(ids, id)
		}
	}
	const dim = 8
	rows := make([]float32, len(ids)*dim)
	for i := range rows {
		rows[i] = float32(i%7)*0.25 - 0.75
	}
	// Every shard's worker says where emb_w's rows live, so the router
	// splits the update rather than send each shard all of it.
	ws, err := reg.List(context.Background(), &prismv1.ListRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range ws.GetWorkers() {
		ref := w.GetShards()[name]
		if ref == nil {
			continue
		}
		i := slices.IndexFunc(ref.GetRowSplits(), func(rs *prismv1.RowSplit) bool { return rs.GetTable() == "emb_w" })
		pl := p.Sharding.Placement("emb_w")
		if i < 0 || ref.GetRowSplits()[i].GetRows() != 1700 || len(ref.GetRowSplits()[i].GetShards()) != len(pl.Shards) {
			t.Fatalf("shard %d announces row splits %v; emb_w is 1700 rows on shards %v", ref.GetShard(), ref.GetRowSplits(), pl.Shards)
		}
		for j, k := range pl.Shards {
			if int(ref.GetRowSplits()[i].GetShards()[j]) != k {
				t.Fatalf("shard %d announces emb_w's rows on %v, the plan on %v", ref.GetShard(), ref.GetRowSplits()[i].GetShards(), pl.Shards)
			}
		}
	}
	upd := prismv1.NewEmbeddingsClient(conn)
	var ur *prismv1.UpdateResponse
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		ur, err = upd.Update(context.Background(), &prismv1.UpdateRequest{Model: name, Table: "emb_w", Ids: ids, Rows: leview.Bytes(rows)})
		if err == nil || status.Code(err) != codes.Unavailable || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		t.Fatalf("update of emb_w ids %v: %v", ids, err)
	}
	var on []int32
	for _, id := range ids {
		if k := int32(p.Sharding.Placement("emb_w").ShardOf(id)); !slices.Contains(on, k) {
			on = append(on, k)
		}
	}
	slices.Sort(on)
	if !slices.Equal(ur.GetShards(), on) {
		t.Errorf("update of emb_w ids %v acknowledged on shards %v, its rows are on %v", ids, ur.GetShards(), on)
	}
	t.Logf("update of emb_w ids %v: shards %v, %d workers", ids, ur.GetShards(), ur.GetWorkers())
	updated := rowWiseModel(3)
	for _, init := range updated.GetGraph().GetInitializer() {
		if init.GetName() == "emb_w" {
			data := slices.Clone(leview.Float32s(init.GetRawData()))
			for i, id := range ids {
				copy(data[id*dim:(id+1)*dim], rows[i*dim:(i+1)*dim])
			}
			init.RawData = leview.Bytes(data)
		}
	}
	updatedPath := filepath.Join(dir, "updated", "model.onnx")
	if err := os.MkdirAll(filepath.Dir(updatedPath), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := pb.WriteModel(updatedPath, updated, pb.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	mono2, err := ort.NewSession(updatedPath, ort.SessionOptions{IntraOpThreads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer mono2.Close()
	want, err := mono2.Run(modelrun.Inputs(b))
	if err != nil {
		t.Fatal(err)
	}
	stale, err := mono.Run(modelrun.Inputs(b))
	if err != nil {
		t.Fatal(err)
	}
	if maxAbsError(want[0][:1], stale[0][:1]) == 0 {
		t.Fatal("the update changes no score of sample 0: the check below would prove nothing")
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		resp, err := rec.Recommend(ctx, toRequest(name, b, nil))
		cancel()
		worst := math.Inf(1)
		if err == nil {
			worst = maxAbsError(resp.GetScores(), want[0])
		}
		if err == nil && worst <= 1e-5 {
			t.Logf("after the row-wise update: max abs error %g against the updated monolith", worst)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the row-wise update: %v, max abs error %g against the updated monolith", err, worst)
		}
	}

	// Shard 1 read its rows from Pebble: its lookups went past its hot tier.
	c, err := auth.ClientTLS(auth.FilesFor(certs, auth.Admin))
	if err != nil {
		t.Fatal(err)
	}
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: c}}
	resp, err := hc.Get("https://" + missMetrics + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var reads float64
	for _, line := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, "prism_store_pebble_reads_total "); ok {
			reads, _ = strconv.ParseFloat(v, 64)
		}
	}
	if reads == 0 {
		t.Fatalf("shard 1 (an 8 KiB hot tier) read no row from Pebble:\n%.600s", body)
	}
	t.Logf("shard 1 read %.0f rows from Pebble", reads)
}

// TestShardReplicaKilledUnderLoad: two replicas of each of three
// table-wise shards (six embedding workers, two on each shard's store
// copy); one replica of shard 1 is killed while clients send requests:
// no request fails (the router's one retry goes to the other replica of
// the shard), and the scores stay the monolith's.
func TestShardReplicaKilledUnderLoad(t *testing.T) {
	t.Parallel()
	if err := ort.Init(); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	model, part, cfg := partitioned(t, dir, "dlrm-tiny")
	if out, err := run(t, nil, "shard", part, "--shards", "3", "--shard-bytes", "1MiB", "--zipf", "1.05"); err != nil {
		t.Fatalf("shard: %v\n%s", err, out)
	}
	for k := range 3 {
		for r := range 2 { // each replica its own store of the shard
			if out, err := run(t, nil, "ingest", part, "--db", filepath.Join(dir, fmt.Sprintf("db%d-%d", k, r)), "--shard", fmt.Sprint(k)); err != nil {
				t.Fatalf("ingest --shard %d: %v\n%s", k, err, out)
			}
		}
	}
	certs := newCerts(t)
	router := startProc(t, readyline.Router, "serve", "router", "--certs", certs, "--addr", "127.0.0.1:0", "--heartbeat", "200ms", "--micro-batch", "64")
	startProc(t, readyline.Dense, "serve", "dense", "--certs", certs, "--plan", part, "--router", router.addr)
	replicas := map[[2]int]*proc{}
	for k := range 3 {
		for r := range 2 {
			replicas[[2]int{k, r}] = startProc(t, readyline.Embedding, "serve", "embedding", "--certs", certs, "--plan", part,
				"--db", filepath.Join(dir, fmt.Sprintf("db%d-%d", k, r)), "--router", router.addr)
		}
	}
	conn := dial(t, router.addr, certs, auth.Admin)
	reg := prismv1.NewRegistryClient(conn)
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		ws, err := reg.List(context.Background(), &prismv1.ListRequest{})
		n := 0
		for _, w := range ws.GetWorkers() {
			if w.GetShards()[cfg.Name] != nil {
				n++
			}
		}
		if err == nil && n == 6 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of 6 shard replicas registered (%v)", n, err)
		}
	}
	mono, err := ort.NewSession(model, ort.SessionOptions{IntraOpThreads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer mono.Close()
	src, _ := models.NewSynthetic(cfg.Signature(), models.SyntheticOptions{Seed: 7})
	b, _ := src.Next(150)
	want, err := mono.Run(modelrun.Inputs(b))
	if err != nil {
		t.Fatal(err)
	}
	req := toRequest(cfg.Name, b, nil)
	rec := prismv1.NewRecommenderClient(conn)

	var ok, failed atomic.Int64
	var firstErr atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				resp, err := rec.Recommend(ctx, req)
				cancel()
				if err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
					continue
				}
				for i, v := range resp.GetScores() {
					if math.Abs(float64(v)-float64(want[0][i])) > 1e-5 {
						failed.Add(1)
						firstErr.CompareAndSwap(nil, fmt.Sprintf("score %d: %v, monolith %v", i, v, want[0][i]))
						break
					}
				}
				ok.Add(1)
			}
		}()
	}
	time.Sleep(time.Second)
	victim := replicas[[2]int{1, 0}]
	victim.cmd.Process.Kill()
	victim.cmd.Wait()
	time.Sleep(2 * time.Second) // past the registry's expiry (3 heartbeats of 200 ms)
	close(stop)
	wg.Wait()
	t.Logf("one replica of shard 1 killed under load: %d ok, %d failed", ok.Load(), failed.Load())
	if failed.Load() > 0 {
		t.Fatalf("%d requests failed with a replica of every shard alive: first %v", failed.Load(), firstErr.Load())
	}
	if ok.Load() == 0 {
		t.Fatal("no request answered")
	}
}
