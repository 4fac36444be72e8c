package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/cpuserve/store"
	"github.com/prism-serve/prism/internal/leview"
	"github.com/prism-serve/prism/internal/readyline"
	"github.com/prism-serve/prism/models"
)

// Graceful shutdown on real processes: a tier told to stop (SIGTERM, as
// the kubelet and the capacity lenders do) while requests keep coming.

// tally counts a load's answers by code, with each code's first message.
type tally struct {
	mu    sync.Mutex
	ok    int
	codes map[codes.Code]int
	first map[codes.Code]string
}

func (c *tally) add(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err == nil {
		c.ok++
		return
	}
	if c.codes == nil {
		c.codes, c.first = map[codes.Code]int{}, map[codes.Code]string{}
	}
	s := status.Convert(err)
	if c.codes[s.Code()]++; c.codes[s.Code()] == 1 {
		c.first[s.Code()] = s.Message()
	}
}

func (c *tally) failed() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, k := range c.codes {
		n += k
	}
	return n
}

func (c *tally) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var parts []string
	for code, n := range c.codes {
		parts = append(parts, fmt.Sprintf("%v %d (%q)", code, n, c.first[code]))
	}
	sort.Strings(parts)
	return fmt.Sprintf("%d ok, failed: [%s]", c.ok, strings.Join(parts, "; "))
}

// loadUntil runs n loops of call until stop closes.
func loadUntil(n int, stop <-chan struct{}, call func() error, into *tally) *sync.WaitGroup {
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				into.add(call())
			}
		})
	}
	return &wg
}

// stopAndWait sends sig to p and waits up to within for it to exit,
// returning how long it took.
func stopAndWait(t *testing.T, p *proc, within time.Duration, sig ...syscall.Signal) time.Duration {
	t.Helper()
	began := time.Now()
	exited := make(chan struct{})
	go func() { p.cmd.Wait(); close(exited) }()
	for _, s := range sig {
		p.cmd.Process.Signal(s)
		time.Sleep(100 * time.Millisecond)
	}
	select {
	case <-exited:
	case <-time.After(within):
		t.Fatalf("%v: still running %v after the signal", p.cmd.Args[:3], within)
	}
	return time.Since(began)
}

// workersOn waits until the router at addr lists n workers.
func workersOn(t *testing.T, addr string, n int) {
	t.Helper()
	reg := prismv1.NewRegistryClient(dial(t, addr, "", ""))
	var got int
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		ws, err := reg.List(context.Background(), &prismv1.ListRequest{})
		if got = len(ws.GetWorkers()); err == nil && got == n {
			return
		}
	}
	t.Fatalf("router %s lists %d workers, want %d", addr, got, n)
}

// drainStack is a plaintext stack of dlrm-tiny: the partition, a request
// of 64 candidates, and a starter for each tier.
type drainStack struct {
	dir, part string
	cfg       models.Config
	req       *prismv1.RecommendRequest
}

func newDrainStack(t *testing.T) *drainStack {
	dir := t.TempDir()
	_, part, cfg := partitioned(t, dir, "dlrm-tiny")
	src, _ := models.NewSynthetic(cfg.Signature(), models.SyntheticOptions{Seed: 3})
	b, _ := src.Next(64)
	return &drainStack{dir: dir, part: part, cfg: cfg, req: toRequest(cfg.Name, b, nil)}
}

func (s *drainStack) router(t *testing.T, args ...string) *proc {
	return startProc(t, readyline.Router, append([]string{"serve", "router", "--insecure", "--addr", "127.0.0.1:0", "--heartbeat", "500ms", "--micro-batch", "16"}, args...)...)
}

func (s *drainStack) dense(t *testing.T, routers string) *proc {
	return startProc(t, readyline.Dense, "serve", "dense", "--insecure", "--plan", s.part, "--router", routers, "--threads", "1")
}

func (s *drainStack) embedding(t *testing.T, routers, db string) *proc {
	return startProc(t, readyline.Embedding, "serve", "embedding", "--insecure", "--plan", s.part, "--db", filepath.Join(s.dir, db), "--router", routers, "--threads", "1")
}

func (s *drainStack) recommend(rec prismv1.RecommenderClient) func() error {
	return func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := rec.Recommend(ctx, s.req)
		return err
	}
}

