package router

import (
	"context"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
)

// A worker (or anyone) announcing a huge update_seq after the startup
// window must not renumber the model and leave the real workers behind.
func TestHugeAnnouncedSeqKeepsNumbering(t *testing.T) {
	a, b := &seqCN{}, &seqCN{}
	rig := newUpdateRig(t, Options{}, a, b)
	if r, err := rig.update("t", 1, 10); err != nil || r.GetWorkers() != 2 {
		t.Fatalf("update 1: %v %v", r, err)
	}
	rig.r.Reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: &prismv1.WorkerInfo{
		Id: "evil", Role: prismv1.Role_ROLE_EMBEDDING, Addr: "evil:1", Models: []string{"m"}, Healthy: true,
		UpdateSeq: map[string]int64{"m": 1 << 40},
	}})
	if r, err := rig.update("t", 1, 20); err != nil || r.GetWorkers() != 2 {
		t.Fatalf("update after the huge seq: %v %v (the real workers were left behind)", r, err)
	}
	if a.held() != 2 || b.held() != 2 {
		t.Fatalf("seqs held: %d %d, want 2", a.held(), b.held())
	}
	if got := rig.servers(); !got[0] || !got[1] {
		t.Fatalf("serving %v: the real workers must serve", got)
	}
	if _, _, err := rig.r.Reg.Pick(prismv1.Role_ROLE_EMBEDDING, "m", 1, []string{"cpu" + rig.addr[0], "cpu" + rig.addr[1]}); err == nil {
		t.Fatal("the worker claiming foreign updates serves lookups")
	}
}

// A hung worker is left behind after the per-worker timeout; the update
// is answered without it, well before the caller's deadline, and the
// next update does not wait for it either.
//
// It runs in a synctest bubble: the 100 ms per-worker timeout is fake
// time, which moves on only once the live worker has answered and the
// hung one alone is waited for: update 1 takes exactly that timeout, and
// update 2, not sent to the hung worker, none. On the wall clock a
// loaded machine could take longer than that to connect to the live
// worker and hear its answer, and the update failed as acknowledged by
// none (1 of 15 runs, 3 copies at once).
func TestHungWorkerLeftBehind(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, b := &seqCN{}, &seqCN{}
		rig := newUpdateRig(t, Options{UpdateWorkerTimeout: 100 * time.Millisecond, UpdateQuorum: QuorumOne}, a, b)
		t.Cleanup(rig.r.Close)
		gate := make(chan struct{})
		b.mu.Lock()
		b.gate, b.entered = gate, make(chan struct{}, 16)
		b.mu.Unlock()
		defer close(gate)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		start := time.Now()
		r, err := rig.updateCtx(ctx, "t", 1, 10)
		if err != nil || r.GetWorkers() != 1 {
			t.Fatalf("update with a hung worker: %v %v", r, err)
		}
		if el := time.Since(start); el != 100*time.Millisecond {
			t.Fatalf("the update took %v of fake time, want the per-worker timeout, 100ms", el)
		}
		if got := rig.servers(); got[1] || !got[0] {
			t.Fatalf("serving %v: the hung worker lacks update 1", got)
		}
		start = time.Now()
		if r, err := rig.updateCtx(ctx, "t", 1, 20); err != nil || r.GetWorkers() != 1 {
			t.Fatalf("update 2: %v %v", r, err)
		}
		if el := time.Since(start); el != 0 || len(b.entered) != 1 {
			t.Fatalf("update 2 took %v of fake time, the slow worker was sent %d updates; want none of its time, and only update 1", el, len(b.entered))
		}
		if !strings.Contains(rig.logs.String(), "did not answer an update in time") {
			t.Fatalf("no log of the slow worker:\n%s", rig.logs.String())
		}
	})
}

