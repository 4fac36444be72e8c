package serve

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/internal/auth"
)

// TestRefusedMethodNamesBounded: a caller holding nothing (no
// certificate, no token: the router admits such connections when it
// takes a bearer token) sends calls to method names of its choosing,
// and to names under a service the table opens to the token. The tap
// refuses them, and counts them: each name must not become a label
// series of its own, or the router's memory (and /metrics) grows with
// every name an attacker invents, as long as a header list allows.
func TestRefusedMethodNamesBounded(t *testing.T) {
	ctx := context.Background()
	s, conn := tokenRouter(t, func(s *Server) { prismv1.RegisterRegistryServer(s.GRPC, &slowRegistry{}) })
	const n = 300
	for i := range n {
		methods := []string{
			fmt.Sprintf("/attacker.Svc/M%d", i),
			fmt.Sprintf("/grpc.health.v1.Health/X%d", i), // the token's wildcard row
		}
		if i == 0 {
			methods = append(methods, "/big/"+strings.Repeat("A", 32<<10))
		}
		for _, m := range methods {
			in, out := []byte{}, []byte{}
			err := conn.Invoke(ctx, m, &in, &out, grpc.ForceCodec(rawCodec{}))
			if status.Code(err) != codes.Unauthenticated {
				t.Fatalf("%.40s: %v, want Unauthenticated", m, err)
			}
		}
	}
	mfs, err := s.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	series, longest := 0, 0
	for _, mf := range mfs {
		if mf.GetName() != "prism_rpc_requests_total" && mf.GetName() != "prism_rpc_latency_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			series++
			for _, l := range m.GetLabel() {
				longest = max(longest, len(l.GetValue()))
			}
		}
	}
	// The registered methods (health, reflection, registry) bound it.
	if series > 40 || longest > 256 {
		t.Fatalf("%d unauthenticated calls to invented methods made %d RPC metric series (longest label %d bytes): label cardinality set by the caller", 2*n+1, series, longest)
	}
}

// TestHeaderListBounded: a caller holding nothing may not make a tier
// read and decode megabytes of request headers (gRPC's default allows 16
// MiB per request, held while a slow sender trickles it, on as many
// connections as it opens) before the tap can refuse it.
func TestHeaderListBounded(t *testing.T) {
	ctx := context.Background()
	_, conn := tokenRouter(t, nil)
	hctx := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer 0123456789abcdef0123", "x-pad", strings.Repeat("p", 4<<20))
	_, err := healthpb.NewHealthClient(conn).Check(hctx, &healthpb.HealthCheckRequest{})
	if err == nil {
		t.Fatal("a request with 4 MiB of headers was read and served: the server bounds no header list below gRPC's 16 MiB default")
	}
}

// tokenRouter serves a router's server taking the bearer token
// 0123456789abcdef0123 (so it admits callers without a certificate),
// with register's services, and a client connection to it holding no
// certificate and no token.
func tokenRouter(t *testing.T, register func(*Server)) (*Server, *grpc.ClientConn) {
	t.Helper()
	dir := t.TempDir()
	if err := auth.InitCerts(dir, auth.CertOptions{}); err != nil {
		t.Fatal(err)
	}
	conf, err := auth.ServerTLS(auth.FilesFor(dir, auth.Router), auth.ServerTLSOptions{AllowNoClientCert: true})
	if err != nil {
		t.Fatal(err)
	}
	s, err := New("router", Options{Addr: "127.0.0.1:0", MetricsAddr: "off", TLS: conf, BearerToken: "0123456789abcdef0123", Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	if register != nil {
		register(s)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- s.Serve(ctx) }()
	t.Cleanup(func() { cancel(); <-served })
	c, err := auth.ClientTLS(auth.Files{CA: auth.FilesFor(dir, auth.Admin).CA}, auth.Router)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(s.Addr(), grpc.WithTransportCredentials(credentials.NewTLS(c)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return s, conn
}
