package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/internal/auth"
	"github.com/prism-serve/prism/internal/leview"
	"github.com/prism-serve/prism/internal/readyline"
	"github.com/prism-serve/prism/models"
)

// TestAuth: real processes over mutual TLS. A certificate from another
// CA, a plaintext client or one without a certificate is refused; a
// right certificate with the wrong role gets PermissionDenied; a bearer
// token admits a client without a certificate to Recommend only.
func TestAuth(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	_, part, cfg := partitioned(t, dir, "dlrm-tiny")
	certs, other := newCerts(t), newCerts(t)
	const token = "e2e-0123456789abcdef0123456789"
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// The router gets certs init's folder (and reads only router/), the
	// dense worker its role's folder alone.
	router := startProc(t, readyline.Router, "serve", "router", "--certs", certs, "--auth-token-file", tokenFile, "--addr", "127.0.0.1:0", "--heartbeat", "200ms")
	dense := startProc(t, readyline.Dense, "serve", "dense", "--certs", auth.RoleDir(certs, auth.Dense), "--plan", part, "--router", router.addr)
	// The embedding tier with explicit files instead of --certs.
	ef := auth.FilesFor(certs, auth.Embedding)
	embedding := startProc(t, readyline.Embedding, "serve", "embedding", "--tls-cert", ef.Cert, "--tls-key", ef.Key, "--tls-ca", ef.CA,
		"--plan", part, "--db", filepath.Join(dir, "db"), "--router", router.addr)
	admin := dial(t, router.addr, certs, auth.Admin)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		ws, err := prismv1.NewRegistryClient(admin).List(ctx, &prismv1.ListRequest{})
		if err == nil && len(ws.GetWorkers()) == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the workers never registered over TLS: %v %v", ws, err)
		}
	}
	src, _ := models.NewSynthetic(cfg.Signature(), models.SyntheticOptions{Seed: 9})
	b, _ := src.Next(8)
	req := toRequest(cfg.Name, b, nil)
	// The embedding worker learns the dense workers from the router's
	// answer to its next announce: until then Unavailable.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		_, err := prismv1.NewRecommenderClient(admin).Recommend(ctx, req)
		if err == nil {
			break
		}
		if status.Code(err) != codes.Unavailable || time.Now().After(deadline) {
			t.Fatalf("Recommend as admin: %v", err)
		}
	}

	// Connections that present something else.
	tlsConn := func(f auth.Files, opts ...grpc.DialOption) *grpc.ClientConn {
		c, err := auth.ClientTLS(f)
		if err != nil {
			t.Fatal(err)
		}
		conn, err := grpc.NewClient(router.addr, append([]grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(c))}, opts...)...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return conn
	}
	withToken := func(tok string) grpc.DialOption {
		o, err := auth.BearerToken(tok)
		if err != nil {
			t.Fatal(err)
		}
		return o
	}
	caOnly := auth.Files{CA: auth.FilesFor(certs, auth.Admin).CA}
	otherCA := auth.FilesFor(other, auth.Admin)
	otherCA.CA = caOnly.CA // trusts the router; the router does not trust it
	plain, err := grpc.NewClient(router.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	recommend := func(c *grpc.ClientConn) error {
		_, err := prismv1.NewRecommenderClient(c).Recommend(ctx, req)
		return err
	}
	row := leview.Bytes(make([]float32, 16))
	for _, tc := range []struct {
		name string
		call func() error
		want []codes.Code
	}{
		{"certificate of another CA", func() error { return recommend(tlsConn(otherCA)) }, []codes.Code{codes.Unavailable, codes.Unauthenticated}},
		{"plaintext client", func() error { return recommend(plain) }, []codes.Code{codes.Unavailable}},
		{"no certificate, no token", func() error { return recommend(tlsConn(caOnly)) }, []codes.Code{codes.Unauthenticated}},
		{"bearer token Recommend", func() error { return recommend(tlsConn(caOnly, withToken(token))) }, []codes.Code{codes.OK}},
		{"wrong bearer token", func() error { return recommend(tlsConn(caOnly, withToken(token+"x"))) }, []codes.Code{codes.Unauthenticated}},
		{"bearer token updating embeddings", func() error {
			_, err := prismv1.NewEmbeddingsClient(tlsConn(caOnly, withToken(token))).Update(ctx, &prismv1.UpdateRequest{Model: cfg.Name, Table: "emb_l.0.weight", Ids: []int64{1}, Rows: row})
			return err
		}, []codes.Code{codes.Unauthenticated}},
		{"embedding certificate updating embeddings", func() error {
			_, err := prismv1.NewEmbeddingsClient(dial(t, router.addr, certs, auth.Embedding)).Update(ctx, &prismv1.UpdateRequest{Model: cfg.Name, Table: "emb_l.0.weight", Ids: []int64{1}, Rows: row})
			return err
		}, []codes.Code{codes.PermissionDenied}},
		{"client announcing as a worker", func() error {
			_, err := prismv1.NewRegistryClient(admin).Announce(ctx, &prismv1.AnnounceRequest{Worker: &prismv1.WorkerInfo{Id: "evil", Role: prismv1.Role_ROLE_EMBEDDING, Addr: "127.0.0.1:1", Models: []string{cfg.Name}}})
			return err
		}, []codes.Code{codes.PermissionDenied}},
		{"router certificate scoring on a dense worker", func() error {
			_, err := prismv1.NewDenseTierClient(dial(t, dense.addr, certs, auth.Router)).Score(ctx, &prismv1.ScoreRequest{Model: cfg.Name, NumSamples: 1})
			return err
		}, []codes.Code{codes.PermissionDenied}},
		{"embedding certificate looking up on an embedding worker", func() error {
			_, err := prismv1.NewEmbeddingTierClient(dial(t, embedding.addr, certs, auth.Embedding)).Lookup(ctx, &prismv1.LookupRequest{Model: cfg.Name, NumSamples: 1})
			return err
		}, []codes.Code{codes.PermissionDenied}},
		{"router certificate sending an unsequenced update", func() error {
			_, err := prismv1.NewEmbeddingTierClient(dial(t, embedding.addr, certs, auth.Router)).Update(ctx, &prismv1.ApplyUpdateRequest{Update: &prismv1.UpdateRequest{Model: cfg.Name, Table: "emb_l.0.weight", Ids: []int64{1}, Rows: row}})
			return err
		}, []codes.Code{codes.PermissionDenied}},
		{"admin taking an update number", func() error {
			_, err := prismv1.NewEmbeddingTierClient(dial(t, embedding.addr, certs, auth.Admin)).Update(ctx, &prismv1.ApplyUpdateRequest{Seq: 1000, Update: &prismv1.UpdateRequest{Model: cfg.Name, Table: "emb_l.0.weight", Ids: []int64{1}, Rows: row}})
			return err
		}, []codes.Code{codes.PermissionDenied}},
		{"admin sending an unsequenced update", func() error {
			_, err := prismv1.NewEmbeddingTierClient(dial(t, embedding.addr, certs, auth.Admin)).Update(ctx, &prismv1.ApplyUpdateRequest{Update: &prismv1.UpdateRequest{Model: cfg.Name, Table: "emb_l.0.weight", Ids: []int64{1}, Rows: row}})
			return err
		}, []codes.Code{codes.OK}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			for _, c := range tc.want {
				if status.Code(err) == c {
					return
				}
			}
			t.Fatalf("%v, want one of %v", err, tc.want)
		})
	}
	if _, err := prismv1.NewRecommenderClient(admin).Recommend(ctx, req); err != nil {
		t.Fatalf("Recommend after the refused calls: %v", err)
	}
	// prism loadgen with a certificate, and with the token alone.
	for _, args := range [][]string{{"--certs", certs}, {"--certs", auth.RoleDir(certs, auth.Admin)}, {"--tls-ca", caOnly.CA, "--auth-token-file", tokenFile}} {
		out, err := run(t, nil, append([]string{"loadgen", "--target", router.addr, "--model", cfg.Name, "--plan", part, "--candidates", "8",
			"--rate", "200", "--max-requests", "20", "--duration", "5s", "--quiet"}, args...)...)
		if err != nil || !strings.Contains(out, "ok 20  errors 0") {
			t.Errorf("loadgen %v: %v\n%s", args, err, out)
		}
	}
	// Its update stream: taken from an admin certificate, refused to
	// the token (which is for Recommend alone), and said so. First the
	// router's window of learning what its workers hold ends (updates
	// in it are Unavailable, "retry in ...").
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		_, err := prismv1.NewEmbeddingsClient(admin).Update(ctx, &prismv1.UpdateRequest{Model: cfg.Name, Table: "emb_l.0.weight", Ids: []int64{1}, Rows: row})
		if err == nil {
			break
		}
		if status.Code(err) != codes.Unavailable || time.Now().After(deadline) {
			t.Fatalf("update before the loadgen's: %v", err)
		}
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--certs", certs}, "updates     sent 20  ok 20  errors 0"},
		{[]string{"--tls-ca", caOnly.CA, "--auth-token-file", tokenFile}, "updates: none of 20 updates was acknowledged; the first Unauthenticated"},
	} {
		out, err := run(t, nil, append([]string{"loadgen", "--target", router.addr, "--model", cfg.Name, "--plan", part, "--update-only",
			"--update-rate", "100", "--update-rows", "16", "--max-requests", "20", "--duration", "5s", "--quiet"}, tc.args...)...)
		if !strings.Contains(out+fmt.Sprint(err), tc.want) {
			t.Errorf("loadgen --update-only %v: %v\n%s\nwant %q", tc.args, err, out, tc.want)
		}
	}
}

