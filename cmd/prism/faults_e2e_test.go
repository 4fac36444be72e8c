package main

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/cpuserve/store"
	"github.com/prism-serve/prism/internal/auth"
	"github.com/prism-serve/prism/internal/leview"
	"github.com/prism-serve/prism/internal/readyline"
	"github.com/prism-serve/prism/models"
)

// The fault campaign of issue 14: real processes (a router, two embedding
// workers on their own stores, two dense workers), a stream of embedding
// updates and Recommend load, and kill -9 of each tier at randomized
// points, over several rounds. Its choices (which worker, after how many
// updates, how long into an update, how long down) come from a seeded
// source; the seed is logged and PRISM_FAULTS_SEED replays it.
// PRISM_FAULTS_ROUNDS sets the number of rounds (default 3);
// PRISM_FAULTS_MEMORY_LOG=1 runs the router without --update-log-dir.
//
// What it checks, after the campaign and a settle period:
//   - no acknowledged update is lost: every row's final value is that of
//     the last acknowledged update of the row (or of a later update whose
//     answer the client never got). Checked twice: through Recommend,
//     against the zoo's float64 reference with the expected rows, with
//     each embedding worker serving alone and with both; and in the stores
//     themselves, read directly after the workers stopped. A row no store
//     holds, or a Recommend answer computed from a stale row, is a lost
//     update;
//   - no accepted Recommend hangs: each gets its scores or a status
//     within its deadline.
const (
	faultModelSeed   = 5  // partitioned() builds the zoo model with --seed 5
	faultTables      = 4  // updates go to tables 0..3 ...
	faultIDs         = 12 // ... rows 0..11 of each: rows are overwritten often
	faultRecDeadline = 3 * time.Second
	faultUpdAttempt  = 2 * time.Second
	faultUpdGiveUp   = 10 * time.Second
	faultHeartbeat   = 200 * time.Millisecond
)

// faultValue is element j of the row that update k writes: a multiple of
// 1/1024 in [-0.5, 0.5), exact in float32, and a different row for
// different k (with overwhelming probability over 16 elements).
func faultValue(k, j int) float32 {
	h := uint64(k)*0x9e3779b97f4a7c15 + uint64(j)*0xbf58476d1ce4e5b9
	h ^= h >> 31
	h *= 0x94d049bb133111eb
	h ^= h >> 29
	return float32(int(h%1024)-512) / 1024
}

func faultRow(k, dim int) []float32 {
	r := make([]float32, dim)
	for j := range r {
		r[j] = faultValue(k, j)
	}
	return r
}

// faultUpdate is one update of the stream: update k writes faultRow(k) to
// row id of table.
type faultUpdate struct {
	k        int
	table    int
	id       int64
	acked    bool
	attempts int
	lastErr  string
}

type rowKey struct {
	table int
	id    int64
}

// member is one restartable prism process of the campaign.
type member struct {
	name  string
	ready readyline.Line
	args  func() []string
	p     *proc
	up    bool
}

func (m *member) start(t *testing.T) {
	t.Helper()
	m.p = startProc(t, m.ready, m.args()...)
	m.up = true
}

// kill sends SIGKILL and reaps the process.
func (m *member) kill() {
	m.p.cmd.Process.Kill()
	m.p.cmd.Wait()
	m.up = false
}

// stop sends SIGTERM (the worker leaves the registry) and waits.
func (m *member) stop() {
	m.p.cmd.Process.Signal(syscall.SIGTERM)
	m.p.cmd.Wait()
	m.up = false
}

// faultStats counts the Recommend load.
type faultStats struct {
	mu      sync.Mutex
	sent    int
	ok      int
	errs    map[codes.Code]int
	example map[codes.Code]string // the first message of each code
	hung    int
	hungMsg []string
}

