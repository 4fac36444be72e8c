package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/internal/auth"
	"github.com/prism-serve/prism/internal/leview"
	"github.com/prism-serve/prism/internal/modelrun"
	"github.com/prism-serve/prism/internal/ort"
	"github.com/prism-serve/prism/internal/readyline"
	"github.com/prism-serve/prism/internal/tablefile"
	"github.com/prism-serve/prism/loadgen"
	"github.com/prism-serve/prism/models"
	"github.com/prism-serve/prism/plan"
)

// proc is a prism process started by a test.
type proc struct {
	cmd  *exec.Cmd
	addr string
	log  *testLog
}

// startProc runs prism with args and waits for its ready line; the
// line's address is the proc's.
func startProc(t *testing.T, ready readyline.Line, args ...string) *proc {
	t.Helper()
	// Anywhere: prism up echoes its children's lines tagged "[name] ".
	return startCmd(t, exec.Command(prismBin, args...), args[0]+" "+args[1], ready, true, 3*time.Minute)
}

// startCmd starts cmd (a prism command), logs its stderr under prefix,
// and waits up to within for its ready line (anywhere in a line, or at
// its start); it is stopped (SIGTERM, then killed after 20 s) when the
// test ends.
func startCmd(t *testing.T, cmd *exec.Cmd, prefix string, ready readyline.Line, anywhere bool, within time.Duration) *proc {
	t.Helper()
	log := &testLog{t: t, prefix: prefix}
	cmd.Stderr = log
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{cmd: cmd, log: log}
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	})
	w := readyline.Start(out, ready, readyline.WatchOptions{Anywhere: anywhere})
	if p.addr, err = w.Await(context.Background(), within); err != nil {
		// Its stderr says why (a CI log has it only with -v otherwise).
		tail := log.String()
		if len(tail) > 8<<10 {
			tail = tail[len(tail)-8<<10:]
		}
		t.Fatalf("%s: %v; its stderr's end:\n%s", prefix, err, tail)
	}
	return p
}

// servingMetrics is the metrics address p logged when it began serving
// ("msg=serving ... metrics=ADDR"): a port the process picked itself
// (--metrics-addr 127.0.0.1:0). A port the test reserved and freed for
// it could be taken in between by another test's process, which then
// exited "before it was ready" (address already in use).
func servingMetrics(t *testing.T, p *proc) string {
	t.Helper()
	re := regexp.MustCompile(`msg=serving .*metrics=(\S+)`)
	for end := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if m := re.FindStringSubmatch(p.log.String()); m != nil && m[1] != `""` {
			return m[1]
		}
		if time.Now().After(end) {
			t.Fatalf("no metrics address in its log:\n%s", p.log.String())
		}
	}
}

type testLog struct {
	t      *testing.T
	prefix string
	mu     sync.Mutex
	// tail keeps the last 64 KiB written, for tests that read it.
	tail []byte
	// lines counts the lines written, for tests that bound them.
	lines int
}

func (l *testLog) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if testing.Verbose() {
		fmt.Fprintf(os.Stderr, "[%s] %s", l.prefix, b)
	}
	l.tail = append(l.tail, b...)
	l.lines += bytes.Count(b, []byte{'\n'})
	if over := len(l.tail) - 64<<10; over > 0 {
		l.tail = append(l.tail[:0], l.tail[over:]...)
	}
	return len(b), nil
}

// Lines is the number of lines the process wrote to stderr.
func (l *testLog) Lines() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lines
}

// String is the last 64 KiB the process wrote to stderr.
func (l *testLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return string(l.tail)
}

// partitioned builds a zoo preset and partitions it; returns the model
// file, the partition folder and the config.
func partitioned(t *testing.T, dir, name string) (string, string, models.Config) {
	t.Helper()
	p, err := models.Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	mdir := filepath.Join(dir, name)
	if out, err := run(t, nil, "models", "build", name, "-o", mdir, "--seed", "5"); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	part := filepath.Join(dir, name+"-part")
	if out, err := run(t, nil, "partition", filepath.Join(mdir, "model.onnx"), "-o", part); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	return filepath.Join(mdir, "model.onnx"), part, p.Config
}

// toRequest turns a batch into a Recommend request; inputs named in
// context go once, from sample 0.
func toRequest(model string, b *models.Batch, context map[string]bool) *prismv1.RecommendRequest {
	req := &prismv1.RecommendRequest{Model: model, NumCandidates: int32(b.N), Context: &prismv1.Features{}, Candidates: &prismv1.Features{}}
	for i, in := range b.Sig.Inputs {
		col := b.Columns[i]
		if context[in.Name] {
			req.Context.Inputs = append(req.Context.Inputs, &prismv1.Input{Name: in.Name, Values: head(col.F32, in.Width), Ids: headI(col.I64, in.Width)})
			continue
		}
		req.Candidates.Inputs = append(req.Candidates.Inputs, &prismv1.Input{Name: in.Name, Values: col.F32, Ids: col.I64})
	}
	return req
}

func head(v []float32, n int) []float32 {
	if v == nil {
		return nil
	}
	return v[:n]
}

func headI(v []int64, n int) []int64 {
	if v == nil {
		return nil
	}
	return v[:n]
}

// broadcastContext makes every sample carry sample 0's context inputs,
// as the server does.
func broadcastContext(b *models.Batch, context map[string]bool) {
	for i, in := range b.Sig.Inputs {
		if !context[in.Name] {
			continue
		}
		c := &b.Columns[i]
		for s := 1; s < b.N; s++ {
			if c.F32 != nil {
				copy(c.F32[s*in.Width:(s+1)*in.Width], c.F32[:in.Width])
			}
			if c.I64 != nil {
				copy(c.I64[s*in.Width:(s+1)*in.Width], c.I64[:in.Width])
			}
		}
	}
}

// newCerts makes a CA and the role certificates with prism certs init.
func newCerts(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "certs")
	if out, err := run(t, nil, "certs", "init", dir); err != nil {
		t.Fatalf("certs init: %v\n%s", err, out)
	}
	return dir
}