// TestTLSFlags: a serving command without TLS flags says how to get
// them; --insecure says once that it runs without authentication.
func TestTLSFlags(t *testing.T) {
	dir := t.TempDir()
	certs := newCerts(t)
	// The layout certs init wrote before role folders.
	flat := filepath.Join(dir, "flat")
	os.Mkdir(flat, 0o755)
	for _, r := range auth.Roles {
		f := auth.FilesFor(certs, r)
		for from, to := range map[string]string{f.Cert: string(r) + ".pem", f.Key: string(r) + "-key.pem", f.CA: "ca.pem"} {
			b, _ := os.ReadFile(from)
			os.WriteFile(filepath.Join(flat, to), b, 0o600)
		}
	}
	token := filepath.Join(dir, "token")
	os.WriteFile(token, []byte("0123456789abcdef0123"), 0o600)
	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{"no TLS flags", []string{"serve", "router", "--addr", "127.0.0.1:0"}, []string{"prism certs init", "--insecure"}},
		{"both", []string{"serve", "router", "--addr", "127.0.0.1:0", "--insecure", "--certs", dir}, []string{"--insecure goes with neither"}},
		{"token over plaintext", []string{"serve", "router", "--addr", "127.0.0.1:0", "--insecure", "--auth-token-file", token}, []string{"warning: --insecure", "needs TLS"}},
		{"plain HTTP named", []string{"serve", "router", "--addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--insecure", "--auth-token-file", token}, []string{"warning: --insecure: the router (and its --http-addr, plain HTTP) runs plaintext", "needs TLS"}},
		{"certs folder without certificates", []string{"serve", "router", "--addr", "127.0.0.1:0", "--certs", dir}, []string{"--certs", "holds no router certificate", "prism certs init folder"}},
		{"another role's folder", []string{"serve", "router", "--addr", "127.0.0.1:0", "--certs", auth.RoleDir(certs, auth.Admin)}, []string{"carries role \"admin\"", "runs as router"}},
		{"flat folder warns once", []string{"serve", "dense", "--certs", flat, "--plan", filepath.Join(dir, "nope")}, []string{"warning: " + flat + " has the old flat layout", "nope"}},
		{"insecure warns", []string{"serve", "dense", "--insecure", "--plan", filepath.Join(dir, "nope")}, []string{"warning: --insecure: the dense tier runs plaintext"}},
		{"certs init twice", []string{"certs", "init", newCerts(t)}, []string{"a CA exists there already"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := run(t, nil, tc.args...)
			if err == nil {
				t.Fatalf("no error:\n%s", out)
			}
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("output lacks %q:\n%s", w, out)
				}
			}
			if n := strings.Count(out, "warning:"); n > 1 {
				t.Errorf("%d warnings:\n%s", n, out)
			}
		})
	}
}

