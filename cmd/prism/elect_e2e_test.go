package main

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	coordinationv1 "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/internal/auth"
	"github.com/prism-serve/prism/internal/kubetest"
	"github.com/prism-serve/prism/internal/leview"
	"github.com/prism-serve/prism/internal/readyline"
	"github.com/prism-serve/prism/models"
	"github.com/prism-serve/prism/plan"
)

// electedPair is two routers electing their update sequencer through a
// Lease on a real API server, with a heartbeat of 200 ms, a Lease of
// 2 s and a majority quorum.
type electedPair struct {
	t       *testing.T
	certs   string
	addrs   []string
	routers []*proc
	leases  coordinationv1.LeasesGetter
}

func startElectedPair(t *testing.T, api *kubetest.Server, certs string) *electedPair {
	t.Helper()
	free := func() string {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer lis.Close()
		return lis.Addr().String()
	}
	e := &electedPair{t: t, certs: certs, addrs: []string{free(), free()}, routers: make([]*proc, 2)}
	for i, addr := range e.addrs {
		e.routers[i] = startProc(t, readyline.Router, "serve", "router", "--certs", certs, "--addr", addr, "--advertise-addr", addr,
			"--heartbeat", "200ms", "--update-quorum", "majority", "--sequencer-lease", "default/prism-router-sequencer",
			"--kubeconfig", api.Kubeconfig, "--sequencer-lease-duration", "2s")
	}
	kc, err := clientcmd.BuildConfigFromFlags("", api.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	if e.leases, err = coordinationv1.NewForConfig(kc); err != nil {
		t.Fatal(err)
	}
	return e
}

// both is the routers' addresses as workers' --router takes them.
func (e *electedPair) both() string { return strings.Join(e.addrs, ",") }

// holder is the index of the router holding the Lease, -1 for none.
func (e *electedPair) holder() int {
	l, err := e.leases.Leases("default").Get(context.Background(), "prism-router-sequencer", metav1.GetOptions{})
	if err != nil || l.Spec.HolderIdentity == nil {
		return -1
	}
	addr, _, _ := strings.Cut(*l.Spec.HolderIdentity, "#")
	return slices.Index(e.addrs, addr)
}

// awaitHolder waits until router want (any router for -1) holds the
// Lease, and returns it.
func (e *electedPair) awaitHolder(want int, within time.Duration) int {
	e.t.Helper()
	for deadline := time.Now().Add(within); ; time.Sleep(100 * time.Millisecond) {
		if h := e.holder(); h >= 0 && (want < 0 || h == want) {
			return h
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("the Lease never went to router %d (holder %d)", want, e.holder())
		}
	}
}

// update writes row v to id 3 of table through router via, retrying
// while the answer is Unavailable (a sequencer moving, a worker not yet
// registered).
func (e *electedPair) update(via int, model, table string, dim int, v float32) *prismv1.UpdateResponse {
	e.t.Helper()
	conn := dial(e.t, e.addrs[via], e.certs, auth.Admin)
	defer conn.Close()
	row := make([]float32, dim)
	for i := range row {
		row[i] = v
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		ur, err := prismv1.NewEmbeddingsClient(conn).Update(ctx, &prismv1.UpdateRequest{Model: model, Table: table, Ids: []int64{3}, Rows: leview.Bytes(row)})
		cancel()
		if err == nil {
			return ur
		}
		if status.Code(err) != codes.Unavailable || time.Now().After(deadline) {
			e.t.Fatalf("update %v of %s.%s via router %d: %v", v, model, table, via, err)
		}
	}
}

// holds waits until router via lists the embedding worker at addr
// holding update seq of model (of its shard's sequence, for a shard).
func (e *electedPair) holds(via int, model, addr string, seq int64, within time.Duration) {
	e.t.Helper()
	conn := dial(e.t, e.addrs[via], e.certs, auth.Admin)
	defer conn.Close()
	var last string
	for deadline := time.Now().Add(within); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		ws, err := prismv1.NewRegistryClient(conn).List(ctx, &prismv1.ListRequest{})
		cancel()
		if err != nil {
			last = err.Error()
			continue
		}
		for _, w := range ws.GetWorkers() {
			if w.GetAddr() == addr {
				last = fmt.Sprintf("holds %d", w.GetUpdateSeq()[model])
				if w.GetUpdateSeq()[model] == seq {
					return
				}
			}
		}
	}
	e.t.Fatalf("router %d never listed the worker at %s holding update %d of %s (last: %s)", via, addr, seq, model, last)
}

