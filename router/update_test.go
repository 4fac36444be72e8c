package router

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
)

// These tests drive the Updater and its driver over in-process gRPC
// workers; the rules themselves are tested event by event in
// TestSequencer (testdata/sequencer).

// seqCN is an embedding worker with a one-table store that applies
// sequenced updates as cpuserve's store does: seq only after seq-1, older
// ones acknowledged again (but AlreadyExists when sent fresh, as
// cpuserve's server answers), table "bad" refused but taking its seq.
type seqCN struct {
	fakeCN
	mu   sync.Mutex
	seq  int64
	rows map[int64]float32
	down bool
	// gate, when set, holds every Update until it is closed; entered
	// hears of each Update held.
	gate, entered chan struct{}
	// order records the seqs applied, in order; values the rows
	// written, in order.
	order  []int64
	values []float32
	// tableRows, when set, is the table's rows: an update with an id
	// beyond is refused as bad input (taking its seq, writing nothing),
	// as cpuserve's store refuses it.
	tableRows int64
	// refuse: every table is refused as bad input (taking its seq).
	refuse bool
	// fence: a worker of this release, which keeps the highest election
	// epoch it heard of (an update's, an announcement's answer: heard)
	// and refuses the updates of a lower one of the same Lease, writing
	// nothing and taking no number (cpuserve's store.StaleEpochError).
	// Unset: a worker of an earlier release, which reads no epoch.
	fence bool
	epoch uint64
	// stranded is what the latest answer to its announcement said of
	// its models stranded (AnnounceResponse.stranded).
	stranded []string
	// marks are the diverged marks its store recorded from the answers
	// to its announcements (AnnounceResponse.diverged), announced back
	// (WorkerInfo.diverged), as a worker of this release does.
	marks map[string]int64
}

// told is the worker taking the diverged marks of an answer to its
// announcement (store.MarkDiverged: the first mark of a model stays).
func (f *seqCN) told(marks map[string]int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for m, seq := range marks {
		if _, ok := f.marks[m]; !ok {
			if f.marks == nil {
				f.marks = map[string]int64{}
			}
			f.marks[m] = seq
		}
	}
}

// marked is what the worker announces of its marks.
func (f *seqCN) marked() map[string]int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return maps.Clone(f.marks)
}

// heard is the worker hearing of election epoch (an answer to its
// announcement).
func (f *seqCN) heard(epoch uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fence && prismv1.EpochRaises(f.epoch, epoch) {
		f.epoch = epoch
	}
}

func (f *seqCN) Update(_ context.Context, req *prismv1.ApplyUpdateRequest) (*prismv1.UpdateResponse, error) {
	f.mu.Lock()
	gate, entered := f.gate, f.entered
	f.mu.Unlock()
	if gate != nil {
		entered <- struct{}{}
		<-gate
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.down {
		return nil, status.Error(codes.Unavailable, "down")
	}
	seq := req.GetSeq()
	if f.fence && seq > 0 {
		if prismv1.EpochStale(f.epoch, req.GetEpoch()) {
			return nil, prismv1.StaleEpochError(req.GetUpdate().GetModel(), seq, req.GetEpoch(), f.epoch)
		}
		if prismv1.EpochRaises(f.epoch, req.GetEpoch()) {
			f.epoch = req.GetEpoch()
		}
	}
	switch {
	case seq <= f.seq && req.GetFresh():
		return nil, status.Errorf(codes.AlreadyExists, "holds %d already", f.seq)
	case seq <= f.seq:
		return &prismv1.UpdateResponse{Workers: 1}, nil
	case seq > f.seq+1:
		return nil, status.Errorf(codes.FailedPrecondition, "needs %d", f.seq+1)
	}
	f.seq = seq
	if req.GetUpdate().GetTable() == "bad" || f.refuse {
		return nil, status.Error(codes.InvalidArgument, "unknown table")
	}
	if i := slices.IndexFunc(req.GetUpdate().GetIds(), func(id int64) bool { return f.tableRows > 0 && id >= f.tableRows }); i >= 0 {
		return nil, status.Errorf(codes.InvalidArgument, "ids[%d]=%d, table has %d rows", i, req.GetUpdate().GetIds()[i], f.tableRows)
	}
	if f.rows == nil {
		f.rows = map[int64]float32{}
	}
	for i, id := range req.GetUpdate().GetIds() {
		f.rows[id] = math.Float32frombits(binary.LittleEndian.Uint32(req.GetUpdate().GetRows()[4*i:]))
		f.values = append(f.values, f.rows[id])
	}
	f.order = append(f.order, seq)
	return &prismv1.UpdateResponse{Workers: 1}, nil
}

func (f *seqCN) held() int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.seq
}

func (f *seqCN) row(id int64) float32 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.rows[id]
}

func (f *seqCN) setDown(down bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.down = down
}

