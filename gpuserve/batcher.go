package gpuserve

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/prism-serve/prism/internal/ort"
)

// Runner scores one batch: ONNX Runtime's session in production.
type Runner interface {
	Run(in []ort.Input) ([][]float32, error)
}

var _ Runner = (*ort.Session)(nil)

// InputSpec is one dense-model input: float32, Width values per sample.
type InputSpec struct {
	Name  string
	Width int
	// Shape is the per-sample shape (batch left out); its product is Width.
	Shape []int64
}

// BatchOptions are the dynamic-batching knobs.
type BatchOptions struct {
	// MaxBatch is the most samples one Run gets (default 256). A request
	// larger than this runs alone.
	MaxBatch int
	// MaxDelay is how long the first request of a batch waits for others
	// (default 2ms): the latency given up for throughput.
	MaxDelay time.Duration
	// MaxQueue is the most samples waiting; beyond it Submit fails with
	// ErrOverloaded at once rather than queueing without bound
	// (default 64 batches).
	MaxQueue int
}

// EnsureDefaults fills zero fields.
func (o *BatchOptions) EnsureDefaults() {
	if o.MaxBatch <= 0 {
		o.MaxBatch = 256
	}
	if o.MaxDelay <= 0 {
		o.MaxDelay = 2 * time.Millisecond
	}
	if o.MaxQueue <= 0 {
		o.MaxQueue = 64 * o.MaxBatch
	}
}

// ErrOverloaded: the queue is full; callers map it to ResourceExhausted.
var ErrOverloaded = errors.New("dense tier overloaded: queue full")

// ErrClosed: the batcher is shutting down.
var ErrClosed = errors.New("dense tier shutting down")

// Request is n samples of every input, sample-major, in spec order.
type Request struct {
	N      int
	Inputs [][]float32
}

type pending struct {
	ctx  context.Context
	req  Request
	done chan result
}

type result struct {
	out [][]float32
	err error
}

// Batcher merges concurrent requests into batches for its runners, one
// goroutine per runner (one per GPU, MIG slice or CPU pool).
type Batcher struct {
	spec   []InputSpec
	opts   BatchOptions
	queue  chan *pending
	mu     sync.Mutex
	queued int // samples waiting
	closed bool
	// sending counts Submits between their closed check and their send,
	// so Close closes the queue only once no send can follow.
	sending sync.WaitGroup
	wg      sync.WaitGroup
	stats   Stats
}

// Stats are counters for the metrics endpoint.
type Stats struct {
	mu       sync.Mutex
	Batches  int64
	Samples  int64
	Rejected int64
	// BatchSizes counts runs by size bucket (powers of two).
	BatchSizes map[int]int64
}

// NewBatcher starts one batching loop per runner.
func NewBatcher(spec []InputSpec, runners []Runner, o BatchOptions) *Batcher {
	o.EnsureDefaults()
	b := &Batcher{spec: spec, opts: o, queue: make(chan *pending, 4096)}
	b.stats.BatchSizes = map[int]int64{}
	for _, r := range runners {
		b.wg.Add(1)
		go b.loop(r)
	}
	return b
}

// Submit queues req and waits for its outputs (per output, n x width).
func (b *Batcher) Submit(ctx context.Context, req Request) ([][]float32, error) {
	if req.N <= 0 {
		return nil, fmt.Errorf("empty request")
	}
	if len(req.Inputs) != len(b.spec) {
		return nil, fmt.Errorf("request has %d inputs, the dense model %d", len(req.Inputs), len(b.spec))
	}
	for i, in := range req.Inputs {
		if len(in) != req.N*b.spec[i].Width {
			return nil, fmt.Errorf("input %q: %d values for %d samples of width %d", b.spec[i].Name, len(in), req.N, b.spec[i].Width)
		}
	}
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil, ErrClosed
	}
	if b.queued+req.N > b.opts.MaxQueue {
		b.mu.Unlock()
		b.stats.mu.Lock()
		b.stats.Rejected++
		b.stats.mu.Unlock()
		return nil, ErrOverloaded
	}
	b.queued += req.N
	b.sending.Add(1)
	b.mu.Unlock()
	p := &pending{ctx: ctx, req: req, done: make(chan result, 1)}
	select {
	case b.queue <- p:
		b.sending.Done()
	case <-ctx.Done():
		// The channel is full of small requests: give up at the deadline
		// instead of blocking past it.
		b.sending.Done()
		b.mu.Lock()
		b.queued -= req.N
		b.mu.Unlock()
		return nil, ctx.Err()
	}
	select {
	case r := <-p.done:
		return r.out, r.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// QueueDepth is the number of samples waiting or running.
func (b *Batcher) QueueDepth() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.queued
}