// gone waits until router via no longer lists the worker at addr (its
// heartbeats missed), so the quorum of an update counts it out.
func (e *electedPair) gone(via int, addr string, within time.Duration) {
	e.t.Helper()
	conn := dial(e.t, e.addrs[via], e.certs, auth.Admin)
	defer conn.Close()
	for deadline := time.Now().Add(within); ; time.Sleep(100 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		ws, err := prismv1.NewRegistryClient(conn).List(ctx, &prismv1.ListRequest{})
		cancel()
		if err == nil && !slices.ContainsFunc(ws.GetWorkers(), func(w *prismv1.WorkerInfo) bool { return w.GetAddr() == addr }) {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("router %d still lists the worker at %s (%v)", via, addr, err)
		}
	}
}

// kill ends router i with SIGKILL.
func (e *electedPair) kill(i int) {
	e.routers[i].cmd.Process.Kill()
	e.routers[i].cmd.Wait()
}

// TestElectedFailoverCatchUp, on real processes and a real API server
// (skipped without one: make kube-apiserver): two routers elect their
// update sequencer through a Lease, three embedding workers hold the
// model. Worker 3 is killed and misses update 2; the holder is killed
// (kill -9) a moment later. The other router takes the Lease over and
// starts its sequencer from its copy of the old holder's update log
// (router/replica.go), so worker 3, back on its store holding update 1,
// is caught up to 2 by replay and serves again. Before the copy the new
// holder could not: worker 3 stayed out of serving until an operator
// copied a store.
func TestElectedFailoverCatchUp(t *testing.T) {
	api := kubetest.Start(t)
	dir := t.TempDir()
	_, part, cfg := partitioned(t, dir, "dlrm-tiny")
	p, err := plan.Read(part)
	if err != nil {
		t.Fatal(err)
	}
	dbs := make([]string, 3)
	for k := range dbs {
		dbs[k] = filepath.Join(dir, fmt.Sprintf("db%d", k))
		if out, err := run(t, nil, "ingest", part, "--db", dbs[k]); err != nil {
			t.Fatalf("ingest: %v\n%s", err, out)
		}
	}
	certs := newCerts(t)
	e := startElectedPair(t, api, certs)
	startProc(t, readyline.Dense, "serve", "dense", "--certs", certs, "--plan", part, "--router", e.both())
	embedding := func(k int) *proc {
		return startProc(t, readyline.Embedding, "serve", "embedding", "--certs", certs, "--plan", part, "--db", dbs[k], "--router", e.both())
	}
	workers := []*proc{embedding(0), embedding(1), embedding(2)}
	table, dim := p.Tables[0].Name, p.Tables[0].Dim

	a := e.awaitHolder(-1, 30*time.Second)
	b := 1 - a
	e.update(b, cfg.Name, table, dim, 1) // forwarded to the holder
	for _, w := range workers {
		e.holds(a, cfg.Name, w.addr, 1, 10*time.Second)
	}
	// Worker 3 is killed and misses update 2 (acknowledged by the other
	// two, a majority); the follower copies the log at its heartbeat.
	workers[2].cmd.Process.Kill()
	workers[2].cmd.Wait()
	e.update(a, cfg.Name, table, dim, 2)
	time.Sleep(2 * time.Second) // ten heartbeats: the copy is pulled
	killed := time.Now()
	e.kill(a)
	back := embedding(2) // on its store: holds update 1
	e.awaitHolder(b, 30*time.Second)
	tookOver := time.Since(killed)
	e.holds(b, cfg.Name, back.addr, 2, 20*time.Second)
	t.Logf("holder killed: the other router held the Lease after %v, and worker 3 held update 2 after %v (lease 2 s, heartbeat 200 ms)", tookOver.Round(time.Millisecond), time.Since(killed).Round(time.Millisecond))
	if !strings.Contains(e.routers[b].log.String(), "starts from its copy") {
		t.Errorf("router %d did not say it started from its copy:\n%s", b, e.routers[b].log.String())
	}
	e.update(b, cfg.Name, table, dim, 3)
	e.holds(b, cfg.Name, back.addr, 3, 10*time.Second)
}

