package router

import (
	"context"
	"encoding/binary"
	"math"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
)

// seqCN is an embedding worker with a one-table store that applies
// sequenced updates as cpuserve's store does: seq only after seq-1, older
// ones acknowledged again, table "bad" refused but taking its seq.
type seqCN struct {
	fakeCN
	mu   sync.Mutex
	seq  int64
	rows map[int64]float32
	down bool
	// order records the seqs applied, in order.
	order []int64
}

func (f *seqCN) Update(_ context.Context, req *prismv1.ApplyUpdateRequest) (*prismv1.UpdateResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.down {
		return nil, status.Error(codes.Unavailable, "down")
	}
	seq := req.GetSeq()
	switch {
	case seq <= f.seq:
		return &prismv1.UpdateResponse{Workers: 1}, nil
	case seq > f.seq+1:
		return nil, status.Errorf(codes.FailedPrecondition, "needs %d", f.seq+1)
	}
	f.seq = seq
	if req.GetUpdate().GetTable() == "bad" {
		return nil, status.Error(codes.InvalidArgument, "unknown table")
	}
	if f.rows == nil {
		f.rows = map[int64]float32{}
	}
	for i, id := range req.GetUpdate().GetIds() {
		f.rows[id] = math.Float32frombits(binary.LittleEndian.Uint32(req.GetUpdate().GetRows()[4*i:]))
	}
	f.order = append(f.order, seq)
	return &prismv1.UpdateResponse{Workers: 1}, nil
}

func (f *seqCN) held() int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.seq
}

// updateRig: a router with embedding workers that announce what they
// hold, as their heartbeats would.
type updateRig struct {
	t    *testing.T
	r    *Router
	cns  []*seqCN
	addr []string
}

func newUpdateRig(t *testing.T, o Options, cns ...*seqCN) *updateRig {
	rig := &updateRig{t: t, r: New(o, nil), cns: cns}
	rig.r.upd.ready = time.Time{} // as if every worker had announced: the start-up wait has its own test
	for i, f := range cns {
		f.tag = float32(1000 * (i + 1))
		rig.addr = append(rig.addr, startCN(t, f))
	}
	rig.r.Reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: &prismv1.WorkerInfo{Id: "gpu", Role: prismv1.Role_ROLE_DENSE, Addr: "dense:a", Models: []string{"m"}, Healthy: true}})
	rig.announce()
	return rig
}

func (rig *updateRig) announce() {
	for i, f := range rig.cns {
		rig.r.Reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: &prismv1.WorkerInfo{
			Id: "cpu" + rig.addr[i], Role: prismv1.Role_ROLE_EMBEDDING, Addr: rig.addr[i], Models: []string{"m"}, Healthy: true,
			UpdateSeq: map[string]int64{"m": f.held()},
		}})
	}
}

// tick is one heartbeat of the router's catch-up, waited out.
func (rig *updateRig) tick() {
	rig.announce()
	ws, _ := rig.r.Reg.List(context.Background(), nil)
	rig.r.upd.catchUp(context.Background(), ws.GetWorkers())
	deadline := time.Now().Add(5 * time.Second)
	for {
		rig.r.upd.mu.Lock()
		busy := 0
		for _, m := range rig.r.upd.models {
			busy += len(m.catching)
		}
		rig.r.upd.mu.Unlock()
		if busy == 0 {
			return
		}
		if time.Now().After(deadline) {
			rig.t.Fatal("catch-up did not finish")
		}
		time.Sleep(time.Millisecond)
	}
}

