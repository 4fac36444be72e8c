package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/prism-serve/prism/internal/readyline"
)

// TestNodeInterop: a client in Node's pure-JS gRPC
// (scripts/interop/node/client.js, @grpc/grpc-js) is served by `prism
// up` as a Go client is: Recommend and RecommendStream with the admin
// certificate and with the bearer token, gzip-compressed, health (of the
// server and of prism.v1.Recommender by name) and reflection. Skipped
// without node or the script's node_modules (npm ci in
// scripts/interop/node, or PRISM_NODE_MODULES naming a node_modules
// that holds @grpc/grpc-js and @grpc/proto-loader); CI installs neither.
func TestNodeInterop(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node is not on the PATH: the Node interop check needs it (README: Clients in other languages)")
	}
	script, err := filepath.Abs(filepath.Join("..", "..", "scripts", "interop", "node"))
	if err != nil {
		t.Fatal(err)
	}
	modules := os.Getenv("PRISM_NODE_MODULES")
	if modules == "" {
		modules = filepath.Join(script, "node_modules")
	}
	for _, p := range []string{"@grpc/grpc-js", "@grpc/proto-loader"} {
		if _, err := os.Stat(filepath.Join(modules, p, "package.json")); err != nil {
			t.Skipf("%s lacks %s: run npm ci in scripts/interop/node (or set PRISM_NODE_MODULES) for the Node interop check", modules, p)
		}
	}
	dir := t.TempDir()
	_, part, cfg := partitioned(t, dir, "dlrm-tiny")
	token := filepath.Join(dir, "token.txt")
	if err := os.WriteFile(token, []byte("interop-0123456789abcdef0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	up := startProc(t, readyline.Up, "up", "--addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--db", filepath.Join(dir, "db"), "--model", part, "--auth-token-file", token)
	// The HTTP/JSON address, from the curl command up prints.
	hint := regexp.MustCompile(`up: Recommend over HTTP/JSON: curl [^\n]*https://(\S+)/v1/recommend`)
	var httpAddr string
	for deadline := time.Now().Add(5 * time.Second); httpAddr == "" && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if m := hint.FindStringSubmatch(up.log.String()); m != nil {
			httpAddr = m[1]
		}
	}
	if httpAddr == "" {
		t.Fatalf("up printed no HTTP/JSON address:\n%s", up.log.String())
	}
	req, err := exec.Command(prismBin, "loadgen", "--model", cfg.Name, "--print-request", "1", "--candidates", "5").Output()
	if err != nil {
		t.Fatalf("loadgen --print-request: %v", err)
	}
	reqFile := filepath.Join(dir, "request.json")
	if err := os.WriteFile(reqFile, req, 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, filepath.Join(script, "client.js"), "--addr", up.addr, "--certs", filepath.Join(dir, "certs"), "--token-file", token, "--request", reqFile, "--http", httpAddr)
	// NODE_PATH: the modules may live outside the script's folder.
	cmd.Env = append(os.Environ(), "NODE_PATH="+modules, "NODE_OPTIONS=--no-deprecation")
	out, err := cmd.CombinedOutput()
	t.Logf("node client.js:\n%s", out)
	if err != nil {
		t.Fatalf("the Node client's checks failed (%v); see its lines above", err)
	}
}
