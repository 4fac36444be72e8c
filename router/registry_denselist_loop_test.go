package router

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/internal/grpctest"
	"github.com/prism-serve/prism/internal/serve"
)

// answerLog is a registry as a worker reaches it, counting its answers
// to embedding workers that carry the dense workers' list.
type answerLog struct {
	*Registry
	mu         sync.Mutex
	full, kept int
}

func (a *answerLog) Announce(ctx context.Context, req *prismv1.AnnounceRequest) (*prismv1.AnnounceResponse, error) {
	resp, err := a.Registry.Announce(ctx, req)
	if err == nil && req.GetWorker().GetRole() == prismv1.Role_ROLE_EMBEDDING {
		a.mu.Lock()
		if resp.GetDenseUnchanged() {
			a.kept++
		} else {
			a.full++
		}
		a.mu.Unlock()
	}
	return resp, err
}

func (a *answerLog) counts() (full, kept int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.full, a.kept
}

// TestAnnounceLoopDenseList: an embedding worker's heartbeat
// (serve.AnnounceWith) against a real registry over bufconn. The
// router sends the dense workers' list once, then leaves it out, and
// the worker hands the whole list on at every answer; a dense worker
// that joins is in the list the worker hands on from the first answer
// to an announcement begun after the join; a router restarted at the
// same address with another list, whose version counts as many changes
// as the one the worker holds, has it take the new list, never keep
// the old one.
func TestAnnounceLoopDenseList(t *testing.T) {
	var bn grpctest.Net
	const name = "router"
	start := func(dense ...string) (*answerLog, func()) {
		reg := &answerLog{Registry: NewRegistry(20*time.Millisecond, nil)}
		for _, a := range dense {
			w := &prismv1.WorkerInfo{Id: "dense-" + a, Role: prismv1.Role_ROLE_DENSE, Addr: a, Models: []string{"m"}, Healthy: true}
			if err := announceW(reg.Registry, context.Background(), w); err != nil {
				t.Fatal(err)
			}
		}
		s := grpc.NewServer()
		prismv1.RegisterRegistryServer(s, reg)
		go s.Serve(bn.MustListen(t, name))
		t.Cleanup(s.Stop)
		return reg, s.Stop
	}
	var mu sync.Mutex
	var handed []string // every answer's list as the worker hands it on
	count := func() int { mu.Lock(); defer mu.Unlock(); return len(handed) }
	from := func(i int) []string { mu.Lock(); defer mu.Unlock(); return slices.Clone(handed[min(i, len(handed)):]) }
	await := func(what string, n int) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); count() < n; time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d answers handed on, want %d", what, count(), n)
			}
		}
	}
	allAre := func(what string, lists []string, want string) {
		t.Helper()
		for i, l := range lists {
			if l != want {
				t.Fatalf("%s: answer %d handed on %q, want %q (all: %q)", what, i, l, want, lists)
			}
		}
	}

	reg1, stop1 := start("d:1", "d:2")
	ctx, cancel := context.WithCancel(context.Background())
	done := serve.AnnounceWith(ctx, grpctest.Target(name), func() *prismv1.WorkerInfo {
		return &prismv1.WorkerInfo{Id: "e", Role: prismv1.Role_ROLE_EMBEDDING, Addr: "e:1", Models: []string{"m"}, Healthy: true}
	}, func(resp *prismv1.AnnounceResponse) {
		mu.Lock()
		handed = append(handed, strings.Join(resp.GetDenseAddrs(), ","))
		mu.Unlock()
	}, slog.New(slog.DiscardHandler), bn.DialOption())
	defer func() { cancel(); <-done }()

	await("steady", 5)
	allAre("steady", from(0), "d:1,d:2")
	if full, kept := reg1.counts(); full != 1 || kept < 4 {
		t.Fatalf("steady: %d answers carried the list and %d left it out; want 1, then none", full, kept)
	}

	// A dense worker joins.
	if err := announceW(reg1.Registry, context.Background(), &prismv1.WorkerInfo{Id: "dense-d:3", Role: prismv1.Role_ROLE_DENSE, Addr: "d:3", Models: []string{"m"}, Healthy: true}); err != nil {
		t.Fatal(err)
	}
	// The answer after this one may be to an announcement begun before
	// the join; the one after that is not.
	joined := count()
	await("after the join", joined+5)
	allAre("after the join", from(joined+1), "d:1,d:2,d:3")
	if full, _ := reg1.counts(); full != 2 {
		t.Fatalf("after the join: %d answers carried the list, want 2 (the first, the one after the join)", full)
	}
	held := reg1.denseVersion.GetGen()

	// The router restarts at the same address with three other dense
	// workers: its list has as many changes as the one held.
	stop1()
	restarted := count()
	reg2, _ := start("x:1", "x:2", "x:3")
	if g := reg2.denseVersion.GetGen(); g != held {
		t.Fatalf("the restarted registry's list has %d changes, want %d as the worker's", g, held)
	}
	await("after the restart", restarted+5)
	allAre("after the restart", from(restarted+1), "x:1,x:2,x:3")
	if full, kept := reg2.counts(); full != 1 || kept < 3 {
		t.Fatalf("after the restart: %d answers carried the list and %d left it out; want 1, then none", full, kept)
	}
}