// dial connects to a tier over mutual TLS as role, with the certificates
// in certs ("" : plaintext).
func dial(t *testing.T, addr, certs string, role auth.Role) *grpc.ClientConn {
	t.Helper()
	creds := insecure.NewCredentials()
	if certs != "" {
		c, err := auth.ClientTLS(auth.FilesFor(certs, role))
		if err != nil {
			t.Fatal(err)
		}
		creds = credentials.NewTLS(c)
	}
	c, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestEndToEnd: `prism up` serves all three families; Recommend equals
// the monolithic model within 1e-5; bad input gets clear statuses from
// every tier and the servers keep serving.
func TestEndToEnd(t *testing.T) {
	t.Parallel()
	if err := ort.Init(); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	type served struct {
		name, model, part string
		cfg               models.Config
	}
	var all []served
	args := []string{"up", "--addr", "127.0.0.1:0", "--db", filepath.Join(dir, "db")}
	for _, name := range []string{"dlrm-tiny", "dcnv2-tiny", "deepfm-tiny"} {
		model, part, cfg := partitioned(t, dir, name)
		all = append(all, served{name, model, part, cfg})
		args = append(args, "--model", part)
	}
	// TLS by default: prism up makes the certificates beside the store.
	up := startProc(t, readyline.Up, args...)
	certs := filepath.Join(dir, "certs")
	conn := dial(t, up.addr, certs, auth.Admin)
	rec := prismv1.NewRecommenderClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	for _, s := range all {
		t.Run(s.name, func(t *testing.T) {
			mono, err := ort.NewSession(s.model, ort.SessionOptions{IntraOpThreads: 1})
			if err != nil {
				t.Fatal(err)
			}
			defer mono.Close()
			p, err := plan.Read(s.part)
			if err != nil {
				t.Fatal(err)
			}
			content, err := p.Content(s.part)
			if err != nil || content == "" {
				t.Fatalf("the plan's content: %q, %v", content, err)
			}
			sig := s.cfg.Signature()
			// Half the sparse features in the context (user features,
			// looked up once and sent to the dense worker as one row) and
			// the dense ones: issue 18's user context.
			half := map[string]bool{models.DenseInput: true}
			var sparse []string
			for _, in := range sig.Inputs {
				if in.Kind == models.SparseKind {
					sparse = append(sparse, in.Name)
				}
			}
			for _, name := range sparse[:len(sparse)/2] {
				half[name] = true
			}
			for _, tc := range []struct {
				n       int
				context map[string]bool
			}{{1, nil}, {150, nil}, {97, map[string]bool{"dense": true, "cat_0": true}}, {270, half}, {3, half}} {
				src, _ := models.NewSynthetic(sig, models.SyntheticOptions{Seed: uint64(tc.n)})
				b, _ := src.Next(tc.n)
				broadcastContext(b, tc.context)
				want, err := mono.Run(modelrun.Inputs(b))
				if err != nil {
					t.Fatal(err)
				}
				resp, err := rec.Recommend(ctx, toRequest(s.cfg.Name, b, tc.context))
				if err != nil {
					t.Fatalf("n=%d: %v", tc.n, err)
				}
				if len(resp.GetScores()) != tc.n {
					t.Fatalf("%d scores for %d candidates", len(resp.GetScores()), tc.n)
				}
				if resp.GetVersion() != 1 || resp.GetContent() != content {
					t.Errorf("response names version %d content %q; the store serves version 1, the plan's content is %q", resp.GetVersion(), resp.GetContent(), content)
				}
				worst := maxAbsError(resp.GetScores(), want[0])
				if worst > 1e-5 {
					t.Fatalf("n=%d: max abs error %g against the monolith", tc.n, worst)
				}
			}
		})
	}

	// Bad input, each with its status; then a good request still works.
	// Each request gets its own batch: the cases below edit them in place.
	good := func() *prismv1.RecommendRequest {
		src, _ := models.NewSynthetic(all[0].cfg.Signature(), models.SyntheticOptions{Seed: 1})
		b, _ := src.Next(4)
		return toRequest(all[0].cfg.Name, b, nil)
	}
	missing := good()
	missing.Candidates.Inputs = missing.Candidates.Inputs[:5]
	outOfRange := good()
	outOfRange.Candidates.Inputs[3].Ids[2] = 1 << 40
	negative := good()
	negative.Candidates.Inputs[3].Ids[1] = -1
	short := good()
	short.Candidates.Inputs[0].Values = short.Candidates.Inputs[0].Values[:13*3+1]
	unknown := good()
	unknown.Model = "no-such-model"
	empty := good()
	empty.NumCandidates = 0
	huge := good()
	huge.NumCandidates = 100000
	cases := []struct {
		name string
		req  *prismv1.RecommendRequest
		want codes.Code
		msg  string
	}{
		{"unknown model", unknown, codes.NotFound, "no-such-model"},
		{"missing inputs", missing, codes.InvalidArgument, "cat_"},
		{"id out of range", outOfRange, codes.InvalidArgument, ""},
		{"negative id", negative, codes.InvalidArgument, ""},
		{"wrong value count", short, codes.InvalidArgument, ""},
		{"empty", empty, codes.InvalidArgument, "empty"},
		{"over the size limit", huge, codes.InvalidArgument, "limit"},
	}
	for _, tc := range cases {
		_, err := rec.Recommend(ctx, tc.req)
		if status.Code(err) != tc.want || !strings.Contains(status.Convert(err).Message(), tc.msg) {
			t.Errorf("%s: %v, want %v containing %q", tc.name, err, tc.want, tc.msg)
		}
	}
	past, pcancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer pcancel()
	if _, err := rec.Recommend(past, good()); status.Code(err) != codes.DeadlineExceeded {
		t.Errorf("deadline passed: %v", err)
	}
	// A malformed tensor buffer straight to a dense worker, and a lookup
	// naming an unknown model straight to an embedding worker.
	ws, err := prismv1.NewRegistryClient(conn).List(ctx, &prismv1.ListRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range ws.GetWorkers() {
		switch w.GetRole() {
		case prismv1.Role_ROLE_DENSE:
			c := dial(t, w.GetAddr(), certs, auth.Embedding)
			_, err := prismv1.NewDenseTierClient(c).Score(ctx, &prismv1.ScoreRequest{Model: all[0].cfg.Name, NumSamples: 2, Tensors: []byte("definitely not arrow")})
			if status.Code(err) != codes.InvalidArgument {
				t.Errorf("malformed tensors: %v", err)
			}
		case prismv1.Role_ROLE_EMBEDDING:
			c := dial(t, w.GetAddr(), certs, auth.Router)
			_, err := prismv1.NewEmbeddingTierClient(c).Lookup(ctx, &prismv1.LookupRequest{Model: "nope", NumSamples: 1})
			if status.Code(err) != codes.NotFound {
				t.Errorf("lookup of an unknown model: %v", err)
			}
		}
	}
	if _, err := rec.Recommend(ctx, good()); err != nil {
		t.Fatalf("after the bad requests: %v", err)
	}

	// prism loadgen over a mix of two of the models the stack serves, as
	// README's example runs it: one arrival process split 70/30, every
	// request answered, each model reported beside the totals.
	lgOut := filepath.Join(dir, "loadgen-mix")
	out, err := run(t, nil, "loadgen", "--target", up.addr, "--certs", certs, "--model", "dlrm-tiny=0.7,dcnv2-tiny=0.3",
		"--rate", "40", "--duration", "2s", "--candidates", "8", "--quiet", "--out", lgOut)
	if err != nil {
		t.Fatalf("loadgen over two models: %v\n%s", err, out)
	}
	var lg loadgen.Summary
	if b, err := os.ReadFile(filepath.Join(lgOut, "summary.json")); err != nil || json.Unmarshal(b, &lg) != nil {
		t.Fatalf("loadgen's summary.json: %v\n%s", err, b)
	}
	if len(lg.Models) != 2 || lg.Errors != 0 || lg.Models[0].OK == 0 || lg.Models[1].OK == 0 || lg.Models[0].OK+lg.Models[1].OK != lg.OK ||
		!strings.Contains(out, "model       dlrm-tiny   share 70.0%") || !strings.Contains(out, "model       dcnv2-tiny  share 30.0%") {
		t.Fatalf("loadgen over two models: ok %d, errors %d, models %+v\n%s", lg.OK, lg.Errors, lg.Models, out)
	}
	t.Logf("loadgen over two models:\n%s", out)

	// Online updates: a row changed through the router changes the scores
	// of the candidates that read it; putting it back restores them.
	upd := prismv1.NewEmbeddingsClient(conn)
	tab, err := tablefile.Open(filepath.Join(all[0].part, "tables", "emb_l.0.weight.arrow"))
	if err != nil {
		t.Fatal(err)
	}
	orig, err := tab.ReadAll()
	tab.Close()
	if err != nil {
		t.Fatal(err)
	}
	req := good()
	id := req.Candidates.Inputs[1].Ids[0] // cat_0 of candidate 0
	before, err := rec.Recommend(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	row := func(v []float32) []byte { return leview.Bytes(append([]float32(nil), v...)) }
	bumped := make([]float32, 16)
	for i := range bumped {
		bumped[i] = 3
	}
	// A router takes updates once it has heard from every worker (three
	// heartbeats after it starts): until then Unavailable, retry.
	var r *prismv1.UpdateResponse
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		r, err = upd.Update(ctx, &prismv1.UpdateRequest{Model: "dlrm-tiny", Table: "emb_l.0.weight", Ids: []int64{id}, Rows: row(bumped)})
		if status.Code(err) != codes.Unavailable || time.Now().After(deadline) {
			break
		}
	}
	if err != nil || r.GetWorkers() != 1 {
		t.Fatalf("update: %v %v", r, err)
	}
	after, err := rec.Recommend(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if after.GetScores()[0] == before.GetScores()[0] {
		t.Error("the updated row did not change the score")
	}
	if _, err := upd.Update(ctx, &prismv1.UpdateRequest{Model: "dlrm-tiny", Table: "emb_l.0.weight", Ids: []int64{id}, Rows: row(orig[id*16 : id*16+16])}); err != nil {
		t.Fatal(err)
	}
	restored, err := rec.Recommend(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	for i := range restored.GetScores() {
		if restored.GetScores()[i] != before.GetScores()[i] {
			t.Fatalf("candidate %d: %v after restoring the row, %v before", i, restored.GetScores()[i], before.GetScores()[i])
		}
	}
	for _, bad := range []struct {
		req  *prismv1.UpdateRequest
		want codes.Code
	}{
		{&prismv1.UpdateRequest{Model: "nope", Table: "emb_l.0.weight", Ids: []int64{1}, Rows: row(bumped)}, codes.NotFound},
		{&prismv1.UpdateRequest{Model: "dlrm-tiny", Table: "no_table", Ids: []int64{1}, Rows: row(bumped)}, codes.InvalidArgument},
		{&prismv1.UpdateRequest{Model: "dlrm-tiny", Table: "emb_l.0.weight", Ids: []int64{1}, Rows: row(bumped[:3])}, codes.InvalidArgument},
		{&prismv1.UpdateRequest{Model: "dlrm-tiny", Table: "emb_l.0.weight", Ids: []int64{1 << 40}, Rows: row(bumped)}, codes.InvalidArgument},
	} {
		if _, err := upd.Update(ctx, bad.req); status.Code(err) != bad.want {
			t.Errorf("update %v: %v, want %v", bad.req.GetTable(), err, bad.want)
		}
	}

	// Every tier answers standard health checks and lists its services by
	// reflection (what grpcurl and ghz rely on).
	addrs := []string{up.addr}
	for _, w := range ws.GetWorkers() {
		addrs = append(addrs, w.GetAddr())
	}
	for _, a := range addrs {
		c := dial(t, a, certs, auth.Admin)
		h, err := healthpb.NewHealthClient(c).Check(ctx, &healthpb.HealthCheckRequest{})
		if err != nil || h.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("%s health: %v %v", a, h.GetStatus(), err)
		}
		st, err := reflectpb.NewServerReflectionClient(c).ServerReflectionInfo(ctx)
		if err != nil {
			t.Fatal(err)
		}
		st.Send(&reflectpb.ServerReflectionRequest{MessageRequest: &reflectpb.ServerReflectionRequest_ListServices{}})
		resp, err := st.Recv()
		if err != nil {
			t.Fatalf("%s reflection: %v", a, err)
		}
		var names []string
		for _, s := range resp.GetListServicesResponse().GetService() {
			names = append(names, s.GetName())
		}
		if !strings.Contains(strings.Join(names, " "), "prism.v1.") {
			t.Errorf("%s lists %v by reflection", a, names)
		}
		st.CloseSend()
	}
}

// TestDenseWorkerKilled: with two dense workers under load, killing one
// loses no request (each is answered, with scores or an error, never
// hangs); a restarted worker registers again and takes load.
func TestDenseWorkerKilled(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	_, part, cfg := partitioned(t, dir, "dlrm-tiny")
	certs := newCerts(t)
	router := startProc(t, readyline.Router, "serve", "router", "--certs", certs, "--addr", "127.0.0.1:0", "--heartbeat", "200ms", "--micro-batch", "16")
	denseArgs := []string{"serve", "dense", "--certs", certs, "--plan", part, "--router", router.addr}
	g1 := startProc(t, readyline.Dense, denseArgs...)
	g2 := startProc(t, readyline.Dense, denseArgs...)
	startProc(t, readyline.Embedding, "serve", "embedding", "--certs", certs, "--plan", part, "--db", filepath.Join(dir, "db"), "--router", router.addr)
	conn := dial(t, router.addr, certs, auth.Admin)
	reg := prismv1.NewRegistryClient(conn)
	waitWorkers := func(gpus int) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for time.Now().Before(deadline) {
			ws, err := reg.List(context.Background(), &prismv1.ListRequest{})
			if err == nil {
				n := 0
				for _, w := range ws.GetWorkers() {
					if w.GetRole() == prismv1.Role_ROLE_DENSE {
						n++
					}
				}
				if n == gpus {
					return
				}
			}
			time.Sleep(50 * time.Millisecond)
		}
		t.Fatalf("never saw %d dense workers registered", gpus)
	}
	waitWorkers(2)
	rec := prismv1.NewRecommenderClient(conn)
	src, _ := models.NewSynthetic(cfg.Signature(), models.SyntheticOptions{Seed: 3})
	b, _ := src.Next(64)
	req := toRequest(cfg.Name, b, nil)

	var wg sync.WaitGroup
	var mu sync.Mutex
	var ok, failed, hung int
	stop := make(chan struct{})
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				_, err := rec.Recommend(ctx, req)
				cancel()
				mu.Lock()
				switch {
				case err == nil:
					ok++
				case status.Code(err) == codes.DeadlineExceeded:
					hung++
				default:
					failed++
				}
				mu.Unlock()
			}
		}()
	}
	time.Sleep(500 * time.Millisecond)
	g1.cmd.Process.Kill()
	time.Sleep(1500 * time.Millisecond)
	close(stop)
	wg.Wait()
	t.Logf("with a dense worker killed mid-load: %d ok, %d errors, %d hung", ok, failed, hung)
	if hung > 0 {
		t.Fatalf("%d requests hung until their deadline", hung)
	}
	if ok == 0 {
		t.Fatal("no request succeeded")
	}
	waitWorkers(1)
	// Restart it; it registers again. Then kill the other: the restarted
	// worker must carry the load alone.
	startProc(t, readyline.Dense, denseArgs...)
	waitWorkers(2)
	g2.cmd.Process.Kill()
	waitWorkers(1)
	for i := range 5 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := rec.Recommend(ctx, req)
		cancel()
		if err != nil {
			t.Fatalf("request %d served by the restarted worker: %v", i, err)
		}
	}
}

