package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/internal/auth"
	"github.com/prism-serve/prism/internal/readyline"
	"github.com/prism-serve/prism/internal/serve"
	"github.com/prism-serve/prism/router"
)

// TestUpHTTPJSON: prism up --http-addr serves Recommend over HTTP/JSON
// with up's certificates: the request prism loadgen --print-request 1
// writes, POSTed with the admin certificate, gets the scores the same
// request gets over gRPC; without a certificate it is 401. The curl
// command up prints runs as printed.
func TestUpHTTPJSON(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	_, part, cfg := partitioned(t, dir, "dlrm-tiny")
	cmd := exec.Command(prismBin, "up", "--addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--db", "db", "--model", part)
	cmd.Dir = dir
	up := startCmd(t, cmd, "up", readyline.Up, true, 3*time.Minute)
	certs := filepath.Join(dir, "certs")

	// up names the HTTP/JSON address in the curl command it prints.
	hintRE := regexp.MustCompile(`up: Recommend over HTTP/JSON: (curl [^\n]*https://(\S+)/v1/recommend)`)
	var hint, addr string
	for deadline := time.Now().Add(5 * time.Second); hint == "" && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if m := hintRE.FindStringSubmatch(up.log.String()); m != nil {
			hint, addr = m[1], m[2]
		}
	}
	if hint == "" {
		t.Fatalf("up printed no HTTP/JSON hint:\n%s", up.log.String())
	}

	out, err := exec.Command(prismBin, "loadgen", "--model", cfg.Name, "--print-request", "1", "--candidates", "7").Output()
	if err != nil {
		t.Fatalf("loadgen --print-request: %v", err)
	}
	var req prismv1.RecommendRequest
	if err := protojson.Unmarshal(out, &req); err != nil {
		t.Fatalf("printed request %q: %v", out, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	byGRPC, err := prismv1.NewRecommenderClient(dial(t, up.addr, certs, auth.Admin)).Recommend(ctx, &req)
	if err != nil {
		t.Fatalf("Recommend over gRPC: %v", err)
	}
	if len(byGRPC.GetScores()) != 7 {
		t.Fatalf("gRPC scores %v, want 7", byGRPC.GetScores())
	}
	same := func(how string, got *prismv1.RecommendResponse) {
		t.Helper()
		if len(got.GetScores()) != len(byGRPC.GetScores()) {
			t.Fatalf("%s: scores %v, over gRPC %v", how, got.GetScores(), byGRPC.GetScores())
		}
		for i, s := range got.GetScores() {
			if d := math.Abs(float64(s - byGRPC.GetScores()[i])); d > 1e-6 {
				t.Fatalf("%s: score %d is %v, over gRPC %v", how, i, s, byGRPC.GetScores()[i])
			}
		}
		if got.GetModel() != cfg.Name || got.GetVersion() != byGRPC.GetVersion() {
			t.Fatalf("%s: model %q version %d, over gRPC %q %d", how, got.GetModel(), got.GetVersion(), byGRPC.GetModel(), byGRPC.GetVersion())
		}
	}

	post := func(role auth.Role) (int, []byte) {
		t.Helper()
		f := auth.Files{CA: auth.FilesFor(certs, auth.Admin).CA}
		if role != "" {
			f = auth.FilesFor(certs, role)
		}
		c, err := auth.ClientTLS(f)
		if err != nil {
			t.Fatal(err)
		}
		hc := &http.Client{Timeout: time.Minute, Transport: &http.Transport{TLSClientConfig: c, ForceAttemptHTTP2: true}}
		hr, err := http.NewRequestWithContext(ctx, http.MethodPost, "https://"+addr+"/v1/recommend", bytes.NewReader(out))
		if err != nil {
			t.Fatal(err)
		}
		hr.Header.Set("Content-Type", "application/json")
		hr.Header.Set("X-Prism-Timeout", "30s")
		r, err := hc.Do(hr)
		if err != nil {
			t.Fatalf("POST /v1/recommend as %q: %v", role, err)
		}
		defer r.Body.Close()
		b, _ := io.ReadAll(r.Body)
		if ct := r.Header.Get("Content-Type"); ct != "application/json" {
			t.Errorf("Content-Type %q", ct)
		}
		return r.StatusCode, b
	}
	code, body := post(auth.Admin)
	if code != http.StatusOK {
		t.Fatalf("POST as admin: %d %s", code, body)
	}
	var byHTTP prismv1.RecommendResponse
	if err := protojson.Unmarshal(body, &byHTTP); err != nil {
		t.Fatalf("response %s: %v", body, err)
	}
	same("HTTP/JSON", &byHTTP)

	code, body = post("")
	var e struct{ Code, Message string }
	if err := json.Unmarshal(body, &e); err != nil || code != http.StatusUnauthorized || e.Code != "UNAUTHENTICATED" || !strings.Contains(e.Message, "certificate") {
		t.Fatalf("POST without a certificate: %d %s (%v), want 401 UNAUTHENTICATED", code, body, err)
	}

	// The endpoint's OpenAPI document and readiness, to anyone (an API
	// gateway, a load balancer): the document is the committed one.
	{
		c, err := auth.ClientTLS(auth.Files{CA: auth.FilesFor(certs, auth.Admin).CA})
		if err != nil {
			t.Fatal(err)
		}
		hc := &http.Client{Timeout: time.Minute, Transport: &http.Transport{TLSClientConfig: c}}
		want, err := os.ReadFile(filepath.Join("..", "..", "docs", "openapi.json"))
		if err != nil {
			t.Fatal(err)
		}
		for path, body := range map[string][]byte{router.OpenAPIPath: want, serve.ReadyPath: []byte("ok\n")} {
			r, err := hc.Get("https://" + addr + path)
			if err != nil {
				t.Fatalf("GET %s: %v", path, err)
			}
			b, _ := io.ReadAll(r.Body)
			r.Body.Close()
			if r.StatusCode != http.StatusOK || !bytes.Equal(b, body) {
				t.Errorf("GET %s without a certificate: %d %.200q, want 200 and %.60q", path, r.StatusCode, b, body)
			}
		}
	}

	// The command up printed, run as printed from up's folder.
	if _, err := exec.LookPath("curl"); err != nil {
		t.Log("curl not installed: up's curl command not run")
		return
	}
	if err := os.WriteFile(filepath.Join(dir, "req.json"), out, 0o644); err != nil {
		t.Fatal(err)
	}
	c := exec.Command("sh", "-c", hint+" --fail-with-body --silent --show-error")
	c.Dir = dir
	got, err := c.Output()
	if err != nil {
		t.Fatalf("%s: %v\n%s", hint, err, got)
	}
	var byCurl prismv1.RecommendResponse
	if err := protojson.Unmarshal(got, &byCurl); err != nil {
		t.Fatalf("curl's answer %s: %v", got, err)
	}
	same("curl", &byCurl)
}

// TestLoadgenHTTPJSON: prism loadgen --target https://HOST:PORT drives
// prism up --http-addr over HTTP/JSON: with up's admin certificate
// (--certs) and with the CA and the bearer token, every request is
// answered OK; a wrong token is counted as the code the router's JSON
// names (UNAUTHENTICATED), read back by the generator.
func TestLoadgenHTTPJSON(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	_, part, cfg := partitioned(t, dir, "dlrm-tiny")
	const token = "lg-http-0123456789abcdef0123456789"
	if err := os.WriteFile(filepath.Join(dir, "token.txt"), []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "wrong.txt"), []byte("wrong-0123456789abcdef0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(prismBin, "up", "--addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--db", "db", "--model", part, "--auth-token-file", "token.txt")
	cmd.Dir = dir
	up := startCmd(t, cmd, "up", readyline.Up, true, 3*time.Minute)
	hintRE := regexp.MustCompile(`up: Recommend over HTTP/JSON: curl [^\n]*https://(\S+)/v1/recommend`)
	var addr string
	for deadline := time.Now().Add(5 * time.Second); addr == "" && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if m := hintRE.FindStringSubmatch(up.log.String()); m != nil {
			addr = m[1]
		}
	}
	if addr == "" {
		t.Fatalf("up printed no HTTP/JSON address:\n%s", up.log.String())
	}
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"admin certificate, pooled, open loop", []string{"--target", "https://" + addr, "--certs", "certs", "--rate", "20", "--duration", "3s", "--pool", "16"}},
		{"token, closed loop", []string{"--target", "https://" + addr + "/v1/recommend", "--tls-ca", "certs/admin/ca.pem", "--auth-token-file", "token.txt", "--clients", "2", "--duration", "2s"}},
	} {
		out := filepath.Join(dir, "out-"+strings.Fields(tc.name)[0])
		lg := exec.Command(prismBin, append([]string{"loadgen", "--model", cfg.Name, "--candidates", "uniform:10-40", "--quiet", "--out", out}, tc.args...)...)
		lg.Dir = dir
		got, err := lg.CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v\n%s", tc.name, err, got)
		}
		var sum struct{ Sent, OK int64 }
		b, err := os.ReadFile(filepath.Join(out, "summary.json"))
		if err == nil {
			err = json.Unmarshal(b, &sum)
		}
		if err != nil || sum.Sent < 10 || sum.OK != sum.Sent || !strings.Contains(string(got), "errors 0") {
			t.Fatalf("%s: sent %d ok %d (%v)\n%s", tc.name, sum.Sent, sum.OK, err, got)
		}
	}
	lg := exec.Command(prismBin, "loadgen", "--model", cfg.Name, "--target", "https://"+addr, "--tls-ca", "certs/admin/ca.pem", "--auth-token-file", "wrong.txt",
		"--clients", "1", "--max-requests", "3", "--duration", "5s", "--candidates", "5", "--quiet")
	lg.Dir = dir
	got, err := lg.CombinedOutput()
	if err == nil || !strings.Contains(string(got), "none of 3 requests was answered OK; the first Unauthenticated: ") {
		t.Fatalf("a wrong token: %v\n%s", err, got)
	}
}
