package main

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/internal/leview"
	"github.com/prism-serve/prism/internal/readyline"
	"github.com/prism-serve/prism/models"
)

// TestStrandedWorkerMendedByCopy: a worker behind when a router that
// keeps its update log in memory restarts can never be replayed what it
// lacks (no router holds it). prism status shows it stranded, out for
// good for --check, and names a serving worker to copy from; prism
// store copy from that worker, staged while the stranded one runs, and
// its restart bring it back in sync. On real processes, mutual TLS. The
// workers are told not to mend themselves (--mend=false): the operator's
// path; TestStrandedWorkerMendsItself is the default's.
func TestStrandedWorkerMendedByCopy(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	_, part, cfg := partitioned(t, dir, "dlrm-tiny")
	certs := newCerts(t)
	routerArgs := func(addr string) []string {
		return []string{"serve", "router", "--certs", certs, "--addr", addr, "--heartbeat", "200ms", "--update-quorum", "one"}
	}
	router := startProc(t, readyline.Router, routerArgs("127.0.0.1:0")...)
	embArgs := func(db string) []string {
		return []string{"serve", "embedding", "--certs", certs, "--plan", part, "--db", filepath.Join(dir, db), "--router", router.addr, "--mend=false"}
	}
	startProc(t, readyline.Embedding, embArgs("db-a")...)
	b := startProc(t, readyline.Embedding, embArgs("db-b")...)
	reg := prismv1.NewRegistryClient(dialRestartable(t, router.addr, certs))
	awaitList(t, reg, "two embedding workers", func(r *prismv1.ListResponse) bool { return len(embeddingWorkers(r)) == 2 })

	// B down; A alone applies an update (quorum one).
	b.cmd.Process.Kill()
	b.cmd.Wait()
	awaitList(t, reg, "one embedding worker", func(r *prismv1.ListResponse) bool { return len(embeddingWorkers(r)) == 1 })
	upd := prismv1.NewEmbeddingsClient(dialRestartable(t, router.addr, certs))
	row := make([]float32, cfg.EmbDim)
	row[0] = 1
	updateByOne(t, upd, &prismv1.UpdateRequest{Model: cfg.Name, Table: "emb_l.0.weight", Ids: []int64{1}, Rows: leview.Bytes(row)})
	// The router restarts with its log lost; B comes back holding none.
	router.cmd.Process.Kill()
	router.cmd.Wait()
	startProc(t, readyline.Router, routerArgs(router.addr)...)
	b = startProc(t, readyline.Embedding, embArgs("db-b")...)
	var stranded, serving string
	after := awaitList(t, reg, "B stranded", func(r *prismv1.ListResponse) bool {
		u := r.GetUpdates()[cfg.Name]
		if len(embeddingWorkers(r)) != 2 || len(u.GetStranded()) != 1 || len(u.GetInSync()) != 1 {
			return false
		}
		stranded, serving = u.GetStranded()[0], u.GetInSync()[0]
		return true
	})
	var aAddr string
	for _, w := range embeddingWorkers(after) {
		if w.GetId() == serving {
			aAddr = w.GetAddr()
		}
	}
	out, err := run(t, nil, "status", "--router", router.addr, "--certs", certs)
	if err != nil {
		t.Fatalf("prism status: %v\n%s", err, out)
	}
	t.Logf("prism status:\n%s", out)
	var row2 string
	for _, line := range strings.Split(out, "\n") {
		if strings.HasSuffix(line, " "+stranded) {
			row2 = line
		}
	}
	if !strings.Contains(row2, " stranded ") || !strings.Contains(out, "prism store copy --from "+aAddr+" --db ITS_STORE") {
		t.Fatalf("prism status: B's row %q, and no mend from A (%s)", row2, aAddr)
	}
	if out, err := run(t, nil, "status", "--router", router.addr, "--certs", certs, "--check"); err == nil || !strings.Contains(out, "is stranded") {
		t.Fatalf("prism status --check with a stranded worker: %v\n%s", err, out)
	}

	// The mend.
	if out, err := run(t, nil, "store", "copy", "--from", aAddr, "--db", filepath.Join(dir, "db-b"), "--certs", certs); err != nil || !strings.Contains(out, "staged in") {
		t.Fatalf("store copy: %v\n%s", err, out)
	}
	b.cmd.Process.Kill()
	b.cmd.Wait()
	startProc(t, readyline.Embedding, embArgs("db-b")...)
	awaitList(t, reg, "B mended: both in sync at update 1", func(r *prismv1.ListResponse) bool {
		u := r.GetUpdates()[cfg.Name]
		ws := embeddingWorkers(r)
		return len(ws) == 2 && len(u.GetInSync()) == 2 && len(u.GetStranded()) == 0 && !slices.ContainsFunc(ws, func(w *prismv1.WorkerInfo) bool { return w.GetUpdateSeq()[cfg.Name] != 1 })
	})

	// A new replica, C, seeded from a worker the router names (as the
	// chart's Pods start): it serves in sync at once, holding update 1,
	// where a store ingested from the plan would hold none and be
	// stranded. --seed leaves a store already there alone, and copies
	// nothing after --seed-wait while it cannot tell.
	seed := func(routerAddr, model, db string) string {
		t.Helper()
		out, err := run(t, nil, "store", "copy", "--router", routerAddr, "--model", model, "--db", filepath.Join(dir, db), "--seed", "--seed-wait", "1s", "--certs", filepath.Join(certs, "embedding"))
		if err != nil {
			t.Fatalf("store copy --seed: %v\n%s", err, out)
		}
		return out
	}
	if out := seed(router.addr, cfg.Name, "db-c"); !strings.Contains(out, "names 127.0.0.1:") || !strings.Contains(out, "swapped in") {
		t.Fatalf("seeding C:\n%s", out)
	}
	if out := seed(router.addr, cfg.Name, "db-c"); !strings.Contains(out, "holds a store already") {
		t.Fatalf("seeding C again:\n%s", out)
	}
	// A model no worker serves: a router just started knows none either,
	// so it cannot tell, and after the wait copies nothing.
	if out := seed(router.addr, "unserved", "db-d"); !strings.Contains(out, "no embedding worker of unserved registered") || !strings.Contains(out, "nothing copied (--seed)") {
		t.Fatalf("seeding a model no worker serves:\n%s", out)
	}
	if out := seed("127.0.0.1:1", cfg.Name, "db-e"); !strings.Contains(out, "after --seed-wait 1s") || !strings.Contains(out, "nothing copied (--seed)") {
		t.Fatalf("seeding from a router that does not answer:\n%s", out)
	}
	startProc(t, readyline.Embedding, embArgs("db-c")...)
	awaitList(t, reg, "C serving in sync at update 1", func(r *prismv1.ListResponse) bool {
		u := r.GetUpdates()[cfg.Name]
		return len(embeddingWorkers(r)) == 3 && len(u.GetInSync()) == 3 && len(u.GetStranded()) == 0
	})
}