// TestEmbeddingWorkerCatchesUp: two embedding workers, each with its own
// store. One is killed, an update goes to the other, the killed one
// restarts on its store and is caught up by the router before it serves:
// alone, it answers with the updated row.
func TestEmbeddingWorkerCatchesUp(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	_, part, cfg := partitioned(t, dir, "dlrm-tiny")
	certs := newCerts(t)
	// Quorum one: with one of the two workers killed, updates are still
	// acknowledged (by the survivor), which is the case under test.
	router := startProc(t, readyline.Router, "serve", "router", "--certs", certs, "--addr", "127.0.0.1:0", "--heartbeat", "200ms", "--update-quorum", "one")
	startProc(t, readyline.Dense, "serve", "dense", "--certs", certs, "--plan", part, "--router", router.addr)
	embeddingArgs := func(db string) []string {
		return []string{"serve", "embedding", "--certs", certs, "--plan", part, "--db", filepath.Join(dir, db), "--router", router.addr}
	}
	e1 := startProc(t, readyline.Embedding, embeddingArgs("db1")...)
	e2 := startProc(t, readyline.Embedding, embeddingArgs("db2")...)
	conn := dial(t, router.addr, certs, auth.Admin)
	reg := prismv1.NewRegistryClient(conn)
	// embeddingWorkers waits until the registry lists n embedding workers,
	// each holding update seq (when seq >= 0).
	embeddingWorkers := func(n int, seq int64) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for time.Now().Before(deadline) {
			ws, err := reg.List(context.Background(), &prismv1.ListRequest{})
			if err == nil {
				got := 0
				for _, w := range ws.GetWorkers() {
					if w.GetRole() == prismv1.Role_ROLE_EMBEDDING && (seq < 0 || w.GetUpdateSeq()[cfg.Name] == seq) {
						got++
					}
				}
				if got == n {
					return
				}
			}
			time.Sleep(50 * time.Millisecond)
		}
		t.Fatalf("never saw %d embedding workers holding update %d", n, seq)
	}
	embeddingWorkers(2, 0)
	rec := prismv1.NewRecommenderClient(conn)
	upd := prismv1.NewEmbeddingsClient(conn)
	src, _ := models.NewSynthetic(cfg.Signature(), models.SyntheticOptions{Seed: 4})
	b, _ := src.Next(8)
	req := toRequest(cfg.Name, b, nil)
	id := req.Candidates.Inputs[1].Ids[0] // cat_0 of candidate 0
	update := func(v float32) *prismv1.UpdateResponse {
		t.Helper()
		row := make([]float32, 16)
		for i := range row {
			row[i] = v
		}
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			r, err := upd.Update(context.Background(), &prismv1.UpdateRequest{Model: cfg.Name, Table: "emb_l.0.weight", Ids: []int64{id}, Rows: leview.Bytes(row)})
			if err == nil {
				return r
			}
			if status.Code(err) != codes.Unavailable || time.Now().After(deadline) {
				t.Fatalf("update: %v", err)
			}
		}
	}
	if r := update(2); r.GetWorkers() != 2 {
		t.Fatalf("first update reached %d workers", r.GetWorkers())
	}
	embeddingWorkers(2, 1)
	e2.cmd.Process.Kill()
	e2.cmd.Wait()
	if r := update(5); r.GetWorkers() != 1 {
		t.Fatalf("update with one worker killed reached %d workers", r.GetWorkers())
	}
	want, err := rec.Recommend(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	// Back on its store (which holds update 1): caught up to 2.
	startProc(t, readyline.Embedding, embeddingArgs("db2")...)
	embeddingWorkers(2, 2)
	// The first worker leaves: the restarted one serves alone.
	e1.cmd.Process.Signal(syscall.SIGTERM)
	e1.cmd.Wait()
	embeddingWorkers(1, 2)
	got, err := rec.Recommend(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	for i := range want.GetScores() {
		if got.GetScores()[i] != want.GetScores()[i] {
			t.Fatalf("candidate %d: %v from the caught-up worker, %v from the one that took the update", i, got.GetScores()[i], want.GetScores()[i])
		}
	}
}

// twiceTheRows builds and partitions dlrm-tiny (named name) with every
// table twice as long, under dir/big, and returns the partition: its
// table 0 holds rows the default build lacks, so an update of one is
// applied by its workers and refused as bad input by the default's.
func twiceTheRows(t *testing.T, dir, name string) string {
	t.Helper()
	bigDir := filepath.Join(dir, "big", name)
	if out, err := run(t, nil, "models", "build", "dlrm-tiny", "-o", bigDir, "--seed", "5", "--rows-scale", "2"); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	bigPart := filepath.Join(dir, "big", "part")
	if out, err := run(t, nil, "partition", filepath.Join(bigDir, "model.onnx"), "-o", bigPart); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	return bigPart
}

// awaitList polls reg's Registry/List for up to 30 s until ok says its
// answer will do, and returns it.
func awaitList(t *testing.T, reg prismv1.RegistryClient, what string, ok func(*prismv1.ListResponse) bool) *prismv1.ListResponse {
	t.Helper()
	var last *prismv1.ListResponse
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		resp, err := reg.List(context.Background(), &prismv1.ListRequest{})
		if err == nil && ok(resp) {
			return resp
		}
		if err == nil {
			last = resp
		}
	}
	t.Fatalf("never saw %s; last answer: %v", what, last)
	return nil
}

