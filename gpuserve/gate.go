package gpuserve

import (
	"slices"
	"sync"
	"time"
)

// RunGate orders the runs of the batchers of one dense worker (one per
// model it serves) by deadline across models: each batcher orders its
// own queue earliest deadline first (schedule.go), and the gate decides
// which model's formed batch runs when they compete for the device. At
// most Slots batches run at once, whichever models they are of; a slot
// that frees goes to the waiting batch due first (the earliest deadline
// among its requests still waiting for scores, taken when the slot
// frees), arrival order among equals. A request counts as due at most
// gateHorizon after it arrived, its deadline or not: work with a far
// deadline (or none) does not go ahead of urgent work, and does not wait
// behind it without bound either (a batch arriving later is due later
// than that, so it waits at most about gateHorizon and a run).
//
// Without a gate (one model), a model's batching loops run their batches
// as soon as they form them, as many at once as it has sessions; with
// one, the worker runs at most Slots batches at once in all, the count
// of sessions one model gets, so two models no longer run twice the
// sessions the worker was given (on the CPU, two intra-op pools of every
// core each).
type RunGate struct {
	mu      sync.Mutex
	free    int
	seq     uint64
	waiting []*gateWaiter
}

// gateHorizon is the latest a request is due at the gate, from its
// arrival.
const gateHorizon = time.Second

// NewRunGate returns a gate letting slots batches (at least one) run at
// once.
func NewRunGate(slots int) *RunGate { return &RunGate{free: max(slots, 1)} }

// Acquire waits for a slot for a batch due at due (the earliest deadline
// of its requests) and returns its release, to be called once when the
// run is over.
func (g *RunGate) Acquire(due time.Time) (release func()) {
	return g.acquire(&gateWaiter{due: due})
}

// acquireBatch is Acquire for a formed batch, whose due time is taken
// anew (dueAt) whenever a slot frees: a request that expired or was
// cancelled while the batch waited, and which its run will leave out,
// no longer ranks it.
func (g *RunGate) acquireBatch(batch []*pending) (release func()) {
	return g.acquire(&gateWaiter{batch: batch})
}

func (g *RunGate) acquire(w *gateWaiter) (release func()) {
	g.mu.Lock()
	if g.free > 0 && len(g.waiting) == 0 {
		g.free--
		g.mu.Unlock()
		return g.release
	}
	g.seq++
	w.seq, w.ready = g.seq, make(chan struct{})
	g.waiting = append(g.waiting, w)
	g.mu.Unlock()
	<-w.ready
	return g.release
}

// release hands the slot to the waiting batch due first, or frees it.
// The waiters are few (one per batching loop of the worker's models),
// ranked afresh at each release: their due times change as their
// requests expire.
func (g *RunGate) release() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.waiting) == 0 {
		g.free++
		return
	}
	now := time.Now()
	best, bestDue := 0, g.waiting[0].dueAt(now)
	for i, w := range g.waiting[1:] {
		if d := w.dueAt(now); d.Before(bestDue) || (d.Equal(bestDue) && w.seq < g.waiting[best].seq) {
			best, bestDue = i+1, d
		}
	}
	w := g.waiting[best]
	g.waiting = slices.Delete(g.waiting, best, best+1)
	close(w.ready)
}

// dueAt is when a formed batch is due at the gate as of now: its
// earliest deadline, a request counting as due at most gateHorizon after
// its arrival. The requests that have expired or been cancelled by now
// are left out (now zero: none), as the batch's run leaves them out; a
// batch left with none is due at once (the zero time): its run costs
// nothing and frees the slot.
func dueAt(batch []*pending, now time.Time) time.Time {
	var d time.Time
	for _, p := range batch {
		if !now.IsZero() && (p.ctx.Err() != nil || (!p.deadline.IsZero() && !now.Before(p.deadline))) {
			continue
		}
		t := p.deadline
		if h := p.arrived.Add(gateHorizon); t.IsZero() || t.After(h) {
			t = h
		}
		if d.IsZero() || t.Before(d) {
			d = t
		}
	}
	return d
}

type gateWaiter struct {
	// due is a fixed due time (Acquire); for a batch (acquireBatch), its
	// requests give it (dueAt).
	due   time.Time
	batch []*pending
	seq   uint64
	ready chan struct{}
}

// dueAt is when w is due, as of now.
func (w *gateWaiter) dueAt(now time.Time) time.Time {
	if w.batch == nil {
		return w.due
	}
	return dueAt(w.batch, now)
}
