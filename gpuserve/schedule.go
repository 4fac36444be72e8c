package gpuserve

import (
	"fmt"
	"math"
	"slices"
	"time"
)

// This file is the batcher's deterministic core: which queued requests
// form the next batch, which are refused for their deadline, and when to
// look again. No locks, no clock, no goroutines: formBatch is a function
// of the queue, the time and the run-time estimates, tested table by
// table in schedule_test.go. batcher.go carries out its decisions.
//
// The rule (Order EDF, the default):
//
//  1. Refused first. A request whose deadline has passed is answered
//     DeadlineExceeded ("expired in queue"). A request chosen for the
//     batch that would finish after its deadline, finish predicted as now
//     plus the EWMA run time of the batch's size bucket, is answered
//     DeadlineExceeded ("predicted to miss by X ms") instead of running:
//     first those that would miss even in a batch of their own (they
//     cannot be run in time; with them gone the others may make it);
//     when there are none, the batch's last requests (latest
//     deadlines, or none) stay queued for a later batch if that lets
//     the rest make it and none of them would miss itself (the overdue
//     oldest always goes: rule 3); and only when that fails, every
//     request that misses in this batch. The batch is then refilled
//     from the queue (in the same order) and checked again, until it
//     holds no predicted miss; a refill takes a request only if no
//     request in the batch, it included, would then miss (one that
//     would miss even alone is refused, another stays queued). Requests
//     are refused only when a batch is formed, that is when a runner is
//     free.
//  2. When a batch goes: when the queued samples fill MaxBatch (as
//     before: a full batch does not wait), when the oldest queued request
//     has waited MaxDelay, when waiting longer would make a queued
//     request miss its deadline (its latest start: deadline less the
//     predicted run of what is queued; with no prediction, at once for a
//     deadline before the MaxDelay mark), or when the batcher is
//     closing. Otherwise the runner looks again at the first of those
//     marks or at the next arrival, whichever is first.
//  3. What goes, in order: the oldest request (by arrival), if it has
//     waited MaxDelay, takes the first place whatever its deadline (the
//     anti-starvation rule); the rest fills by earliest deadline first,
//     fewest samples first among equal deadlines, then arrival; requests
//     without a deadline come after all that have one, in arrival order.
//     A request that does not fit in what is left of MaxBatch is skipped
//     and a later, smaller one may take the room; a request larger than
//     MaxBatch runs alone when it is first.
//
// No request starves: every batch formed once the oldest request has
// waited MaxDelay carries it, so a request waits at most MaxDelay plus
// one batch for each request queued ahead of it when it arrived, as in
// arrival order, however far its deadline (or without one). Deadlines
// reorder the requests inside that bound.
//
// Order FIFO is the former behaviour, kept for comparison: arrival order,
// a batch stops at the first request that does not fit, and only
// requests already expired are refused (no prediction).

// Order is how the batcher orders queued requests.
type Order int

const (
	// OrderEDF: earliest deadline first, and work predicted to miss its
	// deadline is refused instead of run (the default).
	OrderEDF Order = iota
	// OrderFIFO: arrival order; only expired work is refused.
	OrderFIFO
)

func (o Order) String() string {
	switch o {
	case OrderEDF:
		return "edf"
	case OrderFIFO:
		return "fifo"
	}
	return fmt.Sprintf("Order(%d)", int(o))
}

// ParseOrder reads "edf" or "fifo".
func ParseOrder(s string) (Order, error) {
	switch s {
	case "edf", "":
		return OrderEDF, nil
	case "fifo":
		return OrderFIFO, nil
	}
	return 0, fmt.Errorf("batch order %q: want edf or fifo", s)
}

// item is what the scheduler knows of a queued request.
type item struct {
	seq      uint64    // arrival order
	n        int       // samples
	arrived  time.Time // when it was queued
	deadline time.Time // zero: none
}

// late is a request refused for its deadline.
type late struct {
	p *pending
	// miss is by how much it was predicted to miss; zero when it had
	// already expired.
	miss time.Duration
	// waited is its time in the queue.
	waited time.Duration
}