// Close stops taking requests, finishes the queued ones and waits.
func (b *Batcher) Close() {
	b.mu.Lock()
	first := !b.closed
	b.closed = true
	b.mu.Unlock()
	if first {
		// The loops still drain the queue, so a sender blocked on a full
		// queue gets through before the close.
		b.sending.Wait()
		close(b.queue)
	}
	b.wg.Wait()
}

func (b *Batcher) loop(r Runner) {
	defer b.wg.Done()
	var carry *pending
	for {
		first := carry
		carry = nil
		if first == nil {
			var ok bool
			if first, ok = <-b.queue; !ok {
				return
			}
		}
		batch := []*pending{first}
		n := first.req.N
		timer := time.NewTimer(b.opts.MaxDelay)
	collect:
		for n < b.opts.MaxBatch {
			select {
			case p, ok := <-b.queue:
				if !ok {
					break collect
				}
				if n+p.req.N > b.opts.MaxBatch {
					carry = p // starts the next batch
					break collect
				}
				batch = append(batch, p)
				n += p.req.N
			case <-timer.C:
				break collect
			}
		}
		timer.Stop()
		b.run(r, batch)
	}
}

// run scores one batch and hands each request its rows.
func (b *Batcher) run(r Runner, batch []*pending) {
	var all int
	live := make([]*pending, 0, len(batch))
	for _, p := range batch {
		all += p.req.N
		if p.ctx.Err() == nil {
			live = append(live, p)
		}
	}
	if len(live) == 0 {
		b.release(all)
		return
	}
	n := 0
	for _, p := range live {
		n += p.req.N
	}
	ins := make([]ort.Input, len(b.spec))
	for i, s := range b.spec {
		var data []float32
		if len(live) == 1 {
			data = live[0].req.Inputs[i]
		} else {
			data = make([]float32, 0, n*s.Width)
			for _, p := range live {
				data = append(data, p.req.Inputs[i]...)
			}
		}
		ins[i] = ort.Input{Name: s.Name, Shape: append([]int64{int64(n)}, s.Shape...), Float32: data}
	}
	outs, err := r.Run(ins)
	b.release(all)
	b.stats.mu.Lock()
	b.stats.Batches++
	b.stats.Samples += int64(n)
	bucket := 1
	for bucket < n {
		bucket *= 2
	}
	b.stats.BatchSizes[bucket]++
	b.stats.mu.Unlock()
	if err != nil {
		for _, p := range live {
			p.done <- result{err: err}
		}
		return
	}
	off := 0
	for _, p := range live {
		res := make([][]float32, len(outs))
		for o, out := range outs {
			w := len(out) / n
			res[o] = out[off*w : (off+p.req.N)*w]
		}
		off += p.req.N
		p.done <- result{out: res}
	}
}

// release uncounts a finished run's samples. Samples count against
// MaxQueue until their run is over, so the bound covers work in flight as
// well as work waiting; they are uncounted before any caller of the run
// gets its answer, so a caller holding its scores never sees them still
// in QueueDepth (the queue-depth gauge, the load announced to the router)
// and is never refused for a queue full of its own finished work.
func (b *Batcher) release(samples int) {
	b.mu.Lock()
	b.queued -= samples
	b.mu.Unlock()
}

// Snapshot copies the counters.
func (b *Batcher) Snapshot() (batches, samples, rejected int64, sizes map[int]int64) {
	b.stats.mu.Lock()
	defer b.stats.mu.Unlock()
	sizes = map[int]int64{}
	for k, v := range b.stats.BatchSizes {
		sizes[k] = v
	}
	return b.stats.Batches, b.stats.Samples, b.stats.Rejected, sizes
}
