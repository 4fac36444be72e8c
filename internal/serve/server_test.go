package serve

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/prism-serve/prism/api/prismv1"
)

// slowRegistry is a test registry: Announce can be made to take a while,
// and it records what workers said.
type slowRegistry struct {
	prismv1.UnimplementedRegistryServer
	delay time.Duration
	mu    sync.Mutex
	seen  []string
	left  []string
}

func (r *slowRegistry) Announce(ctx context.Context, req *prismv1.AnnounceRequest) (*prismv1.AnnounceResponse, error) {
	time.Sleep(r.delay)
	r.mu.Lock()
	r.seen = append(r.seen, req.GetWorker().GetId())
	r.mu.Unlock()
	return &prismv1.AnnounceResponse{HeartbeatMs: 20}, nil
}

func (r *slowRegistry) Leave(ctx context.Context, req *prismv1.LeaveRequest) (*prismv1.LeaveResponse, error) {
	r.mu.Lock()
	r.left = append(r.left, req.GetId())
	r.mu.Unlock()
	return &prismv1.LeaveResponse{}, nil
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// TestServeHealthMetricsAndGracefulStop: health answers SERVING, /metrics
// counts RPCs by method and code, and a cancelled Serve lets an RPC in
// flight finish before it returns.
func TestServeHealthMetricsAndGracefulStop(t *testing.T) {
	s, err := New("test", Options{Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	reg := &slowRegistry{delay: 300 * time.Millisecond}
	prismv1.RegisterRegistryServer(s.GRPC, reg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- s.Serve(ctx) }()

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

	// An Announce in flight when shutdown starts still completes.
	rpc := make(chan error)
	go func() {
		_, err := prismv1.NewRegistryClient(conn).Announce(context.Background(), &prismv1.AnnounceRequest{Worker: &prismv1.WorkerInfo{Id: "w"}})
		rpc <- err
	}()
	time.Sleep(100 * time.Millisecond)
	cancel()
	if err := <-rpc; err != nil {
		t.Fatalf("in-flight RPC failed at shutdown: %v", err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestAnnounceHeartbeatsAndLeaves: a worker announces at the interval the
// registry asks for, and leaves when its context ends.
func TestAnnounceHeartbeatsAndLeaves(t *testing.T) {
	s, err := New("registry", Options{Logger: quiet(), MetricsAddr: "off"})
	if err != nil {
		t.Fatal(err)
	}
	reg := &slowRegistry{}
	prismv1.RegisterRegistryServer(s.GRPC, reg)
	sctx, stop := context.WithCancel(context.Background())
	defer stop()
	go s.Serve(sctx)

	ctx, cancel := context.WithCancel(context.Background())
	done := Announce(ctx, s.Addr(), func() *prismv1.WorkerInfo {
		return &prismv1.WorkerInfo{Id: "gpu/1", Role: prismv1.Role_ROLE_DENSE, Addr: "x:1"}
	}, quiet())
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