// strandedPair is TestStrandedWorkerMendsItself's stack: a router
// keeping its update log in memory, embedding worker A serving in sync
// at update 1, and B's store (db-b) holding none of it after the
// router's restart, B not running.
type strandedPair struct {
	dir, certs string
	cfg        models.Config
	a          *proc
	embArgs    func(db string, extra ...string) []string
	reg        prismv1.RegistryClient
}

func newStrandedPair(t *testing.T) *strandedPair {
	t.Helper()
	sp := &strandedPair{dir: t.TempDir(), certs: newCerts(t)}
	var part string
	_, part, sp.cfg = partitioned(t, sp.dir, "dlrm-tiny")
	routerArgs := func(addr string) []string {
		return []string{"serve", "router", "--certs", sp.certs, "--addr", addr, "--heartbeat", "200ms", "--update-quorum", "one"}
	}
	router := startProc(t, readyline.Router, routerArgs("127.0.0.1:0")...)
	sp.embArgs = func(db string, extra ...string) []string {
		return append([]string{"serve", "embedding", "--certs", sp.certs, "--plan", part, "--db", filepath.Join(sp.dir, db), "--router", router.addr}, extra...)
	}
	sp.a = startProc(t, readyline.Embedding, sp.embArgs("db-a")...)
	b := startProc(t, readyline.Embedding, sp.embArgs("db-b")...)
	sp.reg = prismv1.NewRegistryClient(dialRestartable(t, router.addr, sp.certs))
	awaitList(t, sp.reg, "two embedding workers", func(r *prismv1.ListResponse) bool { return len(embeddingWorkers(r)) == 2 })
	b.cmd.Process.Kill()
	b.cmd.Wait()
	awaitList(t, sp.reg, "one embedding worker", func(r *prismv1.ListResponse) bool { return len(embeddingWorkers(r)) == 1 })
	upd := prismv1.NewEmbeddingsClient(dialRestartable(t, router.addr, sp.certs))
	row := make([]float32, sp.cfg.EmbDim)
	row[0] = 1
	updateByOne(t, upd, &prismv1.UpdateRequest{Model: sp.cfg.Name, Table: "emb_l.0.weight", Ids: []int64{1}, Rows: leview.Bytes(row)})
	router.cmd.Process.Kill()
	router.cmd.Wait()
	startProc(t, readyline.Router, routerArgs(router.addr)...)
	return sp
}