// Divergent answers: one worker applies, one refuses as bad input. The
// caller learns which refused, and the refuser leaves serving.
func TestDivergentAnswersReported(t *testing.T) {
	a, b := &seqCN{}, &seqCN{}
	rig := newUpdateRig(t, Options{UpdateQuorum: QuorumOne}, a, b)
	b.mu.Lock()
	b.refuse = true
	b.mu.Unlock()
	r, err := rig.update("t", 1, 10)
	if err != nil || r.GetWorkers() != 1 || len(r.GetRefused()) != 1 || !strings.HasPrefix(r.GetRefused()[0], rig.addr[1]+": ") {
		t.Fatalf("divergent update answered %v, %v; want 1 worker and %s named as refusing", r, err, rig.addr[1])
	}
	if got := rig.servers(); got[1] || !got[0] {
		t.Fatalf("serving %v: the refusing worker's copy differs, it must not serve", got)
	}
	// It never serves again under its id: a gauge (and its alert,
	// PrismEmbeddingWorkerDiverged) says so, where the log alone did.
	if got := divergedGauge(t, rig.r, "m"); got != 1 {
		t.Fatalf("prism_router_embedding_workers_diverged{model=m} = %v, want 1", got)
	}
	rig.r.Reg.Remove("cpu" + rig.addr[1])
	rig.announce()
	if got := divergedGauge(t, rig.r, "m"); got != 0 {
		t.Fatalf("prism_router_embedding_workers_diverged{model=m} = %v after the worker left, want 0", got)
	}
}

// divergedGauge is r's prism_router_embedding_workers_diverged of model
// (0 when the router reports none).
func divergedGauge(t *testing.T, r *Router, model string) float64 {
	return seqGauge(t, r, divergedDesc, model)
}

// seqGauge is r's gauge desc (one of updateLogCollector's) of model
// (0 when the router reports none).
func seqGauge(t *testing.T, r *Router, desc *prometheus.Desc, model string) float64 {
	t.Helper()
	ch := make(chan prometheus.Metric, 16)
	updateLogCollector{r}.Collect(ch)
	close(ch)
	v := 0.0
	for m := range ch {
		if m.Desc() != desc {
			continue
		}
		var pb dto.Metric
		if err := m.Write(&pb); err != nil {
			t.Fatal(err)
		}
		if len(pb.GetLabel()) == 1 && pb.GetLabel()[0].GetValue() == model {
			v = pb.GetGauge().GetValue()
		}
	}
	return v
}

