package grpctest

import (
	"context"
	"errors"
	"syscall"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// TestNet: a server on a named listener answers a client dialling its
// Addr; a name nobody listens on, or a listener whose server stopped, is
// refused (Unavailable); a live name cannot be taken twice.
func TestNet(t *testing.T) {
	var n Net
	lis := n.MustListen(t, "a")
	if lis.Addr().String() != "passthrough:///a" || lis.Addr().Network() != "bufconn" {
		t.Fatalf("addr %s %s", lis.Addr().Network(), lis.Addr())
	}
	if _, err := n.Listen("a"); err == nil {
		t.Fatal("listened twice on a")
	}
	srv := grpc.NewServer()
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go srv.Serve(lis)
	ctx := context.Background()
	if _, err := healthpb.NewHealthClient(n.Dial(t, lis.Addr().String())).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
	if _, err := n.DialContext(ctx, "b"); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dial b: %v, want ECONNREFUSED", err)
	}
	if _, err := healthpb.NewHealthClient(n.Dial(t, Target("b"))).Check(ctx, &healthpb.HealthCheckRequest{}); status.Code(err) != codes.Unavailable {
		t.Fatalf("check on b: %v, want Unavailable", err)
	}
	srv.Stop()
	if _, err := n.DialContext(ctx, "a"); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dial a after Stop: %v, want ECONNREFUSED", err)
	}
	if _, err := n.Listen("a"); err != nil {
		t.Fatalf("listen again on a after Stop: %v", err)
	}
}
