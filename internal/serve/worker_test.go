package serve

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/internal/grpctest"
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

// takenRouter is a router whose registry holds the ids in taken bound
// to another certificate (it restarted, and another worker took them
// first): their announcements are refused as the registry refuses them
// (router/registry.go), the others answered. hold, when set, delays the
// refusals until it closes.
type takenRouter struct {
	prismv1.UnimplementedRegistryServer
	taken map[string]bool
	hold  chan struct{}
	mu    sync.Mutex
	seen  []string // ids announced, in order
}

func (r *takenRouter) Announce(ctx context.Context, req *prismv1.AnnounceRequest) (*prismv1.AnnounceResponse, error) {
	id := req.GetWorker().GetId()
	r.mu.Lock()
	r.seen = append(r.seen, id)
	r.mu.Unlock()
	if r.taken[id] {
		if r.hold != nil {
			<-r.hold
		}
		return nil, status.Errorf(codes.PermissionDenied, "announce: worker id %.64q belongs to %q, not %q", id, "embedding/thief", "embedding/worker")
	}
	return &prismv1.AnnounceResponse{HeartbeatMs: 20}, nil
}

func (r *takenRouter) Leave(context.Context, *prismv1.LeaveRequest) (*prismv1.LeaveResponse, error) {
	return &prismv1.LeaveResponse{}, nil
}

func (r *takenRouter) ids() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.seen)
}

// TestRenamedOnceForSeveralRouters: two restarted routers both refuse
// the worker's id as another certificate's; the first refusal renames
// the worker, and the second, of the id it no longer announces, does
// not rename it again. The refusal names the id cut to 64 characters:
// matched by the message, a refusal of the old id passed for one of the
// new id when the two begin alike (a long host name), and each further
// router's refusal renamed the worker once more.
func TestRenamedOnceForSeveralRouters(t *testing.T) {
	var bn grpctest.Net
	// Ids longer than the 64 characters the refusal keeps, alike in
	// those: the tier's name stands for a long host name.
	s, err := New(strings.Repeat("embedding", 8), Options{Listener: bn.MustListen(t, "10.0.0.9:1"), Logger: quiet(), MetricsAddr: "off"})
	if err != nil {
		t.Fatal(err)
	}
	first := WorkerID(s.name)
	r1 := &takenRouter{taken: map[string]bool{first: true}}
	r2 := &takenRouter{taken: map[string]bool{first: true}, hold: make(chan struct{})}
	serveRegistry(t, &bn, "10.0.0.1:7000", r1)
	serveRegistry(t, &bn, "10.0.0.2:7000", r2)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- s.ServeWorker(ctx, WorkerOptions{
			Router: "10.0.0.1:7000,10.0.0.2:7000", AdvertiseAddr: "10.0.0.9:1", ID: first,
			Info: func(id, addr string) *prismv1.WorkerInfo {
				return &prismv1.WorkerInfo{Id: id, Role: prismv1.Role_ROLE_EMBEDDING, Addr: addr, Healthy: true}
			},
			DialOptions: []grpc.DialOption{bn.DialOption()},
		})
	}()
	defer func() { cancel(); <-done }()
	// r1 refuses the first id, and hears the new one; only then does
	// r2's refusal of the first id come back.
	eventually(t, "r1 hears a new id", func() bool { ids := r1.ids(); return len(ids) > 1 && ids[len(ids)-1] != first })
	renamed := r1.ids()[len(r1.ids())-1]
	close(r2.hold)
	eventually(t, "r2 hears a new id", func() bool { ids := r2.ids(); return len(ids) > 1 && ids[len(ids)-1] != first })
	if got := r2.ids()[len(r2.ids())-1]; got != renamed {
		t.Errorf("r2 hears %q after refusing the first id, want %q, the id r1 has: renamed once more by the refusal of the old id", got, renamed)
	}
	if ids := slices.Compact(r1.ids()); len(ids) != 2 {
		t.Errorf("r1 heard %d ids in turn, want 2: the first and one new", len(ids))
	}
}