func (s *faultStats) record(err error, took time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sent++
	switch {
	// A request is hung when it got no answer of the servers' within
	// its deadline: the client's deadline expired, or the call returned
	// late.
	case status.Code(err) == codes.DeadlineExceeded || took > faultRecDeadline+time.Second:
		s.hung++
		if len(s.hungMsg) < 10 {
			s.hungMsg = append(s.hungMsg, fmt.Sprintf("after %v: %v", took.Round(time.Millisecond), err))
		}
	case err == nil:
		s.ok++
	default:
		s.errs[status.Code(err)]++
		if _, ok := s.example[status.Code(err)]; !ok {
			s.example[status.Code(err)] = status.Convert(err).Message()
		}
	}
}

func faultEnvInt(t *testing.T, name string, def uint64) uint64 {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		t.Fatalf("%s=%q: %v", name, v, err)
	}
	return n
}

// dialRestartable connects as admin with a short reconnect backoff, so a
// client sees a restarted router within a few hundred milliseconds (the
// default backoff grows to seconds after a few refused connections).
func dialRestartable(t *testing.T, addr, certs string) *grpc.ClientConn {
	t.Helper()
	c, err := auth.ClientTLS(auth.FilesFor(certs, auth.Admin))
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(c)),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.Config{BaseDelay: 20 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 200 * time.Millisecond}, MinConnectTimeout: time.Second}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func TestFaultCampaign(t *testing.T) {
	t.Parallel()
	seed := faultEnvInt(t, "PRISM_FAULTS_SEED", uint64(time.Now().UnixNano())%1_000_000_007)
	rounds := int(faultEnvInt(t, "PRISM_FAULTS_ROUNDS", 3))
	t.Logf("fault campaign: seed %d, %d rounds (replay: PRISM_FAULTS_SEED=%d PRISM_FAULTS_ROUNDS=%d)", seed, rounds, seed, rounds)
	began := time.Now()

	dir := t.TempDir()
	_, part, cfg := partitioned(t, dir, "dlrm-tiny")
	certs := newCerts(t)
	ref, err := models.New(cfg, faultModelSeed)
	if err != nil {
		t.Fatal(err)
	}
	dim := cfg.EmbDim

	// The router's update log on disk, when this router has one (the flag
	// comes with the durable-updates work of issue 14).
	// PRISM_FAULTS_MEMORY_LOG=1 keeps it in memory, to compare.
	var logDir []string
	if out, _ := run(t, nil, "serve", "router", "--help"); strings.Contains(out, "--update-log-dir") && os.Getenv("PRISM_FAULTS_MEMORY_LOG") == "" {
		logDir = []string{"--update-log-dir", filepath.Join(dir, "update-log")}
	}
	t.Logf("router update log: %v", map[bool]string{true: "persisted (--update-log-dir)", false: "in memory"}[logDir != nil])

	routerAddr := "127.0.0.1:0"
	router := &member{name: "router", ready: readyline.Router, args: func() []string {
		return append([]string{"serve", "router", "--certs", certs, "--addr", routerAddr, "--heartbeat", faultHeartbeat.String(), "--micro-batch", "8"}, logDir...)
	}}
	router.start(t)
	routerAddr = router.p.addr // restarts take the same address
	var emb, dense []*member
	for i := range 2 {
		db := filepath.Join(dir, fmt.Sprintf("db%d", i))
		emb = append(emb, &member{name: fmt.Sprintf("embedding-%d", i), ready: readyline.Embedding, args: func() []string {
			return []string{"serve", "embedding", "--certs", certs, "--plan", part, "--db", db, "--router", routerAddr, "--threads", "1"}
		}})
		dense = append(dense, &member{name: fmt.Sprintf("dense-%d", i), ready: readyline.Dense, args: func() []string {
			return []string{"serve", "dense", "--certs", certs, "--plan", part, "--router", routerAddr, "--threads", "1"}
		}})
	}
	for _, m := range append(slices.Clone(dense), emb...) {
		m.start(t)
	}
	conn := dialRestartable(t, routerAddr, certs)
	reg := prismv1.NewRegistryClient(conn)
	rec := prismv1.NewRecommenderClient(conn)
	upd := prismv1.NewEmbeddingsClient(conn)

	// registered waits until the registry lists exactly the live workers
	// (a killed one is gone, a restarted one is back).
	registered := func(within time.Duration) error {
		var last string
		for deadline := time.Now().Add(within); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			ws, err := reg.List(ctx, &prismv1.ListRequest{})
			cancel()
			if err != nil {
				last = err.Error()
				continue
			}
			var want, got []string
			for _, m := range append(slices.Clone(emb), dense...) {
				if m.up {
					want = append(want, m.p.addr)
				}
			}
			for _, w := range ws.GetWorkers() {
				got = append(got, w.GetAddr())
			}
			sort.Strings(want)
			sort.Strings(got)
			if slices.Equal(want, got) {
				return nil
			}
			last = fmt.Sprintf("registry lists %v, live workers %v", got, want)
		}
		return fmt.Errorf("the registry never listed the live workers: %s", last)
	}
	if err := registered(30 * time.Second); err != nil {
		t.Fatal(err)
	}

	// The update stream: one client, sequential, retrying each update as
	// a client would (Unavailable while the router restarts or refuses
	// updates for its first heartbeats, errors while it is down) until it
	// is acknowledged or faultUpdGiveUp passes.
	var (
		updMu     sync.Mutex
		updates   []*faultUpdate
		ackedN    atomic.Int64
		attemptCh = make(chan struct{}) // an attempt starts (to whoever waits)
		stopUpd   = make(chan struct{})
		updDone   = make(chan struct{})
	)
	updRng := rand.New(rand.NewPCG(seed, 1))
	go func() {
		defer close(updDone)
		for k := 1; ; k++ {
			select {
			case <-stopUpd:
				return
			default:
			}
			u := &faultUpdate{k: k, table: updRng.IntN(faultTables), id: int64(updRng.IntN(faultIDs))}
			updMu.Lock()
			updates = append(updates, u)
			updMu.Unlock()
			req := &prismv1.UpdateRequest{Model: cfg.Name, Table: models.TableName(u.table), Ids: []int64{u.id}, Rows: leview.Bytes(faultRow(k, dim))}
			for giveUp := time.Now().Add(faultUpdGiveUp); time.Now().Before(giveUp); {
				select {
				case attemptCh <- struct{}{}:
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), faultUpdAttempt)
				r, err := upd.Update(ctx, req)
				cancel()
				updMu.Lock()
				u.attempts++
				if err == nil {
					u.acked = true
					if len(r.GetRefused()) > 0 {
						u.lastErr = "acknowledged, refused by " + strings.Join(r.GetRefused(), "; ")
					}
				} else {
					u.lastErr = err.Error()
				}
				updMu.Unlock()
				if err == nil {
					ackedN.Add(1)
					break
				}
				if c := status.Code(err); c == codes.PermissionDenied || c == codes.Unauthenticated || c == codes.InvalidArgument {
					break // refusals no retry changes
				}
				time.Sleep(30 * time.Millisecond)
			}
		}
	}()

	// Recommend load: two clients, each request with its own deadline.
	src, _ := models.NewSynthetic(cfg.Signature(), models.SyntheticOptions{Seed: seed})
	loadBatch, _ := src.Next(32)
	loadReq := toRequest(cfg.Name, loadBatch, nil)
	stats := &faultStats{errs: map[codes.Code]int{}, example: map[codes.Code]string{}}
	stopLoad := make(chan struct{})
	var loadWG sync.WaitGroup
	for range 2 {
		loadWG.Add(1)
		go func() {
			defer loadWG.Done()
			for {
				select {
				case <-stopLoad:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), faultRecDeadline)
				start := time.Now()
				_, err := rec.Recommend(ctx, loadReq)
				took := time.Since(start)
				cancel()
				stats.record(err, took)
				if err != nil {
					time.Sleep(10 * time.Millisecond) // a client backs off on errors
				}
			}
		}()
	}

	// The faults. Every choice comes from faultRng in a fixed order, so a
	// seed replays the same plan (the timing of the processes varies).
	faultRng := rand.New(rand.NewPCG(seed, 2))
	between := func(lo, hi time.Duration) time.Duration { return lo + time.Duration(faultRng.Int64N(int64(hi-lo)+1)) }
	// midUpdate waits until n more updates are acknowledged and the next
	// attempt starts, then waits offset into it: the kill lands in the
	// middle of the update stream, often in the middle of one update.
	midUpdate := func(n int, offset time.Duration) string {
		target := ackedN.Load() + int64(n)
		deadline := time.Now().Add(3 * time.Second) // updates may be refused for a while
		for ackedN.Load() < target && time.Now().Before(deadline) {
			time.Sleep(2 * time.Millisecond)
		}
		select {
		case <-attemptCh:
		case <-time.After(3 * time.Second):
		}
		time.Sleep(offset)
		updMu.Lock()
		defer updMu.Unlock()
		return fmt.Sprintf("update %d (attempt %d), %v after it started, %d acknowledged", len(updates), updates[len(updates)-1].attempts+1, offset, ackedN.Load())
	}
	faults := map[string]int{}
	for round := 1; round <= rounds; round++ {
		var pending []*member // killed, restarted at the end of the round
		for _, f := range faultRng.Perm(3) {
			switch f {
			case 0: // the router, in the middle of the update stream
				at := midUpdate(1+faultRng.IntN(8), between(0, 4*time.Millisecond))
				router.kill()
				down := between(0, 300*time.Millisecond)
				t.Logf("round %d: kill -9 router at %s; restart in %v", round, at, down)
				faults["router"]++
				time.Sleep(down)
				router.start(t)
			case 1: // an embedding worker, in the middle of the update stream
				m := emb[faultRng.IntN(2)]
				at := midUpdate(1+faultRng.IntN(8), between(0, 4*time.Millisecond))
				late := faultRng.IntN(3) == 0
				down := between(100*time.Millisecond, 600*time.Millisecond)
				m.kill()
				faults["embedding"]++
				if late {
					t.Logf("round %d: kill -9 %s at %s; restart at the end of the round", round, m.name, at)
					pending = append(pending, m)
					continue
				}
				t.Logf("round %d: kill -9 %s at %s; restart in %v", round, m.name, at, down)
				time.Sleep(down)
				m.start(t)
			case 2: // a dense worker, under load
				m := dense[faultRng.IntN(2)]
				wait, down := between(50*time.Millisecond, 500*time.Millisecond), between(100*time.Millisecond, 500*time.Millisecond)
				time.Sleep(wait)
				m.kill()
				faults["dense"]++
				t.Logf("round %d: kill -9 %s under load; restart in %v", round, m.name, down)
				time.Sleep(down)
				m.start(t)
			}
		}
		for _, m := range pending {
			m.start(t)
		}
		if err := registered(30 * time.Second); err != nil {
			t.Errorf("after round %d: %v", round, err)
		}
	}
	close(stopUpd)
	<-updDone
	close(stopLoad)
	loadWG.Wait()
	campaign := time.Since(began)

	// What the stream wrote: per row, the acceptable final values.
	updMu.Lock()
	defer updMu.Unlock()
	var acked, unacked, refusedBy int
	lastAcked := map[rowKey]int{}
	for _, u := range updates {
		if u.acked {
			acked++
			lastAcked[rowKey{u.table, u.id}] = u.k
			if strings.HasPrefix(u.lastErr, "acknowledged, refused") {
				refusedBy++
				t.Errorf("update %d: %s", u.k, u.lastErr)
			}
		} else {
			unacked++
			t.Logf("update %d was never acknowledged (%d attempts): %s", u.k, u.attempts, u.lastErr)
		}
	}
	// acceptable: the last acknowledged update of the row, or a later one
	// whose answer never came (it may have been applied).
	acceptable := map[rowKey][]int{}
	for key, k := range lastAcked {
		acceptable[key] = []int{k}
	}
	for _, u := range updates {
		key := rowKey{u.table, u.id}
		if k, ok := lastAcked[key]; ok && !u.acked && u.k > k {
			acceptable[key] = append(acceptable[key], u.k)
		}
	}
	keys := make([]rowKey, 0, len(acceptable))
	for key := range acceptable {
		keys = append(keys, key)
	}
	sort.Slice(keys, func(i, j int) bool {
		return keys[i].table < keys[j].table || keys[i].table == keys[j].table && keys[i].id < keys[j].id
	})
	// describe names what a row holds: "original", "update k (acked)"...
	writers := map[rowKey][]*faultUpdate{}
	for _, u := range updates {
		writers[rowKey{u.table, u.id}] = append(writers[rowKey{u.table, u.id}], u)
	}
	describe := func(key rowKey, row []float32) string {
		for _, u := range slices.Backward(writers[key]) {
			if slices.Equal(row, faultRow(u.k, dim)) {
				return fmt.Sprintf("update %d (%s)", u.k, map[bool]string{true: "acknowledged", false: "not acknowledged"}[u.acked])
			}
		}
		if slices.Equal(row, ref.Tables[key.table][key.id*int64(dim):(key.id+1)*int64(dim)]) {
			return "the original row"
		}
		return fmt.Sprintf("an unknown row %v", row)
	}

	// Settle: every worker registered and holding the same update.
	settled := false
	var seqs []int64
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		ws, err := reg.List(context.Background(), &prismv1.ListRequest{})
		if err != nil {
			continue
		}
		seqs = seqs[:0]
		for _, w := range ws.GetWorkers() {
			if w.GetRole() == prismv1.Role_ROLE_EMBEDDING {
				seqs = append(seqs, w.GetUpdateSeq()[cfg.Name])
			}
		}
		if len(seqs) == 2 && seqs[0] == seqs[1] {
			settled = true
			break
		}
	}
	t.Logf("settle: embedding workers announce updates %v (settled: %v)", seqs, settled)

	// Check 1, through Recommend: one candidate per updated row (the
	// other updated tables read rows the stream never touches), scored
	// against the float64 reference with each acceptable row.
	checkBatch, _ := src.Next(len(keys))
	for c, key := range keys {
		for tb := range faultTables {
			checkBatch.Columns[1+tb].I64[c] = int64(faultIDs) + int64(c)%50
		}
		checkBatch.Columns[1+key.table].I64[c] = key.id
	}
	checkReq := toRequest(cfg.Name, checkBatch, nil)
	refWith := func(c int, key rowKey, row []float32) float64 {
		m := *ref
		m.Tables = slices.Clone(ref.Tables)
		m.Tables[key.table] = slices.Clone(ref.Tables[key.table])
		copy(m.Tables[key.table][key.id*int64(dim):], row)
		s, err := m.Reference(checkBatch.Slice(c, c+1))
		if err != nil {
			t.Fatal(err)
		}
		return s[0]
	}
	want := make([][]float64, len(keys)) // per candidate, per acceptable row
	for c, key := range keys {
		for _, k := range acceptable[key] {
			want[c] = append(want[c], refWith(c, key, faultRow(k, dim)))
		}
	}
	const tol = 1e-4
	// How sharp the check is: the rows whose expected score differs by
	// more than tol from the score with any other value the row had.
	sharp := 0
	for c, key := range keys {
		others := [][]float32{ref.Tables[key.table][key.id*int64(dim) : (key.id+1)*int64(dim)]}
		for _, u := range writers[key] {
			if !slices.Contains(acceptable[key], u.k) {
				others = append(others, faultRow(u.k, dim))
			}
		}
		if !slices.ContainsFunc(others, func(row []float32) bool { return math.Abs(refWith(c, key, row)-want[c][0]) <= tol }) {
			sharp++
		}
	}
	t.Logf("the Recommend check tells %d of %d rows apart from every other value they had (the store check: all)", sharp, len(keys))
	stale := map[rowKey]string{} // rows some Recommend served without their last acknowledged update
	recommendCheck := func(label string) (answered bool) {
		var resp *prismv1.RecommendResponse
		var err error
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			ctx, cancel := context.WithTimeout(context.Background(), faultRecDeadline)
			resp, err = rec.Recommend(ctx, checkReq)
			cancel()
			if err == nil {
				break
			}
		}
		if err != nil {
			t.Logf("check %s: no answer (%v): no worker serves the model", label, err)
			return false
		}
		bad := 0
		for c, key := range keys {
			got := float64(resp.GetScores()[c])
			if slices.ContainsFunc(want[c], func(w float64) bool { return math.Abs(got-w) <= tol }) {
				continue
			}
			bad++
			// Which row did it read? Try every value the row ever had.
			what := "no value the row ever had"
			cands := [][]float32{ref.Tables[key.table][key.id*int64(dim) : (key.id+1)*int64(dim)]}
			names := []string{"the original row"}
			for _, u := range writers[key] {
				cands = append(cands, faultRow(u.k, dim))
				names = append(names, fmt.Sprintf("update %d (acknowledged: %v)", u.k, u.acked))
			}
			for i, row := range cands {
				if math.Abs(got-refWith(c, key, row)) <= tol {
					what = names[i]
				}
			}
			stale[key] = fmt.Sprintf("%s: table %d row %d scored %.6f, as if it held %s; its last acknowledged update is %d (want %.6f)", label, key.table, key.id, got, what, lastAcked[key], want[c][0])
		}
		t.Logf("check %s: %d rows through Recommend, %d stale", label, len(keys), bad)
		return true
	}
	// With both workers up and caught up, the model is served: a check
	// that never got an answer would have checked nothing.
	answered := 0
	for i := range 3 {
		if recommendCheck(fmt.Sprintf("both workers #%d", i+1)) {
			answered++
		}
	}
	if answered == 0 {
		t.Error("no Recommend was answered with both embedding workers up: the Recommend check checked nothing")
	}
	// Each embedding worker alone: the other leaves (SIGTERM), comes back.
	for i := range emb {
		other := emb[1-i]
		other.stop()
		if err := registered(10 * time.Second); err != nil {
			t.Error(err)
		}
		recommendCheck(emb[i].name + " alone")
		other.start(t)
		if err := registered(10 * time.Second); err != nil {
			t.Error(err)
		}
	}

	// Check 2, in the stores: stop the workers and read every updated row.
	for _, m := range emb {
		m.stop()
	}
	behind := map[string]int{}
	holders := map[rowKey]int{}
	storeMsgs := map[rowKey][]string{}
	for _, m := range emb {
		db := m.args()[slices.Index(m.args(), "--db")+1]
		s, err := store.Open(db, &store.Options{ReadOnly: true, HotBytes: -1})
		if err != nil {
			t.Fatalf("open %s's store: %v", m.name, err)
		}
		seq, err := s.AppliedSeq(cfg.Name)
		if err != nil {
			t.Error(err)
		}
		for _, key := range keys {
			out := make([]float32, dim)
			if err := s.Lookup(cfg.Name, []store.TableLookup{{Table: models.TableName(key.table), IDs: []int64{key.id}, Pooling: store.PoolNone, Out: out}}); err != nil {
				t.Fatalf("%s's store: %v", m.name, err)
			}
			if slices.ContainsFunc(acceptable[key], func(k int) bool { return slices.Equal(out, faultRow(k, dim)) }) {
				holders[key]++
				continue
			}
			behind[m.name]++
			storeMsgs[key] = append(storeMsgs[key], fmt.Sprintf("%s holds %s", m.name, describe(key, out)))
		}
		s.Close()
		t.Logf("%s's store holds update %d; %d of %d updated rows lack their last acknowledged update", m.name, seq, behind[m.name], len(keys))
	}
	lost, behindRows := 0, 0
	for _, key := range keys {
		_, isStale := stale[key]
		if holders[key] == 0 || isStale {
			lost++
			t.Errorf("LOST: table %d row %d, last acknowledged update %d: stores: %v; Recommend: %s", key.table, key.id, lastAcked[key], storeMsgs[key], stale[key])
		} else if len(storeMsgs[key]) > 0 {
			if behindRows++; behindRows > 5 {
				continue
			}
			t.Logf("behind: table %d row %d, last acknowledged update %d: %v (another store holds it and Recommend never served the old row)", key.table, key.id, lastAcked[key], storeMsgs[key])
		}
	}
	if behindRows > 5 {
		t.Logf("behind: %d more rows", behindRows-5)
	}
	behindStores := 0
	for range behind {
		behindStores++
	}

	stats.mu.Lock()
	defer stats.mu.Unlock()
	var errParts []string
	for c, n := range stats.errs {
		errParts = append(errParts, fmt.Sprintf("%v %d", c, n))
	}
	sort.Strings(errParts)
	for c, msg := range stats.example {
		t.Logf("Recommend %v, e.g.: %s", c, msg)
	}
	t.Logf("fault campaign results (seed %d, %d rounds, router update log %s):\n"+
		"| faults (router / embedding / dense) | updates acknowledged | not acknowledged | rows checked | updates lost | stores behind | Recommend sent | OK | errors | hung | campaign | total |\n"+
		"|---|---|---|---|---|---|---|---|---|---|---|---|\n"+
		"| %d (%d / %d / %d) | %d | %d | %d | %d | %d | %d | %d | %d (%s) | %d | %.1f s | %.1f s |",
		seed, rounds, map[bool]string{true: "persisted", false: "in memory"}[logDir != nil],
		faults["router"]+faults["embedding"]+faults["dense"], faults["router"], faults["embedding"], faults["dense"],
		acked, unacked, len(keys), lost, behindStores, stats.sent, stats.ok, stats.sent-stats.ok-stats.hung, strings.Join(errParts, ", "), stats.hung,
		campaign.Seconds(), time.Since(began).Seconds())
	if stats.hung > 0 {
		t.Errorf("%d accepted Recommend requests hung past their %v deadline: %v", stats.hung, faultRecDeadline, stats.hungMsg)
	}
	if acked == 0 || stats.ok == 0 {
		t.Errorf("the campaign did no work: %d updates acknowledged, %d requests answered", acked, stats.ok)
	}
	if lost > 0 {
		t.Errorf("%d acknowledged updates lost (replay: PRISM_FAULTS_SEED=%d)", lost, seed)
	}
	// With the update log in memory, a router restarted while an embedding
	// worker was down cannot catch that worker up (README, Online
	// updates): its store stays behind, and if the quorum counts it,
	// updates are refused until it gets a copy of an up-to-date store.
	// With the log persisted, neither may happen.
	if logDir != nil && behindStores > 0 {
		t.Errorf("%d stores lack acknowledged updates after the settle period although the router persists its update log", behindStores)
	}
	if logDir != nil && unacked > 0 {
		t.Errorf("%d updates were never acknowledged within %v of retries although the router persists its update log", unacked, faultUpdGiveUp)
	}

	// The two kinds of folder are told apart: a router given a worker's
	// store as its update log, and a worker given the router's log as its
	// store, refuse to start (both used to start, each with an empty log
	// or store, writing beside the other's keys).
	if logDir != nil {
		router.stop()
		refused := func(want string, args ...string) {
			t.Helper()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			out, err := exec.CommandContext(ctx, prismBin, args...).CombinedOutput()
			if err == nil || ctx.Err() != nil || !strings.Contains(string(out), want) {
				t.Errorf("prism %s: %v, want it refused with %q:\n%s", strings.Join(args, " "), err, want, out)
			}
		}
		storeDir := emb[0].args()[slices.Index(emb[0].args(), "--db")+1]
		refused("holds an embedding store", "serve", "router", "--certs", certs, "--addr", "127.0.0.1:0", "--update-log-dir", storeDir)
		refused("holds a router's update log", "serve", "embedding", "--certs", certs, "--plan", part, "--db", logDir[1], "--router", routerAddr)
	}
}
