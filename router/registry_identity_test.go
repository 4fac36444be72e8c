package router

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
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
	reg := NewRegistry(time.Minute, nil)
	dir, addr, ctx := serveTLSRegistry(t, reg, 2)
	client := func(d string) prismv1.RegistryClient { return dialRegistry(t, addr, d) }
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

// TestRegistryKeepsExpiredWorkersBinding: an id stays bound to the
// certificate that announced it after its worker has been dropped (three
// missed heartbeats: a pause, a network cut): another worker's
// certificate, which can read the id from Registry/List, cannot take it
// over in the meantime and so lock the worker out of the registry (its
// heartbeats under its id answered "belongs to" until it restarts). The
// worker itself gets its id back at its next heartbeat.
func TestRegistryKeepsExpiredWorkersBinding(t *testing.T) {
	var mu sync.Mutex
	now := time.Unix(1000, 0)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	reg := NewRegistry(time.Second, clock)
	dir, raddr, ctx := serveTLSRegistry(t, reg, 2)
	client := func(d string) prismv1.RegistryClient { return dialRegistry(t, raddr, d) }
	announce := func(c prismv1.RegistryClient, id, addr string) error {
		_, err := c.Announce(ctx, &prismv1.AnnounceRequest{Worker: &prismv1.WorkerInfo{
			Id: id, Role: prismv1.Role_ROLE_EMBEDDING, Addr: addr, Models: []string{"m"}, Healthy: true}})
		return err
	}
	e0 := client(auth.InstanceDir(dir, auth.Embedding, 0))
	e1 := client(auth.InstanceDir(dir, auth.Embedding, 1))
	if err := announce(e0, "emb-0", "127.0.0.1:1"); err != nil {
		t.Fatal(err)
	}
	// embedding-0 misses three heartbeats and is dropped.
	mu.Lock()
	now = now.Add(4 * time.Second)
	mu.Unlock()
	if gone := reg.Expire(); len(gone) != 1 || gone[0] != "emb-0" {
		t.Fatalf("expired %v, want [emb-0]", gone)
	}
	// Ids announced and left in bulk under another certificate push out
	// none of embedding-0's bindings.
	for i := range 100 {
		id := fmt.Sprintf("churn-%d", i)
		if err := announce(e1, id, "127.0.0.1:3"); err != nil {
			t.Fatal(err)
		}
		if _, err := e1.Leave(ctx, &prismv1.LeaveRequest{Id: id}); err != nil {
			t.Fatal(err)
		}
	}
	if err := announce(e1, "emb-0", "127.0.0.1:2"); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("embedding-1 taking the id of dropped embedding-0: %v, want PermissionDenied", err)
	}
	if err := announce(e0, "emb-0", "127.0.0.1:1"); err != nil {
		t.Fatalf("embedding-0 back after its pause: %v", err)
	}
	ws, err := reg.List(ctx, &prismv1.ListRequest{})
	if err != nil || len(ws.GetWorkers()) != 1 || ws.GetWorkers()[0].GetAddr() != "127.0.0.1:1" {
		t.Fatalf("registry %v %v, want embedding-0 alone at its address", ws.GetWorkers(), err)
	}
	// Leaving keeps the binding too: the id is the process's alone.
	if _, err := e0.Leave(ctx, &prismv1.LeaveRequest{Id: "emb-0"}); err != nil {
		t.Fatal(err)
	}
	if err := announce(e1, "emb-0", "127.0.0.1:2"); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("embedding-1 taking the id embedding-0 left: %v, want PermissionDenied", err)
	}
}

