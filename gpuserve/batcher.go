package gpuserve

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"

	"github.com/prism-serve/prism/internal/arrowframe"
	"github.com/prism-serve/prism/internal/leview"
	"github.com/prism-serve/prism/internal/ort"
	"github.com/prism-serve/prism/internal/serve"
	"github.com/prism-serve/prism/internal/tracing"
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
	// MaxDelay is how long the oldest queued request waits for others to
	// fill a batch (default 2ms): the latency given up for throughput.
	// Once it has waited that long it goes in the next batch whatever its
	// deadline (schedule.go: no request starves). Under OrderEDF a
	// request due sooner is not held until it can no longer make it:
	// the batch goes by its latest start (schedule.go, rule 2).
	MaxDelay time.Duration
	// MaxQueue is the most samples waiting; beyond it Submit fails with
	// ErrOverloaded at once rather than queueing without bound
	// (default 64 batches).
	MaxQueue int
	// Order is how queued requests are ordered into batches: OrderEDF
	// (the zero value: earliest deadline first, work predicted to miss
	// its deadline refused) or OrderFIFO (arrival order). See schedule.go.
	Order Order
	// Gate, when set, is shared by the batchers of one worker's models:
	// a formed batch waits there for a run slot, granted by deadline
	// across the models (gate.go). Nil: each batch runs as formed.
	Gate *RunGate
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
	// Context marks the inputs (nil: none) that hold one sample's Width
	// values, the same for all N samples: a cut tensor computed from the
	// request's context alone, which crossed the network once
	// (arrowframe's context columns). The batcher expands it into the
	// batch as it copies the samples into the runner's input.
	Context []bool
	// Index, per input (nil: none), dictionary-encodes it: Inputs[i]
	// holds distinct rows of Width values and Index[i] (N entries) each
	// sample's row among them, as arrowframe.DecodeIndexed reads a
	// dictionary-encoded cut column. The batcher gathers the rows into
	// the batch as it copies the samples into the runner's input, so a
	// frame is never expanded on its own first.
	Index [][]int32
}

// context says whether input i holds one row shared by every sample.
func (r *Request) context(i int) bool { return i < len(r.Context) && r.Context[i] }

// index is input i's per-sample rows, nil unless it is dictionary-encoded.
func (r *Request) index(i int) []int32 {
	if i < len(r.Index) {
		return r.Index[i]
	}
	return nil
}

// rows is how many samples' values input i holds.
func (r *Request) rows(i int) int {
	if r.context(i) {
		return 1
	}
	return r.N
}

// checkIndex checks a dictionary-encoded input i of width w: N indices,
// each a row of its values.
func (r *Request) checkIndex(i, w int) error {
	index, in := r.index(i), r.Inputs[i]
	if r.context(i) {
		return fmt.Errorf("context input %d is dictionary-encoded", i)
	}
	if len(index) != r.N || w <= 0 || len(in)%w != 0 {
		return fmt.Errorf("%d indices into %d values of width %d for %d samples", len(index), len(in), w, r.N)
	}
	rows := uint32(len(in) / w)
	for s, k := range index {
		if uint32(k) >= rows {
			return fmt.Errorf("sample %d indexes row %d of %d", s, k, rows)
		}
	}
	return nil
}

type pending struct {
	item
	ctx  context.Context
	req  Request
	done chan result
	// state is guarded by the batcher's mu.
	state pendingState
}

type pendingState int

const (
	queuedState   pendingState = iota // in the queue
	runningState                      // taken into a batch
	answeredState                     // refused; its result is in done
)

type result struct {
	out [][]float32
	err error
	// run is the batch that scored it (zero for a refusal), for the
	// request's trace.
	run batchRun
}

// batchRun times a batch: taken from the queue, its run's start and end,
// and its size.
type batchRun struct {
	taken, start, end time.Time
	samples, requests int
}

// DeadlineError answers a request refused for its deadline: it expired
// in the queue, or it was predicted to finish after it. It matches
// context.DeadlineExceeded under errors.Is.
type DeadlineError struct {
	// Miss is by how much the request was predicted to miss; zero when
	// its deadline had passed already.
	Miss time.Duration
	// Waited is its time in the queue.
	Waited time.Duration
}

