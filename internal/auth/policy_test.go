package auth

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
)

// asPeer is a server context whose caller presented a verified
// certificate with role r ("" : a verified certificate without a role).
func asPeer(r Role) context.Context {
	c := &x509.Certificate{}
	c.Subject.CommonName = "test-" + string(r)
	if r != "" {
		c.URIs = []*url.URL{RoleURI(r)}
	}
	return peer.NewContext(context.Background(), &peer.Peer{AuthInfo: credentials.TLSInfo{State: tls.ConnectionState{VerifiedChains: [][]*x509.Certificate{{c}}}}})
}

// noCert is a TLS connection without a client certificate.
func noCert(md ...string) context.Context {
	ctx := peer.NewContext(context.Background(), &peer.Peer{AuthInfo: credentials.TLSInfo{}})
	if len(md) > 0 {
		ctx = metadata.NewIncomingContext(ctx, metadata.Pairs(md...))
	}
	return ctx
}

func TestAuthorizeTable(t *testing.T) {
	const (
		recommend = "/prism.v1.Recommender/Recommend"
		stream    = "/prism.v1.Recommender/RecommendStream"
		update    = "/prism.v1.Embeddings/Update"
		announce  = "/prism.v1.Registry/Announce"
		leave     = "/prism.v1.Registry/Leave"
		list      = "/prism.v1.Registry/List"
		updateLog = "/prism.v1.Registry/UpdateLog"
		lookup    = "/prism.v1.EmbeddingTier/Lookup"
		apply     = "/prism.v1.EmbeddingTier/Update"
		score     = "/prism.v1.DenseTier/Score"
		health    = "/grpc.health.v1.Health/Check"
		reflect   = "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"
		unknown   = "/prism.v1.Registry/Forget"
	)
	ok, denied := codes.OK, codes.PermissionDenied
	// want[method] is the code for router, embedding, dense, admin.
	want := map[string][4]codes.Code{
		recommend: {ok, ok, ok, ok},
		stream:    {ok, ok, ok, ok},
		update:    {ok, denied, denied, ok},
		announce:  {denied, ok, ok, denied},
		leave:     {denied, ok, ok, denied},
		list:      {ok, ok, ok, ok},
		updateLog: {ok, denied, denied, denied},
		lookup:    {ok, denied, denied, denied},
		apply:     {ok, denied, denied, ok},
		score:     {denied, ok, denied, denied},
		health:    {ok, ok, ok, ok},
		reflect:   {ok, ok, ok, ok},
		unknown:   {denied, denied, denied, denied},
	}
	p := Policy{Token: "0123456789abcdef-token"}
	for method, codes4 := range want {
		for i, r := range Roles {
			err := p.Authorize(asPeer(r), method)
			if status.Code(err) != codes4[i] {
				t.Errorf("%s calling %s: %v, want %v", r, method, err, codes4[i])
			}
			if err != nil && (!strings.Contains(err.Error(), string(r)) || !strings.Contains(err.Error(), method)) {
				t.Errorf("%s calling %s: message %q names not both", r, method, err)
			}
		}
	}
	for _, tc := range []struct {
		name   string
		ctx    context.Context
		policy Policy
		method string
		want   codes.Code
	}{
		{"token on Recommend", noCert("authorization", "Bearer 0123456789abcdef-token"), p, recommend, codes.OK},
		{"token on a stream", noCert("authorization", "bearer 0123456789abcdef-token"), p, stream, codes.OK},
		{"token on health", noCert("authorization", "Bearer 0123456789abcdef-token"), p, health, codes.OK},
		{"wrong token", noCert("authorization", "Bearer 0123456789abcdef-tokeN"), p, recommend, codes.Unauthenticated},
		{"token prefix", noCert("authorization", "Bearer 0123456789abcdef"), p, recommend, codes.Unauthenticated},
		{"no token", noCert(), p, recommend, codes.Unauthenticated},
		{"basic auth", noCert("authorization", "Basic 0123456789abcdef-token"), p, recommend, codes.Unauthenticated},
		{"token on an update", noCert("authorization", "Bearer 0123456789abcdef-token"), p, update, codes.Unauthenticated},
		{"token on the registry", noCert("authorization", "Bearer 0123456789abcdef-token"), p, announce, codes.Unauthenticated},
		{"token on an internal RPC", noCert("authorization", "Bearer 0123456789abcdef-token"), p, score, codes.Unauthenticated},
		{"no token configured", noCert("authorization", "Bearer "), Policy{}, recommend, codes.Unauthenticated},
		{"plaintext peer", context.Background(), p, recommend, codes.Unauthenticated},
		{"certificate without a role", asPeer(""), p, recommend, codes.PermissionDenied},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.policy.Authorize(tc.ctx, tc.method); status.Code(err) != tc.want {
				t.Fatalf("%v, want %v", err, tc.want)
			}
		})
	}
}