// TestElectedShardedFailover: the same failover with dlrm-tiny sharded
// table-wise in two, two replicas of each shard, so each shard numbers
// its updates in a sequence of its own (MODEL#shardK) and the
// follower's copy holds both. Replica 1 of the shard holding table A
// is killed and misses its shard's update 2, which table B's shard
// numbers too; the holder is killed. The other router starts from its
// copy and catches the replica up by replay in its shard's sequence
// alone; the shards' scores then come from the replay: the same from
// the caught-up replica as from its sibling, and not those of the rows
// before.
func TestElectedShardedFailover(t *testing.T) {
	api := kubetest.Start(t)
	dir := t.TempDir()
	_, part, cfg := partitioned(t, dir, "dlrm-tiny")
	if out, err := run(t, nil, "shard", part, "--shards", "2", "--shard-bytes", "1MiB", "--zipf", "1.05"); err != nil {
		t.Fatalf("shard: %v\n%s", err, out)
	}
	p, err := plan.Read(part)
	if err != nil {
		t.Fatal(err)
	}
	// Table A is the first table; table B the first on the other shard.
	ta := p.Tables[0]
	sa := p.Sharding.Placement(ta.Name).Shards[0]
	ib := slices.IndexFunc(p.Tables, func(tb plan.Table) bool { return p.Sharding.Placement(tb.Name).Shards[0] != sa })
	if ib < 0 {
		t.Fatalf("every table on shard %d: %+v", sa, p.Sharding)
	}
	tb := p.Tables[ib]
	sb := p.Sharding.Placement(tb.Name).Shards[0]
	db := func(shard, replica int) string { return filepath.Join(dir, fmt.Sprintf("db%d-%d", shard, replica)) }
	for k := range 2 {
		for r := range 2 {
			if out, err := run(t, nil, "ingest", part, "--db", db(k, r), "--shard", fmt.Sprint(k)); err != nil {
				t.Fatalf("ingest --shard %d: %v\n%s", k, err, out)
			}
		}
	}
	certs := newCerts(t)
	e := startElectedPair(t, api, certs)
	startProc(t, readyline.Dense, "serve", "dense", "--certs", certs, "--plan", part, "--router", e.both())
	embedding := func(shard, replica int) *proc {
		return startProc(t, readyline.Embedding, "serve", "embedding", "--certs", certs, "--plan", part, "--db", db(shard, replica), "--router", e.both())
	}
	// workers[k][r] is replica r of shard k.
	workers := [][]*proc{{embedding(0, 0), embedding(0, 1)}, {embedding(1, 0), embedding(1, 1)}}

	// req's candidate 0 reads id 3 of table A.
	src, _ := models.NewSynthetic(cfg.Signature(), models.SyntheticOptions{Seed: 7})
	batch, _ := src.Next(20)
	req := toRequest(cfg.Name, batch, nil)
	in := slices.IndexFunc(req.Candidates.Inputs, func(x *prismv1.Input) bool { return x.Name == ta.Lookups[0].Input })
	if in < 0 {
		t.Fatalf("no candidate input %q", ta.Lookups[0].Input)
	}
	req.Candidates.Inputs[in].Ids[0] = 3
	score := func(via int) []float32 {
		t.Helper()
		conn := dial(t, e.addrs[via], certs, auth.Admin)
		defer conn.Close()
		for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			resp, err := prismv1.NewRecommenderClient(conn).Recommend(ctx, req)
			cancel()
			if err == nil {
				return resp.GetScores()
			}
			if status.Code(err) != codes.Unavailable || time.Now().After(deadline) {
				t.Fatalf("recommend via router %d: %v", via, err)
			}
		}
	}

	a := e.awaitHolder(-1, 30*time.Second)
	b := 1 - a
	before := score(b)
	// Update 1 of each shard's sequence, forwarded to the holder.
	if ur := e.update(b, cfg.Name, ta.Name, ta.Dim, 1); len(ur.GetShards()) != 1 || int(ur.GetShards()[0]) != sa {
		t.Fatalf("update of %s acknowledged on shards %v, want [%d]", ta.Name, ur.GetShards(), sa)
	}
	e.update(b, cfg.Name, tb.Name, tb.Dim, 1)
	for _, sh := range workers {
		for _, w := range sh {
			e.holds(a, cfg.Name, w.addr, 1, 10*time.Second)
		}
	}
	// Replica 1 of shard A misses its shard's update 2; shard B takes
	// its own update 2 meanwhile. (Once the holder has dropped it: until
	// then the two replicas' majority is both, each try of the update
	// fails and takes a number.)
	workers[sa][1].cmd.Process.Kill()
	workers[sa][1].cmd.Wait()
	e.gone(a, workers[sa][1].addr, 10*time.Second)
	e.update(a, cfg.Name, ta.Name, ta.Dim, 2)
	e.update(a, cfg.Name, tb.Name, tb.Dim, 2)
	time.Sleep(2 * time.Second) // ten heartbeats: the copy is pulled
	killed := time.Now()
	e.kill(a)
	back := embedding(sa, 1) // on its store: holds its shard's update 1
	workers[sa][1] = back
	e.awaitHolder(b, 30*time.Second)
	e.holds(b, cfg.Name, back.addr, 2, 20*time.Second)
	t.Logf("holder killed: shard %d's replica held its shard's update 2 after %v", sa, time.Since(killed).Round(time.Millisecond))
	if !strings.Contains(e.routers[b].log.String(), "starts from its copy") {
		t.Errorf("router %d did not say it started from its copy:\n%s", b, e.routers[b].log.String())
	}
	for _, w := range workers[sb] {
		e.holds(b, cfg.Name, w.addr, 2, 10*time.Second)
	}
	e.holds(b, cfg.Name, workers[sa][0].addr, 2, 10*time.Second)

	// Shard A served by the caught-up replica alone, then by its sibling
	// alone: the same scores, and candidate 0's not those before.
	workers[sa][0].cmd.Process.Kill()
	workers[sa][0].cmd.Wait()
	e.gone(b, workers[sa][0].addr, 10*time.Second)
	fromReplay := score(b)
	workers[sa][0] = embedding(sa, 0)
	e.holds(b, cfg.Name, workers[sa][0].addr, 2, 10*time.Second)
	back.cmd.Process.Kill()
	back.cmd.Wait()
	e.gone(b, back.addr, 10*time.Second)
	fromSibling := score(b)
	if worst := maxAbsError(fromReplay, fromSibling); worst > 1e-6 {
		t.Fatalf("the caught-up replica scores %v, its sibling %v (max abs difference %g)", fromReplay, fromSibling, worst)
	}
	if fromReplay[0] == before[0] {
		t.Fatalf("candidate 0 scores %v before and after the updates of its row", before[0])
	}
	// The new holder numbers on in each shard's sequence.
	e.update(b, cfg.Name, ta.Name, ta.Dim, 3)
	e.holds(b, cfg.Name, workers[sa][0].addr, 3, 10*time.Second)
	for _, w := range workers[sb] {
		e.holds(b, cfg.Name, w.addr, 2, time.Second)
	}
}
