package main

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/internal/auth"
	"github.com/prism-serve/prism/internal/readyline"
)

// TestLateWorkerKeepsCalls: over mutual TLS, the only dense (or
// embedding) worker's announcements are held up for five heartbeats
// (its link to the router paused, as on a host too starved to announce
// in time) while it serves the router's calls: the router finds it
// overdue after three, probes its health (over the embedding worker's
// connection; for a dense worker, over one dialled with the router's
// identity towards a dense worker), finds it SERVING and keeps it: its
// calls in flight are not abandoned, picks still take it, and no
// Recommend fails. Before, its registration expired and its calls in
// flight were abandoned; with no other worker of its role, those and
// the requests until it announced again failed Unavailable (CI at load
// average 16: 55 and 27 Recommends in two drain tests).
//
// Sequential, unlike the other end-to-end tests: beside another test
// its embedding case saw Recommends fail Unavailable (the worker
// refusing the dense worker, "0 are"), its list of dense workers
// dropped while the link was held (internal/serve's answers drops a
// router's list when an announce attempt fails over three heartbeats
// after its last answer; the attempt's timeout is 2 s, the hold 2.5 s).
func TestLateWorkerKeepsCalls(t *testing.T) {
	const hb = 500 * time.Millisecond
	for _, late := range []string{"dense", "embedding"} {
		t.Run(late, func(t *testing.T) {
			s := newDrainStack(t)
			certs := newCerts(t)
			router := startProc(t, readyline.Router, "serve", "router", "--certs", certs, "--addr", "127.0.0.1:0", "--heartbeat", hb.String(), "--micro-batch", "16")
			link := newTCPLink(t, router.addr)
			via := func(role string) string {
				if role == late {
					return link.addr
				}
				return router.addr
			}
			startProc(t, readyline.Dense, "serve", "dense", "--certs", certs, "--plan", s.part, "--router", via("dense"), "--threads", "1")
			startProc(t, readyline.Embedding, "serve", "embedding", "--certs", certs, "--plan", s.part, "--db", filepath.Join(s.dir, "db"), "--router", via("embedding"), "--threads", "1")
			conn := dial(t, router.addr, certs, auth.Admin)
			reg := prismv1.NewRegistryClient(conn)
			for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
				ws, err := reg.List(context.Background(), &prismv1.ListRequest{})
				if err == nil && len(ws.GetWorkers()) == 2 && s.recommend(prismv1.NewRecommenderClient(conn))() == nil {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("the router lists %d workers (%v), want 2 answering", len(ws.GetWorkers()), err)
				}
			}
			var recs tally
			stop := make(chan struct{})
			load := loadUntil(4, stop, s.recommend(prismv1.NewRecommenderClient(conn)), &recs)
			time.Sleep(time.Second)
			link.pause()
			time.Sleep(5 * hb)
			link.resume()
			time.Sleep(4 * hb)
			close(stop)
			load.Wait()
			var kept string
			for _, l := range strings.Split(router.log.String(), "\n") {
				if strings.Contains(l, "answers its health check") {
					kept = l
				}
			}
			t.Logf("the %s worker's announcements held up for %v: Recommend %v; router: %q", late, 5*hb, &recs, kept)
			if kept == "" {
				t.Errorf("the router never probed the overdue %s worker (no line saying it answers its health check): the test proves nothing", late)
			}
			if recs.failed() > 0 || recs.ok == 0 {
				t.Errorf("Recommend while the %s worker was late to announce: %v", late, &recs)
			}
		})
	}
}
