package main

import (
	"context"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/internal/auth"
	"github.com/prism-serve/prism/internal/readyline"
	"github.com/prism-serve/prism/models"
)

// TestDeadWorkerLogBounded: a worker killed under steady load fails
// every micro-batch sent its way until its heartbeats expire. The
// router logs the first failure at once and the worker's removal, but
// not a line per micro-batch: its log over the 10 s after the kill
// stays within a few dozen lines, and the failures it held back are
// summed up in one line at the window's end.
func TestDeadWorkerLogBounded(t *testing.T) {
	t.Parallel()
	const (
		window   = 10 * time.Second
		maxLines = 24
	)
	dir := t.TempDir()
	_, part, cfg := partitioned(t, dir, "dlrm-tiny")
	certs := newCerts(t)
	tests := []struct {
		name string
		kill string // the tier of the worker killed: dense or embedding
	}{
		{"dense worker killed", "dense"},
		{"embedding worker killed", "embedding"},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			router := startProc(t, readyline.Router, "serve", "router", "--certs", certs, "--addr", "127.0.0.1:0", "--micro-batch", "16")
			workers := map[string][]*proc{}
			for _, role := range []string{"dense", "embedding"} {
				for j := range 2 {
					args := []string{"serve", role, "--certs", certs, "--plan", part, "--router", router.addr}
					ready := readyline.Dense
					if role == "embedding" {
						args = append(args, "--db", filepath.Join(dir, "db", tc.kill, string(rune('a'+i)), string(rune('0'+j))))
						ready = readyline.Embedding
					}
					workers[role] = append(workers[role], startProc(t, ready, args...))
				}
			}
			conn := dial(t, router.addr, certs, auth.Admin)
			reg := prismv1.NewRegistryClient(conn)
			registered := func() int {
				ws, err := reg.List(context.Background(), &prismv1.ListRequest{})
				if err != nil {
					return -1
				}
				return len(ws.GetWorkers())
			}
			for end := time.Now().Add(30 * time.Second); registered() != 4; time.Sleep(50 * time.Millisecond) {
				if time.Now().After(end) {
					t.Fatalf("never saw the 4 workers registered (%d)", registered())
				}
			}
			rec := prismv1.NewRecommenderClient(conn)
			src, _ := models.NewSynthetic(cfg.Signature(), models.SyntheticOptions{Seed: 3})
			b, _ := src.Next(64) // 4 micro-batches a request
			req := toRequest(cfg.Name, b, nil)
			var ok, failed atomic.Int64
			stop := make(chan struct{})
			var wg sync.WaitGroup
			for range 4 {
				wg.Go(func() {
					for {
						select {
						case <-stop:
							return
						default:
						}
						ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
						_, err := rec.Recommend(ctx, req)
						cancel()
						if err != nil {
							failed.Add(1)
						} else {
							ok.Add(1)
						}
					}
				})
			}
			defer func() { close(stop); wg.Wait() }()
			time.Sleep(time.Second)
			before, okBefore := router.log.Lines(), ok.Load()
			victim := workers[tc.kill][0]
			victim.cmd.Process.Kill()
			victim.cmd.Wait()
			time.Sleep(window)
			lines, served := router.log.Lines()-before, ok.Load()-okBefore
			t.Logf("%d requests answered, %d failed, %d router log lines in the %s after the kill", served, failed.Load(), lines, window)
			if served < 100 {
				t.Fatalf("only %d requests answered in %s: too little load to tell", served, window)
			}
			log := router.log.String()
			if !strings.Contains(log, "micro-batch failed") {
				t.Errorf("the first failure is not logged:\n%s", log)
			}
			if !strings.Contains(log, "worker stopped answering; removed") {
				t.Errorf("the worker's removal is not logged:\n%s", log)
			}
			if lines > maxLines {
				tail := log
				if len(tail) > 4<<10 {
					tail = tail[len(tail)-4<<10:]
				}
				t.Fatalf("%d router log lines in the %s after a %s worker was killed, want at most %d; its log's end:\n%s", lines, window, tc.kill, maxLines, tail)
			}
		})
	}
}
