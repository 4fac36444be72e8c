package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
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

// previousRelease is the commit TestMixedReleases builds the earlier
// release from when PRISM_OLD_BIN names no binary: main before the
// session that added id renaming, one id per instance certificate and
// the untold dense worker's ErrorInfo.
const previousRelease = "c09be5519201d8676a44efc58519161878c9a454"

// TestMixedReleases runs a rolling upgrade's mixed stack on real
// processes: routers and workers of this release beside those of an
// earlier one ($PRISM_OLD_BIN, else previousRelease built from this
// clone's history), each worker with its own certificate (certs init
// --instances). Every pair of workers answers the monolith's scores; a
// version number and a content pin are answered; an update is
// acknowledged, held by every embedding worker and read by every pair;
// an old embedding worker restarted as this release takes its place.
func TestMixedReleases(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds an earlier release and runs two stacks for about a minute")
	}
	old := os.Getenv("PRISM_OLD_BIN")
	if old == "" {
		old = buildRelease(t, previousRelease)
	}
	for _, oldSequences := range []bool{false, true} {
		t.Run(fmt.Sprintf("old sequencer %v", oldSequences), func(t *testing.T) {
			t.Parallel()
			testMixedReleases(t, old, oldSequences)
		})
	}
}

func testMixedReleases(t *testing.T, old string, oldSequences bool) {
	if err := ort.Init(); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	model, part, cfg := partitioned(t, dir, "dlrm-tiny")
	p, err := plan.Read(part)
	if err != nil {
		t.Fatal(err)
	}
	content, err := p.Content(part)
	if err != nil {
		t.Fatal(err)
	}
	mono, err := ort.NewSession(model, ort.SessionOptions{IntraOpThreads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer mono.Close()
	certs := filepath.Join(t.TempDir(), "certs")
	if out, err := run(t, nil, "certs", "init", certs, "--instances", "2"); err != nil {
		t.Fatalf("certs init: %v\n%s", err, out)
	}
	start := func(bin, name string, ready readyline.Line, args ...string) *proc {
		return startCmd(t, exec.Command(bin, args...), name, ready, true, 3*time.Minute)
	}
	// One router sequences; the other forwards updates to it.
	routerArgs := []string{"serve", "router", "--certs", certs, "--addr", "127.0.0.1:0", "--heartbeat", "200ms", "--micro-batch", "8", "--update-worker-timeout", "2s"}
	var newRouter, oldRouter *proc
	if oldSequences {
		oldRouter = start(old, "old router", readyline.Router, routerArgs...)
		newRouter = start(prismBin, "new router", readyline.Router, append(routerArgs, "--sequencer", oldRouter.addr)...)
	} else {
		newRouter = start(prismBin, "new router", readyline.Router, routerArgs...)
		oldRouter = start(old, "old router", readyline.Router, append(routerArgs, "--sequencer", newRouter.addr)...)
	}
	routers := newRouter.addr + "," + oldRouter.addr
	embedding := func(bin, name string, i int) *proc {
		return start(bin, name, readyline.Embedding, "serve", "embedding", "--certs", auth.InstanceDir(certs, auth.Embedding, i),
			"--plan", part, "--db", filepath.Join(dir, fmt.Sprintf("db%d", i)), "--router", routers)
	}
	dense := func(bin, name string, i int) *proc {
		return start(bin, name, readyline.Dense, "serve", "dense", "--certs", auth.InstanceDir(certs, auth.Dense, i), "--plan", part, "--router", routers)
	}
	for i, bin := range []string{old, prismBin} {
		if out, err := exec.Command(bin, "ingest", part, "--db", filepath.Join(dir, fmt.Sprintf("db%d", i))).CombinedOutput(); err != nil {
			t.Fatalf("ingest: %v\n%s", err, out)
		}
	}
	oldEmb := embedding(old, "old embedding", 0)
	newEmb := embedding(prismBin, "new embedding", 1)
	oldDense := dense(old, "old dense", 0)
	dense(prismBin, "new dense", 1)

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	via := map[string]prismv1.RecommenderClient{
		"new router": prismv1.NewRecommenderClient(dial(t, newRouter.addr, certs, auth.Admin)),
		"old router": prismv1.NewRecommenderClient(dial(t, oldRouter.addr, certs, auth.Admin)),
	}
	list := func(addr string) []*prismv1.WorkerInfo {
		t.Helper()
		c := dial(t, addr, certs, auth.Admin)
		defer c.Close()
		lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		ws, err := prismv1.NewRegistryClient(c).List(lctx, &prismv1.ListRequest{})
		if err != nil {
			t.Fatalf("List at %s: %v", addr, err)
		}
		return ws.GetWorkers()
	}
	// awaitWorkers waits until both routers list n healthy workers of
	// each role.
	awaitWorkers := func(n int) {
		t.Helper()
		for _, addr := range []string{newRouter.addr, oldRouter.addr} {
			var last []string
			for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(100 * time.Millisecond) {
				count := map[prismv1.Role]int{}
				last = last[:0]
				for _, w := range list(addr) {
					last = append(last, fmt.Sprintf("%s %s %s healthy=%v", w.GetRole(), w.GetId(), w.GetAddr(), w.GetHealthy()))
					if w.GetHealthy() {
						count[w.GetRole()]++
					}
				}
				if count[prismv1.Role_ROLE_EMBEDDING] == n && count[prismv1.Role_ROLE_DENSE] == n {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("router %s does not list %d healthy workers of each role:\n%s", addr, n, strings.Join(last, "\n"))
				}
			}
		}
	}
	awaitWorkers(2)

	src, _ := models.NewSynthetic(cfg.Signature(), models.SyntheticOptions{Seed: 9})
	b, _ := src.Next(64)
	want, err := mono.Run(modelrun.Inputs(b))
	if err != nil {
		t.Fatal(err)
	}
	recommend := func(name string, req *prismv1.RecommendRequest) (*prismv1.RecommendResponse, error) {
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			resp, err := via[name].Recommend(rctx, req)
			cancel()
			if err == nil || status.Code(err) != codes.Unavailable || time.Now().After(deadline) {
				return resp, err
			}
		}
	}
	// Micro-batches of 8: each request's spread over the pairs.
	for _, name := range []string{"new router", "old router"} {
		for i := range 6 {
			resp, err := recommend(name, toRequest(cfg.Name, b, nil))
			if err != nil {
				t.Fatalf("%s, request %d: %v", name, i, err)
			}
			if worst := maxAbsError(resp.GetScores(), want[0]); len(resp.GetScores()) != b.N || worst > 1e-5 {
				t.Fatalf("%s, request %d: %d scores, max abs error %g against the monolith", name, i, len(resp.GetScores()), worst)
			}
		}
	}
	// Pins: the content, and the number the workers give it.
	version := int64(0)
	for _, w := range list(newRouter.addr) {
		if w.GetRole() == prismv1.Role_ROLE_EMBEDDING {
			version = max(version, w.GetVersion()[cfg.Name])
		}
	}
	for _, name := range []string{"new router", "old router"} {
		for _, pin := range []struct {
			what    string
			version int64
			content string
		}{{"content", 0, content}, {"number", version, ""}} {
			req := toRequest(cfg.Name, b, nil)
			req.Version, req.Content = pin.version, pin.content
			resp, err := recommend(name, req)
			if err != nil {
				t.Fatalf("%s, pinned to the %s: %v", name, pin.what, err)
			}
			if worst := maxAbsError(resp.GetScores(), want[0]); worst > 1e-5 {
				t.Fatalf("%s, pinned to the %s: max abs error %g", name, pin.what, worst)
			}
		}
	}

	// An update of every row of the first table, through each router:
	// acknowledged, held by both embedding workers, read by every pair.
	tb := p.Tables[0]
	update := func(name, addr string, v float32) {
		t.Helper()
		c := dial(t, addr, certs, auth.Admin)
		defer c.Close()
		ids := make([]int64, tb.Rows)
		rows := make([]float32, int(tb.Rows)*tb.Dim)
		for i := range ids {
			ids[i] = int64(i)
		}
		for i := range rows {
			rows[i] = v
		}
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			uctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			_, err := prismv1.NewEmbeddingsClient(c).Update(uctx, &prismv1.UpdateRequest{Model: cfg.Name, Table: tb.Name, Ids: ids, Rows: leview.Bytes(rows)})
			cancel()
			if err == nil {
				return
			}
			if status.Code(err) != codes.Unavailable || time.Now().After(deadline) {
				t.Fatalf("update %v through the %s: %v", v, name, err)
			}
		}
	}
	consistent := func(what string) []float32 {
		t.Helper()
		var first []float32
		for _, name := range []string{"new router", "old router"} {
			for i := range 6 {
				resp, err := recommend(name, toRequest(cfg.Name, b, nil))
				if err != nil {
					t.Fatalf("%s: %s, request %d: %v", what, name, i, err)
				}
				if first == nil {
					first = resp.GetScores()
					continue
				}
				// Within 1e-5: a dense worker's batch of other sizes
				// rounds otherwise.
				worst := maxAbsError(resp.GetScores(), first)
				if len(resp.GetScores()) != b.N || worst > 1e-5 {
					t.Fatalf("%s: %s, request %d: scores differ from the first request's by up to %g (a pair reads other rows)", what, name, i, worst)
				}
			}
		}
		return first
	}
	// awaitHeld waits until both routers list every embedding worker
	// holding one update number, at least seq, and returns it. (An
	// update retried after Unavailable is numbered again: the count of
	// updates sent is a lower bound.)
	awaitHeld := func(seq int64) int64 {
		t.Helper()
		var top int64
		for _, addr := range []string{newRouter.addr, oldRouter.addr} {
			for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
				var held []int64
				var last []string
				for _, w := range list(addr) {
					if w.GetRole() == prismv1.Role_ROLE_EMBEDDING {
						last = append(last, fmt.Sprintf("%s holds %d", w.GetAddr(), w.GetUpdateSeq()[cfg.Name]))
						held = append(held, w.GetUpdateSeq()[cfg.Name])
					}
				}
				if len(held) == 2 && held[0] == held[1] && held[0] >= max(seq, top) {
					top = held[0]
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("router %s: the embedding workers do not hold one update, at least %d: %v", addr, max(seq, top), last)
				}
			}
		}
		return top
	}
	update("new router", newRouter.addr, 0.5)
	seq := awaitHeld(1)
	after1 := consistent("after an update through the new router")
	if maxAbsError(after1, want[0]) < 1e-6 {
		t.Fatal("an update of every row of a table left the scores as they were")
	}
	update("old router", oldRouter.addr, -0.25)
	seq = awaitHeld(seq + 1)
	if after2 := consistent("after an update through the old router"); maxAbsError(after1, after2) < 1e-6 {
		t.Fatal("the second update left the scores as they were")
	}

	// Each embedding worker in turn misses an update (stopped past its
	// heartbeats) and is caught up by the sequencer of either release.
	for i, e := range []*proc{oldEmb, newEmb} {
		e.cmd.Process.Signal(syscall.SIGSTOP)
		update("new router", newRouter.addr, float32(i)+2)
		e.cmd.Process.Signal(syscall.SIGCONT)
		awaitWorkers(2)
		seq = awaitHeld(seq + 1)
		consistent(fmt.Sprintf("after embedding worker %d caught up", i))
	}

	// The old embedding worker is upgraded in place: the same
	// certificate and store, this release's binary.
	oldEmb.cmd.Process.Kill()
	oldEmb.cmd.Wait()
	embedding(prismBin, "upgraded embedding", 0)
	awaitWorkers(2)
	update("new router", newRouter.addr, 0.75)
	seq = awaitHeld(seq + 1)
	consistent("after the upgrade of an embedding worker")

	// The old dense worker too; then the new router restarts at its
	// address (its bindings, in memory, are gone).
	oldDense.cmd.Process.Kill()
	oldDense.cmd.Wait()
	dense(prismBin, "upgraded dense", 0)
	awaitWorkers(2)
	consistent("after the upgrade of a dense worker")
	newRouter.cmd.Process.Signal(syscall.SIGTERM)
	newRouter.cmd.Wait()
	args := slices.Clone(routerArgs)
	args[slices.Index(args, "127.0.0.1:0")] = newRouter.addr
	if oldSequences {
		args = append(args, "--sequencer", oldRouter.addr)
	}
	newRouter = start(prismBin, "restarted router", readyline.Router, args...)
	awaitWorkers(2)
	update("new router", newRouter.addr, 1.5)
	awaitHeld(seq + 1)
	consistent("after the new router restarted")

	// The old router restarts (its bindings, in memory, are gone), and
	// another certificate of the role announces the new embedding
	// worker's id there first: the worker takes a new id and serves on.
	var stolen string
	for _, w := range list(oldRouter.addr) {
		if w.GetAddr() == newEmb.addr {
			stolen = w.GetId()
		}
	}
	oldRouter.cmd.Process.Signal(syscall.SIGTERM)
	oldRouter.cmd.Wait()
	args = slices.Clone(routerArgs)
	args[slices.Index(args, "127.0.0.1:0")] = oldRouter.addr
	if !oldSequences {
		args = append(args, "--sequencer", newRouter.addr)
	}
	oldRouter = start(old, "restarted old router", readyline.Router, args...)
	tc, err := auth.ClientTLS(auth.FolderFiles(auth.InstanceDir(certs, auth.Embedding, 0)))
	if err != nil {
		t.Fatal(err)
	}
	thief, err := grpc.NewClient(oldRouter.addr, grpc.WithTransportCredentials(credentials.NewTLS(tc)))
	if err != nil {
		t.Fatal(err)
	}
	defer thief.Close()
	_, err = prismv1.NewRegistryClient(thief).Announce(ctx, &prismv1.AnnounceRequest{Worker: &prismv1.WorkerInfo{
		Id: stolen, Role: prismv1.Role_ROLE_EMBEDDING, Addr: "127.0.0.1:1", Models: []string{cfg.Name}}})
	t.Logf("announcing %q first at the restarted old router: %v", stolen, err)
	awaitWorkers(2)
	renamed := false
	for _, w := range list(oldRouter.addr) {
		renamed = renamed || w.GetAddr() == newEmb.addr && w.GetId() != stolen && w.GetHealthy()
	}
	if err == nil && !renamed {
		t.Fatalf("the new embedding worker was not listed under a new id at the old router after its id was taken")
	}
	consistent("after the old router restarted")

	// A stream through each router. A request answered Unavailable
	// (retry: the restarted sequencer may still be learning what the
	// workers hold, or a worker's announcement under its new id not
	// judged yet) is sent again in a new stream, for up to 30 s, as
	// recommend retries a unary one.
	for name, rec := range via {
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			st, err := rec.RecommendStream(ctx)
			if err != nil {
				t.Fatal(err)
			}
			for range 4 {
				if err := st.Send(toRequest(cfg.Name, b, nil)); err != nil {
					t.Fatal(err)
				}
			}
			st.CloseSend()
			retry := false
			for i := range 4 {
				resp, err := st.Recv()
				if e := resp.GetError(); err == nil && e != nil && codes.Code(e.GetCode()) == codes.Unavailable && time.Now().Before(deadline) {
					retry = true
					continue
				}
				if err != nil || resp.GetError() != nil || len(resp.GetScores()) != b.N {
					t.Fatalf("%s: stream answer %d: %v %v", name, i, err, resp.GetError())
				}
			}
			if !retry {
				break
			}
		}
	}
}