// awaitMendExit waits up to within for worker b, mending itself, to
// exit with a failure (so that it is restarted) saying so.
func awaitMendExit(t *testing.T, b *proc, within time.Duration) {
	t.Helper()
	exited := make(chan error, 1)
	go func() { exited <- b.cmd.Wait() }()
	select {
	case err := <-exited:
		if code := b.cmd.ProcessState.ExitCode(); err == nil || code == 0 {
			t.Fatalf("the stranded worker exited with %v (code %d), want a failure so that it is restarted", err, code)
		}
	case <-time.After(within):
		t.Fatalf("the stranded worker did not mend itself and exit within %v; its stderr:\n%s", within, b.log.String())
	}
	if log := b.log.String(); !strings.Contains(log, "stranded") || !strings.Contains(log, "exiting to be restarted: a copy of embedding worker 127.0.0.1:") {
		t.Fatalf("the stranded worker's stderr does not say it mended itself:\n%s", log)
	}
}

// awaitMended waits for B, restarted on its copy, to serve in sync at
// update 1 beside A, and checks it kept its store from before.
func (sp *strandedPair) awaitMended(t *testing.T, b *proc) {
	t.Helper()
	awaitList(t, sp.reg, "B mended itself: both in sync at update 1", func(r *prismv1.ListResponse) bool {
		u := r.GetUpdates()[sp.cfg.Name]
		ws := embeddingWorkers(r)
		return len(ws) == 2 && len(u.GetInSync()) == 2 && len(u.GetStranded()) == 0 && !slices.ContainsFunc(ws, func(w *prismv1.WorkerInfo) bool { return w.GetUpdateSeq()[sp.cfg.Name] != 1 })
	})
	if !strings.Contains(b.log.String(), "swapped in the copy") {
		t.Errorf("the restarted worker does not say it swapped the copy in:\n%s", b.log.String())
	}
	if kept, _ := filepath.Glob(filepath.Join(sp.dir, "db-b", "replaced-*")); len(kept) != 1 {
		t.Fatalf("B's store from before the copy: %v, want one folder replaced-*", kept)
	}
}

// TestStrandedWorkerMendsItself: the stranded worker of
// TestStrandedWorkerMendedByCopy, serving with the default --mend, is
// told by the router's answer that it is stranded, copies the serving
// worker's store into its own folder (staged: it holds the store open)
// and exits, saying why; its restart (what Kubernetes or prism up does)
// swaps the copy in, and it serves in sync at update 1, its store from
// before kept in replaced-<time>. On real processes, mutual TLS.
func TestStrandedWorkerMendsItself(t *testing.T) {
	t.Parallel()
	sp := newStrandedPair(t)
	b := startProc(t, readyline.Embedding, sp.embArgs("db-b")...)
	awaitMendExit(t, b, 90*time.Second)
	b = startProc(t, readyline.Embedding, sp.embArgs("db-b")...)
	sp.awaitMended(t, b)
}

