package auth

import (
	"context"
	"crypto/tls"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/internal/grpctest"
)

// peerRegistry answers List with the caller's role and name.
type peerRegistry struct {
	prismv1.UnimplementedRegistryServer
}

func (peerRegistry) List(ctx context.Context, _ *prismv1.ListRequest) (*prismv1.ListResponse, error) {
	role, name, ok := Peer(ctx)
	if !ok {
		return nil, status.Error(codes.Internal, "no peer")
	}
	return &prismv1.ListResponse{Workers: []*prismv1.WorkerInfo{{Id: role + "/" + name}}}, nil
}

func TestMutualTLS(t *testing.T) {
	root := t.TempDir()
	good, other, expired := filepath.Join(root, "good"), filepath.Join(root, "other"), filepath.Join(root, "expired")
	for _, d := range []string{good, other} {
		if err := InitCerts(d, CertOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := InitCerts(expired, CertOptions{Validity: time.Hour, Now: func() time.Time { return time.Now().Add(-48 * time.Hour) }}); err != nil {
		t.Fatal(err)
	}
	// The server is a router trusting both its own CA and, for the
	// expired case, the expired CA (so only the expiry refuses it).
	serve := func(t *testing.T, caDir string) (*grpctest.Net, string) {
		f := FilesFor(good, Router)
		f.CA = FilesFor(caDir, Router).CA
		conf, err := ServerTLS(f, ServerTLSOptions{})
		if err != nil {
			t.Fatal(err)
		}
		p := Policy{}
		srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(conf)), grpc.UnaryInterceptor(p.UnaryInterceptor()))
		prismv1.RegisterRegistryServer(srv, peerRegistry{})
		var n grpctest.Net
		lis := n.MustListen(t, "router")
		go srv.Serve(lis)
		t.Cleanup(srv.Stop)
		return &n, lis.Addr().String()
	}
	client := func(t *testing.T, f Files, serverRoles ...Role) grpc.DialOption {
		c, err := ClientTLS(f, serverRoles...)
		if err != nil {
			t.Fatal(err)
		}
		c.ServerName = "localhost" // bufconn targets are names, not hosts
		return grpc.WithTransportCredentials(credentials.NewTLS(c))
	}
	withCA := func(f Files, dir string) Files { f.CA = FilesFor(dir, Admin).CA; return f }
	for _, tc := range []struct {
		name     string
		serverCA string
		creds    func(t *testing.T) grpc.DialOption
		announce bool
		want     codes.Code
		wantPeer string
	}{
		{"admin lists", good, func(t *testing.T) grpc.DialOption { return client(t, FilesFor(good, Admin), Router) }, false, codes.OK, "admin/admin"},
		{"embedding lists", good, func(t *testing.T) grpc.DialOption { return client(t, FilesFor(good, Embedding)) }, false, codes.OK, "embedding/embedding"},
		{"admin may not announce", good, func(t *testing.T) grpc.DialOption { return client(t, FilesFor(good, Admin)) }, true, codes.PermissionDenied, ""},
		{"embedding announces", good, func(t *testing.T) grpc.DialOption { return client(t, FilesFor(good, Embedding)) }, true, codes.Unimplemented, ""},
		{"other CA", good, func(t *testing.T) grpc.DialOption { return client(t, withCA(FilesFor(other, Admin), good)) }, false, codes.Unavailable, ""},
		{"expired certificate", expired, func(t *testing.T) grpc.DialOption {
			// Presented by a client other than Prism's: ClientTLS refuses
			// to load it.
			c, err := ClientTLS(Files{CA: FilesFor(good, Admin).CA})
			if err != nil {
				t.Fatal(err)
			}
			f := FilesFor(expired, Admin)
			cert, err := tls.LoadX509KeyPair(f.Cert, f.Key)
			if err != nil {
				t.Fatal(err)
			}
			c.Certificates, c.ServerName = []tls.Certificate{cert}, "localhost"
			return grpc.WithTransportCredentials(credentials.NewTLS(c))
		}, false, codes.Unavailable, ""},
		{"no certificate", good, func(t *testing.T) grpc.DialOption { return client(t, Files{CA: FilesFor(good, Admin).CA}) }, false, codes.Unavailable, ""},
		{"server of the wrong role", good, func(t *testing.T) grpc.DialOption { return client(t, FilesFor(good, Embedding), Dense) }, false, codes.Unavailable, ""},
		{"server from another CA", good, func(t *testing.T) grpc.DialOption { return client(t, withCA(FilesFor(good, Admin), other)) }, false, codes.Unavailable, ""},
		{"plaintext", good, func(t *testing.T) grpc.DialOption { return grpc.WithTransportCredentials(insecure.NewCredentials()) }, false, codes.Unavailable, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n, addr := serve(t, tc.serverCA)
			reg := prismv1.NewRegistryClient(n.Dial(t, addr, tc.creds(t)))
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			var err error
			var resp *prismv1.ListResponse
			if tc.announce {
				_, err = reg.Announce(ctx, &prismv1.AnnounceRequest{})
			} else {
				resp, err = reg.List(ctx, &prismv1.ListRequest{})
			}
			if status.Code(err) != tc.want {
				t.Fatalf("%v, want %v", err, tc.want)
			}
			if tc.wantPeer != "" && !strings.HasPrefix(resp.GetWorkers()[0].GetId(), tc.wantPeer+"/") {
				t.Errorf("the server saw %q, want %q", resp.GetWorkers()[0].GetId(), tc.wantPeer)
			}
		})
	}
}

