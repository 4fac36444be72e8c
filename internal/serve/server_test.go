package serve

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/internal/grpctest"
)

// slowRegistry is a test registry: Announce can be held until released,
// and it records what workers said.
type slowRegistry struct {
	prismv1.UnimplementedRegistryServer
	// leaveFails, when set, fails that many Leaves first (Unavailable:
	// a router too loaded to answer in time).
	leaveFails int
	entered    chan struct{} // if set, gets a value as each Announce starts
	release    chan struct{} // if set, Announce waits for it to close
	mu         sync.Mutex
	seen       []string
	left       []string
	order      []string // "announce ID" and "leave ID", as handled
}

func (r *slowRegistry) Announce(ctx context.Context, req *prismv1.AnnounceRequest) (*prismv1.AnnounceResponse, error) {
	if r.entered != nil {
		r.entered <- struct{}{}
	}
	if r.release != nil {
		<-r.release
	}
	r.mu.Lock()
	r.seen = append(r.seen, req.GetWorker().GetId())
	r.order = append(r.order, "announce "+req.GetWorker().GetId())
	r.mu.Unlock()
	return &prismv1.AnnounceResponse{HeartbeatMs: 20}, nil
}

// waitAnnounced waits up to 5 s for a first announcement.
func (r *slowRegistry) waitAnnounced(t *testing.T) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		r.mu.Lock()
		n := len(r.seen)
		r.mu.Unlock()
		if n >= 1 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("no announce in 5s")
		}
	}
}