// decision is formBatch's answer.
type decision struct {
	// batch is what runs now, in run order; empty when nothing goes yet.
	batch []*pending
	// late are answered DeadlineExceeded and leave the queue.
	late []late
	// wake is when to form again if nothing arrives (zero: at the next
	// arrival only). Set only when batch is empty.
	wake time.Time
}

// estimator predicts a run's time from its samples (0: no estimate).
type estimator func(n int) time.Duration

// formBatch applies the rule above to queue (in arrival order) at now.
// It does not change queue; the caller removes what batch and late name.
func formBatch(queue []*pending, now time.Time, o BatchOptions, est estimator, closing bool) decision {
	var d decision
	live := make([]*pending, 0, len(queue))
	total := 0
	for _, p := range queue {
		if !p.deadline.IsZero() && !now.Before(p.deadline) {
			d.late = append(d.late, late{p: p, waited: now.Sub(p.arrived)})
			continue
		}
		live = append(live, p)
		total += p.n
	}
	if len(live) == 0 {
		return d
	}
	// live keeps arrival order: live[0] is the oldest.
	due := live[0].arrived.Add(o.MaxDelay)
	overdue := !now.Before(due)
	if !closing && !overdue && total < o.MaxBatch {
		wake := due
		if o.Order == OrderEDF {
			wake = startBy(live, now, due, est, total)
		}
		if now.Before(wake) {
			d.wake = wake
			return d
		}
	}
	if o.Order == OrderFIFO {
		n := 0
		for i, p := range live {
			if i > 0 && n+p.n > o.MaxBatch {
				break
			}
			d.batch = append(d.batch, p)
			n += p.n
		}
		return d
	}
	// The walk takes requests in run order from a heap built in linear
	// time, not a sorted copy of the queue: a batch needs its first few
	// requests, and the queue may hold thousands (sorting it whole on
	// every batch cost 2.6 ms at 16k queued, under the batcher's lock).
	var first, anchor *pending // anchor: the overdue oldest, which must go
	rest := live
	if overdue {
		// The oldest goes first; the rest by deadline.
		first, rest = live[0], live[1:]
		anchor = first
	}
	h := make(edfHeap, len(rest))
	for i, p := range rest {
		h[i] = edfKeyOf(p)
	}
	h.init()
	nextOf := func() *pending {
		if first != nil {
			p := first
			first = nil
			return p
		}
		return h.pop()
	}
	n := 0
	refill := false
	for {
		skipped := 0
		for n < o.MaxBatch && skipped < maxSkips {
			p := nextOf()
			if p == nil {
				break
			}
			if len(d.batch) > 0 && n+p.n > o.MaxBatch {
				skipped++
				continue
			}
			if refill {
				// A refill takes a request only if the batch, with it,
				// holds no predicted miss: it must not make a request
				// already kept miss (nor miss itself). One that would
				// miss even alone is refused; otherwise it stays queued.
				if run := est(n + p.n); run > 0 {
					finish := now.Add(run)
					if lateAt(p, finish) || slices.ContainsFunc(d.batch, func(q *pending) bool { return lateAt(q, finish) }) {
						if alone := est(p.n); alone > 0 && lateAt(p, now.Add(alone)) {
							d.late = append(d.late, late{p: p, miss: now.Add(alone).Sub(p.deadline), waited: now.Sub(p.arrived)})
						} else {
							skipped++
						}
						continue
					}
				}
			}
			skipped = 0
			d.batch = append(d.batch, p)
			n += p.n
		}
		if est == nil || len(d.batch) == 0 {
			break
		}
		run := est(n)
		if run <= 0 {
			break
		}
		finish := now.Add(run)
		// refuse answers DeadlineExceeded the requests of the batch
		// that miss (predicted to finish at finish) and are picked.
		refuse := func(pick func(p *pending) bool) (dropped int) {
			kept := d.batch[:0]
			for _, p := range d.batch {
				if lateAt(p, finish) && pick(p) {
					d.late = append(d.late, late{p: p, miss: finish.Sub(p.deadline), waited: now.Sub(p.arrived)})
					n -= p.n
					dropped++
					continue
				}
				kept = append(kept, p)
			}
			d.batch = kept
			return dropped
		}
		// Refused first, alone: the requests that miss even in a batch
		// of their own. They cannot be run in time, and with them gone
		// the others may make it: none is refused for the size of a
		// batch that held them.
		dropped := refuse(func(p *pending) bool {
			alone := est(p.n)
			return alone > 0 && lateAt(p, now.Add(alone))
		})
		if dropped == 0 {
			// Then, when the batch's last requests (the latest
			// deadlines, or none) are what makes earlier ones miss,
			// they stay queued for a later batch: a request that can
			// make its deadline is not refused for later work to run.
			if kept, m := shed(d.batch, n, now, est, anchor); kept < len(d.batch) {
				d.batch, n = d.batch[:kept], m
				break
			}
			// Else those that miss in this batch: refused, not run, so
			// the batch is filled with what can still make it.
			dropped = refuse(func(*pending) bool { return true })
		}
		if dropped == 0 {
			break
		}
		// Skipped requests that now fit are not reconsidered: they were
		// passed over for larger, earlier ones; the refill goes on from
		// where the walk stopped.
		refill = true
	}
	return d
}