// embeddingWorkers are resp's embedding workers.
func embeddingWorkers(resp *prismv1.ListResponse) (out []*prismv1.WorkerInfo) {
	for _, w := range resp.GetWorkers() {
		if w.GetRole() == prismv1.Role_ROLE_EMBEDDING {
			out = append(out, w)
		}
	}
	return out
}

// TestDivergedWorkerOutAfterRouterRestart (issue 14): two embedding
// workers of one model answer an update otherwise than each other (one
// serves a build with twice the rows and applies it, the other refuses
// its row as bad input, taking its number), so the refuser's copy
// differs and it leaves serving. The router's answer tells it; its store
// records the mark and it announces it, so the router restarted (in
// memory: it never saw the divergent update) still sends it no lookups.
// Before, the restarted router took its update number for an up-to-date
// copy and sent it lookups of its differing rows. (--mend=false: the
// workers leave the mend to the operator, so the refuser stays out.)
func TestDivergedWorkerOutAfterRouterRestart(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	_, part, cfg := partitioned(t, dir, "dlrm-tiny")
	bigPart := twiceTheRows(t, dir, cfg.Name)
	certs := newCerts(t)
	// The default update quorum, majority: of two workers, both. The
	// refuser leaves the model, and the update's quorum is counted
	// without it (it failed with Unavailable, and the retry, numbered
	// without the refuser, named no refusal).
	routerArgs := func(addr string) []string {
		return []string{"serve", "router", "--certs", certs, "--addr", addr, "--heartbeat", "200ms"}
	}
	router := startProc(t, readyline.Router, routerArgs("127.0.0.1:0")...)
	for i, plan := range []string{bigPart, part} {
		startProc(t, readyline.Embedding, "serve", "embedding", "--certs", certs, "--plan", plan, "--db", filepath.Join(dir, fmt.Sprintf("db%d", i)), "--router", router.addr, "--mend=false")
	}
	conn := dialRestartable(t, router.addr, certs)
	reg := prismv1.NewRegistryClient(conn)
	await := func(what string, ok func(*prismv1.ListResponse) bool) *prismv1.ListResponse {
		t.Helper()
		return awaitList(t, reg, what, ok)
	}
	embedding := embeddingWorkers
	await("two embedding workers", func(r *prismv1.ListResponse) bool { return len(embedding(r)) == 2 })

	upd := prismv1.NewEmbeddingsClient(conn)
	row := make([]float32, cfg.EmbDim)
	var resp *prismv1.UpdateResponse
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		var err error
		resp, err = upd.Update(context.Background(), &prismv1.UpdateRequest{Model: cfg.Name, Table: "emb_l.0.weight", Ids: []int64{cfg.TableRows[0]}, Rows: leview.Bytes(row)})
		if err == nil {
			break
		}
		if status.Code(err) != codes.Unavailable || time.Now().After(deadline) {
			t.Fatalf("update: %v", err)
		}
	}
	if resp.GetWorkers() != 1 || len(resp.GetRefused()) != 1 {
		t.Fatalf("update of a row one build lacks answered %v; want one worker applying it and one refusing it", resp)
	}
	// The refuser's store records the mark, and it announces it.
	var refuser, applier string
	await("the refusing worker announcing its copy diverged", func(r *prismv1.ListResponse) bool {
		refuser, applier = "", ""
		for _, w := range embedding(r) {
			if w.GetDiverged()[cfg.Name] == 1 {
				refuser = w.GetId()
			} else {
				applier = w.GetId()
			}
		}
		return refuser != "" && applier != ""
	})

	// The router restarts, at the same address, in memory.
	router.cmd.Process.Kill()
	router.cmd.Wait()
	startProc(t, readyline.Router, routerArgs(router.addr)...)
	after := await("the restarted router past its start-up window", func(r *prismv1.ListResponse) bool {
		u := r.GetUpdates()[cfg.Name]
		return len(embedding(r)) == 2 && u != nil && !u.GetSettling()
	})
	u := after.GetUpdates()[cfg.Name]
	if !slices.Equal(u.GetInSync(), []string{applier}) || !slices.Contains(u.GetLeftOut(), refuser) {
		t.Fatalf("the restarted router sends lookups to %v and leaves out %v; want only %s, the diverged %s left out", u.GetInSync(), u.GetLeftOut(), applier, refuser)
	}

	// prism status says so, row by row, to an admin certificate.
	out, err := run(t, nil, "status", "--router", router.addr, "--certs", certs)
	if err != nil {
		t.Fatalf("prism status: %v\n%s", err, out)
	}
	t.Logf("prism status:\n%s", out)
	rowOf := func(id string) string {
		for _, line := range strings.Split(out, "\n") {
			if strings.HasSuffix(line, " "+id) {
				return line
			}
		}
		t.Fatalf("prism status has no row of %s:\n%s", id, out)
		return ""
	}
	if row := rowOf(refuser); !strings.Contains(row, "diverged at 1") {
		t.Errorf("prism status's row of the refuser: %q, want it diverged at 1", row)
	}
	if row := rowOf(applier); !strings.Contains(row, " serving ") || !strings.Contains(row, "1 of 1") {
		t.Errorf("prism status's row of the applier: %q, want it serving, holding 1 of 1", row)
	}
	for _, w := range embeddingWorkers(after) {
		if w.GetId() == applier && !strings.Contains(out, "prism store copy --from "+w.GetAddr()+" --db ITS_STORE") {
			t.Errorf("prism status names no mend of the refuser from the applier (%s):\n%s", w.GetAddr(), out)
		}
	}
	out, err = run(t, nil, "status", "--router", router.addr, "--certs", certs, "--json")
	var list prismv1.ListResponse
	if err != nil || protojson.Unmarshal([]byte(out), &list) != nil || len(embedding(&list)) != 2 {
		t.Fatalf("prism status --json: %v\n%s", err, out)
	}
	if out, err := run(t, nil, "status", "--router", router.addr, "--insecure", "--timeout", "5s"); err == nil {
		t.Fatalf("prism status --insecure against a TLS router succeeded:\n%s", out)
	}
	// --check fails on it (and on the model's missing dense tier).
	if out, err := run(t, nil, "status", "--router", router.addr, "--certs", certs, "--check"); err == nil || !strings.Contains(out, "--check: 2 problem(s)") || !strings.Contains(out, "is diverged at 1") {
		t.Fatalf("prism status --check with a diverged worker and no dense one: %v, want it to fail naming both:\n%s", err, out)
	}
	// Any role's folder will do (inside a tier's Pod, the one mounted).
	if out, err := run(t, nil, "status", "--router", router.addr, "--certs", filepath.Join(certs, "embedding")); err != nil || !strings.Contains(out, "diverged at 1") {
		t.Fatalf("prism status --certs with the embedding role's folder: %v\n%s", err, out)
	}
}