// TestMendSurvivesKills (issue 14's fault campaign, for the mend): kill
// -9 of the stranded worker in the middle of its copy, then of the
// worker it copies from. The copy, paced to 1 MiB/s so that each kill
// lands inside it, goes on where it stopped when the worker restarts
// (files it wrote whole and the sender still has are kept, not sent
// again); with its source gone it finds none to copy from and asks again
// until the source is back. Nothing half-copied is ever swapped in, and
// the worker ends in sync.
func TestMendSurvivesKills(t *testing.T) {
	t.Parallel()
	sp := newStrandedPair(t)
	slow := []string{"--mend-rate", "1MiB/s"}
	await := func(p *proc, what, line string) {
		t.Helper()
		for deadline := time.Now().Add(60 * time.Second); !strings.Contains(p.log.String(), line); time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("no %s within 60 s (%q); its stderr:\n%s", what, line, p.log.String())
			}
		}
	}
	// B killed halfway through its copy (1.4 MiB at 1 MiB/s): once it
	// has written 512 KiB (files are written in turn, so some whole).
	b := startProc(t, readyline.Embedding, sp.embArgs("db-b", slow...)...)
	await(b, "copy started", "mend: replacing")
	staged := filepath.Join(sp.dir, "db-b", "copy-in")
	for deadline := time.Now().Add(60 * time.Second); dirBytes(staged) < 512<<10; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("B's copy wrote %d bytes in 60 s; its stderr:\n%s", dirBytes(staged), b.log.String())
		}
	}
	b.cmd.Process.Kill()
	b.cmd.Wait()
	if _, err := os.Stat(filepath.Join(staged, "COMPLETE")); err == nil {
		t.Fatal("B's copy was complete when B was killed halfway through it")
	}
	// Restarted, it serves its own store (the copy is not complete),
	// is told stranded again, and the copy goes on where it stopped.
	b = startProc(t, readyline.Embedding, sp.embArgs("db-b", slow...)...)
	await(b, "copy started again", "mend: replacing")
	// The source killed in the middle of that copy: the copy fails, and
	// B finds no worker to copy from until A is back.
	time.Sleep(200 * time.Millisecond)
	sp.a.cmd.Process.Kill()
	sp.a.cmd.Wait()
	await(b, "the copy failing", "mend: the copy failed")
	await(b, "no source", "mend: no worker serves this worker's models in sync")
	sp.a = startProc(t, readyline.Embedding, sp.embArgs("db-a")...)
	awaitMendExit(t, b, 90*time.Second)
	log := b.log.String()
	if !strings.Contains(log, "mend: received a copy") || strings.Contains(log, "kept_from_an_earlier_copy=0 ") {
		t.Fatalf("B's copy after the kills kept nothing of what it had written whole:\n%s", log)
	}
	b = startProc(t, readyline.Embedding, sp.embArgs("db-b")...)
	sp.awaitMended(t, b)
}

// dirBytes is the bytes of the files in dir (0 when it is missing).
func dirBytes(dir string) int64 {
	var n int64
	es, _ := os.ReadDir(dir)
	for _, e := range es {
		if fi, err := e.Info(); err == nil && fi.Mode().IsRegular() {
			n += fi.Size()
		}
	}
	return n
}

// updateByOne sends req until the router takes it (Unavailable while it
// settles, for up to 10 s) and fails the test unless one worker applied
// it.
func updateByOne(t *testing.T, upd prismv1.EmbeddingsClient, req *prismv1.UpdateRequest) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		resp, err := upd.Update(context.Background(), req)
		if err == nil {
			if resp.GetWorkers() != 1 {
				t.Fatalf("update answered %v, want one worker applying it", resp)
			}
			return
		}
		if status.Code(err) != codes.Unavailable || time.Now().After(deadline) {
			t.Fatalf("update: %v", err)
		}
	}
}