func (r *slowRegistry) Leave(ctx context.Context, req *prismv1.LeaveRequest) (*prismv1.LeaveResponse, error) {
	r.mu.Lock()
	if r.leaveFails > 0 {
		r.leaveFails--
		r.mu.Unlock()
		return nil, status.Error(codes.Unavailable, "busy")
	}
	r.left = append(r.left, req.GetId())
	r.order = append(r.order, "leave "+req.GetId())
	r.mu.Unlock()
	return &prismv1.LeaveResponse{}, nil
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// TestServeHealthMetricsAndGracefulStop: health answers SERVING, the
// registry counts RPCs by method and code, and a cancelled Serve lets an
// RPC in flight finish before it returns. In process, over bufconn.
func TestServeHealthMetricsAndGracefulStop(t *testing.T) {
	var bn grpctest.Net
	s, err := New("test", Options{Listener: bn.MustListen(t, "test"), MetricsAddr: "off", Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	if s.Addr() != grpctest.Target("test") {
		t.Errorf("Addr %q, want the listener's", s.Addr())
	}
	reg := &slowRegistry{entered: make(chan struct{}, 1), release: make(chan struct{})}
	prismv1.RegisterRegistryServer(s.GRPC, reg)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx) }()

	conn := bn.Dial(t, s.Addr())
	h, err := healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{})
	if err != nil || h.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health %v %v", h.GetStatus(), err)
	}
	if n := countRequests(t, s, "/grpc.health.v1.Health/Check", "OK"); n != 1 {
		t.Errorf("prism_rpc_requests_total{Health/Check, OK} = %v, want 1", n)
	}
	// Each registered service by name too, as a probe naming it asks.
	if h, err := healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{Service: "prism.v1.Registry"}); err != nil || h.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health of prism.v1.Registry: %v %v", h.GetStatus(), err)
	}

	// An Announce in flight when shutdown starts still completes, and
	// Serve waits for it.
	rpc := make(chan error, 1)
	go func() {
		_, err := prismv1.NewRegistryClient(conn).Announce(context.Background(), &prismv1.AnnounceRequest{Worker: &prismv1.WorkerInfo{Id: "w"}})
		rpc <- err
	}()
	<-reg.entered
	cancel()
	select {
	case err := <-done:
		t.Fatalf("Serve returned (%v) with an RPC in flight", err)
	case <-time.After(50 * time.Millisecond):
	}
	close(reg.release)
	if err := <-rpc; err != nil {
		t.Fatalf("in-flight RPC failed at shutdown: %v", err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// countRequests is prism_rpc_requests_total for one method and code.
func countRequests(t *testing.T, s *Server, method, code string) float64 {
	t.Helper()
	mfs, err := s.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "prism_rpc_requests_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			got := map[string]string{}
			for _, l := range m.GetLabel() {
				got[l.GetName()] = l.GetValue()
			}
			if got["method"] == method && got["code"] == code {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// TestServeTCP is about the network, so it keeps real sockets: New binds
// Addr on loopback (a port the OS picks) before Serve, a gRPC client
// reaches it there, and /metrics answers over HTTP on its own port.
func TestServeTCP(t *testing.T) {
	s, err := New("test", Options{Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	host, port, err := net.SplitHostPort(s.Addr())
	if err != nil || host != "127.0.0.1" || port == "0" {
		t.Fatalf("Addr %q (%v): want a loopback port the OS picked", s.Addr(), err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	conn, err := grpc.NewClient(s.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	h, err := healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{})
	if err != nil || h.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health %v %v", h.GetStatus(), err)
	}
	resp, err := http.Get("http://" + s.MetricsAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), `prism_rpc_requests_total{code="OK",method="/grpc.health.v1.Health/Check"} 1`) {
		t.Errorf("metrics lack the health check:\n%s", body)
	}
}

// announceTo serves reg as a router's registry and starts a dense
// worker's Announce loop against it; cancel ends the loop (the worker
// leaves) and done closes when it has.
func announceTo(t *testing.T, reg prismv1.RegistryServer) (cancel context.CancelFunc, done <-chan struct{}) {
	t.Helper()
	var bn grpctest.Net
	s, err := New("registry", Options{Listener: bn.MustListen(t, "router"), Logger: quiet(), MetricsAddr: "off"})
	if err != nil {
		t.Fatal(err)
	}
	prismv1.RegisterRegistryServer(s.GRPC, reg)
	sctx, stop := context.WithCancel(context.Background())
	t.Cleanup(stop)
	go s.Serve(sctx)
	ctx, cancel := context.WithCancel(context.Background())
	done = Announce(ctx, s.Addr(), func() *prismv1.WorkerInfo {
		return &prismv1.WorkerInfo{Id: "gpu/1", Role: prismv1.Role_ROLE_DENSE, Addr: "x:1"}
	}, quiet(), bn.DialOption())
	return cancel, done
}

// TestAnnounceHeartbeatsAndLeaves: a worker announces at the interval the
// registry asks for, and leaves when its context ends.
func TestAnnounceHeartbeatsAndLeaves(t *testing.T) {
	reg := &slowRegistry{}
	cancel, done := announceTo(t, reg)
	// Heartbeats are timed by the registry's interval: wait for them.
	deadline := time.Now().Add(5 * time.Second)
	for {
		reg.mu.Lock()
		n := len(reg.seen)
		reg.mu.Unlock()
		if n >= 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("only %d announces in 5s at a 20ms heartbeat", n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	<-done
	reg.mu.Lock()
	defer reg.mu.Unlock()
	if len(reg.left) != 1 || reg.left[0] != "gpu/1" {
		t.Fatalf("left %v", reg.left)
	}
}

// TestLeaveRetried: a Leave that fails (a router too loaded to answer
// within its bound) is sent again: lost, the worker stayed registered
// until it expired, and the router then abandoned its calls in flight
// where a drain lets them finish.
func TestLeaveRetried(t *testing.T) {
	reg := &slowRegistry{leaveFails: 1}
	cancel, done := announceTo(t, reg)
	reg.waitAnnounced(t)
	cancel()
	<-done
	reg.mu.Lock()
	defer reg.mu.Unlock()
	if len(reg.left) != 1 || reg.left[0] != "gpu/1" {
		t.Fatalf("left %v after a first Leave failed, want [gpu/1]", reg.left)
	}
}

// A worker shut down while an Announce is in flight leaves after the
// router has handled that Announce, never before: a cancelled Announce
// handled after the Leave would register the drained worker again
// (what TestDenseDrainDropsNothing caught now and then).
func TestLeaveAfterInflightAnnounce(t *testing.T) {
	reg := &slowRegistry{entered: make(chan struct{}, 1), release: make(chan struct{})}
	cancel, done := announceTo(t, reg)
	<-reg.entered // the first Announce is in the handler, held there
	cancel()
	time.Sleep(100 * time.Millisecond) // time for a Leave to overtake it
	close(reg.release)
	<-done
	reg.mu.Lock()
	defer reg.mu.Unlock()
	if want := []string{"announce gpu/1", "leave gpu/1"}; !slices.Equal(reg.order, want) {
		t.Fatalf("handled %v, want %v", reg.order, want)
	}
}

// With a ReadyGate, health says NOT_SERVING (calls are still served)
// until the gate closes, then SERVING; a shutdown marks it not serving.
func TestServeReadyGate(t *testing.T) {
	var bn grpctest.Net
	s, err := New("test", Options{Listener: bn.MustListen(t, "gated"), MetricsAddr: "off", Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	gate := make(chan struct{})
	s.ReadyGate = gate
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx) }()
	hc := healthpb.NewHealthClient(bn.Dial(t, s.Addr()))
	// The server ("") and each service by name alike: a probe or a
	// client's health checking may name the service it calls.
	services := []string{"", "grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection"}
	status := func(svc string) healthpb.HealthCheckResponse_ServingStatus {
		t.Helper()
		h, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{Service: svc})
		if err != nil {
			t.Fatalf("health of %q: %v", svc, err)
		}
		return h.GetStatus()
	}
	for _, svc := range services {
		if st := status(svc); st != healthpb.HealthCheckResponse_NOT_SERVING {
			t.Fatalf("before the gate: %q %v", svc, st)
		}
	}
	close(gate)
	for _, svc := range services {
		for deadline := time.Now().Add(5 * time.Second); status(svc) != healthpb.HealthCheckResponse_SERVING; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%q never SERVING after the gate closed", svc)
			}
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestLeaveRouterGoneQuiet: a worker whose router stopped before it (prism
// up stops the router first, then the workers) has no router to leave: its
// Leave, refused for want of a router, is no warning. Every worker of
// every prism up warned "leave failed" at each clean shutdown.
func TestLeaveRouterGoneQuiet(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	reg := &slowRegistry{}
	prismv1.RegisterRegistryServer(g, reg)
	go g.Serve(lis)
	defer g.Stop()
	var logs lockedBuffer
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := Announce(ctx, lis.Addr().String(), func() *prismv1.WorkerInfo {
		return &prismv1.WorkerInfo{Id: "gpu/1", Role: prismv1.Role_ROLE_DENSE, Addr: "x:1"}
	}, slog.New(slog.NewTextHandler(&logs, nil)))
	reg.waitAnnounced(t)
	g.Stop() // the router goes first
	cancel()
	<-done
	if strings.Contains(logs.String(), "leave failed") {
		t.Fatalf("the router stopped first: the worker's shutdown warned\n%s", logs.String())
	}
}