// TestReplayDivergedAfterRouterRestart (issue 14): the router keeps what
// became of each logged update in its update log, so after a restart it
// still judges a worker's answer to a replay by the update's first
// holders. Embedding worker A (a build with twice the rows) applies an
// update of a row B's build lacks while B is down; the router restarts
// from its log; B comes back and refuses the replay as bad input, taking
// its number. B is then diverged and out of serving. Before, the
// restarted router learnt the update's outcome from B's refusal, the
// first answer it saw: B was not marked, and served its copy lacking the
// row, as in sync. (--mend=false: the operator's mend, prism store
// copy, is the one tested here.)
func TestReplayDivergedAfterRouterRestart(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	_, part, cfg := partitioned(t, dir, "dlrm-tiny")
	bigPart := twiceTheRows(t, dir, cfg.Name)
	certs := newCerts(t)
	logDir := filepath.Join(dir, "router-log")
	routerArgs := func(addr string) []string {
		return []string{"serve", "router", "--certs", certs, "--addr", addr, "--heartbeat", "200ms", "--update-quorum", "one", "--update-log-dir", logDir}
	}
	router := startProc(t, readyline.Router, routerArgs("127.0.0.1:0")...)
	embArgs := func(plan, db string) []string {
		return []string{"serve", "embedding", "--certs", certs, "--plan", plan, "--db", filepath.Join(dir, db), "--router", router.addr, "--mend=false"}
	}
	startProc(t, readyline.Embedding, embArgs(bigPart, "db-a")...)
	b := startProc(t, readyline.Embedding, embArgs(part, "db-b")...)
	reg := prismv1.NewRegistryClient(dialRestartable(t, router.addr, certs))
	awaitList(t, reg, "two embedding workers", func(r *prismv1.ListResponse) bool { return len(embeddingWorkers(r)) == 2 })

	// B goes down; A alone applies the update (quorum one).
	b.cmd.Process.Kill()
	b.cmd.Wait()
	awaitList(t, reg, "one embedding worker", func(r *prismv1.ListResponse) bool { return len(embeddingWorkers(r)) == 1 })
	upd := prismv1.NewEmbeddingsClient(dialRestartable(t, router.addr, certs))
	row := make([]float32, cfg.EmbDim)
	updateByOne(t, upd, &prismv1.UpdateRequest{Model: cfg.Name, Table: "emb_l.0.weight", Ids: []int64{cfg.TableRows[0]}, Rows: leview.Bytes(row)})

	// The router restarts from its log, then B comes back on its store.
	router.cmd.Process.Kill()
	router.cmd.Wait()
	startProc(t, readyline.Router, routerArgs(router.addr)...)
	b = startProc(t, readyline.Embedding, embArgs(part, "db-b")...)
	var refuser string
	after := awaitList(t, reg, "B caught up and marked diverged", func(r *prismv1.ListResponse) bool {
		refuser = ""
		for _, w := range embeddingWorkers(r) {
			if w.GetDiverged()[cfg.Name] == 1 {
				refuser = w.GetId()
			}
		}
		u := r.GetUpdates()[cfg.Name]
		return refuser != "" && len(embeddingWorkers(r)) == 2 && u != nil && !u.GetSettling()
	})
	if u := after.GetUpdates()[cfg.Name]; slices.Contains(u.GetInSync(), refuser) || len(u.GetInSync()) != 1 {
		t.Fatalf("the restarted router sends lookups to %v; want only A, not B (%s), whose copy lacks the row A applied", u.GetInSync(), refuser)
	}

	// The mend: B's store replaced by a copy of A's (prism store copy),
	// staged while B runs and swapped in when B restarts on A's build;
	// B then serves in sync, holding update 1, with no mark. Only an
	// admin or an embedding worker may ask for a worker's store.
	var aAddr string
	for _, w := range embeddingWorkers(after) {
		if w.GetId() != refuser {
			aAddr = w.GetAddr()
		}
	}
	if out, err := run(t, nil, "store", "copy", "--from", aAddr, "--db", filepath.Join(dir, "db-x"), "--certs", filepath.Join(certs, "router")); err == nil || !strings.Contains(out, "PermissionDenied") {
		t.Fatalf("store copy with a router's certificate: %v\n%s", err, out)
	}
	// With the embedding role's folder, as from inside a worker's Pod.
	out, err := run(t, nil, "store", "copy", "--from", aAddr, "--db", filepath.Join(dir, "db-b"), "--certs", filepath.Join(certs, "embedding"))
	if err != nil || !strings.Contains(out, "staged in") || !strings.Contains(out, "updates applied 1") {
		t.Fatalf("store copy into a running worker's store: %v\n%s", err, out)
	}
	t.Logf("prism store copy:\n%s", out)
	// An update after the copy was taken (A alone applies it: B is out):
	// the mended B, holding 1, is caught up to 2 by the router's replay.
	row[0] = 2
	if resp, err := upd.Update(context.Background(), &prismv1.UpdateRequest{Model: cfg.Name, Table: "emb_l.0.weight", Ids: []int64{cfg.TableRows[0]}, Rows: leview.Bytes(row)}); err != nil || resp.GetWorkers() != 1 {
		t.Fatalf("update 2: %v, %v; want A alone applying it", resp, err)
	}
	b.cmd.Process.Kill()
	b.cmd.Wait()
	// The chart's init step opens the store first (prism ingest
	// --if-changed): that open swaps the copy in, and the plan it then
	// finds served needs no ingest.
	if out, err := run(t, nil, "ingest", bigPart, "--db", filepath.Join(dir, "db-b"), "--if-changed"); err != nil || !strings.Contains(out, "swapped in the copy") {
		t.Fatalf("prism ingest --if-changed over a staged copy: %v\n%s", err, out)
	}
	startProc(t, readyline.Embedding, embArgs(bigPart, "db-b")...)
	awaitList(t, reg, "B mended and caught up: both workers in sync at update 2, none diverged", func(r *prismv1.ListResponse) bool {
		ws := embeddingWorkers(r)
		for _, w := range ws {
			if len(w.GetDiverged()) > 0 || w.GetUpdateSeq()[cfg.Name] != 2 {
				return false
			}
		}
		u := r.GetUpdates()[cfg.Name]
		return len(ws) == 2 && len(u.GetInSync()) == 2 && u.GetAcknowledged() == 2
	})
	kept, _ := filepath.Glob(filepath.Join(dir, "db-b", "replaced-*"))
	if len(kept) != 1 {
		t.Fatalf("B's store from before the copy: %v, want one folder replaced-*", kept)
	}
}