// TestEmbeddingDrainUnderUpdates: one of two embedding workers (replicas
// of the model) is sent SIGTERM while Recommend load and a stream of
// embedding updates run: no Recommend fails, no update fails, and the
// worker left holds every acknowledged update.
func TestEmbeddingDrainUnderUpdates(t *testing.T) {
	t.Parallel()
	s := newDrainStack(t)
	router := s.router(t)
	s.dense(t, router.addr)
	stays := s.embedding(t, router.addr, "db0")
	leaving := s.embedding(t, router.addr, "db1")
	workersOn(t, router.addr, 3)
	conn := dial(t, router.addr, "", "")
	rec := prismv1.NewRecommenderClient(conn)
	upd := prismv1.NewEmbeddingsClient(conn)

	// Update k writes updateRow(k) to row k%100 of table 0.
	dim := s.cfg.EmbDim
	updateRow := func(k int) []float32 {
		row := make([]float32, dim)
		for j := range row {
			row[j] = float32(k+1) + float32(j)/1000
		}
		return row
	}
	update := func(k int) error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := upd.Update(ctx, &prismv1.UpdateRequest{Model: s.cfg.Name, Table: models.TableName(0), Ids: []int64{int64(k % 100)}, Rows: leview.Bytes(updateRow(k))})
		return err
	}
	// The router takes updates once it has heard what its workers hold
	// (a few heartbeats): not what this test measures.
	for deadline := time.Now().Add(20 * time.Second); update(0) != nil; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no update acknowledged in 20s")
		}
	}

	var recs, upds tally
	stop := make(chan struct{})
	load := loadUntil(4, stop, s.recommend(rec), &recs)
	// acked[k]: update k was acknowledged (sequential: k is the count sent).
	acked := []bool{true}
	updated := loadUntil(1, stop, func() error {
		err := update(len(acked))
		acked = append(acked, err == nil)
		return err
	}, &upds)
	time.Sleep(500 * time.Millisecond)
	took := stopAndWait(t, leaving, 20*time.Second, syscall.SIGTERM)
	time.Sleep(500 * time.Millisecond)
	close(stop)
	load.Wait()
	updated.Wait()
	t.Logf("embedding worker drained in %v: Recommend %v; updates %v", took.Round(time.Millisecond), &recs, &upds)
	if recs.failed() > 0 || recs.ok == 0 {
		t.Errorf("Recommend while an embedding worker drained: %v", &recs)
	}
	if upds.failed() > 0 || upds.ok == 0 {
		t.Errorf("updates while an embedding worker drained: %v", &upds)
	}

	// The worker left holds, for each row, its last acknowledged update
	// (or a later one that failed).
	stopAndWait(t, stays, 20*time.Second, syscall.SIGTERM)
	st, err := store.Open(filepath.Join(s.dir, "db0"), &store.Options{ReadOnly: true, HotBytes: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	lost := 0
	for id := range min(100, len(acked)) {
		out := make([]float32, dim)
		if err := st.Lookup(s.cfg.Name, []store.TableLookup{{Table: models.TableName(0), IDs: []int64{int64(id)}, Pooling: store.PoolNone, Out: out}}); err != nil {
			t.Fatal(err)
		}
		last := -1
		var later []int
		for k := id; k < len(acked); k += 100 {
			if acked[k] {
				last, later = k, nil
			} else {
				later = append(later, k)
			}
		}
		ok := last < 0 || slices.Equal(out, updateRow(last))
		for _, k := range later {
			ok = ok || slices.Equal(out, updateRow(k))
		}
		if !ok {
			if lost++; lost <= 5 {
				t.Errorf("row %d holds %v, want acknowledged update %d", id, out[:2], last)
			}
		}
	}
	t.Logf("%d updates sent, %d rows checked in the store left, %d lost", len(acked), min(100, len(acked)), lost)
}

// TestRouterDrainTwoRouters: one of two routers, both known to the
// client (round robin over their addresses), is sent SIGTERM under
// Recommend load: no call fails.
func TestRouterDrainTwoRouters(t *testing.T) {
	t.Parallel()
	s := newDrainStack(t)
	r1, r2 := s.router(t), s.router(t)
	both := r1.addr + "," + r2.addr
	s.dense(t, both)
	s.embedding(t, both, "db0")
	workersOn(t, r1.addr, 2)
	workersOn(t, r2.addr, 2)
	res := manual.NewBuilderWithScheme("drain")
	res.InitialState(resolver.State{Addresses: []resolver.Address{{Addr: r1.addr}, {Addr: r2.addr}}})
	conn, err := grpc.NewClient(res.Scheme()+":///routers", grpc.WithResolvers(res),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultServiceConfig(`{"loadBalancingConfig":[{"round_robin":{}}]}`))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rec := prismv1.NewRecommenderClient(conn)
	var recs, alone tally
	stop := make(chan struct{})
	load := loadUntil(6, stop, s.recommend(rec), &recs)
	// A client that knows the stopping router only (as one a Service
	// still sends there until its endpoint is gone: the chart's preStop
	// wait is for it): told, not counted.
	toR2 := s.recommend(prismv1.NewRecommenderClient(dial(t, r2.addr, "", "")))
	onlyR2 := loadUntil(1, stop, func() error {
		err := toR2()
		if err != nil {
			time.Sleep(time.Millisecond) // refused at once: no spinning
		}
		return err
	}, &alone)
	time.Sleep(500 * time.Millisecond)
	took := stopAndWait(t, r2, 20*time.Second, syscall.SIGTERM)
	time.Sleep(500 * time.Millisecond)
	close(stop)
	load.Wait()
	onlyR2.Wait()
	t.Logf("router drained in %v: Recommend over both routers %v; a client of the stopping router alone %v", took.Round(time.Millisecond), &recs, &alone)
	if recs.failed() > 0 || recs.ok == 0 {
		t.Errorf("Recommend while a router drained: %v", &recs)
	}
}

// TestWorkerLeaveLostRetried: a dense worker stops while its router
// cannot hear its Leave (its heartbeats go through a link the test cuts,
// silently), so the router still lists it after it has gone: the calls
// picking it are retried on the other dense worker, and none fails.
func TestWorkerLeaveLostRetried(t *testing.T) {
	t.Parallel()
	s := newDrainStack(t)
	router := startProc(t, readyline.Router, "serve", "router", "--insecure", "--addr", "127.0.0.1:0", "--heartbeat", "2s", "--micro-batch", "16")
	link := newTCPLink(t, router.addr)
	s.dense(t, router.addr)
	gone := s.dense(t, link.addr)
	s.embedding(t, router.addr, "db0")
	workersOn(t, router.addr, 3)
	rec := prismv1.NewRecommenderClient(dial(t, router.addr, "", ""))
	var recs tally
	stop := make(chan struct{})
	load := loadUntil(4, stop, s.recommend(rec), &recs)
	time.Sleep(500 * time.Millisecond)
	link.cut()
	took := stopAndWait(t, gone, 20*time.Second, syscall.SIGTERM)
	reg := prismv1.NewRegistryClient(dial(t, router.addr, "", ""))
	ws, err := reg.List(context.Background(), &prismv1.ListRequest{})
	if err != nil {
		t.Fatal(err)
	}
	listed := false
	for _, w := range ws.GetWorkers() {
		listed = listed || w.GetAddr() == gone.addr
	}
	if !listed {
		t.Fatal("the router heard the worker leave: the test checks nothing")
	}
	time.Sleep(2 * time.Second)
	close(stop)
	load.Wait()
	t.Logf("dense worker gone in %v, its Leave unheard; Recommend %v; router: %s", took.Round(time.Millisecond), &recs, metricLines(t, servingMetrics(t, router), "prism_router_retries_total", `prism_router_micro_batches_total{outcome="ok"}`))
	if recs.failed() > 0 || recs.ok == 0 {
		t.Errorf("Recommend after a dense worker left unheard: %v", &recs)
	}
}

// metricLines are the lines of the /metrics at addr that start with one
// of names.
func metricLines(t *testing.T, addr string, names ...string) string {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		for _, n := range names {
			if strings.HasPrefix(l, n+" ") {
				out = append(out, l)
			}
		}
	}
	return strings.Join(out, "; ")
}