// TestWorkerRenamedWhenItsIDIsTaken: a router's id bindings live in its
// memory, so right after it restarts another worker of the role may
// announce, first, an id it read from List before: the worker holding
// that id was answered "belongs to" at every heartbeat and never
// registered again while the router lived. It now announces under a new
// id (serve.IDTaken), bound to its own certificate.
func TestWorkerRenamedWhenItsIDIsTaken(t *testing.T) {
	reg := NewRegistry(time.Minute, nil)
	dir, raddr, ctx := serveTLSRegistry(t, reg, 2)
	quiet := slog.New(slog.DiscardHandler)

	// embedding-1 takes embedding-0's id at the restarted router.
	const id = "embedding/host/42/1"
	if _, err := dialRegistry(t, raddr, auth.InstanceDir(dir, auth.Embedding, 1)).Announce(ctx, &prismv1.AnnounceRequest{Worker: &prismv1.WorkerInfo{
		Id: id, Role: prismv1.Role_ROLE_EMBEDDING, Addr: "127.0.0.1:1", Models: []string{"m"}}}); err != nil {
		t.Fatal(err)
	}

	// embedding-0, the id's worker, heartbeats under it.
	w, err := serve.New("embedding", serve.Options{Addr: "127.0.0.1:0", MetricsAddr: "off", Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	wctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- w.ServeWorker(wctx, serve.WorkerOptions{Router: raddr, ID: id,
			Info: func(id, addr string) *prismv1.WorkerInfo {
				return &prismv1.WorkerInfo{Id: id, Role: prismv1.Role_ROLE_EMBEDDING, Addr: addr, Models: []string{"m"}, Healthy: true}
			},
			DialOptions: []grpc.DialOption{tlsDial(t, auth.InstanceDir(dir, auth.Embedding, 0))}})
	}()
	defer func() { stop(); <-done }()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		reg.mu.Lock()
		var got *worker
		for _, e := range reg.workers {
			if e.info.GetAddr() == w.Addr() {
				got = e
			}
		}
		reg.mu.Unlock()
		if got != nil {
			reg.mu.Lock()
			thief := reg.workers[id].peer
			reg.mu.Unlock()
			if got.info.GetId() == id || got.peer == "" || got.peer == thief {
				t.Fatalf("registered as %q bound to %q (the id's taker: %q)", got.info.GetId(), got.peer, thief)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the worker whose id was taken is still not registered after 10 s")
		}
	}
}

// TestOneIDPerInstanceCertificate: a worker's own certificate (certs
// init --instances) keeps one worker id live at the router: a new id
// under it, at any address, replaces the one before. A stolen instance
// certificate registered any number of ids, each counted towards an
// update's quorum (a majority of stuffed ids acknowledged updates no
// honest worker held). A role's shared certificate speaks for many
// workers and keeps them all.
func TestOneIDPerInstanceCertificate(t *testing.T) {
	reg := NewRegistry(time.Minute, nil)
	reg.Instance = func(ctx context.Context) bool { return auth.PeerInstance(ctx) != "" }
	var logs lockedBuffer
	reg.Log = slog.New(slog.NewTextHandler(&logs, nil))
	dir, addr, ctx := serveTLSRegistry(t, reg, 1)
	client := func(d string) prismv1.RegistryClient { return dialRegistry(t, addr, d) }
	live := func() []string {
		reg.mu.Lock()
		defer reg.mu.Unlock()
		return slices.Sorted(maps.Keys(reg.workers))
	}
	for _, tc := range []struct {
		name string
		dir  string
		want []string
	}{
		{"an instance certificate", auth.InstanceDir(dir, auth.Embedding, 0), []string{"instance-3"}},
		{"the role's shared certificate", auth.RoleDir(dir, auth.Embedding), []string{"shared-1", "shared-2", "shared-3"}},
	} {
		c := client(tc.dir)
		for i := 1; i <= 3; i++ {
			if _, err := c.Announce(ctx, &prismv1.AnnounceRequest{Worker: &prismv1.WorkerInfo{
				Id: fmt.Sprintf("%s-%d", tc.want[0][:strings.IndexByte(tc.want[0], '-')], i), Role: prismv1.Role_ROLE_EMBEDDING, Addr: fmt.Sprintf("127.0.0.1:%d", i), Models: []string{"m"}, Healthy: true}}); err != nil {
				t.Fatalf("%s: announce %d: %v", tc.name, i, err)
			}
		}
		got := slices.DeleteFunc(live(), func(id string) bool { return !strings.HasPrefix(id, tc.want[0][:strings.IndexByte(tc.want[0], '-')]) })
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s: live ids %v, want %v", tc.name, got, tc.want)
		}
	}
	// Each replacement at another address is said (two processes given
	// one worker's certificate would flap silently), as a restart: a
	// rolling upgrade restarts every worker, and a warning of two
	// processes at each restart would be false.
	if n := strings.Count(logs.String(), "announced a new id at another address"); n != 2 {
		t.Errorf("%d replacements logged, want 2:\n%s", n, logs.String())
	}
	if strings.Contains(logs.String(), "level=WARN") {
		t.Errorf("a worker restarted at another address is warned of as two processes holding its certificate:\n%s", logs.String())
	}
	// The id replaced last announces again: its process lives, beside
	// the one that replaced it. That is warned of.
	if _, err := client(auth.InstanceDir(dir, auth.Embedding, 0)).Announce(ctx, &prismv1.AnnounceRequest{Worker: &prismv1.WorkerInfo{
		Id: "instance-2", Role: prismv1.Role_ROLE_EMBEDDING, Addr: "127.0.0.1:2", Models: []string{"m"}, Healthy: true}}); err != nil {
		t.Fatalf("instance-2 again: %v", err)
	}
	if !strings.Contains(logs.String(), "level=WARN") || !strings.Contains(logs.String(), "two processes hold one worker's certificate") {
		t.Errorf("two processes replacing each other under one worker's certificate are not warned of:\n%s", logs.String())
	}
}