// TestServeAliases: the tiers' former names still start them, so older
// scripts keep working.
func TestServeAliases(t *testing.T) {
	for alias, want := range map[string]string{"cpu": "prism serve embedding", "gpu": "prism serve dense", "embedding": "prism serve embedding", "dense": "prism serve dense"} {
		out, err := run(t, nil, "serve", alias, "--help")
		if err != nil || !strings.Contains(out, want) {
			t.Errorf("serve %s --help: %v\n%s", alias, err, out)
		}
	}
}

// TestEndToEndDictionaryFrames: with --dictionary-frames the embedding
// worker sends the repeated rows of a micro-batch once (dictionary-
// encoded columns) and the dense worker expands them: scores stay the
// monolith's within 1e-5, with and without a user context.
func TestEndToEndDictionaryFrames(t *testing.T) {
	t.Parallel()
	rec, mono, cfg := tinyUp(t, "--dictionary-frames")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sig := cfg.Signature()
	for _, tc := range []struct {
		n       int
		context map[string]bool
	}{{1, nil}, {270, nil}, {150, map[string]bool{"dense": true, "cat_0": true}}} {
		src, _ := models.NewSynthetic(sig, models.SyntheticOptions{Seed: uint64(40 + tc.n)})
		b, _ := src.Next(tc.n)
		broadcastContext(b, tc.context)
		matchMonolith(t, ctx, rec, mono, cfg, b, tc.context, fmt.Sprintf("n=%d", tc.n))
	}
}