// Issue 14: the refuser's leaving serving outlives the router's memory.
// The answers to its announcements tell it that its copy diverged; its
// store records the mark and it announces it, so it stays out of the
// model's lookups and updates when its registration lapses and it comes
// back (leave dropped what the router knew), and under a restarted
// router (a new one, which never saw the divergent update). Before, it
// served its differing rows again in both cases: its update number
// counts the refused update.
func TestDivergedMarkOutlivesRouter(t *testing.T) {
	a, b := &seqCN{}, &seqCN{}
	rig := newUpdateRig(t, Options{UpdateQuorum: QuorumOne}, a, b)
	t.Cleanup(rig.r.Close)
	b.mu.Lock()
	b.refuse = true
	b.mu.Unlock()
	if r, err := rig.update("t", 1, 10); err != nil || len(r.GetRefused()) != 1 {
		t.Fatalf("divergent update answered %v, %v; want %s named as refusing", r, err, rig.addr[1])
	}
	b.mu.Lock()
	b.refuse = false
	b.mu.Unlock()
	rig.announce() // the answers tell the workers
	if got := b.marked(); !maps.Equal(got, map[string]int64{"m": 1}) {
		t.Fatalf("the refuser was told %v, want m diverged at 1", got)
	}
	if got := a.marked(); got != nil {
		t.Fatalf("the worker that applied it was told %v, want nothing", got)
	}

	// Its registration lapses and it comes back.
	rig.r.Reg.Remove("cpu" + rig.addr[1])
	rig.announce()
	if got := rig.servers(); got[1] || !got[0] {
		t.Fatalf("serving %v after the refuser left and came back: its copy still differs, it must not serve", got)
	}

	// The router restarts: a new one (in memory), the workers announcing.
	re := &updateRig{t: t, cns: rig.cns, addr: rig.addr}
	re.r = testRouter(Options{UpdateQuorum: QuorumOne, Logger: slog.New(slog.NewTextHandler(&re.logs, nil)),
		now: func() time.Time { return time.Now().Add(time.Duration(re.skew.Load())) }})
	t.Cleanup(re.r.Close)
	re.r.Reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: &prismv1.WorkerInfo{Id: "gpu", Role: prismv1.Role_ROLE_DENSE, Addr: "dense:a", Models: []string{"m"}, Healthy: true}})
	re.announce()
	re.settle()
	re.announce()
	if got := re.servers(); got[1] || !got[0] {
		t.Fatalf("serving %v under a restarted router: the refuser's copy still differs, it must not serve", got)
	}
	if r, err := re.update("t", 2, 20); err != nil || r.GetWorkers() != 1 || b.held() != 1 {
		t.Fatalf("update under the restarted router: %v, %v, the refuser holds %d; want it applied by the other worker alone", r, err, b.held())
	}
	if !strings.Contains(re.logs.String(), "records that its copy of the model diverged") {
		t.Fatalf("the restarted router does not say why the worker is left out:\n%s", re.logs.String())
	}
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestDeadlineMidFanOutLeavesNoGap: a client whose deadline passes after
// its update was numbered, while the workers apply it, is answered
// DeadlineExceeded at its deadline, but the fan-out goes on: every
// worker applies the update in its turn, and the next update (and the
// lookups) find them holding it. Cut by the caller's deadline, the
// fan-out left every worker behind, and every update was refused
// Unavailable ("no live embedding worker holds update N yet") until the
// next heartbeat's catch-up.
func TestDeadlineMidFanOutLeavesNoGap(t *testing.T) {
	a, b := &seqCN{}, &seqCN{}
	rig := newUpdateRig(t, Options{Heartbeat: 20 * time.Millisecond, UpdateWorkerTimeout: 10 * time.Second}, a, b)
	t.Cleanup(rig.r.Close)
	gate := make(chan struct{})
	entered := make(chan struct{}, 4)
	for _, f := range []*seqCN{a, b} {
		f.mu.Lock()
		f.gate, f.entered = gate, entered
		f.mu.Unlock()
	}
	// The router's clock runs skew ahead (newUpdateRig): the deadline
	// is 100ms of its time ahead.
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(rig.skew.Load())+100*time.Millisecond)
	defer cancel()
	first := make(chan error, 1)
	go func() { _, err := rig.updateCtx(ctx, "t", 1, 1); first <- err }()
	for range 2 { // update 1 is numbered and at both workers
		select {
		case <-entered:
		case err := <-first:
			t.Fatalf("update answered before reaching the workers: %v", err)
		}
	}
	select {
	case err := <-first:
		if status.Code(err) != codes.DeadlineExceeded {
			t.Errorf("update whose deadline passed at the workers: %v, want DeadlineExceeded", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the client was not answered at its deadline: it waits for the workers")
	}
	for _, f := range []*seqCN{a, b} {
		f.mu.Lock()
		f.gate = nil
		f.mu.Unlock()
	}
	close(gate)
	// No heartbeat in between: the next update finds the workers
	// holding update 1.
	r, err := rig.update("t", 1, 2)
	if err != nil || r.GetWorkers() != 2 {
		t.Fatalf("update right after one whose client's deadline passed mid-fan-out: %v %v", r, err)
	}
	for i, f := range []*seqCN{a, b} {
		f.mu.Lock()
		order := slices.Clone(f.order)
		f.mu.Unlock()
		if !slices.Equal(order, []int64{1, 2}) || f.row(1) != 2 {
			t.Errorf("worker %d applied %v (row 1 = %v), want [1 2] in order (row 1 = 2)", i, order, f.row(1))
		}
	}
	if got := rig.servers(); !got[0] || !got[1] {
		t.Errorf("serving %v, want both workers", got)
	}
	rig.r.upd.wait()
}

// TestFanOutPastDeadlineEndsAtClose: a fan-out that outlives its
// caller's deadline (TestDeadlineMidFanOutLeavesNoGap) is bounded by the
// per-worker timeout, and ends at once when the router closes: no call
// to a hung worker outlives the router.
func TestFanOutPastDeadlineEndsAtClose(t *testing.T) {
	a := &seqCN{}
	rig := newUpdateRig(t, Options{Heartbeat: 20 * time.Millisecond, UpdateWorkerTimeout: time.Minute}, a)
	gate := make(chan struct{})
	defer close(gate)
	a.mu.Lock()
	a.gate, a.entered = gate, make(chan struct{}, 4)
	a.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(rig.skew.Load())+100*time.Millisecond)
	defer cancel()
	if _, err := rig.updateCtx(ctx, "t", 1, 1); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("update at a hung worker past its deadline: %v, want DeadlineExceeded", err)
	}
	rig.r.Close()
	done := make(chan struct{})
	go func() { rig.r.upd.wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the fan-out to a hung worker outlived the router's Close")
	}
}