// buildRelease builds prism at commit from this clone's git history
// (git archive into a temporary folder, go build there) and returns the
// binary. It skips, saying why, where the history lacks the commit (a
// shallow clone, a source tarball): PRISM_OLD_BIN then names one.
func buildRelease(t *testing.T, commit string) string {
	t.Helper()
	top, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		t.Skipf("no git history to build release %.12s from (%v): set PRISM_OLD_BIN to a prism binary of an earlier release", commit, err)
	}
	root := strings.TrimSpace(string(top))
	if err := exec.Command("git", "-C", root, "cat-file", "-e", commit+"^{commit}").Run(); err != nil {
		t.Skipf("this clone's history lacks release %.12s (shallow?): set PRISM_OLD_BIN to a prism binary of an earlier release", commit)
	}
	src := t.TempDir()
	tarball := filepath.Join(t.TempDir(), "release.tar")
	if out, err := exec.Command("git", "-C", root, "archive", "-o", tarball, commit).CombinedOutput(); err != nil {
		t.Fatalf("git archive %.12s: %v\n%s", commit, err, out)
	}
	if out, err := exec.Command("tar", "-xf", tarball, "-C", src).CombinedOutput(); err != nil {
		t.Fatalf("untar release %.12s: %v\n%s", commit, err, out)
	}
	os.Remove(tarball) // the disk is CI's to share: keep only the tree
	bin := filepath.Join(t.TempDir(), "prism-old")
	build := exec.Command("go", "build", "-o", bin, "./cmd/prism")
	build.Dir = src
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build release %.12s: %v\n%s", commit, err, out)
	}
	return bin
}