// tinyUp partitions dlrm-tiny, serves it with prism up and flags, and
// returns a client of the stack and the monolith's session.
func tinyUp(t *testing.T, flags ...string) (prismv1.RecommenderClient, *ort.Session, models.Config) {
	t.Helper()
	if err := ort.Init(); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	model, part, cfg := partitioned(t, dir, "dlrm-tiny")
	up := startProc(t, readyline.Up, append([]string{"up", "--addr", "127.0.0.1:0", "--db", filepath.Join(dir, "db"), "--model", part}, flags...)...)
	conn := dial(t, up.addr, filepath.Join(dir, "certs"), auth.Admin)
	mono, err := ort.NewSession(model, ort.SessionOptions{IntraOpThreads: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mono.Close() })
	return prismv1.NewRecommenderClient(conn), mono, cfg
}

// matchMonolith sends b (its context inputs once) and fails the test
// unless the scores equal the monolith's within 1e-5.
func matchMonolith(t *testing.T, ctx context.Context, rec prismv1.RecommenderClient, mono *ort.Session, cfg models.Config, b *models.Batch, inContext map[string]bool, what string) {
	t.Helper()
	want, err := mono.Run(modelrun.Inputs(b))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := rec.Recommend(ctx, toRequest(cfg.Name, b, inContext))
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	if worst := maxAbsError(resp.GetScores(), want[0]); len(resp.GetScores()) != b.N || worst > 1e-5 {
		t.Fatalf("%s: %d scores for %d candidates, max abs error %g against the monolith", what, len(resp.GetScores()), b.N, worst)
	}
}

// maxAbsError is the largest |got[i] - want[i]| over got.
func maxAbsError(got, want []float32) float64 {
	var worst float64
	for i, v := range got {
		worst = max(worst, math.Abs(float64(v)-float64(want[i])))
	}
	return worst
}