// updateRig: a router with embedding workers that announce what they
// hold, as their heartbeats would. The router's clock runs skew ahead of
// the wall clock (deadlines stay wall-clock), so a test moves it past
// the start-up wait without waiting.
type updateRig struct {
	t    *testing.T
	r    *Router
	cns  []*seqCN
	addr []string
	skew atomic.Int64
	logs lockedBuffer
}

// newUpdateRig is a router past its start-up wait (it has its own test).
func newUpdateRig(t *testing.T, o Options, cns ...*seqCN) *updateRig {
	rig := newStartingRig(t, o, cns...)
	rig.settle()
	return rig
}

// newStartingRig is a router that has just started.
func newStartingRig(t *testing.T, o Options, cns ...*seqCN) *updateRig {
	rig := &updateRig{t: t}
	o.now = func() time.Time { return time.Now().Add(time.Duration(rig.skew.Load())) }
	o.Logger = slog.New(slog.NewTextHandler(&rig.logs, nil))
	rig.r = testRouter(o)
	rig.r.Reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: &prismv1.WorkerInfo{Id: "gpu", Role: prismv1.Role_ROLE_DENSE, Addr: "dense:a", Models: []string{"m"}, Healthy: true}})
	for _, f := range cns {
		rig.add(f)
	}
	return rig
}

// settle moves the router's clock three heartbeats on: every worker has
// had time to announce.
func (rig *updateRig) settle() {
	rig.skew.Add(int64(3*rig.r.opts.Heartbeat) + 1)
}

// add starts a worker and announces it.
func (rig *updateRig) add(f *seqCN) {
	f.tag = float32(1000 * (len(rig.cns) + 1))
	rig.cns = append(rig.cns, f)
	rig.addr = append(rig.addr, startCN(rig.t, f))
	rig.announce()
}

func (rig *updateRig) announce() {
	for i, f := range rig.cns {
		resp, err := rig.r.Reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: &prismv1.WorkerInfo{
			Id: "cpu" + rig.addr[i], Role: prismv1.Role_ROLE_EMBEDDING, Addr: rig.addr[i], Models: []string{"m"}, Healthy: true,
			UpdateSeq: map[string]int64{"m": f.held()}, Diverged: f.marked(),
		}})
		if err == nil {
			f.told(resp.GetDiverged())
			f.mu.Lock()
			f.stranded = resp.GetStranded()
			f.mu.Unlock()
		}
	}
}

// tick is one heartbeat: the workers announce, the router's heartbeat
// runs, and its catch-up calls are waited out.
func (rig *updateRig) tick() {
	rig.announce()
	rig.r.upd.tick(context.Background())
	rig.r.upd.wait()
}

func (rig *updateRig) update(table string, id int64, v float32) (*prismv1.UpdateResponse, error) {
	return rig.updateCtx(context.Background(), table, id, v)
}

func (rig *updateRig) updateCtx(ctx context.Context, table string, id int64, v float32) (*prismv1.UpdateResponse, error) {
	rows := binary.LittleEndian.AppendUint32(nil, math.Float32bits(v))
	return rig.r.Updater().Update(ctx, &prismv1.UpdateRequest{Model: "m", Table: table, Ids: []int64{id}, Rows: rows})
}

// servers returns which workers (by index) the router would send a
// lookup to: each worker is asked for alone, the others excluded.
func (rig *updateRig) servers() map[int]bool {
	got := map[int]bool{}
	for i := range rig.cns {
		var others []string
		for j := range rig.cns {
			if j != i {
				others = append(others, "cpu"+rig.addr[j])
			}
		}
		if _, release, err := rig.r.Reg.Pick(prismv1.Role_ROLE_EMBEDDING, "m", 1, others); err == nil {
			release()
			got[i] = true
		}
	}
	return got
}

// lockedBuffer is a log sink safe for the router's goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) count(s string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Count(l.b.String(), s)
}

