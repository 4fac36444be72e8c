package serve

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/prism-serve/prism/api/prismv1"
)

func startRegistry(t *testing.T) (*slowRegistry, string) {
	t.Helper()
	rs, err := New("registry", Options{Logger: quiet(), MetricsAddr: "off"})
	if err != nil {
		t.Fatal(err)
	}
	reg := &slowRegistry{}
	prismv1.RegisterRegistryServer(rs.GRPC, reg)
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { rs.Serve(ctx); close(done) }()
	t.Cleanup(func() { stop(); <-done })
	return reg, rs.Addr()
}

func workerInfo(addr string) *prismv1.WorkerInfo {
	return &prismv1.WorkerInfo{Id: "dense/test", Role: prismv1.Role_ROLE_DENSE, Addr: addr}
}

// TestServeWorkerListenerError: serving that fails while the context is
// live returns promptly, with the error, and the worker leaves the
// registry (the embedding tier once waited for its context here, forever).
func TestServeWorkerListenerError(t *testing.T) {
	reg, raddr := startRegistry(t)
	s, err := New("embedding", Options{Logger: quiet(), MetricsAddr: "off"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- s.ServeWorker(ctx, WorkerOptions{Router: raddr, Info: func(_, addr string) *prismv1.WorkerInfo { return workerInfo(addr) }, Ready: func(string) {
			s.lis.Close() // the listener fails under the server
		}})
	}()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("ServeWorker returned no error after its listener failed")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("ServeWorker still running 10s after its listener failed")
	}
	reg.mu.Lock()
	defer reg.mu.Unlock()
	if len(reg.left) != 1 {
		t.Errorf("left %v, want the worker to leave", reg.left)
	}
}

// TestServeWorkerOrder: Ready after the announce has begun, Drained after
// Serve, and ServeWorker returns only once the worker has left.
func TestServeWorkerOrder(t *testing.T) {
	reg, raddr := startRegistry(t)
	s, err := New("dense", Options{Logger: quiet(), MetricsAddr: "off"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var mu sync.Mutex
	var events []string
	note := func(e string) { mu.Lock(); events = append(events, e); mu.Unlock() }
	var readyAddr string
	done := make(chan error, 1)
	go func() {
		done <- s.ServeWorker(ctx, WorkerOptions{
			Router: raddr, Info: func(_, addr string) *prismv1.WorkerInfo { return workerInfo(addr) },
			Ready: func(addr string) { readyAddr = addr; note("ready") },
			// The leave may come before Drained: a worker told to stop
			// leaves the registry at once, so the router stops sending
			// to it while it finishes what it holds.
			Drained: func() { note("drained") },
		})
	}()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		reg.mu.Lock()
		n := len(reg.seen)
		reg.mu.Unlock()
		if n > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("never announced")
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if readyAddr != s.Addr() {
		t.Errorf("Ready got %q, want %q", readyAddr, s.Addr())
	}
	if len(events) != 2 || events[0] != "ready" || events[1] != "drained" {
		t.Errorf("events %v", events)
	}
	reg.mu.Lock()
	defer reg.mu.Unlock()
	if len(reg.left) != 1 || reg.left[0] != "dense/test" {
		t.Errorf("left %v", reg.left)
	}
}