// TestEndToEndLargerThanMemory serves through an embedding worker under a
// memory budget whose hot tier holds a sliver of the tables (64 KiB of
// dlrm-tiny's rows), so most lookups read rows from the store's files
// (with O_DIRECT where the file system allows it, as such a worker does
// by default), on real processes: scores equal the monolith's, first
// read cold, then again with the tier warm.
// TestEmbeddingWorkerRestartsWarm: an embedding worker whose hot tier
// holds a fraction of the rows, stopped with SIGTERM and started again on
// its store, reads the rows its tier held back (its "warm restart" line),
// an update acknowledged before the restart included, and scores as the
// monolith does; started with --warm-restart=false it reads none back.
func TestEmbeddingWorkerRestartsWarm(t *testing.T) {
	t.Parallel()
	if err := ort.Init(); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	model, part, cfg := partitioned(t, dir, "dlrm-tiny")
	certs := newCerts(t)
	router := startProc(t, readyline.Router, "serve", "router", "--certs", certs, "--addr", "127.0.0.1:0", "--heartbeat", "200ms")
	startProc(t, readyline.Dense, "serve", "dense", "--certs", certs, "--plan", part, "--router", router.addr)
	embedding := func(flags ...string) *proc {
		return startProc(t, readyline.Embedding, append([]string{"serve", "embedding", "--certs", certs, "--plan", part,
			"--db", filepath.Join(dir, "db"), "--router", router.addr, "--memory-limit", "2GiB", "--hot-bytes", "64KiB"}, flags...)...)
	}
	conn := dial(t, router.addr, certs, auth.Admin)
	rec := prismv1.NewRecommenderClient(conn)
	mono, err := ort.NewSession(model, ort.SessionOptions{IntraOpThreads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer mono.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	src, _ := models.NewSynthetic(cfg.Signature(), models.SyntheticOptions{Seed: 5})
	var batches []*models.Batch
	for range 4 {
		b, _ := src.Next(270)
		batches = append(batches, b)
	}
	// score retries while the restarted worker registers.
	score := func(what string) {
		t.Helper()
		for i, b := range batches {
			for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
				_, err := rec.Recommend(ctx, toRequest(cfg.Name, b, nil))
				if err == nil {
					break
				}
				if status.Code(err) != codes.Unavailable || time.Now().After(deadline) {
					t.Fatalf("%s, request %d: %v", what, i, err)
				}
			}
			matchMonolith(t, ctx, rec, mono, cfg, b, nil, fmt.Sprintf("%s, request %d", what, i))
		}
	}
	stop := func(p *proc) {
		p.cmd.Process.Signal(syscall.SIGTERM)
		p.cmd.Wait()
	}
	restored := regexp.MustCompile(`warm restart: read (\d+) rows`)
	// waitRestored is the rows the worker says it read back.
	waitRestored := func(p *proc) int {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			if m := restored.FindStringSubmatch(p.log.String()); m != nil {
				n, _ := strconv.Atoi(m[1])
				return n
			}
		}
		t.Fatal("the restarted worker never logged its warm restart")
		return 0
	}

	e := embedding()
	score("before the restart")
	// An update to a row the requests read, acknowledged before the
	// restart: the restored tier must hold it, not the ingested row.
	req := toRequest(cfg.Name, batches[0], nil)
	id := req.Candidates.Inputs[1].Ids[0]
	row := make([]float32, 16)
	for i := range row {
		row[i] = 0.25
	}
	upd := prismv1.NewEmbeddingsClient(conn)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		_, err := upd.Update(ctx, &prismv1.UpdateRequest{Model: cfg.Name, Table: "emb_l.0.weight", Ids: []int64{id}, Rows: leview.Bytes(row)})
		if err == nil {
			break
		}
		if status.Code(err) != codes.Unavailable || time.Now().After(deadline) {
			t.Fatalf("update: %v", err)
		}
	}
	before, err := rec.Recommend(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	stop(e)
	e = embedding()
	if n := waitRestored(e); n == 0 {
		t.Fatal("the warm restart read no rows back")
	}
	// sameAsBefore: req scores as it did before the restart (the update
	// held), once the restarted worker has registered.
	sameAsBefore := func(what string) {
		t.Helper()
		after, err := rec.Recommend(ctx, req)
		for deadline := time.Now().Add(30 * time.Second); status.Code(err) == codes.Unavailable && time.Now().Before(deadline); {
			time.Sleep(100 * time.Millisecond)
			after, err = rec.Recommend(ctx, req)
		}
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		for i := range before.GetScores() {
			if after.GetScores()[i] != before.GetScores()[i] {
				t.Fatalf("%s: candidate %d scores %v, %v before the restart (the updated row)", what, i, after.GetScores()[i], before.GetScores()[i])
			}
		}
	}
	sameAsBefore("after a warm restart")
	stop(e)
	e = embedding("--warm-restart=false")
	sameAsBefore("after a cold restart")
	if restored.MatchString(e.log.String()) {
		t.Fatal("--warm-restart=false read rows back")
	}
}

func TestEndToEndLargerThanMemory(t *testing.T) {
	t.Parallel()
	rec, mono, cfg := tinyUp(t, "--memory-limit", "2GiB", "--hot-bytes", "64KiB")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	src, _ := models.NewSynthetic(cfg.Signature(), models.SyntheticOptions{Seed: 77, Uniform: true})
	var batches []*models.Batch
	for range 3 {
		b, _ := src.Next(270)
		batches = append(batches, b)
	}
	for round := range 2 {
		for i, b := range batches {
			matchMonolith(t, ctx, rec, mono, cfg, b, nil, fmt.Sprintf("round %d, request %d", round, i))
		}
	}
}

// printedRequest is one Recommend request of model with n candidates as
// prism loadgen --print-request writes it (the JSON a grpcurl or ghz
// user sends), read back.
func printedRequest(t *testing.T, model string, n int) *prismv1.RecommendRequest {
	t.Helper()
	out, err := exec.Command(prismBin, "loadgen", "--model", model, "--print-request", "1", "--candidates", fmt.Sprint(n)).Output()
	if err != nil {
		t.Fatalf("loadgen --print-request: %v", err)
	}
	var req prismv1.RecommendRequest
	if err := protojson.Unmarshal(out, &req); err != nil {
		t.Fatalf("printed request %q: %v", out, err)
	}
	return &req
}
