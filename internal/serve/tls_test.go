package serve

import (
	"context"
	"fmt"
	"io"
	"net/http"
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

// TestMetricsOverTLS: a tier serving TLS serves /metrics over HTTPS with
// its certificate, not plain HTTP; a scraper needs only the CA unless
// MetricsRequireClientCert, and then a certificate the CA signed.
func TestMetricsOverTLS(t *testing.T) {
	dir := t.TempDir()
	if err := auth.InitCerts(dir, auth.CertOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, require := range []bool{false, true} {
		conf, err := auth.ServerTLS(auth.FilesFor(dir, auth.Dense), auth.ServerTLSOptions{})
		if err != nil {
			t.Fatal(err)
		}
		s, err := New("dense", Options{Addr: "127.0.0.1:0", MetricsAddr: "127.0.0.1:0", TLS: conf, MetricsRequireClientCert: require, Logger: quiet()})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		served := make(chan error, 1)
		go func() { served <- s.Serve(ctx) }()
		get := func(url string, files auth.Files) error {
			c, err := auth.ClientTLS(files)
			if err != nil {
				t.Fatal(err)
			}
			hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: c}}
			resp, err := hc.Get(url)
			if err != nil {
				return err
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), "prism_rpc_") && !strings.Contains(string(b), "go_goroutines") {
				return fmt.Errorf("status %d: %.200s", resp.StatusCode, b)
			}
			return nil
		}
		https := MetricsScheme(true) + "://" + s.MetricsAddr() + "/metrics"
		caOnly := auth.Files{CA: auth.FilesFor(dir, auth.Admin).CA}
		if err := get(https, auth.FilesFor(dir, auth.Admin)); err != nil {
			t.Errorf("require %v: scraping with a certificate: %v", require, err)
		}
		if err := get(https, caOnly); (err == nil) == require {
			t.Errorf("require %v: scraping with the CA alone: %v", require, err)
		}
		if resp, err := http.Get("http://" + s.MetricsAddr() + "/metrics"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				t.Errorf("require %v: /metrics answers plain HTTP", require)
			}
		}
		cancel()
		<-served
	}
}

// TestMaxConcurrentStreams: one client connection runs at most
// MaxConcurrentStreams RPCs at once; the next waits for one to end.
func TestMaxConcurrentStreams(t *testing.T) {
	bn := &grpctest.Net{}
	s, err := New("dense", Options{Listener: bn.MustListen(t, "dense"), MetricsAddr: "off", MaxConcurrentStreams: 2, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- s.Serve(ctx) }()
	t.Cleanup(func() { cancel(); <-served })
	hc := healthpb.NewHealthClient(bn.Dial(t, s.Addr()))
	// Two Watch streams stay open: the connection's whole allowance.
	var stops []context.CancelFunc
	for range 2 {
		wctx, stop := context.WithCancel(context.Background())
		stops = append(stops, stop)
		w, err := hc.Watch(wctx, &healthpb.HealthCheckRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Recv(); err != nil { // the stream is open on the server
			t.Fatal(err)
		}
	}
	check := func(d time.Duration) error {
		cctx, c := context.WithTimeout(context.Background(), d)
		defer c()
		_, err := hc.Check(cctx, &healthpb.HealthCheckRequest{})
		return err
	}
	if err := check(300 * time.Millisecond); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("a third RPC beside two open streams, limit 2: %v, want it held until its deadline", err)
	}
	stops[0]()
	if err := check(5 * time.Second); err != nil {
		t.Fatalf("after one stream ended: %v", err)
	}
	stops[1]()
}
