package router

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prism-serve/prism/api/prismv1"
)

// TestReadyWaitsForResolvingWorkers: a new router's Ready (its health
// gate) stays open while no worker has announced for longer than three
// heartbeats (workers that resolve the routers' name find a new router
// only at their next resolution), closes once workers of both tiers
// have announced, and closes at the announce window when none does.
func TestReadyWaitsForResolvingWorkers(t *testing.T) {
	announce := func(r *Router, role prismv1.Role, id string) {
		t.Helper()
		if _, err := r.Reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: &prismv1.WorkerInfo{
			Id: id, Role: role, Addr: id + ":1", Models: []string{"m"}, Healthy: true}}); err != nil {
			t.Fatal(err)
		}
	}
	isReady := func(ready <-chan struct{}) bool {
		synctest.Wait()
		select {
		case <-ready:
			return true
		default:
			return false
		}
	}
	synctest.Test(t, func(t *testing.T) {
		r := New(Options{Heartbeat: time.Second}, nil)
		ready := r.Ready()
		time.Sleep(10 * time.Second)
		if isReady(ready) {
			t.Fatal("ready 10 s after start with no worker announced: a load balancer sends it requests it answers NotFound")
		}
		announce(r, prismv1.Role_ROLE_EMBEDDING, "emb")
		if isReady(ready) {
			t.Fatal("ready with no dense worker announced")
		}
		time.Sleep(10 * time.Second)
		announce(r, prismv1.Role_ROLE_DENSE, "dense")
		if !isReady(ready) {
			t.Fatal("not ready once workers of both tiers announced")
		}
	})
	synctest.Test(t, func(t *testing.T) {
		r := New(Options{Heartbeat: time.Second}, nil)
		ready := r.Ready()
		time.Sleep(DefaultAnnounceWindow(time.Second) - time.Millisecond)
		if isReady(ready) {
			t.Fatal("ready before the announce window with no worker")
		}
		time.Sleep(time.Millisecond)
		if !isReady(ready) {
			t.Fatalf("not ready %v after start with no worker: the window is over", DefaultAnnounceWindow(time.Second))
		}
	})
}