func (e *DeadlineError) Error() string {
	if e.Miss <= 0 {
		return fmt.Sprintf("deadline expired in queue (waited %s)", ms(e.Waited))
	}
	return fmt.Sprintf("deadline: predicted to miss by %s (waited %s in queue; not run)", ms(e.Miss), ms(e.Waited))
}

// Is makes errors.Is(err, context.DeadlineExceeded) hold.
func (e *DeadlineError) Is(target error) bool { return target == context.DeadlineExceeded }

func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond)) }

// Batcher merges concurrent requests into batches for its runners, one
// goroutine per runner (one per GPU, MIG slice or CPU pool). The batches
// are formed by formBatch (schedule.go): earliest deadline first, work
// that would miss its deadline refused, MaxBatch and MaxDelay kept.
type Batcher struct {
	spec []InputSpec
	opts BatchOptions
	mu   sync.Mutex
	// waiting are the queued requests in arrival order.
	waiting []*pending
	seq     uint64
	queued  int // samples waiting or running
	closed  bool
	times   runTimes
	// wake tells an idle runner to form a batch (one token is enough:
	// the runner looks at the whole queue); stop ends the idle waits at
	// Close.
	wake  chan struct{}
	stop  chan struct{}
	wg    sync.WaitGroup
	stats Stats
}

// Stats are counters for the metrics endpoint.
type Stats struct {
	mu       sync.Mutex
	Batches  int64
	Samples  int64
	Rejected int64
	// BatchSizes counts runs by size bucket (powers of two).
	BatchSizes map[int]int64
	// Expired and Late count requests refused for their deadline: expired
	// in the queue, or predicted to miss it.
	Expired, Late int64
}

// NewBatcher starts one batching loop per runner.
func NewBatcher(spec []InputSpec, runners []Runner, o BatchOptions) *Batcher {
	o.EnsureDefaults()
	b := &Batcher{spec: spec, opts: o, wake: make(chan struct{}, 1), stop: make(chan struct{})}
	b.stats.BatchSizes = map[int]int64{}
	for _, r := range runners {
		b.wg.Add(1)
		go b.loop(r)
	}
	return b
}

// Submit queues req and waits for its outputs (per output, n x width).
// Its deadline is ctx's. A request refused for its deadline gets a
// *DeadlineError; one whose ctx ends while queued leaves the queue and
// gets ctx's error (a DeadlineError when the deadline passed).
//
// One whose ctx ends while its batch runs returns at once, the run still
// reading its inputs: the caller must leave them unchanged (the dense
// worker's are views of the received frame, garbage collected).
func (b *Batcher) Submit(ctx context.Context, req Request) ([][]float32, error) {
	if req.N <= 0 {
		return nil, fmt.Errorf("empty request")
	}
	if len(req.Inputs) != len(b.spec) {
		return nil, fmt.Errorf("request has %d inputs, the dense model %d", len(req.Inputs), len(b.spec))
	}
	if req.Context != nil && len(req.Context) != len(b.spec) {
		return nil, fmt.Errorf("request marks %d inputs context or not, the dense model has %d", len(req.Context), len(b.spec))
	}
	if req.Index != nil && len(req.Index) != len(b.spec) {
		return nil, fmt.Errorf("request has %d inputs' indices, the dense model %d inputs", len(req.Index), len(b.spec))
	}
	for i, in := range req.Inputs {
		if req.index(i) != nil {
			if err := req.checkIndex(i, b.spec[i].Width); err != nil {
				return nil, fmt.Errorf("input %q: %w", b.spec[i].Name, err)
			}
			continue
		}
		if len(in) != req.rows(i)*b.spec[i].Width {
			return nil, fmt.Errorf("input %q: %d values for %d samples of width %d", b.spec[i].Name, len(in), req.rows(i), b.spec[i].Width)
		}
	}
	p := &pending{ctx: ctx, req: req, done: make(chan result, 1)}
	p.n = req.N
	p.deadline, _ = ctx.Deadline()
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
	b.seq++
	p.seq = b.seq
	p.arrived = time.Now()
	b.waiting = append(b.waiting, p)
	b.mu.Unlock()
	b.signal()
	select {
	case r := <-p.done:
		if r.err == nil {
			traceRun(ctx, p.arrived, r.run)
		}
		return r.out, r.err
	case <-ctx.Done():
	}
	b.mu.Lock()
	switch p.state {
	case queuedState:
		// Still queued: leave at once and release the depth.
		b.remove(p)
		b.queued -= p.n
		b.mu.Unlock()
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			b.count(1, 0)
			return nil, &DeadlineError{Waited: time.Since(p.arrived)}
		}
		return nil, ctx.Err()
	case answeredState:
		b.mu.Unlock()
		r := <-p.done
		return r.out, r.err
	}
	// Running: its run drops it and releases the depth.
	b.mu.Unlock()
	return nil, ctx.Err()
}

