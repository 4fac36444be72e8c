package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/internal/auth"
	"github.com/prism-serve/prism/internal/readyline"
	"github.com/prism-serve/prism/models"
)

// TestTLSInstancesMetrics: real processes over mutual TLS with
// per-worker certificates (certs init --instances): requests are
// answered, and the dense worker's /metrics is HTTPS only, with a client
// certificate required under --metrics-client-cert.
func TestTLSInstancesMetrics(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	_, part, cfg := partitioned(t, dir, "dlrm-tiny")
	certs := filepath.Join(t.TempDir(), "certs")
	if out, err := run(t, nil, "certs", "init", certs, "--instances", "1"); err != nil || !strings.Contains(out, "embedding-0") {
		t.Fatalf("certs init --instances 1: %v\n%s", err, out)
	}
	router := startProc(t, readyline.Router, "serve", "router", "--certs", certs, "--addr", "127.0.0.1:0", "--heartbeat", "200ms")
	dense := startProc(t, readyline.Dense, "serve", "dense", "--certs", auth.InstanceDir(certs, auth.Dense, 0),
		"--metrics-addr", "127.0.0.1:0", "--metrics-client-cert", "--plan", part, "--router", router.addr)
	maddr := servingMetrics(t, dense)
	startProc(t, readyline.Embedding, "serve", "embedding", "--certs", auth.InstanceDir(certs, auth.Embedding, 0),
		"--plan", part, "--db", filepath.Join(dir, "db"), "--router", router.addr)
	admin := dial(t, router.addr, certs, auth.Admin)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	src, _ := models.NewSynthetic(cfg.Signature(), models.SyntheticOptions{Seed: 9})
	b, _ := src.Next(8)
	req := toRequest(cfg.Name, b, nil)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		_, err := prismv1.NewRecommenderClient(admin).Recommend(ctx, req)
		if err == nil {
			break
		}
		if status.Code(err) != codes.Unavailable || time.Now().After(deadline) {
			t.Fatalf("Recommend as admin: %v", err)
		}
	}

	scrape := func(files auth.Files) (string, error) {
		c, err := auth.ClientTLS(files)
		if err != nil {
			t.Fatal(err)
		}
		hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: c}}
		resp, err := hc.Get("https://" + maddr + "/metrics")
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			return "", fmt.Errorf("status %d", resp.StatusCode)
		}
		return string(body), nil
	}
	body, err := scrape(auth.FilesFor(certs, auth.Admin))
	if err != nil {
		t.Fatalf("scraping the dense worker over HTTPS as admin: %v", err)
	}
	if !strings.Contains(body, "prism_") {
		t.Errorf("the dense worker's /metrics has no prism metrics:\n%.400s", body)
	}
	if _, err := scrape(auth.Files{CA: auth.FilesFor(certs, auth.Admin).CA}); err == nil {
		t.Error("--metrics-client-cert: a scraper without a certificate read /metrics")
	}
	if resp, err := http.Get("http://" + maddr + "/metrics"); err == nil {
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			t.Error("/metrics answers plain HTTP under TLS")
		}
	}
}