func TestTLSFiles(t *testing.T) {
	dir := t.TempDir()
	if err := InitCerts(dir, CertOptions{}); err != nil {
		t.Fatal(err)
	}
	f := FilesFor(dir, Dense)
	for _, tc := range []struct {
		name string
		f    Files
	}{
		{"no CA", Files{Cert: f.Cert, Key: f.Key}},
		{"missing CA", Files{Cert: f.Cert, Key: f.Key, CA: filepath.Join(dir, "nope.pem")}},
		{"CA is a key", Files{Cert: f.Cert, Key: f.Key, CA: f.Key}},
		{"key of another role", Files{Cert: f.Cert, Key: FilesFor(dir, Admin).Key, CA: f.CA}},
		{"no key", Files{Cert: f.Cert, CA: f.CA}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := ServerTLS(tc.f, ServerTLSOptions{}); err == nil {
				t.Error("ServerTLS accepted it")
			}
			if _, err := ClientTLS(tc.f); err == nil {
				t.Error("ClientTLS accepted it")
			}
		})
	}
	if c, err := ServerTLS(f, ServerTLSOptions{}); err != nil || c.MinVersion != 0x0304 || c.ClientAuth.String() != "RequireAndVerifyClientCert" {
		t.Errorf("server config %+v, %v", c, err)
	}
}

