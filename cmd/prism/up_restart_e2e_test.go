package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/internal/readyline"
	"github.com/prism-serve/prism/models"
)

// childPID is the pid of parent's child whose command line holds want
// (arguments joined by spaces), 0 when none.
func childPID(t *testing.T, parent int, want string) int {
	t.Helper()
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...
		f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
		if len(f) < 2 || f[1] != strconv.Itoa(parent) {
			continue
		}
		cmd, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if strings.Contains(strings.ReplaceAll(string(cmd), "\x00", " "), want) {
			return pid
		}
	}
	return 0
}

// TestUpRestartsRouter: prism up on --addr 127.0.0.1:0 whose router is
// killed restarts it on the same port; the workers register again and
// Recommend answers at the address up printed.
func TestUpRestartsRouter(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	_, part, cfg := partitioned(t, dir, "dlrm-tiny")
	u := startProc(t, readyline.Up, "up", "--model", part, "--addr", "127.0.0.1:0", "--db", filepath.Join(dir, "db"), "--dense-workers", "1")
	pid := childPID(t, u.cmd.Process.Pid, "serve router")
	if pid == 0 {
		t.Fatal("no router child of prism up")
	}
	p, _ := os.FindProcess(pid)
	p.Kill()
	conn := dialRestartable(t, u.addr, filepath.Join(dir, "certs"))
	reg := prismv1.NewRegistryClient(conn)
	rec := prismv1.NewRecommenderClient(conn)
	src, _ := models.NewSynthetic(cfg.Signature(), models.SyntheticOptions{Seed: 3})
	b, _ := src.Next(16)
	req := toRequest(cfg.Name, b, nil)
	var last error
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		ws, err := reg.List(ctx, &prismv1.ListRequest{})
		if err == nil && len(ws.GetWorkers()) == 2 {
			_, err = rec.Recommend(ctx, req)
			if err == nil {
				cancel()
				return
			}
		}
		cancel()
		last = err
	}
	t.Fatalf("30 s after its router was killed, prism up serves no Recommend at %s (last: %v)\n%s", u.addr, last, u.log)
}

// TestUpOnEveryInterface: prism up --addr 0.0.0.0:0 (the router listens
// on every interface) comes up over TLS and serves Recommend at the
// address it prints. Its workers dialled the router's ready-line
// address, [::]:P, for which no certificate is valid: they never
// registered and up gave up after --ready-timeout.
func TestUpOnEveryInterface(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	_, part, cfg := partitioned(t, dir, "dlrm-tiny")
	u := startProc(t, readyline.Up, "up", "--model", part, "--addr", "0.0.0.0:0", "--db", filepath.Join(dir, "db"),
		"--dense-workers", "1", "--ready-timeout", "40s")
	conn := dialRestartable(t, u.addr, filepath.Join(dir, "certs"))
	src, _ := models.NewSynthetic(cfg.Signature(), models.SyntheticOptions{Seed: 3})
	b, _ := src.Next(16)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := prismv1.NewRecommenderClient(conn).Recommend(ctx, toRequest(cfg.Name, b, nil))
	if err != nil || len(resp.GetScores()) != 16 {
		t.Fatalf("Recommend at %s: %d scores, %v\n%s", u.addr, len(resp.GetScores()), err, u.log)
	}
}
