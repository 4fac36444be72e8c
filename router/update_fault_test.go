package router

import (
	"context"
	"log/slog"
	"maps"
	"strings"
	"testing"
	"testing/synctest"
	"time"

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