// TestScrapeTLS: a scraper's configuration takes a server whose
// certificate the CA signed and carries the wanted role, whatever name
// it was dialled by, and refuses another role or another CA's.
func TestScrapeTLS(t *testing.T) {
	dir, other := t.TempDir(), t.TempDir()
	for _, d := range []string{dir, other} {
		if err := InitCerts(d, CertOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	handshake := func(server Files, client *tls.Config) error {
		sc, err := ServerTLS(server, ServerTLSOptions{AllowNoClientCert: true})
		if err != nil {
			t.Fatal(err)
		}
		a, b := net.Pipe()
		defer a.Close()
		defer b.Close()
		go tls.Server(a, sc).Handshake()
		client.ServerName = "a-name-no-certificate-lists.example"
		return tls.Client(b, client).Handshake()
	}
	c, err := ScrapeTLS(FilesFor(dir, Admin), Router)
	if err != nil {
		t.Fatal(err)
	}
	if err := handshake(FilesFor(dir, Router), c.Clone()); err != nil {
		t.Errorf("the router, by a name its certificate does not list: %v", err)
	}
	if err := handshake(FilesFor(dir, Dense), c.Clone()); err == nil || !strings.Contains(err.Error(), "role") {
		t.Errorf("a dense worker as the router: %v", err)
	}
	if err := handshake(FilesFor(other, Router), c.Clone()); err == nil {
		t.Error("another CA's router accepted")
	}
	caOnly, err := ScrapeTLS(Files{CA: FilesFor(dir, Admin).CA}, Router)
	if err != nil || len(caOnly.Certificates) != 0 {
		t.Fatalf("CA only: %v", err)
	}
	if err := handshake(FilesFor(dir, Router), caOnly); err != nil {
		t.Errorf("CA only: %v", err)
	}
}

// Certificates signed by an operator's RSA CA (testdata/orgca) carry a
// mutual TLS handshake between a router and an admin, each verifying the
// other's role certificate against that CA.
func TestMutualTLSOrgCA(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "certs")
	if err := InitCerts(dir, CertOptions{CACert: filepath.Join("testdata", "orgca", "rsa-ca.pem"), CAKey: filepath.Join("testdata", "orgca", "rsa-ca-key.pem")}); err != nil {
		t.Fatal(err)
	}
	sconf, err := ServerTLS(FilesFor(dir, Router), ServerTLSOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cconf, err := ClientTLS(FilesFor(dir, Admin), Router)
	if err != nil {
		t.Fatal(err)
	}
	cconf.ServerName = "localhost"
	a, b := net.Pipe()
	srv, cli := tls.Server(a, sconf), tls.Client(b, cconf)
	done := make(chan error, 1)
	go func() { done <- srv.Handshake() }()
	if err := cli.Handshake(); err != nil {
		t.Fatalf("client handshake: %v", err)
	}
	if err := <-done; err != nil {
		t.Fatalf("server handshake: %v", err)
	}
	if peers := srv.ConnectionState().PeerCertificates; len(peers) == 0 || RoleOf(peers[0]) != Admin {
		t.Fatalf("the router sees %v", peers)
	}
	a.Close() // not the TLS conns: their close_notify would wait on an unread pipe
	b.Close()
}

// TestMismatchHint: the hint for a client and server that disagree on
// TLS, on the messages grpc-go and crypto/tls write; a TLS alert read
// where the preface should be (a certificate refused) is no plaintext
// client, and gets none.
func TestMismatchHint(t *testing.T) {
	for msg, want := range map[string]string{
		`connection error: desc = "error reading server preface: connection reset by peer"`:                         "a plaintext client",
		`connection error: desc = "error reading server preface: EOF"`:                                              "a plaintext client",
		`connection error: desc = "error reading server preface: remote error: tls: unknown certificate authority"`: "",
		`authentication handshake failed: tls: first record does not look like a TLS handshake`:                     "a TLS client against a server started with --insecure",
		`router stopping`: "",
	} {
		got := MismatchHint(msg)
		if want == "" && got != "" || want != "" && !strings.Contains(got, want) {
			t.Errorf("MismatchHint(%q) = %q, want %q", msg, got, want)
		}
	}
}

// tokenCatcher is a Recommender that keeps the bearer token it is sent.
type tokenCatcher struct {
	prismv1.UnimplementedRecommenderServer
	got chan string
}

func (c tokenCatcher) Recommend(ctx context.Context, _ *prismv1.RecommendRequest) (*prismv1.RecommendResponse, error) {
	tok, _ := bearer(ctx)
	c.got <- tok
	return &prismv1.RecommendResponse{}, nil
}

// TestAdminCertificateCannotServe: the admin certificate, which every
// client and operator holds, is a client's only: a server presenting it
// in the router's place at the router's address is refused by a client
// that verifies the server as TLS clients do (the CA and the host name,
// as grpcurl and ghz given ca.pem do, which check no Prism role), so it
// gets neither the client's bearer token nor its requests. The tiers'
// certificates still serve.
func TestAdminCertificateCannotServe(t *testing.T) {
	dir := t.TempDir()
	if err := InitCerts(dir, CertOptions{}); err != nil {
		t.Fatal(err)
	}
	const token = "0123456789abcdef-token"
	for _, tc := range []struct {
		role  Role
		serve bool
	}{{Router, true}, {Admin, false}} {
		conf, err := ServerTLS(FilesFor(dir, tc.role), ServerTLSOptions{AllowNoClientCert: true})
		if err != nil {
			t.Fatal(err)
		}
		srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(conf)))
		catcher := tokenCatcher{got: make(chan string, 1)}
		prismv1.RegisterRecommenderServer(srv, catcher)
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		go srv.Serve(lis)
		cc, err := ClientTLS(Files{CA: FilesFor(dir, Admin).CA})
		if err != nil {
			t.Fatal(err)
		}
		bt, err := BearerToken(token)
		if err != nil {
			t.Fatal(err)
		}
		conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(credentials.NewTLS(cc)), bt)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err = prismv1.NewRecommenderClient(conn).Recommend(ctx, &prismv1.RecommendRequest{})
		cancel()
		conn.Close()
		srv.Stop()
		var got string
		select {
		case got = <-catcher.got:
		default:
		}
		switch {
		case tc.serve && (err != nil || got != token):
			t.Errorf("a server with the %s certificate: %v (token %q)", tc.role, err, got)
		case !tc.serve && (err == nil || got != ""):
			t.Errorf("a server with the %s certificate was taken for the router: %v, and got the bearer token %q", tc.role, err, got)
		}
	}
}

// TestTLSOwnCertificateOutOfDate: a process whose own certificate has
// expired, or is not valid yet, is told so when it loads it, naming the
// file and the date, instead of serving (or dialling) with it and being
// refused by every peer, the reason in the peers' logs alone.
func TestTLSOwnCertificateOutOfDate(t *testing.T) {
	root := t.TempDir()
	expired, early := filepath.Join(root, "expired"), filepath.Join(root, "early")
	if err := InitCerts(expired, CertOptions{Validity: time.Hour, Now: func() time.Time { return time.Now().Add(-48 * time.Hour) }}); err != nil {
		t.Fatal(err)
	}
	if err := InitCerts(early, CertOptions{Validity: time.Hour, Now: func() time.Time { return time.Now().Add(48 * time.Hour) }}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		dir, want string
	}{{expired, "expired"}, {early, "not valid before"}} {
		f := FilesFor(tc.dir, Router)
		_, serr := ServerTLS(f, ServerTLSOptions{})
		_, cerr := ClientTLS(f, Embedding)
		for _, err := range []error{serr, cerr} {
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), f.Cert) {
				t.Errorf("%s: %v, want an error naming %s and saying %q", tc.dir, err, f.Cert, tc.want)
			}
		}
		// A client without a certificate of its own has none to check.
		if _, err := ClientTLS(Files{CA: f.CA}, Router); err != nil {
			t.Errorf("%s: the CA alone: %v", tc.dir, err)
		}
	}
}