func TestUpdatesCatchUpLaggingWorker(t *testing.T) {
	a, b := &seqCN{}, &seqCN{}
	rig := newUpdateRig(t, Options{UpdateQuorum: QuorumOne}, a, b)
	if r, err := rig.update("t", 1, 10); err != nil || r.GetWorkers() != 2 {
		t.Fatalf("update 1: %v %v", r, err)
	}
	// b goes down: the update is acknowledged (a holds it) and b stops
	// serving until it has it.
	b.setDown(true)
	if r, err := rig.update("t", 1, 20); err != nil || r.GetWorkers() != 1 {
		t.Fatalf("update 2 with a worker down: %v %v", r, err)
	}
	if got := rig.servers(); got[1] || !got[0] {
		t.Fatalf("lookups went to %v: the worker lacking update 2 served", got)
	}
	// A heartbeat while b is still down: nothing to do but wait.
	rig.tick()
	if b.held() != 1 {
		t.Fatalf("b holds %d", b.held())
	}
	b.setDown(false)
	rig.tick()
	if b.held() != 2 || b.row(1) != 20 {
		t.Fatalf("after catch-up b holds %d, row %v", b.held(), b.row(1))
	}
	if got := rig.servers(); !got[0] || !got[1] {
		t.Fatalf("lookups went to %v: the caught-up worker does not serve again", got)
	}
	// Bad input: refused with its status, the seq taken everywhere, and
	// the next update goes through on both.
	if _, err := rig.update("bad", 1, 0); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("bad table: %v", err)
	}
	if r, err := rig.update("t", 2, 5); err != nil || r.GetWorkers() != 2 {
		t.Fatalf("update after a bad one: %v %v", r, err)
	}
	if a.held() != 4 || b.held() != 4 {
		t.Fatalf("seqs held: %d %d", a.held(), b.held())
	}
	// Checks that need no worker: ragged rows, an update too big to
	// send, a model nobody serves.
	u := rig.r.Updater()
	if _, err := u.Update(context.Background(), &prismv1.UpdateRequest{Model: "m", Table: "t", Ids: []int64{1}, Rows: []byte{1, 2, 3}}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("ragged rows: %v", err)
	}
	if _, err := u.Update(context.Background(), &prismv1.UpdateRequest{Model: "m", Table: "t", Ids: []int64{1}, Rows: make([]byte, maxUpdateBytes)}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("oversize update: %v", err)
	}
	if _, err := u.Update(context.Background(), &prismv1.UpdateRequest{Model: "nope", Table: "t", Ids: []int64{1}, Rows: make([]byte, 4)}); status.Code(err) != codes.NotFound {
		t.Fatalf("unknown model: %v", err)
	}
	if a.held() != 4 || b.held() != 4 {
		t.Fatalf("a refused update took a number: %d %d", a.held(), b.held())
	}
}

// Concurrent updates of one row land in one order on every worker.
func TestUpdatesOneOrder(t *testing.T) {
	a, b, c := &seqCN{}, &seqCN{}, &seqCN{}
	rig := newUpdateRig(t, Options{}, a, b, c)
	var wg sync.WaitGroup
	for i := range 40 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := rig.update("t", 7, float32(i)); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	// Concurrent updates waiting their turn are merged (group commit):
	// fewer numbers than updates, but every worker applied every row
	// once, in the same order, numbers in order, and holds the last.
	a.mu.Lock()
	want := slices.Clone(a.values)
	a.mu.Unlock()
	if sorted := slices.Sorted(slices.Values(want)); len(sorted) != 40 || sorted[0] != 0 || sorted[39] != 39 || slices.Compact(sorted)[39] != 39 {
		t.Fatalf("worker 0 wrote rows %v, want each of 0..39 once", want)
	}
	for i, f := range []*seqCN{a, b, c} {
		f.mu.Lock()
		order, values := f.order, f.values
		f.mu.Unlock()
		if f.held() != int64(len(order)) || len(order) == 0 || len(order) > 40 || !slices.Equal(values, want) || f.row(7) != want[39] {
			t.Fatalf("worker %d: holds %d, %d applied, rows %v, row %v (worker 0: %v)", i, f.held(), len(order), values, f.row(7), want)
		}
		for j, s := range order {
			if s != int64(j+1) {
				t.Fatalf("worker %d applied seq %d as its %dth", i, s, j)
			}
		}
	}
	t.Logf("40 updates in %d numbered ones", a.held())
}