// TestTableCoversTheAPI: every RPC of api/prismv1 has a rule, so a new
// one is decided on, not refused by surprise.
func TestTableCoversTheAPI(t *testing.T) {
	for _, sd := range []grpc.ServiceDesc{prismv1.Recommender_ServiceDesc, prismv1.Embeddings_ServiceDesc,
		prismv1.Registry_ServiceDesc, prismv1.EmbeddingTier_ServiceDesc, prismv1.DenseTier_ServiceDesc} {
		var names []string
		for _, m := range sd.Methods {
			names = append(names, m.MethodName)
		}
		for _, s := range sd.Streams {
			names = append(names, s.StreamName)
		}
		for _, n := range names {
			if _, ok := RuleFor("/" + sd.ServiceName + "/" + n); !ok {
				t.Errorf("/%s/%s has no rule in auth.Table", sd.ServiceName, n)
			}
		}
	}
}

func TestAllowedAndPeer(t *testing.T) {
	for _, tc := range []struct {
		name     string
		ctx      context.Context
		allowed  bool
		role     string
		ok       bool
		peerName string
	}{
		{"plaintext", context.Background(), true, "", false, ""},
		{"admin", asPeer(Admin), true, "admin", true, "admin/"},
		{"router", asPeer(Router), false, "router", true, "router/"},
		{"no certificate", noCert(), false, "", false, ""},
		{"no role", asPeer(""), false, "", false, "/"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Allowed(tc.ctx, Admin); got != tc.allowed {
				t.Errorf("Allowed = %v", got)
			}
			// The name is the role and the certificate's SHA-256 (hex).
			role, name, ok := Peer(tc.ctx)
			wantLen := 0
			if tc.peerName != "" {
				wantLen = len(tc.peerName) + 64
			}
			if role != tc.role || ok != tc.ok || !strings.HasPrefix(name, tc.peerName) || len(name) != wantLen {
				t.Errorf("Peer = %q %q %v", role, name, ok)
			}
		})
	}
}

func TestReadToken(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name, content, want string
		ok                  bool
	}{
		{"good", "0123456789abcdef0123\n", "0123456789abcdef0123", true},
		{"short", "secret\n", "", false},
		{"empty", "", "", false},
		{"space inside", "0123456789 abcdef0123", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(dir, tc.name)
			os.WriteFile(p, []byte(tc.content), 0o600)
			got, err := ReadToken(p)
			if (err == nil) != tc.ok || got != tc.want {
				t.Fatalf("%q, %v", got, err)
			}
		})
	}
	if _, err := ReadToken(filepath.Join(dir, "missing")); err == nil {
		t.Error("a missing file was read")
	}
}

// TestTokenModeWarning: a bearer token file that group or others can
// read is warned about as a key file is (it admits its reader to
// Recommend as a certificate would); one only its owner reads is not.
func TestTokenModeWarning(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		mode os.FileMode
		warn bool
	}{{0o600, false}, {0o400, false}, {0o640, true}, {0o644, true}, {0o604, true}} {
		p := filepath.Join(dir, fmt.Sprintf("token-%04o", tc.mode))
		if err := os.WriteFile(p, []byte("0123456789abcdef0123\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, tc.mode); err != nil {
			t.Fatal(err)
		}
		w := TokenModeWarning(p)
		if (w != "") != tc.warn {
			t.Errorf("mode %04o: warning %q, want one: %v", tc.mode, w, tc.warn)
		}
		if w != "" && (!strings.Contains(w, p) || !strings.Contains(w, "token") || strings.Contains(w, "0123456789abcdef")) {
			t.Errorf("mode %04o: warning %q should name the token file, and not the token", tc.mode, w)
		}
	}
}
