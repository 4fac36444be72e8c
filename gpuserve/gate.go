package gpuserve

import (
	"container/heap"
	"sync"
	"time"
)

// RunGate orders the runs of the batchers of one dense worker (one per
// model it serves) by deadline across models: each batcher orders its
// own queue earliest deadline first (schedule.go), and the gate decides
// which model's formed batch runs when they compete for the device. At
// most Slots batches run at once, whichever models they are of; a slot
// that frees goes to the waiting batch due first (its earliest request's
// deadline), arrival order among equals. A request counts as due at most
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
	waiting gateQueue
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
	g.mu.Lock()
	if g.free > 0 && len(g.waiting) == 0 {
		g.free--
		g.mu.Unlock()
		return g.release
	}
	g.seq++
	w := &gateWaiter{due: due, seq: g.seq, ready: make(chan struct{})}
	heap.Push(&g.waiting, w)
	g.mu.Unlock()
	<-w.ready
	return g.release
}

// release hands the slot to the waiting batch due first, or frees it.
func (g *RunGate) release() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.waiting) > 0 {
		close(heap.Pop(&g.waiting).(*gateWaiter).ready)
		return
	}
	g.free++
}

// due is when a formed batch is due at the gate: its earliest deadline,
// a request counting as due at most gateHorizon after its arrival.
func due(batch []*pending) time.Time {
	var d time.Time
	for _, p := range batch {
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
	due   time.Time
	seq   uint64
	ready chan struct{}
}

// gateQueue is a min-heap of waiters by due time, then arrival.
type gateQueue []*gateWaiter

func (q gateQueue) Len() int { return len(q) }
func (q gateQueue) Less(i, j int) bool {
	if !q[i].due.Equal(q[j].due) {
		return q[i].due.Before(q[j].due)
	}
	return q[i].seq < q[j].seq
}
func (q gateQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *gateQueue) Push(x any)   { *q = append(*q, x.(*gateWaiter)) }
func (q *gateQueue) Pop() any {
	old := *q
	w := old[len(old)-1]
	old[len(old)-1] = nil
	*q = old[:len(old)-1]
	return w
}