// TestUpdatesGroupCommit: updates waiting behind the one in flight are
// merged into one numbered update (one synced write per worker), each
// client answered as for its own update; one with a bad id among them
// is refused alone, the others applied.
func TestUpdatesGroupCommit(t *testing.T) {
	gate, entered := make(chan struct{}), make(chan struct{}, 1)
	a, b := &seqCN{gate: gate, entered: entered, tableRows: 100}, &seqCN{tableRows: 100}
	rig := newUpdateRig(t, Options{}, a, b)
	type result struct {
		i    int
		resp *prismv1.UpdateResponse
		err  error
	}
	// round holds the model's turn with an update a has not answered,
	// queues the updates of ids (value 10+i for the i-th), then lets a
	// answer, and returns the clients' answers, in the order of ids.
	round := func(first int64, ids []int64) []result {
		t.Helper()
		firstDone := make(chan error, 1)
		go func() { _, err := rig.update("t", first, -1); firstDone <- err }()
		<-entered
		a.mu.Lock()
		a.gate = nil // the next ones go through
		a.mu.Unlock()
		results := make(chan result, len(ids))
		for i, id := range ids {
			go func() {
				resp, err := rig.update("t", id, float32(10+i))
				results <- result{i, resp, err}
			}()
		}
		for queued := false; !queued; time.Sleep(time.Millisecond) {
			rig.r.upd.mu.Lock()
			queued = len(rig.r.upd.clients) == 1+len(ids)
			rig.r.upd.mu.Unlock()
		}
		close(gate)
		if err := <-firstDone; err != nil {
			t.Fatalf("the update in flight: %v", err)
		}
		out := make([]result, len(ids))
		for range ids {
			r := <-results
			out[r.i] = r
		}
		return out
	}

	// Eight updates behind the first: one number, one apply per worker.
	got := round(1, []int64{10, 11, 12, 13, 14, 15, 16, 17})
	for _, r := range got {
		if r.err != nil || r.resp.GetWorkers() != 2 || r.resp.GetHeld()["m"].GetSeq() != 2 || len(r.resp.GetHeld()["m"].GetWorkers()) != 2 {
			t.Fatalf("client %d: %v, %v; want ok from 2 workers, held as update 2", r.i, r.resp, r.err)
		}
	}
	for i, f := range []*seqCN{a, b} {
		f.mu.Lock()
		order := slices.Clone(f.order)
		f.mu.Unlock()
		if !slices.Equal(order, []int64{1, 2}) {
			t.Fatalf("worker %d applied %v, want [1 2] (nine updates in two writes)", i, order)
		}
		for j := range 8 {
			if v := f.row(int64(10 + j)); v != float32(10+j) {
				t.Fatalf("worker %d: row %d reads %v", i, 10+j, v)
			}
		}
	}

	// One id outside the table: the merged update is refused by every
	// worker (taking update 4); each part goes again alone: the bad one
	// is refused, the others applied.
	gate, entered = make(chan struct{}), make(chan struct{}, 1)
	a.mu.Lock()
	a.gate, a.entered = gate, entered
	a.mu.Unlock()
	got = round(2, []int64{20, 21, 999, 23})
	for _, r := range got {
		switch {
		case r.i == 2:
			if status.Code(r.err) != codes.InvalidArgument || !strings.Contains(r.err.Error(), "999") {
				t.Fatalf("the bad update: %v, want InvalidArgument naming id 999", r.err)
			}
		case r.err != nil || r.resp.GetWorkers() != 2:
			t.Fatalf("client %d merged with a bad update: %v, %v; want ok from 2 workers", r.i, r.resp, r.err)
		}
	}
	for i, f := range []*seqCN{a, b} {
		for j, id := range []int64{20, 21, 23} {
			want := float32(10 + []int{0, 1, 3}[j])
			if v := f.row(id); v != want {
				t.Fatalf("worker %d: row %d reads %v, want %v", i, id, v, want)
			}
		}
		if f.held() != 8 { // 3 the first, 4 the merged one refused, 5-8 the four alone
			t.Fatalf("worker %d holds %d, want 8", i, f.held())
		}
	}
}

// A worker further behind than the router's log (here: the router
// restarted, so the log is empty) stays out of serving; the router
// continues the sequence after the highest seq any worker holds.
func TestUpdatesStaleWorkerAfterRouterRestart(t *testing.T) {
	a, b := &seqCN{seq: 5}, &seqCN{seq: 2}
	rig := newUpdateRig(t, Options{}, a, b)
	rig.tick()
	if got := rig.servers(); got[1] || !got[0] {
		t.Fatalf("lookups went to %v: the stale worker served", got)
	}
	if r, err := rig.update("t", 1, 1); err != nil || r.GetWorkers() != 1 {
		t.Fatalf("update: %v %v", r, err)
	}
	if a.held() != 6 || b.held() != 2 {
		t.Fatalf("seqs: a %d b %d (want 6: continued after 5; b untouched)", a.held(), b.held())
	}
	rig.tick()
	if b.held() != 2 {
		t.Fatalf("b was replayed updates the router never had: %d", b.held())
	}
	if n := rig.logs.count("misses updates the router no longer holds"); n != 1 {
		t.Fatalf("the stale worker was reported %d times over two heartbeats, want once", n)
	}
	// Only the stale worker left: the model is Unavailable, not served stale.
	a.setDown(true)
	rig.r.Reg.Remove("cpu" + rig.addr[0])
	if _, err := rig.r.Recommend(context.Background(), request(1)); status.Code(err) != codes.Unavailable {
		t.Fatalf("only a stale worker left: %v", err)
	}
}

