package main

import (
	"context"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/internal/auth"
	"github.com/prism-serve/prism/internal/readyline"
)

// pausableLink forwards TCP connections to a target; while paused it
// holds what is sent, in either direction, and delivers it, in order,
// once resumed: a peer too starved (or a path too slow) to get its
// bytes through for a while, that loses nothing.
type pausableLink struct {
	addr string
	mu   sync.Mutex
	open chan struct{} // closed while the link forwards
}

func newPausableLink(t *testing.T, target string) *pausableLink {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := &pausableLink{addr: lis.Addr().String(), open: make(chan struct{})}
	close(l.open)
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		lis.Close()
		l.resume()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	pipe := func(dst, src net.Conn) {
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			if err != nil {
				dst.Close()
				return
			}
			l.mu.Lock()
			open := l.open
			l.mu.Unlock()
			<-open
			if _, err := dst.Write(buf[:n]); err != nil {
				return
			}
		}
	}
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, c, up)
			mu.Unlock()
			go pipe(up, c)
			go pipe(c, up)
		}
	}()
	return l
}

func (l *pausableLink) pause() {
	l.mu.Lock()
	defer l.mu.Unlock()
	select {
	case <-l.open:
		l.open = make(chan struct{})
	default:
	}
}

func (l *pausableLink) resume() {
	l.mu.Lock()
	defer l.mu.Unlock()
	select {
	case <-l.open:
	default:
		close(l.open)
	}
}

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
func TestLateWorkerKeepsCalls(t *testing.T) {
	const hb = 500 * time.Millisecond
	for _, late := range []string{"dense", "embedding"} {
		t.Run(late, func(t *testing.T) {
			s := newDrainStack(t)
			certs := newCerts(t)
			router := startProc(t, readyline.Router, "serve", "router", "--certs", certs, "--addr", "127.0.0.1:0", "--heartbeat", hb.String(), "--micro-batch", "16")
			link := newPausableLink(t, router.addr)
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