// signal wakes an idle runner, if any is waiting.
func (b *Batcher) signal() {
	select {
	case b.wake <- struct{}{}:
	default:
	}
}

// remove takes p out of the queue; b.mu is held.
func (b *Batcher) remove(p *pending) {
	if i := slices.Index(b.waiting, p); i >= 0 {
		b.waiting = slices.Delete(b.waiting, i, i+1)
	}
	p.state = answeredState
}

func (b *Batcher) count(expired, late int64) {
	b.stats.mu.Lock()
	b.stats.Expired += expired
	b.stats.Late += late
	b.stats.mu.Unlock()
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
		close(b.stop)
	}
	b.wg.Wait()
}

// loop forms batches with formBatch and runs them until the batcher is
// closed and its queue empty.
func (b *Batcher) loop(r Runner) {
	defer b.wg.Done()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	edf := b.opts.Order == OrderEDF
	for {
		b.mu.Lock()
		now := time.Now()
		var est estimator
		if edf {
			est = func(n int) time.Duration { return b.times.fresh(n, now) } // called with b.mu held
		}
		d := formBatch(b.waiting, now, b.opts, est, b.closed)
		var expired, lateN int64
		for _, l := range d.late {
			if l.miss > 0 {
				lateN++
			} else {
				expired++
			}
			l.p.state = answeredState // leaves the queue below
			b.queued -= l.p.n
			// Answered under the lock, so Submit finds its state and its
			// result together; done is buffered.
			l.p.done <- result{err: &DeadlineError{Miss: l.miss, Waited: l.waited}}
		}
		for _, p := range d.batch {
			p.state = runningState
		}
		if len(d.batch)+len(d.late) > 0 {
			// One pass for all that leave: removing each on its own
			// moved the whole queue once per request.
			b.waiting = slices.DeleteFunc(b.waiting, func(p *pending) bool { return p.state != queuedState })
		}
		more := len(b.waiting) > 0
		closed := b.closed
		b.mu.Unlock()
		if expired+lateN > 0 {
			b.count(expired, lateN)
		}
		if len(d.batch) > 0 {
			if more {
				b.signal() // another runner may take the rest
			}
			if g := b.opts.Gate; g != nil {
				release := g.acquireBatch(d.batch)
				b.run(r, d.batch)
				release()
				continue
			}
			b.run(r, d.batch)
			continue
		}
		if len(d.late) > 0 {
			continue // the queue changed: form again
		}
		if closed && !more {
			return
		}
		var fire <-chan time.Time
		if !d.wake.IsZero() {
			timer.Reset(d.wake.Sub(now))
			fire = timer.C
		}
		stop := b.stop
		if closed {
			stop = nil // closing: formBatch no longer waits
		}
		select {
		case <-b.wake:
		case <-fire:
		case <-stop:
		}
		timer.Stop()
	}
}