// The log keeps the latest updates within its byte budget (the exact
// span: testdata/sequencer/catchup.txt); a worker behind its start is
// stale, one within it is caught up. A live worker failing its updates
// keeps the log over its budget: it is caught up, not stranded.
func TestUpdateLogBudget(t *testing.T) {
	a, b := &seqCN{}, &seqCN{}
	rig := newUpdateRig(t, Options{UpdateLogBytes: 3200, UpdateQuorum: QuorumOne}, a, b)
	b.setDown(true)
	for i := range 20 {
		if _, err := rig.update("t", int64(i), 1); err != nil {
			t.Fatal(err)
		}
	}
	b.setDown(false)
	rig.tick()
	if b.held() != 20 || !rig.servers()[1] {
		t.Fatalf("a live worker that failed 20 updates holds %d after the catch-up (serving: %v)", b.held(), rig.servers())
	}
	if n := rig.logs.count("update log over its byte budget"); n != 1 {
		t.Fatalf("the log over its budget was reported %d times, want once", n)
	}
	// Away (not live) while the log trims: stale when back.
	rig.r.Reg.Remove("cpu" + rig.addr[1])
	for i := range 20 {
		if _, err := rig.update("t", int64(i), 2); err != nil {
			t.Fatal(err)
		}
	}
	rig.tick()
	if b.held() != 20 {
		t.Fatalf("a worker behind the log's start was replayed to %d", b.held())
	}
	if got := rig.servers(); got[1] {
		t.Fatal("the stale worker served")
	}
	if n := rig.logs.count("misses updates the router no longer holds"); n != 1 {
		t.Fatalf("the stale worker was reported %d times, want once", n)
	}
	// A gauge (and its alert, PrismEmbeddingWorkerStranded) says it
	// will not come back by itself, and Registry/List names it.
	if got := seqGauge(t, rig.r, strandedDesc, "m"); got != 1 {
		t.Fatalf("prism_router_embedding_workers_stranded{model=m} = %v, want 1", got)
	}
	if u, _ := rig.r.describeUpdates(); !slices.Equal(u["m"].GetStranded(), []string{"cpu" + rig.addr[1]}) {
		t.Fatalf("Registry/List's stranded: %v", u["m"].GetStranded())
	}
	// The answer to its announcement tells it (a worker mending itself
	// copies a serving one's store); the worker in sync is told nothing.
	rig.announce()
	if !slices.Equal(b.stranded, []string{"m"}) || a.stranded != nil {
		t.Fatalf("the answers to the announcements said stranded: %v to the stranded worker, %v to the one in sync", b.stranded, a.stranded)
	}
	rig.r.Reg.Remove("cpu" + rig.addr[1])
	rig.r.upd.tick(context.Background()) // a heartbeat with B gone, not announcing
	rig.r.upd.wait()
	if got := seqGauge(t, rig.r, strandedDesc, "m"); got != 0 {
		t.Fatalf("prism_router_embedding_workers_stranded{model=m} = %v after the worker left, want 0", got)
	}
}

// A router that has just started neither numbers updates nor serves a
// model that has had updates until every worker has had time to
// announce: the first to announce may be one that lags.
func TestUpdatesWaitAfterRouterStart(t *testing.T) {
	a, b := &seqCN{seq: 10}, &seqCN{seq: 8}
	rig := newStartingRig(t, Options{}, b) // only the lagging worker has announced
	if _, err := rig.update("t", 1, 1); status.Code(err) != codes.Unavailable {
		t.Fatalf("update right after start: %v", err)
	}
	if got := rig.servers(); len(got) != 0 {
		t.Fatalf("right after start a worker served a model with updates: %v", got)
	}
	// The up-to-date worker announces; the wait ends.
	rig.add(a)
	rig.settle()
	if got := rig.servers(); got[0] || !got[1] {
		t.Fatalf("after the wait lookups go to %v, want only the worker holding update 10", got)
	}
	if r, err := rig.update("t", 1, 1); err != nil || r.GetWorkers() != 1 || a.held() != 11 || b.held() != 8 {
		t.Fatalf("update: %v %v; a holds %d, b %d", r, err, a.held(), b.held())
	}
}

// A number is never handed out where no worker could apply it: not to a
// request whose deadline passed while it waited its turn, and not while
// no live worker holds every earlier update. An update no worker
// acknowledged keeps its number and reaches the workers when they are
// back, and updates resume after it, however small the log.
func TestUpdatesNeverStall(t *testing.T) {
	a, b := &seqCN{}, &seqCN{}
	rig := newUpdateRig(t, Options{UpdateLogBytes: 200}, a, b)
	if _, err := rig.update("t", 1, 1); err != nil {
		t.Fatal(err)
	}
	// Update 2 holds the model's turn (a holds it at its worker) while
	// another's deadline passes.
	gate, entered := make(chan struct{}), make(chan struct{}, 1)
	a.mu.Lock()
	a.gate, a.entered = gate, entered
	a.mu.Unlock()
	first := make(chan error, 1)
	go func() { _, err := rig.update("t", 1, 2); first <- err }()
	<-entered
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := rig.updateCtx(ctx, "t", 1, 7); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("waiting past the deadline: %v", err)
	}
	a.mu.Lock()
	a.gate = nil
	a.mu.Unlock()
	close(gate)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	// Had the expired update taken number 3, this one (4) would find
	// every worker behind.
	if r, err := rig.update("t", 1, 3); err != nil || r.GetWorkers() != 2 || a.held() != 3 {
		t.Fatalf("after an expired update: %v %v, a holds %d", r, err, a.held())
	}
	for _, f := range []*seqCN{a, b} {
		f.setDown(true)
	}
	if _, err := rig.update("t", 1, 4); status.Code(err) != codes.Unavailable {
		t.Fatalf("every worker down: %v", err)
	}
	for range 20 { // clients retrying while the workers are down
		if _, err := rig.update("t", 1, 4); status.Code(err) != codes.Unavailable {
			t.Fatalf("retry with every worker down: %v", err)
		}
	}
	for _, f := range []*seqCN{a, b} {
		f.setDown(false)
	}
	rig.tick()
	// Update 4 kept its number and reached both; the retries took none.
	if a.held() != 4 || b.held() != 4 {
		t.Fatalf("after the workers came back: a %d b %d, want 4", a.held(), b.held())
	}
	if r, err := rig.update("t", 1, 5); err != nil || r.GetWorkers() != 2 || a.held() != 5 {
		t.Fatalf("updates did not resume: %v %v", r, err)
	}
}