// TestRouterDrainEndsStreams: a router sent SIGTERM while a
// RecommendStream keeps sending (an offline scoring job) answers the
// requests it took and ends the stream with Unavailable at once, so the
// client sends the rest to another router; it neither keeps taking
// requests until its grace period cuts the stream (dropping the window's
// answers) nor holds the shutdown that long.
func TestRouterDrainEndsStreams(t *testing.T) {
	t.Parallel()
	s := newDrainStack(t)
	router := s.router(t, "--shutdown-grace", "8s")
	s.dense(t, router.addr)
	s.embedding(t, router.addr, "db0")
	workersOn(t, router.addr, 2)
	rec := prismv1.NewRecommenderClient(dial(t, router.addr, "", ""))
	stream, err := rec.RecommendStream(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	// The sender keeps a few requests ahead of the answers.
	var sent, answered, answerErrs int
	var mu sync.Mutex
	sendErr := make(chan error, 1)
	go func() {
		for i := 0; ; {
			mu.Lock()
			ahead := sent - answered
			mu.Unlock()
			if ahead > 8 {
				time.Sleep(time.Millisecond)
				continue
			}
			req := proto.Clone(s.req).(*prismv1.RecommendRequest)
			req.RequestId = fmt.Sprint(i)
			if err := stream.Send(req); err != nil {
				sendErr <- err
				return
			}
			mu.Lock()
			sent++
			mu.Unlock()
			i++
		}
	}()
	var signalled time.Time
	exited := make(chan struct{})
	var ended error
	var endedAfter time.Duration
	for {
		resp, err := stream.Recv()
		if err != nil {
			ended, endedAfter = err, time.Since(signalled)
			break
		}
		mu.Lock()
		if resp.GetRequestId() != fmt.Sprint(answered) {
			t.Errorf("answer %d is for request %q", answered, resp.GetRequestId())
		}
		answered++
		if resp.GetError() != nil {
			if answerErrs++; answerErrs <= 3 {
				t.Logf("answer %d: %v", answered-1, resp.GetError())
			}
		}
		n := answered
		mu.Unlock()
		if n == 50 {
			signalled = time.Now()
			router.cmd.Process.Signal(syscall.SIGTERM)
			go func() { router.cmd.Wait(); close(exited) }()
		}
	}
	<-exited
	exitedAfter := time.Since(signalled)
	mu.Lock()
	defer mu.Unlock()
	t.Logf("stream ended %v after SIGTERM with %v; router exited after %v; %d requests sent, %d answered (%d with an error)",
		endedAfter.Round(time.Millisecond), ended, exitedAfter.Round(time.Millisecond), sent, answered, answerErrs)
	if errors.Is(ended, io.EOF) || status.Code(ended) != codes.Unavailable {
		t.Errorf("the stream ended with %v, want Unavailable (send the rest again)", ended)
	}
	if answerErrs > 0 {
		t.Errorf("%d answers carried an error", answerErrs)
	}
	if exitedAfter > 4*time.Second {
		t.Errorf("the router exited %v after SIGTERM: the stream held its drain to the grace period (8s)", exitedAfter.Round(time.Millisecond))
	}
}

// TestDrainPastGrace: a router whose in-flight call cannot finish (its
// embedding worker is paused) is sent SIGTERM, then SIGTERM and SIGINT
// again during the drain: it exits once its --shutdown-grace is over,
// the signals neither cutting the drain short nor extending it, and its
// log says how many calls it cut off.
func TestDrainPastGrace(t *testing.T) {
	t.Parallel()
	s := newDrainStack(t)
	// A heartbeat of 2 s: the stopped embedding worker expires 6 s
	// after its last announcement, after the grace; with the stack's
	// 500 ms it expired first, and the router gave its calls up
	// (silent.go) before the grace ran out.
	router := s.router(t, "--shutdown-grace", "2s", "--heartbeat", "2s")
	s.dense(t, router.addr)
	emb := s.embedding(t, router.addr, "db0")
	workersOn(t, router.addr, 2)
	rec := prismv1.NewRecommenderClient(dial(t, router.addr, "", ""))
	if err := s.recommend(rec)(); err != nil {
		t.Fatal(err)
	}
	emb.cmd.Process.Signal(syscall.SIGSTOP)
	defer emb.cmd.Process.Signal(syscall.SIGCONT)
	const stuck = 3
	errs := make(chan error, stuck)
	for range stuck {
		go func() { errs <- s.recommend(rec)() }()
	}
	time.Sleep(300 * time.Millisecond)
	took := stopAndWait(t, router, 10*time.Second, syscall.SIGTERM, syscall.SIGTERM, syscall.SIGINT)
	var got []string
	for range stuck {
		got = append(got, status.Code(<-errs).String())
	}
	line := ""
	for _, l := range strings.Split(router.log.String(), "\n") {
		if strings.Contains(l, "grace period over") {
			line = l
		}
	}
	t.Logf("router exited %v after SIGTERM (grace 2s); the stuck calls ended %v; its log: %s", took.Round(time.Millisecond), got, line)
	if took < 2*time.Second || took > 5*time.Second {
		t.Errorf("exited %v after SIGTERM, want the 2s grace and little more", took)
	}
	if !strings.Contains(line, "in_flight=") || !strings.Contains(line, fmt.Sprintf("Recommend=%d", stuck)) {
		t.Errorf("its log does not say which calls it cut off (%d Recommend): %q", stuck, line)
	}
}
