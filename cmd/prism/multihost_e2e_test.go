package main

import (
	"context"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/internal/auth"
	"github.com/prism-serve/prism/internal/leview"
	"github.com/prism-serve/prism/internal/modelrun"
	"github.com/prism-serve/prism/internal/netns"
	"github.com/prism-serve/prism/internal/ort"
	"github.com/prism-serve/prism/internal/readyline"
	"github.com/prism-serve/prism/internal/tablefile"
	"github.com/prism-serve/prism/models"
)

// startIn runs prism args on host (ip netns exec) and waits for its
// ready line; stopped (SIGTERM, then killed) when the test ends.
func startIn(t *testing.T, topo *netns.Topology, h *netns.Host, ready readyline.Line, args ...string) *proc {
	t.Helper()
	return startCmd(t, topo.Command(h, prismBin, args...), h.Name+" "+args[1], ready, false, time.Minute)
}

// TestMultiHost: two routers, two embedding and two dense workers on
// four "hosts" (network namespaces on a bridge, real TCP between them,
// mutual TLS with certificates for the hosts' addresses). Workers listen
// on every interface, announce to both routers the address of the
// interface that routes to them. Recommend equals the monolith on either
// router; under load on the first, one host's link
// goes down: no call outlives its deadline, the rest keeps serving once
// the registry drops the host, and the host rejoins when its link is
// back, and then serves alone while the other host is cut off.
func TestMultiHost(t *testing.T) {
	t.Parallel()
	if err := netns.Available(); err != nil {
		t.Skipf("skipping the multi-host test: cannot make network namespaces here (%v); it needs root and iproute2", err)
	}
	if err := ort.Init(); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	dir := t.TempDir()
	model, part, cfg := partitioned(t, dir, "dlrm-tiny")
	topo, err := netns.New(4)
	if err != nil {
		t.Skipf("skipping the multi-host test: cannot build the namespaces (%v)", err)
	}
	// Registered before the processes: cleanups run last first, so the
	// processes stop before their namespaces go.
	t.Cleanup(func() {
		if err := topo.Close(); err != nil {
			t.Errorf("removing the namespaces: %v", err)
		}
	})
	rh, h1, h2, rh2 := topo.Hosts[0], topo.Hosts[1], topo.Hosts[2], topo.Hosts[3]
	certs := filepath.Join(dir, "certs")
	certArgs := []string{"certs", "init", certs}
	for _, h := range topo.Hosts {
		certArgs = append(certArgs, "--host", h.Addr)
	}
	if out, err := run(t, nil, certArgs...); err != nil {
		t.Fatalf("certs init: %v\n%s", err, out)
	}
	router := startIn(t, topo, rh, readyline.Router, "serve", "router", "--certs", certs,
		"--addr", net.JoinHostPort(rh.Addr, "0"), "--heartbeat", "200ms", "--micro-batch", "32")
	// A second router on a fourth host: every worker announces to both,
	// and it forwards embedding updates to the first, which orders them.
	router2 := startIn(t, topo, rh2, readyline.Router, "serve", "router", "--certs", certs,
		"--addr", net.JoinHostPort(rh2.Addr, "0"), "--heartbeat", "200ms", "--micro-batch", "32",
		"--sequencer", router.addr)
	routers := router.addr + "," + router2.addr
	for i, h := range []*netns.Host{h1, h2} {
		startIn(t, topo, h, readyline.Dense, "serve", "dense", "--certs", certs, "--plan", part, "--threads", "1",
			"--addr", ":0", "--router", routers)
		emb := startIn(t, topo, h, readyline.Embedding, "serve", "embedding", "--certs", certs, "--plan", part, "--threads", "1",
			"--db", filepath.Join(dir, "db", string(rune('a'+i))), "--addr", "0.0.0.0:0", "--router", routers)
		if host, _, _ := net.SplitHostPort(emb.addr); host != h.Addr {
			t.Errorf("embedding worker on %s (%s) says it is at %s", h.Name, h.Addr, emb.addr)
		}
	}
	conn := dial(t, router.addr, certs, auth.Admin)
	reg := prismv1.NewRegistryClient(conn)
	rec := prismv1.NewRecommenderClient(conn)
	conn2 := dial(t, router2.addr, certs, auth.Admin)
	// hostsOf lists the hosts a router's registry has workers on, each
	// with its roles: "10.77.x.3:dense+embedding".
	hostsOf := func(reg prismv1.RegistryClient) []string {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		ws, err := reg.List(ctx, &prismv1.ListRequest{})
		if err != nil {
			return []string{"error: " + err.Error()}
		}
		roles := map[string][]string{}
		for _, w := range ws.GetWorkers() {
			host, _, err := net.SplitHostPort(w.GetAddr())
			if err != nil || net.ParseIP(host) == nil || net.ParseIP(host).IsUnspecified() {
				t.Errorf("worker %s announced %q", w.GetId(), w.GetAddr())
			}
			roles[host] = append(roles[host], w.GetRole().Name())
		}
		var out []string
		for h, r := range roles {
			slices.Sort(r)
			out = append(out, h+":"+strings.Join(r, "+"))
		}
		slices.Sort(out)
		return out
	}
	hosts := func() []string { return hostsOf(reg) }
	both := func(hs ...*netns.Host) []string {
		var out []string
		for _, h := range hs {
			out = append(out, h.Addr+":dense+embedding")
		}
		slices.Sort(out)
		return out
	}
	waitHosts := func(what string, want []string, within time.Duration) time.Time {
		t.Helper()
		var got []string
		for deadline := time.Now().Add(within); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			if got = hosts(); slices.Equal(got, want) {
				return time.Now()
			}
		}
		t.Fatalf("%s: the registry lists %v, want %v", what, got, want)
		return time.Time{}
	}
	waitHosts("start", both(h1, h2), 30*time.Second)
	for deadline := time.Now().Add(10 * time.Second); !slices.Equal(hostsOf(prismv1.NewRegistryClient(conn2)), both(h1, h2)); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the second router lists %v", hostsOf(prismv1.NewRegistryClient(conn2)))
		}
	}

	mono, err := ort.NewSession(model, ort.SessionOptions{IntraOpThreads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer mono.Close()
	equal := func(rec prismv1.RecommenderClient, what string, n int, seed uint64) {
		t.Helper()
		src, _ := models.NewSynthetic(cfg.Signature(), models.SyntheticOptions{Seed: seed})
		b, _ := src.Next(n)
		want, err := mono.Run(modelrun.Inputs(b))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		resp, err := rec.Recommend(ctx, toRequest(cfg.Name, b, nil))
		if err != nil {
			t.Fatalf("%s: n=%d: %v", what, n, err)
		}
		worst := maxAbsError(resp.GetScores(), want[0])
		if len(resp.GetScores()) != n || worst > 1e-5 {
			t.Fatalf("%s: n=%d: %d scores, max abs error %g against the monolith", what, n, len(resp.GetScores()), worst)
		}
	}
	for i, n := range []int{1, 150, 97} {
		equal(rec, "across hosts", n, uint64(i+1))
		equal(prismv1.NewRecommenderClient(conn2), "on the second router", n, uint64(i+1))
	}

	// An embedding update sent to the second router is forwarded over
	// the network to the first (router to router, mutual TLS), applied
	// on both embedding workers, and read through either router.
	updated := func() {
		t.Helper()
		src, _ := models.NewSynthetic(cfg.Signature(), models.SyntheticOptions{Seed: 42})
		b, _ := src.Next(4)
		req := toRequest(cfg.Name, b, nil)
		id := req.Candidates.Inputs[1].Ids[0] // cat_0 of candidate 0
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		before, err := rec.Recommend(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		row := make([]float32, 16)
		for i := range row {
			row[i] = 3
		}
		upd := prismv1.NewEmbeddingsClient(conn2)
		var r *prismv1.UpdateResponse
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			// Unavailable while the first router's start-up wait lasts.
			r, err = upd.Update(ctx, &prismv1.UpdateRequest{Model: cfg.Name, Table: "emb_l.0.weight", Ids: []int64{id}, Rows: leview.Bytes(row)})
			if status.Code(err) != codes.Unavailable || time.Now().After(deadline) {
				break
			}
		}
		if err != nil || r.GetWorkers() != 2 {
			t.Fatalf("update through the second router: %v %v", r, err)
		}
		for i, c := range []*grpc.ClientConn{conn, conn2} {
			after, err := prismv1.NewRecommenderClient(c).Recommend(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			if after.GetScores()[0] == before.GetScores()[0] {
				t.Errorf("router %d: the row updated through the second router did not change the score", i+1)
			}
		}
		// Put it back (through the first router, which sequences), for
		// the comparisons with the monolith below.
		tab, err := tablefile.Open(filepath.Join(part, "tables", "emb_l.0.weight.arrow"))
		if err != nil {
			t.Fatal(err)
		}
		orig, err := tab.ReadAll()
		tab.Close()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := prismv1.NewEmbeddingsClient(conn).Update(ctx, &prismv1.UpdateRequest{Model: cfg.Name, Table: "emb_l.0.weight", Ids: []int64{id}, Rows: leview.Bytes(orig[id*16 : id*16+16])}); err != nil {
			t.Fatalf("restoring the row through the first router: %v", err)
		}
		for i, c := range []*grpc.ClientConn{conn, conn2} {
			again, err := prismv1.NewRecommenderClient(c).Recommend(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			if again.GetScores()[0] != before.GetScores()[0] {
				t.Errorf("router %d: the restored row gives %v, before %v", i+1, again.GetScores()[0], before.GetScores()[0])
			}
		}
	}
	updated()

	// Load from the root namespace: every call has a 2 s deadline.
	const deadline = 2 * time.Second
	type call struct {
		start, end time.Time
		err        error
	}
	var mu sync.Mutex
	var calls []call
	stop := make(chan struct{})
	var wg sync.WaitGroup
	src, _ := models.NewSynthetic(cfg.Signature(), models.SyntheticOptions{Seed: 9})
	b, _ := src.Next(64)
	req := toRequest(cfg.Name, b, nil)
	for range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				start := time.Now()
				ctx, cancel := context.WithTimeout(context.Background(), deadline)
				_, err := rec.Recommend(ctx, req)
				cancel()
				mu.Lock()
				calls = append(calls, call{start, time.Now(), err})
				mu.Unlock()
				if err != nil {
					time.Sleep(10 * time.Millisecond)
				}
			}
		}()
	}
	// okSince counts the calls started after t0 that succeeded, and the
	// ones that failed.
	since := func(t0 time.Time) (ok, failed int) {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range calls {
			if c.start.Before(t0) {
				continue
			}
			if c.err == nil {
				ok++
			} else {
				failed++
			}
		}
		return ok, failed
	}
	time.Sleep(time.Second)
	cut := time.Now()
	if err := topo.SetLink(h2, false); err != nil {
		t.Fatal(err)
	}
	dropped := waitHosts("host 2 cut off", both(h1), 10*time.Second)
	t.Logf("link of %s down: the registry dropped it after %v", h2.Name, dropped.Sub(cut).Round(time.Millisecond))
	// The calls in flight to the cut host end by their deadline; those
	// started after it all succeed.
	settled := dropped.Add(deadline + 200*time.Millisecond)
	time.Sleep(time.Until(settled) + 1500*time.Millisecond)
	if ok, failed := since(settled); ok == 0 || failed > 0 {
		t.Errorf("with %s cut off and dropped: %d calls ok, %d failed; want all ok", h2.Name, ok, failed)
	}
	up := time.Now()
	if err := topo.SetLink(h2, true); err != nil {
		t.Fatal(err)
	}
	back := waitHosts("host 2 rejoins", both(h1, h2), 20*time.Second)
	t.Logf("link of %s up: it rejoined after %v", h2.Name, back.Sub(up).Round(time.Millisecond))
	// The connections that were cut resume on TCP's retransmission
	// timer: the first calls after the rejoin may be slow (not late).
	time.Sleep(deadline + 500*time.Millisecond)
	close(stop)
	wg.Wait()

	var ok, late int
	codesSeen := map[codes.Code]int{}
	for _, c := range calls {
		if took := c.end.Sub(c.start); took > deadline+time.Second {
			late++
			t.Errorf("a call took %v with a %v deadline (%v)", took.Round(time.Millisecond), deadline, c.err)
		}
		if c.err == nil {
			ok++
		} else {
			codesSeen[status.Code(c.err)]++
		}
	}
	t.Logf("under load: %d calls, %d ok, errors by code %v, %d past their deadline", len(calls), ok, codesSeen, late)
	if ok, _ := since(back); ok == 0 {
		t.Error("no call succeeded after the host rejoined")
	}

	// The rejoined host serves alone: cut the other one off.
	if err := topo.SetLink(h1, false); err != nil {
		t.Fatal(err)
	}
	waitHosts("host 1 cut off", both(h2), 10*time.Second)
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err := rec.Recommend(ctx, req)
		cancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the rejoined host alone: %v", err)
		}
	}
	equal(rec, "the rejoined host alone", 150, 7)
	if err := topo.SetLink(h1, true); err != nil {
		t.Fatal(err)
	}
	t.Logf("multi-host test body took %v", time.Since(began).Round(time.Millisecond))
}