// run scores one batch and hands each request its rows.
func (b *Batcher) run(r Runner, batch []*pending) {
	taken := time.Now()
	var all int
	live := make([]*pending, 0, len(batch))
	for _, p := range batch {
		all += p.req.N
		if p.ctx.Err() == nil {
			live = append(live, p)
		}
	}
	if len(live) == 0 {
		b.release(all, 0, 0)
		return
	}
	n := 0
	for _, p := range live {
		n += p.req.N
	}
	ins := make([]ort.Input, len(b.spec))
	var pooled []*[]byte
	for i, s := range b.spec {
		var data []float32
		if len(live) == 1 && !live[0].req.context(i) && live[0].req.index(i) == nil {
			data = live[0].req.Inputs[i] // as received: no copy
		} else {
			// One pass writes the batch into memory of the servers' pool
			// (unzeroed: every float is written; a fresh batch of a few
			// hundred KB costs more in page faults than its copy): each
			// request's samples copied, a context input's row repeated, a
			// dictionary-encoded one's rows gathered by index.
			buf := serve.Pool.Get(4 * n * s.Width)
			pooled = append(pooled, buf)
			data = leview.Float32s(*buf)[:n*s.Width]
			off := 0
			for _, p := range live {
				dst := data[off : off+p.req.N*s.Width]
				switch in := p.req.Inputs[i]; {
				case p.req.context(i):
					arrowframe.Repeat(dst, in)
				case p.req.index(i) != nil:
					arrowframe.Gather(dst, in, p.req.index(i), s.Width)
				default:
					copy(dst, in)
				}
				off += len(dst)
			}
		}
		ins[i] = ort.Input{Name: s.Name, Shape: append([]int64{int64(n)}, s.Shape...), Float32: data}
	}
	start := time.Now()
	outs, err := r.Run(ins)
	took := time.Since(start)
	if err != nil {
		took = 0 // a failed run says nothing of run times
	}
	// The runner is done with the batch's memory (its outputs are its own).
	for _, buf := range pooled {
		serve.Pool.Put(buf)
	}
	b.release(all, n, took)
	if err != nil {
		// Nothing scored: the callers' errors count it (rejected_total).
		for _, p := range live {
			p.done <- result{err: err}
		}
		return
	}
	b.stats.mu.Lock()
	b.stats.Batches++
	b.stats.Samples += int64(n)
	b.stats.BatchSizes[bucketOf(n)]++
	b.stats.mu.Unlock()
	ran := batchRun{taken: taken, start: start, end: start.Add(took), samples: n, requests: len(live)}
	off := 0
	for _, p := range live {
		res := make([][]float32, len(outs))
		for o, out := range outs {
			w := len(out) / n
			res[o] = out[off*w : (off+p.req.N)*w]
		}
		off += p.req.N
		p.done <- result{out: res, run: ran}
	}
}

// release uncounts a finished run's samples. Samples count against
// MaxQueue until their run is over, so the bound covers work in flight as
// well as work waiting; they are uncounted before any caller of the run
// gets its answer, so a caller holding its scores never sees them still
// in QueueDepth (the queue-depth gauge, the load announced to the router)
// and is never refused for a queue full of its own finished work.
//
// A run of n samples that took took (0: not measured) feeds the run-time
// estimate of its size bucket.
func (b *Batcher) release(samples, n int, took time.Duration) {
	b.mu.Lock()
	b.queued -= samples
	if took > 0 {
		b.times.measured(n, took, time.Now())
	}
	b.mu.Unlock()
}

// DeadlineRefused are the requests refused for their deadline without
// running: expired in the queue, and predicted to miss it (late).
func (b *Batcher) DeadlineRefused() (expired, late int64) {
	b.stats.mu.Lock()
	defer b.stats.mu.Unlock()
	return b.stats.Expired, b.stats.Late
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

// traceRun records a scored request's time in the dense tier as stages
// of its trace (nothing when it is not traced): queued (from its arrival
// until its batch was taken from the queue) and the batch's run, with
// the batch's size (the requests of a batch share their run's times;
// between the two, the batch's inputs were copied together).
func traceRun(ctx context.Context, arrived time.Time, ran batchRun) {
	if !tracing.Recording(ctx) {
		return
	}
	tracing.Stage(ctx, "dense.queue", arrived, ran.taken)
	tracing.Stage(ctx, "dense.run", ran.start, ran.end,
		attribute.Int("prism.batch.samples", ran.samples), attribute.Int("prism.batch.requests", ran.requests))
}