func (rig *updateRig) update(table string, id int64, v float32) (*prismv1.UpdateResponse, error) {
	rows := binary.LittleEndian.AppendUint32(nil, math.Float32bits(v))
	return rig.r.Updater().Update(context.Background(), &prismv1.UpdateRequest{Model: "m", Table: table, Ids: []int64{id}, Rows: rows})
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

func TestUpdatesCatchUpLaggingWorker(t *testing.T) {
	a, b := &seqCN{}, &seqCN{}
	rig := newUpdateRig(t, Options{}, a, b)
	if r, err := rig.update("t", 1, 10); err != nil || r.GetWorkers() != 2 {
		t.Fatalf("update 1: %v %v", r, err)
	}
	// b goes down: the update is acknowledged (a holds it) and b stops
	// serving until it has it.
	b.mu.Lock()
	b.down = true
	b.mu.Unlock()
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
	b.mu.Lock()
	b.down = false
	b.mu.Unlock()
	rig.tick()
	if b.held() != 2 || b.rows[1] != 20 {
		t.Fatalf("after catch-up b holds %d, row %v", b.held(), b.rows[1])
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
	// Input checks that need no worker.
	if _, err := rig.r.Updater().Update(context.Background(), &prismv1.UpdateRequest{Model: "m", Table: "t", Ids: []int64{1}, Rows: []byte{1, 2, 3}}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("ragged rows: %v", err)
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
	for i, f := range []*seqCN{a, b, c} {
		if f.held() != 40 || len(f.order) != 40 || f.rows[7] != a.rows[7] {
			t.Fatalf("worker %d: holds %d, %d applied, row %v (worker 0: %v)", i, f.held(), len(f.order), f.rows[7], a.rows[7])
		}
		for j, s := range f.order {
			if s != int64(j+1) {
				t.Fatalf("worker %d applied seq %d as its %dth", i, s, j)
			}
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
	// Only the stale worker left: the model is Unavailable, not served stale.
	a.mu.Lock()
	a.down = true
	a.mu.Unlock()
	rig.r.Reg.Remove("cpu" + rig.addr[0])
	if _, err := rig.r.Recommend(context.Background(), request(1)); status.Code(err) != codes.Unavailable {
		t.Fatalf("only a stale worker left: %v", err)
	}
}

// The log keeps the latest updates within its byte budget; a worker
// behind its start is stale, one within it is caught up.
func TestUpdateLogBudget(t *testing.T) {
	a, b := &seqCN{}, &seqCN{}
	rig := newUpdateRig(t, Options{UpdateLogBytes: 200}, a, b)
	b.mu.Lock()
	b.down = true
	b.mu.Unlock()
	for i := range 20 {
		if _, err := rig.update("t", int64(i), 1); err != nil {
			t.Fatal(err)
		}
	}
	rig.r.upd.mu.Lock()
	m := rig.r.upd.models["m"]
	floor, n := m.floor, len(m.log)
	rig.r.upd.mu.Unlock()
	if floor == 0 || n == 0 || floor+int64(n) != 20 {
		t.Fatalf("log holds %d from %d", n, floor+1)
	}
	b.mu.Lock()
	b.down = false
	b.mu.Unlock()
	rig.tick()
	if b.held() != 0 {
		t.Fatalf("a worker behind the log's start was replayed to %d", b.held())
	}
	if got := rig.servers(); got[1] {
		t.Fatal("the stale worker served")
	}
}

// A router that has just started neither numbers updates nor serves a
// model that has had updates until every worker has had time to
// announce: the first to announce may be one that lags.
func TestUpdatesWaitAfterRouterStart(t *testing.T) {
	a, b := &seqCN{seq: 10}, &seqCN{seq: 8}
	rig := newUpdateRig(t, Options{}, b) // only the lagging worker has announced
	rig.r.upd.ready = time.Now().Add(time.Hour)
	if _, err := rig.update("t", 1, 1); status.Code(err) != codes.Unavailable {
		t.Fatalf("update right after start: %v", err)
	}
	if got := rig.servers(); len(got) != 0 {
		t.Fatalf("right after start a worker served a model with updates: %v", got)
	}
	// The up-to-date worker announces; the wait ends.
	rig.cns = append(rig.cns, a)
	a.tag = 2000
	rig.addr = append(rig.addr, startCN(t, a))
	rig.announce()
	rig.r.upd.ready = time.Time{}
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
	m := rig.r.upd.models["m"]
	m.fanout <- struct{}{} // another update's turn
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	rows := binary.LittleEndian.AppendUint32(nil, 7)
	if _, err := rig.r.Updater().Update(ctx, &prismv1.UpdateRequest{Model: "m", Table: "t", Ids: []int64{1}, Rows: rows}); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("waiting past the deadline: %v", err)
	}
	<-m.fanout
	if m.next != 1 {
		t.Fatalf("an update that never ran took number %d", m.next)
	}
	for _, f := range []*seqCN{a, b} {
		f.mu.Lock()
		f.down = true
		f.mu.Unlock()
	}
	if _, err := rig.update("t", 1, 2); status.Code(err) != codes.Unavailable {
		t.Fatalf("every worker down: %v", err)
	}
	for range 20 { // clients retrying while the workers are down
		if _, err := rig.update("t", 1, 2); status.Code(err) != codes.Unavailable {
			t.Fatalf("retry with every worker down: %v", err)
		}
	}
	if m.next != 2 {
		t.Fatalf("retries took numbers: next %d, want 2", m.next)
	}
	for _, f := range []*seqCN{a, b} {
		f.mu.Lock()
		f.down = false
		f.mu.Unlock()
	}
	rig.tick()
	if a.held() != 2 || b.held() != 2 {
		t.Fatalf("after the workers came back: a %d b %d, want 2", a.held(), b.held())
	}
	if r, err := rig.update("t", 1, 3); err != nil || r.GetWorkers() != 2 {
		t.Fatalf("updates did not resume: %v %v", r, err)
	}
}