// TestCancelledWhileQueuedTakesNoNumber: a client whose context ends
// while its update waits for the model's turn is never numbered, even
// when the step that hands out the next number (the last answer of the
// update before it) runs before the client's own cancel step. Numbering
// it would fan it out under a dead context and make every later update
// wait for the catch-up.
func TestCancelledWhileQueuedTakesNoNumber(t *testing.T) {
	start := time.Unix(1000, 0)
	now := start.Add(time.Hour) // long past the start-up wait
	gate := make(chan struct{})
	entered := make(chan int64, 8)
	var mu sync.Mutex
	var sent []int64 // seqs sent to workers, in order
	call := func(ctx context.Context, addr string, req *prismv1.ApplyUpdateRequest) (*prismv1.UpdateResponse, error) {
		mu.Lock()
		sent = append(sent, req.GetSeq())
		mu.Unlock()
		if req.GetSeq() == 1 {
			entered <- req.GetSeq()
			<-gate
		}
		return &prismv1.UpdateResponse{Workers: 1}, ctx.Err()
	}
	d := newUpdateDriver(newSequencer(start, time.Second, 1<<20, 0, QuorumOne), func() time.Time { return now }, slog.New(slog.DiscardHandler), time.Second, 0, call)
	for _, id := range []string{"w1", "w2"} {
		d.announced(&prismv1.WorkerInfo{Id: id, Role: prismv1.Role_ROLE_EMBEDDING, Addr: "addr-" + id, Models: []string{"m"}, Healthy: true})
	}
	req := func(v float32) *prismv1.UpdateRequest {
		return &prismv1.UpdateRequest{Model: "m", Table: "t", Ids: []int64{1}, Rows: binary.LittleEndian.AppendUint32(nil, math.Float32bits(v))}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	aDone := make(chan error, 1)
	go func() { _, err := d.update(ctx, req(1)); aDone <- err }()
	<-entered
	<-entered // update 1 is at both workers

	bctx, bcancel := context.WithCancel(ctx)
	bDone := make(chan error, 1)
	go func() { _, err := d.update(bctx, req(2)); bDone <- err }()
	for queued := false; !queued; {
		d.mu.Lock()
		queued = len(d.clients) == 2
		d.mu.Unlock()
		time.Sleep(time.Millisecond)
	}
	// Hold the driver while update 1 is answered and then B is
	// cancelled: the answers' steps wait on the lock before B's cancel
	// step, so the step that frees the model's turn runs first.
	d.mu.Lock()
	close(gate)
	time.Sleep(20 * time.Millisecond)
	bcancel()
	time.Sleep(20 * time.Millisecond)
	d.mu.Unlock()

	if err := <-aDone; err != nil {
		t.Fatalf("update 1: %v", err)
	}
	if err := <-bDone; status.Code(err) != codes.Canceled {
		t.Fatalf("cancelled update: %v, want Canceled", err)
	}
	if _, err := d.update(ctx, req(3)); err != nil {
		t.Fatalf("the update after a cancelled one: %v", err)
	}
	d.wait()
	mu.Lock()
	defer mu.Unlock()
	if want := []int64{1, 1, 2, 2}; !slices.Equal(sent, want) {
		t.Fatalf("seqs sent %v, want %v (the cancelled update took no number)", sent, want)
	}
}

// TestUpdateRequestChecks: an update the router can tell is bad never
// reaches a worker or takes a number: no model, table or ids, rows that
// are not whole float32 rows per id, a negative id (a shard would name
// no shard for it, and the other shards' number-only answers would make
// up the quorum).
func TestUpdateRequestChecks(t *testing.T) {
	r := New(Options{}, nil)
	t.Cleanup(r.Close)
	u := r.Updater()
	for _, req := range []*prismv1.UpdateRequest{
		{Table: "t", Ids: []int64{1}, Rows: make([]byte, 4)},
		{Model: "m", Ids: []int64{1}, Rows: make([]byte, 4)},
		{Model: "m", Table: "t", Rows: make([]byte, 4)},
		{Model: "m", Table: "t", Ids: []int64{1, 2}, Rows: make([]byte, 12)},
		{Model: "m", Table: "t", Ids: []int64{1, -2}, Rows: make([]byte, 8)},
	} {
		if _, err := u.Update(context.Background(), req); status.Code(err) != codes.InvalidArgument {
			t.Errorf("%v: %v, want InvalidArgument", req, err)
		}
	}
	// A NaN or an infinity in a row: refused before it is numbered (no
	// worker serves m here, so anything past the checks is NotFound).
	for _, v := range []float32{float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1))} {
		rows := make([]byte, 16) // ids 1 and 2, dim 2
		binary.LittleEndian.PutUint32(rows[12:], math.Float32bits(v))
		_, err := u.Update(context.Background(), &prismv1.UpdateRequest{Model: "m", Table: "t", Ids: []int64{1, 2}, Rows: rows})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "id 2 (at 1), column 1") {
			t.Errorf("a row holding %v: %v, want InvalidArgument naming id 2, column 1", v, err)
		}
	}
	if _, err := u.Update(context.Background(), &prismv1.UpdateRequest{Model: "m", Table: "t", Ids: []int64{1}, Rows: make([]byte, 8)}); status.Code(err) != codes.NotFound {
		t.Errorf("finite rows: %v, want past the checks (NotFound: no worker serves m)", err)
	}
}

