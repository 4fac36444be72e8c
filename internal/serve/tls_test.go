package serve

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/internal/auth"
	"github.com/prism-serve/prism/internal/grpctest"
)

// TestServeTLSEnforcesRoles: with Options.TLS, New serves mutual TLS and
// the authorization table; refused calls are counted by their code; a
// worker announces with the credentials WorkerOptions.DialOptions give.
func TestServeTLSEnforcesRoles(t *testing.T) {
	reg := &slowRegistry{}
	s, bn, creds, ctx := tlsRouter(t, reg)
	admin := bn.Dial(t, s.Addr(), creds(auth.Admin))
	if _, err := healthpb.NewHealthClient(admin).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("health as admin: %v", err)
	}
	_, err := prismv1.NewRegistryClient(admin).Announce(ctx, &prismv1.AnnounceRequest{Worker: &prismv1.WorkerInfo{Id: "fake"}})
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "admin") {
		t.Fatalf("admin announcing: %v", err)
	}
	// A real worker's heartbeat gets through.
	actx, acancel := context.WithCancel(ctx)
	done := Announce(actx, s.Addr(), func() *prismv1.WorkerInfo { return &prismv1.WorkerInfo{Id: "w1"} }, quiet(), bn.DialOption(), creds(auth.Embedding))
	deadline := time.Now().Add(10 * time.Second)
	for {
		reg.mu.Lock()
		n := len(reg.seen)
		reg.mu.Unlock()
		if n > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the embedding worker never announced over TLS")
		}
		time.Sleep(10 * time.Millisecond)
	}
	acancel()
	<-done
	var denied bool
	mfs, _ := s.Registry.Gather()
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			if mf.GetName() == "prism_rpc_requests_total" && strings.Contains(m.String(), "PermissionDenied") {
				denied = true
			}
		}
	}
	if !denied {
		t.Error("the refused announce is not counted")
	}
}

func TestOptionsValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		o    Options
		ok   bool
	}{
		{"plaintext", Options{}, true},
		{"token without TLS", Options{BearerToken: "0123456789abcdef"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.o.EnsureDefaults()
			if tc.o.MaxConcurrentStreams != 1024 {
				t.Errorf("MaxConcurrentStreams default %d", tc.o.MaxConcurrentStreams)
			}
			if err := tc.o.Validate(); (err == nil) != tc.ok {
				t.Fatalf("Validate: %v", err)
			}
		})
	}
}

// tlsRouter serves reg over mutual TLS (certificates from certs init in a
// temporary folder) on an in-process listener until the test ends; creds
// dials it as a role.
func tlsRouter(t *testing.T, reg prismv1.RegistryServer) (s *Server, bn *grpctest.Net, creds func(auth.Role) grpc.DialOption, ctx context.Context) {
	t.Helper()
	dir := t.TempDir()
	if err := auth.InitCerts(dir, auth.CertOptions{}); err != nil {
		t.Fatal(err)
	}
	conf, err := auth.ServerTLS(auth.FilesFor(dir, auth.Router), auth.ServerTLSOptions{})
	if err != nil {
		t.Fatal(err)
	}
	bn = &grpctest.Net{}
	s, err = New("router", Options{Listener: bn.MustListen(t, "router"), MetricsAddr: "off", TLS: conf, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	prismv1.RegisterRegistryServer(s.GRPC, reg)
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- s.Serve(ctx) }()
	t.Cleanup(func() { cancel(); <-served })
	creds = func(r auth.Role) grpc.DialOption {
		c, err := auth.ClientTLS(auth.FilesFor(dir, r), auth.Router)
		if err != nil {
			t.Fatal(err)
		}
		c.ServerName = "localhost"
		return grpc.WithTransportCredentials(credentials.NewTLS(c))
	}
	return s, bn, creds, ctx
}