// shed says how many of batch's first requests (n samples in all) make
// a batch in which none misses its deadline, taking off its last
// requests one by one, each only if it would not miss itself and is not
// anchor (the overdue oldest, which goes in this batch); and their
// samples. kept is len(batch) when no such batch is found.
func shed(batch []*pending, n int, now time.Time, est estimator, anchor *pending) (kept, samples int) {
	kept, samples = len(batch), n
	for kept > 0 {
		run := est(samples)
		finish := now.Add(run)
		if run <= 0 || !slices.ContainsFunc(batch[:kept], func(p *pending) bool { return lateAt(p, finish) }) {
			return kept, samples
		}
		last := batch[kept-1]
		if last == anchor || lateAt(last, finish) {
			return len(batch), n
		}
		kept--
		samples -= last.n
	}
	return len(batch), n
}

// startBy is when the queued requests (live, total samples) must go
// for none to miss its deadline waiting for MaxDelay's mark due: the
// earliest deadline less the predicted run of what is queued, and at
// once for a deadline before due when no run time is known (how long it
// runs is not known; waiting for the mark could only make it miss).
func startBy(live []*pending, now, due time.Time, est estimator, total int) time.Time {
	var run time.Duration
	if est != nil {
		run = est(total)
	}
	by := due
	for _, p := range live {
		if p.deadline.IsZero() {
			continue
		}
		start := p.deadline.Add(-run)
		if run <= 0 && p.deadline.Before(due) {
			start = now
		}
		if start.Before(by) {
			by = start
		}
	}
	return by
}

// lateAt says whether p, finishing at finish, misses its deadline.
func lateAt(p *pending, finish time.Time) bool {
	return !p.deadline.IsZero() && finish.After(p.deadline)
}

// maxSkips bounds the requests the walk passes over for not fitting in
// what is left of MaxBatch before it stops looking: a batch a few
// samples short of full would otherwise pop the whole queue looking for
// a request small enough.
const maxSkips = 64

// edfKey is what the EDF order compares, copied out of the request so a
// heap of thousands compares contiguous values instead of chasing a
// pointer per comparison (that was most of the cost at depth).
type edfKey struct {
	due int64 // deadline in ns after dueBase; none: math.MaxInt64 (after every deadline)
	n   int
	seq uint64
	p   *pending
}

// dueBase is what the EDF keys count from: a reading of this process's
// monotonic clock, as the deadlines are (gRPC sets them from time.Now),
// so a step of the wall clock (NTP) does not reorder the queue. Keyed
// by UnixNano (the wall clock), the requests queued after a step back of
// S were ordered as if due S sooner than those queued before it (these
// starved, and were refused for their deadlines), and after a step
// forward as if due S later.
var dueBase = time.Now()

func edfKeyOf(p *pending) edfKey {
	due := int64(math.MaxInt64)
	if !p.deadline.IsZero() {
		// Sub saturates: a deadline 292 years away (gRPC's clamp of a
		// huge timeout) is after every nearer one, before none.
		due = min(int64(p.deadline.Sub(dueBase)), math.MaxInt64-1)
	}
	return edfKey{due: due, n: p.n, seq: p.seq, p: p}
}