// A worker killed and restarted in place (prism up's supervisor, a
// container restart) announces under a new id (serve.WorkerID) at the
// same address before its old entry expires. The old entry, still
// claiming what the process held before, is the same process: it must
// not count again towards an update's quorum (two answers from one
// store; and the second, to an update sent fresh, says the number is
// held already, which would leave the restarted worker out as holding
// another history), nor serve lookups with the old claim when the store
// came back from an older snapshot. Found by review.
func TestRestartedWorkerAtSameAddress(t *testing.T) {
	t.Run("quorum", func(t *testing.T) {
		a, b := &seqCN{}, &seqCN{}
		rig := newUpdateRig(t, Options{}, a, b) // majority of two: both
		if _, err := rig.update("t", 1, 10); err != nil {
			t.Fatal(err)
		}
		// The heartbeats from now on: the old process is gone.
		ids := []string{"restarted" + rig.addr[0], "cpu" + rig.addr[1]}
		announce := func() {
			for i, f := range []*seqCN{a, b} {
				rig.r.Reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: &prismv1.WorkerInfo{
					Id: ids[i], Role: prismv1.Role_ROLE_EMBEDDING, Addr: rig.addr[i], Models: []string{"m"}, Healthy: true,
					UpdateSeq: map[string]int64{"m": f.held()},
				}})
			}
		}
		announce()
		b.setDown(true)
		if r, err := rig.update("t", 1, 20); err == nil {
			t.Fatalf("update 2 acknowledged (%d workers) with worker b down: only a's store holds it, counted once per registry entry", r.GetWorkers())
		}
		// Nothing about the restarted worker is amiss: once b is back and
		// caught up, both serve (the restarted one under its new id).
		b.setDown(false)
		announce()
		rig.r.upd.tick(context.Background())
		rig.r.upd.wait()
		announce()
		for _, id := range ids {
			var others []string
			for _, o := range []string{"cpu" + rig.addr[0], "restarted" + rig.addr[0], "cpu" + rig.addr[1]} {
				if o != id {
					others = append(others, o)
				}
			}
			w, release, err := rig.r.Reg.Pick(prismv1.Role_ROLE_EMBEDDING, "m", 1, others)
			if err != nil {
				t.Fatalf("%s does not serve after the catch-up: %v\n%s", id, err, rig.logs.String())
			}
			release()
			if w.GetId() != id {
				t.Fatalf("picked %s, want %s", w.GetId(), id)
			}
		}
	})
	t.Run("older snapshot", func(t *testing.T) {
		a, b := &seqCN{}, &seqCN{}
		rig := newUpdateRig(t, Options{}, a, b)
		for v := range 2 {
			if _, err := rig.update("t", 1, float32(10+v)); err != nil {
				t.Fatal(err)
			}
		}
		// a comes back from a copy of its store taken before the updates.
		a.mu.Lock()
		a.seq, a.rows, a.order = 0, nil, nil
		a.mu.Unlock()
		rig.r.Reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: &prismv1.WorkerInfo{
			Id: "restarted" + rig.addr[0], Role: prismv1.Role_ROLE_EMBEDDING, Addr: rig.addr[0], Models: []string{"m"}, Healthy: true,
			UpdateSeq: map[string]int64{"m": 0},
		}})
		for range 4 {
			w, release, err := rig.r.Reg.Pick(prismv1.Role_ROLE_EMBEDDING, "m", 1, []string{"cpu" + rig.addr[1]})
			if err != nil {
				break
			}
			release()
			if w.GetAddr() == rig.addr[0] {
				t.Fatalf("lookup sent to %s (as %s, claiming update 2): the process there holds none of the updates", w.GetAddr(), w.GetId())
			}
		}
	})
}

