package router

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/internal/auth"
	"github.com/prism-serve/prism/internal/serve"
)

// TestRegistryBindsInstanceCertificates: over real mutual TLS on
// loopback, two embedding workers holding per-instance certificates
// (certs init --instances) cannot announce or remove each other's id,
// where two holding the role's shared certificate can: the router binds
// an id to the certificate, and only a certificate of its own makes a
// worker's id its own.
func TestRegistryBindsInstanceCertificates(t *testing.T) {
	dir := t.TempDir()
	if err := auth.InitCerts(dir, auth.CertOptions{Instances: 2}); err != nil {
		t.Fatal(err)
	}
	conf, err := auth.ServerTLS(auth.FilesFor(dir, auth.Router), auth.ServerTLSOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s, err := serve.New("router", serve.Options{Addr: "127.0.0.1:0", MetricsAddr: "off", TLS: conf, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	reg := NewRegistry(time.Minute, nil)
	reg.Peer = auth.Peer
	prismv1.RegisterRegistryServer(s.GRPC, reg)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	served := make(chan error, 1)
	go func() { served <- s.Serve(ctx) }()
	t.Cleanup(func() { cancel(); <-served })

	// client dials the router with the certificate folder d, over its own
	// connection (its own handshake).
	client := func(d string) prismv1.RegistryClient {
		t.Helper()
		c, err := auth.ClientTLS(auth.FolderFiles(d), auth.Router)
		if err != nil {
			t.Fatal(err)
		}
		conn, err := grpc.NewClient(s.Addr(), grpc.WithTransportCredentials(credentials.NewTLS(c)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return prismv1.NewRegistryClient(conn)
	}
	announce := func(c prismv1.RegistryClient, id string) error {
		_, err := c.Announce(ctx, &prismv1.AnnounceRequest{Worker: &prismv1.WorkerInfo{
			Id: id, Role: prismv1.Role_ROLE_EMBEDDING, Addr: "127.0.0.1:1", Models: []string{"m"}, Healthy: true}})
		return err
	}
	e0 := client(auth.InstanceDir(dir, auth.Embedding, 0))
	e1 := client(auth.InstanceDir(dir, auth.Embedding, 1))
	if err := announce(e0, "emb-0"); err != nil {
		t.Fatalf("embedding-0 announcing its id: %v", err)
	}
	if err := announce(e1, "emb-1"); err != nil {
		t.Fatalf("embedding-1 announcing its id: %v", err)
	}
	if err := announce(e1, "emb-0"); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("embedding-1 announcing embedding-0's id: %v, want PermissionDenied", err)
	}
	if _, err := e1.Leave(ctx, &prismv1.LeaveRequest{Id: "emb-0"}); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("embedding-1 removing embedding-0's id: %v, want PermissionDenied", err)
	}
	// The id is still embedding-0's: its heartbeat goes on.
	if err := announce(e0, "emb-0"); err != nil {
		t.Fatalf("embedding-0's heartbeat after the attempts: %v", err)
	}

	// Two holders of the role's shared certificate are one identity to
	// the router: what per-instance certificates are for.
	a, b := client(auth.RoleDir(dir, auth.Embedding)), client(auth.RoleDir(dir, auth.Embedding))
	if err := announce(a, "shared"); err != nil {
		t.Fatal(err)
	}
	if err := announce(b, "shared"); err != nil {
		t.Fatalf("a second holder of the shared certificate: %v (expected to get through)", err)
	}
}