// TestUpBearerToken: prism up --auth-token-file (a path relative to up's
// folder) admits a client without a certificate to Recommend, as the
// README's grpcurl example calls it, with a request prism loadgen
// --print-request wrote; the registry still wants a certificate.
func TestUpBearerToken(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	_, part, cfg := partitioned(t, dir, "dlrm-tiny")
	const token = "up-e2e-0123456789abcdef0123456789"
	if err := os.WriteFile(filepath.Join(dir, "token.txt"), []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(prismBin, "up", "--addr", "127.0.0.1:0", "--db", "db", "--model", part, "--auth-token-file", "token.txt")
	cmd.Dir = dir
	up := startCmd(t, cmd, "up", readyline.Up, true, 3*time.Minute)
	certs := filepath.Join(dir, "certs")

	// Ready means ready for updates too: one sent on the ready line is
	// applied (it was answered Unavailable, the router still in the
	// model's start-up window).
	{
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		r, err := prismv1.NewEmbeddingsClient(dial(t, up.addr, certs, auth.Admin)).Update(ctx, &prismv1.UpdateRequest{
			Model: cfg.Name, Table: models.TableName(0), Ids: []int64{1}, Rows: leview.Bytes(make([]float32, cfg.EmbDim))})
		cancel()
		if err != nil || r.GetWorkers() != 1 {
			t.Fatalf("an Update on the ready line: %v %v", r, err)
		}
	}

	// up says how a client reaches it; the command it prints runs as
	// printed (from up's folder) and is answered.
	var hint string
	for deadline := time.Now().Add(5 * time.Second); hint == "" && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if m := regexp.MustCompile(`up: clients connect with --certs certs, e\.g\. prism (loadgen [^\n]*)`).FindStringSubmatch(up.log.String()); m != nil {
			hint = m[1]
		}
	}
	if hint == "" {
		t.Fatalf("up printed no client hint naming its certificates:\n%s", up.log.String())
	}
	// 20 a second: at 5, a Poisson second sent nothing one run in 150
	// (e^-5), and loadgen fails a run that sent nothing.
	lg := exec.Command(prismBin, append(strings.Fields(hint), "--duration", "1s", "--rate", "20", "--candidates", "5", "--quiet")...)
	lg.Dir = dir
	if out, err := lg.CombinedOutput(); err != nil || !strings.Contains(string(out), "errors 0") {
		t.Fatalf("prism %s: %v\n%s", hint, err, out)
	}
	// And how to see which workers serve what: prism status, as printed.
	m := regexp.MustCompile(`up: which workers serve what: prism (status [^\n]*)`).FindStringSubmatch(up.log.String())
	if m == nil {
		t.Fatalf("up printed no prism status hint:\n%s", up.log.String())
	}
	st := exec.Command(prismBin, append(strings.Fields(m[1]), "--check")...)
	st.Dir = dir
	if out, err := st.CombinedOutput(); err != nil || strings.Count(string(out), " serving ") < 2 || strings.Contains(string(out), "worker serving") {
		t.Fatalf("prism %s: %v, want its embedding and dense workers serving:\n%s", m[1], err, out)
	}

	req := printedRequest(t, cfg.Name, 5)
	c, err := auth.ClientTLS(auth.Files{CA: auth.FilesFor(certs, auth.Admin).CA})
	if err != nil {
		t.Fatal(err)
	}
	bearer := func(tok string) *grpc.ClientConn {
		o, err := auth.BearerToken(tok)
		if err != nil {
			t.Fatal(err)
		}
		conn, err := grpc.NewClient(up.addr, grpc.WithTransportCredentials(credentials.NewTLS(c)), o)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return conn
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	byToken, err := prismv1.NewRecommenderClient(bearer(token)).Recommend(ctx, req)
	if err != nil {
		t.Fatalf("Recommend with the token: %v", err)
	}
	byCert, err := prismv1.NewRecommenderClient(dial(t, up.addr, certs, auth.Admin)).Recommend(ctx, req)
	if err != nil {
		t.Fatalf("Recommend with the admin certificate: %v", err)
	}
	if len(byToken.GetScores()) != 5 || !slices.Equal(byToken.GetScores(), byCert.GetScores()) {
		t.Fatalf("scores with the token %v, with a certificate %v", byToken.GetScores(), byCert.GetScores())
	}
	if _, err := prismv1.NewRecommenderClient(bearer(token+"x")).Recommend(ctx, req); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("Recommend with a wrong token: %v, want Unauthenticated", err)
	}
	if _, err := prismv1.NewRegistryClient(bearer(token)).List(ctx, &prismv1.ListRequest{}); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("Registry/List with the token: %v, want Unauthenticated", err)
	}
}

// TestRouterWarnsReadableToken: serve router warns, as for a key, when
// its --auth-token-file is readable by group or others (whoever reads
// it may call Recommend), naming the file and not the token; not when
// only its owner reads it.
func TestRouterWarnsReadableToken(t *testing.T) {
	certs := newCerts(t)
	const token = "e2e-0123456789abcdef0123456789"
	for _, mode := range []os.FileMode{0o644, 0o600} {
		tokenFile := filepath.Join(t.TempDir(), "token")
		if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(tokenFile, mode); err != nil {
			t.Fatal(err)
		}
		router := startProc(t, readyline.Router, "serve", "router", "--certs", certs, "--auth-token-file", tokenFile, "--addr", "127.0.0.1:0", "--metrics-addr", "off")
		log := router.log.String()
		warned := strings.Contains(log, "warning: bearer token file "+tokenFile+" is readable by group or others")
		if warned != (mode == 0o644) {
			t.Errorf("token file of mode %04o: warned %v; stderr:\n%s", mode, warned, log)
		}
		if strings.Contains(log, token) {
			t.Errorf("the router's stderr holds the token:\n%s", log)
		}
	}
}