// less orders by deadline, then samples, then arrival; requests without
// a deadline last, in arrival order (samples do not matter for them).
func (a edfKey) less(b edfKey) bool {
	if a.due != b.due {
		return a.due < b.due
	}
	if a.n != b.n && a.due != math.MaxInt64 {
		return a.n < b.n
	}
	return a.seq < b.seq
}

// edfHeap is a binary min-heap of queued requests by edfKey.less,
// written out rather than through container/heap: the interface calls
// were half the cost of forming a batch from a deep queue.
type edfHeap []edfKey

// init orders h as a heap in linear time.
func (h edfHeap) init() {
	for i := len(h)/2 - 1; i >= 0; i-- {
		h.down(i)
	}
}

// pop takes the least request out, nil when h is empty.
func (h *edfHeap) pop() *pending {
	old := *h
	if len(old) == 0 {
		return nil
	}
	top := old[0].p
	last := len(old) - 1
	old[0] = old[last]
	*h = old[:last]
	h.down(0)
	return top
}

func (h edfHeap) down(i int) {
	n := len(h)
	for {
		l := 2*i + 1
		if l >= n {
			return
		}
		least := l
		if r := l + 1; r < n && h[r].less(h[l]) {
			least = r
		}
		if !h[least].less(h[i]) {
			return
		}
		h[i], h[least] = h[least], h[i]
		i = least
	}
}

// bucketOf is a run's size bucket: the least power of two >= n.
func bucketOf(n int) int {
	b := 1
	for b < n {
		b *= 2
	}
	return b
}

// runTimes is an EWMA of measured run times per size bucket.
type runTimes struct {
	ewma map[int]time.Duration
	// last is when a run was last measured. Estimates older than
	// staleAfter are not used: they change only when batches run, so a
	// slow run (a GC pause, a cold shape) whose estimate refused every
	// later request would never be corrected; once stale, batches run
	// unpredicted and measure again.
	last time.Time
	// stale holds the estimates that went stale, until each bucket's
	// first run after them (see measured).
	stale map[int]time.Duration
}

// measured notes a run of n samples that took took, ended at now. After
// estimates went stale, each bucket starts over from its first run, not
// averaged with the outlier that may have made them stale; but that
// first run may be the outlier (the first after an idle second, with
// ONNX Runtime's threads asleep and caches cold), and alone it would
// refuse a burst's requests until the EWMA forgot it. So a bucket's
// first run after going stale starts at the lower of the run and the
// stale estimate: an outlier either way is left out, and an estimate
// that errs low refuses nothing that could have made its deadline.
func (r *runTimes) measured(n int, took time.Duration, now time.Time) {
	if !r.last.IsZero() && now.Sub(r.last) > staleAfter {
		r.stale, r.ewma = r.ewma, nil
	}
	b := bucketOf(n)
	if old, ok := r.stale[b]; ok {
		delete(r.stale, b)
		took = min(took, old)
	}
	r.observe(n, took)
	r.last = now
}

// staleAfter is how long run-time estimates stay in use without a run.
const staleAfter = time.Second

// fresh is estimate while a run was measured within staleAfter of now,
// else 0 (not known).
func (r *runTimes) fresh(n int, now time.Time) time.Duration {
	if r.last.IsZero() || now.Sub(r.last) > staleAfter {
		return 0
	}
	return r.estimate(n)
}

// ewmaWeight is the weight of the newest run.
const ewmaWeight = 0.2

func (r *runTimes) observe(n int, d time.Duration) {
	if r.ewma == nil {
		r.ewma = map[int]time.Duration{}
	}
	b := bucketOf(n)
	old, ok := r.ewma[b]
	if !ok {
		r.ewma[b] = d
		return
	}
	r.ewma[b] = old + time.Duration(ewmaWeight*float64(d-old))
}

// estimate is the bucket's EWMA; for a bucket not measured yet, the
// nearest smaller measured bucket's (a lower bound, so no request is
// refused on a guess that is too high); 0 when none is.
func (r *runTimes) estimate(n int) time.Duration {
	for b := bucketOf(n); b >= 1; b /= 2 {
		if d, ok := r.ewma[b]; ok {
			return d
		}
	}
	return 0
}