// TestUnreachableWorkerLogBounded: an embedding worker that keeps
// announcing but fails every update sent to it (an --advertise-addr
// the router cannot reach, say) is named in the router's log once per
// window, not once per update: measured, a stream of 32,259 updates in
// 90 s wrote 32,262 such lines (11 MB) to the log of a router whose one
// worker of two was unreachable.
func TestUnreachableWorkerLogBounded(t *testing.T) {
	const updates = 200
	a, b := &seqCN{}, &seqCN{}
	rig := newUpdateRig(t, Options{UpdateQuorum: QuorumOne}, a, b)
	b.setDown(true)
	for i := range updates {
		if _, err := rig.update("t", int64(i%8), float32(i)); err != nil {
			t.Fatal(err)
		}
		if i%50 == 0 {
			rig.tick() // heartbeats: b announces, and its catch-up fails too
		}
	}
	for _, what := range []string{"update failed on an embedding worker", "replaying an update to an embedding worker failed"} {
		if n := rig.logs.count(what); n < 1 || n > 2 {
			t.Errorf("%q logged %d times for a worker that failed %d updates, want once (more in one summary a window later)", what, n, updates)
		}
	}
}

// The sequencing router reports its update log's bytes by sequence
// (prism_router_update_log_bytes), within its budget.
func TestUpdateLogBytesMetric(t *testing.T) {
	a := &seqCN{}
	rig := newUpdateRig(t, Options{UpdateLogBytes: 3200, UpdateQuorum: QuorumOne}, a)
	if n := seriesCount(updateLogCollector{rig.r}); n != 0 {
		t.Fatalf("%d series before any update, want none", n)
	}
	for i := range 20 {
		if _, err := rig.update("t", int64(i), 1); err != nil {
			t.Fatal(err)
		}
	}
	ch := make(chan prometheus.Metric, 8)
	updateLogCollector{rig.r}.Collect(ch)
	close(ch)
	var got []string
	for m := range ch {
		var d dto.Metric
		if err := m.Write(&d); err != nil {
			t.Fatal(err)
		}
		v := d.GetGauge().GetValue()
		got = append(got, fmt.Sprintf("%s=%v", d.GetLabel()[0].GetValue(), v))
		if v <= 0 || v > 3200 {
			t.Errorf("update log of %d bytes, want some within the 3200-byte budget", int(v))
		}
	}
	if len(got) != 1 || !strings.HasPrefix(got[0], "m=") {
		t.Fatalf("series %v, want one for model m", got)
	}
}

// TestUpdateQueueBounded: updates taken past what the workers write wait
// in the router's memory; past Options.MaxUpdateQueueBytes the next one
// is refused with ResourceExhausted at once (counted), and once the
// queue drains updates are taken again. One update alone is taken
// whatever its size.
func TestUpdateQueueBounded(t *testing.T) {
	a := &seqCN{}
	// Two one-row updates fit, not three.
	one := queuedBytes(&prismv1.UpdateRequest{Model: "m", Table: "t", Ids: []int64{1}, Rows: make([]byte, 4)})
	rig := newUpdateRig(t, Options{MaxUpdateQueueBytes: 2*one + one/2}, a)
	gate, entered := make(chan struct{}), make(chan struct{}, 1)
	a.mu.Lock()
	a.gate, a.entered = gate, entered
	a.mu.Unlock()
	done := make(chan error, 2)
	go func() { _, err := rig.update("t", 1, 1); done <- err }()
	<-entered // update 1 is at the worker
	go func() { _, err := rig.update("t", 2, 2); done <- err }()
	// Update 2 waits for its turn (the driver holds its client).
	for queued := false; !queued; time.Sleep(time.Millisecond) {
		rig.r.upd.mu.Lock()
		queued = len(rig.r.upd.clients) == 2
		rig.r.upd.mu.Unlock()
	}
	_, err := rig.update("t", 3, 3)
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "--max-update-queue-bytes") {
		t.Fatalf("a third update past the queue's bytes: %v, want ResourceExhausted naming --max-update-queue-bytes", err)
	}
	if n := counterValue(t, rig.r.m.rejected.WithLabelValues("updates")); n != 1 {
		t.Fatalf("prism_router_rejected_total{reason=updates} %v, want 1", n)
	}
	a.mu.Lock()
	a.gate = nil
	a.mu.Unlock()
	close(gate)
	for range 2 {
		if err := <-done; err != nil {
			t.Fatalf("a queued update: %v", err)
		}
	}
	if _, err := rig.update("t", 3, 3); err != nil || rig.r.updateBytes.Load() != 0 {
		t.Fatalf("after the queue drained: %v, %d bytes queued", err, rig.r.updateBytes.Load())
	}
	// Alone, an update over the bound is taken: refused, it would be
	// retried for ever.
	big := &prismv1.UpdateRequest{Model: "m", Table: "t", Ids: make([]int64, 4096), Rows: make([]byte, 4*4096)}
	for i := range big.Ids {
		big.Ids[i] = int64(i)
	}
	if size := queuedBytes(big); size <= rig.r.opts.MaxUpdateQueueBytes {
		t.Fatalf("the big update counts %d bytes, within the bound of %d", size, rig.r.opts.MaxUpdateQueueBytes)
	}
	if _, err := rig.r.Updater().Update(context.Background(), big); err != nil {
		t.Fatalf("one update over the bound alone: %v", err)
	}
}