// serveTLSRegistry serves reg over mutual TLS on loopback with the
// router certificate of a new certs init folder (dir, with instances
// per-worker certificates) until the test ends; ctx bounds the test's
// calls.
func serveTLSRegistry(t *testing.T, reg *Registry, instances int) (dir, addr string, ctx context.Context) {
	t.Helper()
	dir = t.TempDir()
	if err := auth.InitCerts(dir, auth.CertOptions{Instances: instances}); err != nil {
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
	reg.Peer = auth.Peer
	prismv1.RegisterRegistryServer(s.GRPC, reg)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	served := make(chan error, 1)
	go func() { served <- s.Serve(ctx) }()
	t.Cleanup(func() { cancel(); <-served })
	return dir, s.Addr(), ctx
}

// tlsDial is the dial option of a client holding the certificate folder d.
func tlsDial(t *testing.T, d string) grpc.DialOption {
	t.Helper()
	c, err := auth.ClientTLS(auth.FolderFiles(d), auth.Router)
	if err != nil {
		t.Fatal(err)
	}
	return grpc.WithTransportCredentials(credentials.NewTLS(c))
}

// dialRegistry dials the registry at addr with the certificate folder
// d, over a connection of its own (its own handshake).
func dialRegistry(t *testing.T, addr, d string) prismv1.RegistryClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, tlsDial(t, d))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return prismv1.NewRegistryClient(conn)
}

// TestTwoProcessesOneCertificateLogBounded: two processes given one
// worker's certificate replace each other at every heartbeat for as
// long as both run. The registry warns of it at once, and again at most
// once per window while it goes on, not at every heartbeat: 100
// heartbeats of each, the first minutes of a misconfigured pair, wrote
// 199 lines.
func TestTwoProcessesOneCertificateLogBounded(t *testing.T) {
	reg := NewRegistry(time.Minute, nil)
	reg.Instance = func(ctx context.Context) bool { return auth.PeerInstance(ctx) != "" }
	var logs lockedBuffer
	reg.Log = slog.New(slog.NewTextHandler(&logs, nil))
	dir, addr, ctx := serveTLSRegistry(t, reg, 1)
	c := dialRegistry(t, addr, auth.InstanceDir(dir, auth.Dense, 0))
	for beat := range 100 {
		for _, w := range []struct{ id, addr string }{{"a", "127.0.0.1:1"}, {"b", "127.0.0.1:2"}} {
			if _, err := c.Announce(ctx, &prismv1.AnnounceRequest{Worker: &prismv1.WorkerInfo{
				Id: w.id, Role: prismv1.Role_ROLE_DENSE, Addr: w.addr, Models: []string{"m"}, Healthy: true}}); err != nil {
				t.Fatalf("heartbeat %d of %s: %v", beat, w.id, err)
			}
		}
	}
	got := logs.String()
	if n := strings.Count(got, "two processes hold one worker's certificate"); n != 1 {
		t.Errorf("the two processes warned of %d times in 100 heartbeats, want once (then once per window):\n%s", n, got)
	}
	if n := strings.Count(got, "\n"); n > 3 {
		t.Errorf("%d lines logged for 100 heartbeats of two processes on one certificate, want at most 3", n)
	}
}
