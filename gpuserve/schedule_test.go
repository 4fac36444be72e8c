package gpuserve

import (
	"cmp"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// q is a queued request in a formBatch table: samples, arrival and
// deadline in ms from t0 (deadline 0: none). Requests are numbered 1, 2,
// ... in the order given, which is arrival order.
type q struct {
	n        int
	at, dead float64
}

var t0 = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

func at(ms float64) time.Time { return t0.Add(time.Duration(ms * float64(time.Millisecond))) }

func queueOf(qs []q) []*pending {
	out := make([]*pending, len(qs))
	for i, x := range qs {
		p := &pending{}
		p.seq, p.n, p.arrived = uint64(i+1), x.n, at(x.at)
		if x.dead != 0 {
			p.deadline = at(x.dead)
		}
		out[i] = p
	}
	return out
}

// linear is a run-time estimate of base + per sample, in ms.
func linear(base, per float64) estimator {
	return func(n int) time.Duration {
		return time.Duration((base + per*float64(n)) * float64(time.Millisecond))
	}
}

// TestFormBatch: the batch-forming rule of schedule.go, case by case, on
// a fake clock. MaxBatch 8, MaxDelay 2 ms unless the case says.
func TestFormBatch(t *testing.T) {
	cases := []struct {
		name    string
		queue   []q
		now     float64
		order   Order
		est     estimator
		closing bool
		batch   []int     // request numbers, in run order
		late    []int     // refused, in the order refused
		miss    []float64 // ms, per late (0: expired)
		wake    float64   // ms; -1: none
	}{
		{name: "empty", wake: -1},
		{name: "lone request waits for its MaxDelay", queue: []q{{3, 0, 50}}, now: 1, wake: 2},
		{name: "wake is the oldest's mark", queue: []q{{1, 0.5, 0}, {1, 1, 0}}, now: 1.2, wake: 2.5},
		{name: "lone request goes at MaxDelay", queue: []q{{3, 0, 50}}, now: 2, batch: []int{1}},
		{name: "closing does not wait", queue: []q{{3, 0, 50}}, now: 0.1, closing: true, batch: []int{1}},
		{name: "full batch goes at once, by deadline",
			queue: []q{{2, 0, 30}, {2, 0.1, 10}, {2, 0.2, 20}, {2, 0.3, 40}}, now: 0.4,
			batch: []int{2, 3, 1, 4}},
		{name: "equal deadlines: fewest samples first",
			queue: []q{{4, 0, 10}, {1, 0.1, 10}, {2, 0.2, 10}, {2, 0.3, 10}}, now: 0.4,
			batch: []int{2, 3, 4}},
		{name: "no deadline comes last, in arrival order",
			queue: []q{{2, 0, 0}, {2, 0.1, 0}, {2, 0.2, 90}, {2, 0.3, 0}, {2, 0.4, 80}}, now: 0.5,
			batch: []int{5, 3, 1, 2}},
		{name: "more than a batch waiting: the batch goes before MaxDelay",
			queue: []q{{5, 0, 10}, {5, 0.1, 5}}, now: 0.2, batch: []int{2}},
		{name: "a request that does not fit is skipped for a smaller one",
			queue: []q{{6, 0, 10}, {4, 0.1, 11}, {2, 0.2, 12}}, now: 0.3, batch: []int{1, 3}},
		{name: "larger than MaxBatch runs alone when first",
			queue: []q{{20, 0, 10}, {2, 0.1, 11}}, now: 0.2, batch: []int{1}},
		{name: "larger than MaxBatch waits its turn",
			queue: []q{{2, 0, 10}, {20, 0.1, 11}, {1, 0.2, 12}}, now: 0.3, batch: []int{1, 3}},
		{name: "anti-starvation: the oldest, overdue, goes first whatever its deadline",
			queue: []q{{2, 0, 0}, {4, 0.5, 10}, {4, 1, 9}}, now: 2, batch: []int{1, 3}},
		{name: "anti-starvation: far deadline",
			queue: []q{{4, 0, 1000}, {4, 0.5, 10}, {4, 1, 9}}, now: 2.1, batch: []int{1, 3}},
		{name: "not overdue yet: a far deadline waits behind nearer ones",
			queue: []q{{4, 0, 1000}, {4, 0.5, 10}, {4, 1, 9}}, now: 1.5, batch: []int{3, 2}},
		{name: "expired in queue: refused, the rest still waits",
			queue: []q{{1, 0, 1}, {1, 0.5, 20}}, now: 1.5, late: []int{1}, miss: []float64{0}, wake: 2.5},
		{name: "deadline exactly now counts as expired",
			queue: []q{{1, 0, 2}}, now: 2, late: []int{1}, miss: []float64{0}, wake: -1},
		{name: "predicted to miss: refused, the batch refilled",
			queue: []q{{4, 0, 3}, {4, 0.1, 20}, {4, 0.2, 21}}, now: 2, est: linear(1, 0.25),
			// 8 samples take 3 ms: request 1 (due at 3) would finish at 5.
			batch: []int{2, 3}, late: []int{1}, miss: []float64{2}},
		{name: "predicted: a request that makes it stays",
			queue: []q{{4, 0, 5}, {4, 0.1, 20}}, now: 2, est: linear(1, 0.25), batch: []int{1, 2}},
		{name: "predicted: refill stops once nothing is late",
			queue: []q{{8, 0, 3}, {8, 0.1, 3.5}, {8, 0.2, 30}, {8, 0.3, 40}}, now: 2, est: linear(1, 0.25),
			// Each batch of 8 takes 3 ms: 1 and 2 would miss by 2 and 1.5.
			batch: []int{3}, late: []int{1, 2}, miss: []float64{2, 1.5}},
		{name: "predicted: one that misses even alone is refused alone, and the refill keeps the rest on time",
			queue: []q{{4, 0, 3}, {4, 0.1, 4.6}, {4, 0.2, 50}}, now: 2, est: linear(1, 0.25),
			// 1 and 2 together take 3 ms: both would miss. 1 alone (2
			// ms, done at 4) still misses, 2 alone does not: 1 is
			// refused, 2 runs, and 3 (due at 50) stays queued, as with
			// it 2 would miss again.
			batch: []int{2}, late: []int{1}, miss: []float64{2}},
		{name: "predicted: two that miss only together are both refused (no batch shrinks for them)",
			queue: []q{{6, 0, 4.6}, {2, 0.1, 4}}, now: 2, est: linear(1, 0.25),
			late: []int{1, 2}, miss: []float64{0.4, 1}, wake: -1},
		{name: "predicted: the overdue oldest is refused too",
			queue: []q{{2, 0, 2.5}, {2, 1, 50}}, now: 2, est: linear(1, 0), batch: []int{2}, late: []int{1}, miss: []float64{0.5}},
		{name: "no estimate yet: nothing predicted",
			queue: []q{{4, 0, 2.1}}, now: 2, est: linear(0, 0), batch: []int{1}},
		{name: "fifo: arrival order, stops at the first that does not fit",
			queue: []q{{6, 0, 30}, {4, 0.1, 10}, {2, 0.2, 20}}, now: 0.3, order: OrderFIFO, est: linear(1, 10),
			batch: []int{1}},
		{name: "fifo: no prediction, expired still refused",
			queue: []q{{1, 0, 1}, {4, 0.1, 2.5}, {2, 0.2, 20}}, now: 2.2, order: OrderFIFO, est: linear(10, 10),
			batch: []int{2, 3}, late: []int{1}, miss: []float64{0}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			o := BatchOptions{MaxBatch: 8, MaxDelay: 2 * time.Millisecond, Order: c.order}
			o.EnsureDefaults()
			queue := queueOf(c.queue)
			before := slices.Clone(queue)
			est := c.est
			if c.order == OrderFIFO {
				est = nil // as the batcher passes it
			}
			d := formBatch(queue, at(c.now), o, est, c.closing)
			if !slices.Equal(queue, before) {
				t.Error("formBatch changed the queue")
			}
			if got := seqs(d.batch); !slices.Equal(got, c.batch) {
				t.Errorf("batch %v, want %v", got, c.batch)
			}
			var late []int
			var miss []float64
			for _, l := range d.late {
				late = append(late, int(l.p.seq))
				miss = append(miss, float64(l.miss)/float64(time.Millisecond))
				if want := at(c.now).Sub(l.p.arrived); l.waited != want {
					t.Errorf("late %d waited %v, want %v", l.p.seq, l.waited, want)
				}
			}
			if !slices.Equal(late, c.late) || !slices.Equal(miss, c.miss) {
				t.Errorf("late %v miss %v ms, want %v %v", late, miss, c.late, c.miss)
			}
			wantWake := time.Time{}
			if len(c.batch) == 0 && c.wake >= 0 {
				wantWake = at(c.wake)
			}
			if !d.wake.Equal(wantWake) {
				t.Errorf("wake %v, want %v", d.wake.Sub(t0), wantWake.Sub(t0))
			}
		})
	}
}

func seqs(ps []*pending) []int {
	var out []int
	for _, p := range ps {
		out = append(out, int(p.seq))
	}
	return out
}

// TestFormBatchNoStarvation: a request without a deadline, behind a
// stream of tighter requests that alone would fill every batch, goes
// within its MaxDelay plus the batches of the requests queued ahead of it
// (simulated on the fake clock: one batch per ms, four tight arrivals of
// 4 samples per ms into batches of 8).
func TestFormBatchNoStarvation(t *testing.T) {
	o := BatchOptions{MaxBatch: 8, MaxDelay: 2 * time.Millisecond}
	var queue []*pending
	seq := uint64(0)
	add := func(n int, now time.Time, dead time.Duration) *pending {
		seq++
		p := &pending{}
		p.seq, p.n, p.arrived = seq, n, now
		if dead > 0 {
			p.deadline = now.Add(dead)
		}
		queue = append(queue, p)
		return p
	}
	for i := range 10 { // a backlog ahead of it
		add(4, at(float64(i)/10), time.Hour)
	}
	starved := add(4, at(1), 0)
	ahead := 10
	for ms := 1; ms < 100; ms++ {
		now := at(float64(ms))
		for range 4 {
			add(4, now, 5*time.Millisecond)
		}
		d := formBatch(queue, now, o, nil, false)
		for _, l := range d.late {
			queue = slices.DeleteFunc(queue, func(p *pending) bool { return p == l.p })
		}
		for _, p := range d.batch {
			if p == starved {
				if waited := now.Sub(starved.arrived); waited > o.MaxDelay+time.Duration(ahead+1)*time.Millisecond {
					t.Fatalf("went after %v", waited)
				}
				t.Logf("the deadline-free request went after %d ms", ms-1)
				return
			}
			queue = slices.DeleteFunc(queue, func(q *pending) bool { return q == p })
		}
	}
	t.Fatal("a request without a deadline never went")
}

func TestRunTimes(t *testing.T) {
	var r runTimes
	if d := r.estimate(100); d != 0 {
		t.Fatalf("no runs: %v", d)
	}
	r.observe(100, 10*time.Millisecond) // bucket 128
	r.observe(120, 20*time.Millisecond)
	if d := r.estimate(128); d != 12*time.Millisecond {
		t.Errorf("ewma %v, want 12ms", d)
	}
	if d := r.estimate(200); d != 12*time.Millisecond {
		t.Errorf("an unmeasured larger bucket takes the nearest smaller one's: %v", d)
	}
	if d := r.estimate(50); d != 0 {
		t.Errorf("smaller than anything measured: %v", d)
	}
	for _, c := range []struct{ n, b int }{{1, 1}, {2, 2}, {3, 4}, {256, 256}, {257, 512}} {
		if b := bucketOf(c.n); b != c.b {
			t.Errorf("bucketOf(%d) = %d", c.n, b)
		}
	}
	if o, err := ParseOrder("fifo"); err != nil || o != OrderFIFO || fmt.Sprint(o) != "fifo" {
		t.Errorf("ParseOrder fifo: %v %v", o, err)
	}
	if _, err := ParseOrder("lifo"); err == nil {
		t.Error("lifo accepted")
	}
}

// TestEstimatesGoStale: one slow run's estimate is used only while runs
// are being measured; a second without one and the batcher runs
// unpredicted (and measures again), so one outlier cannot refuse every
// later request of a model forever.
func TestEstimatesGoStale(t *testing.T) {
	var r runTimes
	t0 := time.Unix(100, 0)
	if d := r.fresh(4, t0); d != 0 {
		t.Fatalf("nothing measured: %v, want 0", d)
	}
	r.observe(4, 300*time.Millisecond)
	r.last = t0
	for _, c := range []struct {
		at   time.Duration
		want time.Duration
	}{
		{0, 300 * time.Millisecond},
		{500 * time.Millisecond, 300 * time.Millisecond},
		{staleAfter, 300 * time.Millisecond},
		{staleAfter + time.Millisecond, 0},
		{time.Hour, 0},
	} {
		if d := r.fresh(4, t0.Add(c.at)); d != c.want {
			t.Errorf("%v after the run: %v, want %v", c.at, d, c.want)
		}
	}
}

// sortedEDF is the reference order, written on the requests' own
// fields (time.Time deadlines, not the heap's keys): by deadline, then
// samples, then arrival; requests without a deadline last, by arrival.
func sortedEDF(ps []*pending) []*pending {
	out := slices.Clone(ps)
	slices.SortFunc(out, func(a, b *pending) int {
		az, bz := a.deadline.IsZero(), b.deadline.IsZero()
		switch {
		case az && bz:
			return cmp.Compare(a.seq, b.seq)
		case az:
			return 1
		case bz:
			return -1
		}
		if c := a.deadline.Compare(b.deadline); c != 0 {
			return c
		}
		if c := cmp.Compare(a.n, b.n); c != 0 {
			return c
		}
		return cmp.Compare(a.seq, b.seq)
	})
	return out
}

// randomQueue is n queued requests of 1..maxN samples arriving 0.01 ms
// apart, a quarter without a deadline, the rest due within 100 ms (ties
// on purpose: deadlines on a 1 ms grid).
func randomQueue(rng *rand.Rand, n, maxN int) []*pending {
	out := make([]*pending, n)
	for i := range out {
		p := &pending{}
		p.seq, p.n, p.arrived = uint64(i+1), 1+rng.IntN(maxN), at(float64(i)/100)
		if rng.IntN(4) > 0 {
			p.deadline = at(float64(1 + rng.IntN(100)))
		}
		out[i] = p
	}
	return out
}

// TestHeapOrderMatchesSort: without a run-time estimate and with every
// request fitting, the batch is the first requests of the sorted queue,
// for random queues (the heap walk is only a faster way to that order).
func TestHeapOrderMatchesSort(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := range 200 {
		queue := randomQueue(rng, 1+rng.IntN(300), 1+rng.IntN(4))
		if trial%4 == 0 {
			// Deadlines beyond what UnixNano holds (gRPC's clamp of a
			// huge timeout): after every nearer one.
			queue[rng.IntN(len(queue))].deadline = at(0).Add(time.Duration(math.MaxInt64))
		}
		// Every request fits: MaxBatch covers the queue's samples.
		o := BatchOptions{MaxBatch: 4 * len(queue), MaxDelay: time.Hour, MaxQueue: 1 << 20}
		d := formBatch(queue, at(0), o, nil, true)
		want := sortedEDF(queue)
		if !slices.Equal(d.batch, want) {
			t.Fatalf("trial %d: batch of %d differs from the sorted queue's head", trial, len(d.batch))
		}
	}
}

// TestSkipBound: a batch a few samples short of full stops looking after
// maxSkips requests too large for the room left.
func TestSkipBound(t *testing.T) {
	qs := []q{{7, 0, 10}}
	for range 1000 {
		qs = append(qs, q{4, 0.5, 20})
	}
	qs = append(qs, q{1, 0.6, 30}) // fits, but behind 1000 that do not
	d := formBatch(queueOf(qs), at(1), BatchOptions{MaxBatch: 8, MaxDelay: time.Millisecond, MaxQueue: 1 << 20}, nil, false)
	if len(d.batch) != 1 || d.batch[0].seq != 1 {
		t.Fatalf("batch %v, want only request 1", seqs(d.batch))
	}
}

// BenchmarkFormBatch: forming one batch from a deep queue, against the
// former rule's cost (sorting the whole queue) in the same run.
func BenchmarkFormBatch(b *testing.B) {
	for _, depth := range []int{256, 4096, 16384} {
		queue := randomQueue(rand.New(rand.NewPCG(3, 4)), depth, 512)
		o := BatchOptions{MaxBatch: 2048, MaxDelay: time.Millisecond, MaxQueue: 1 << 30}
		est := linear(1, 0.01)
		b.Run(fmt.Sprintf("heap/queue=%d", depth), func(b *testing.B) {
			for b.Loop() {
				formBatch(queue, at(0), o, est, true)
			}
		})
		b.Run(fmt.Sprintf("sort-baseline/queue=%d", depth), func(b *testing.B) {
			for b.Loop() {
				sortedEDF(queue)
			}
		})
	}
}

// TestEstimatesRestartLow: after estimates went stale, a bucket starts
// over from the lower of its first run and its stale estimate, so a
// cold first run after an idle second (or the slow run that made the
// estimate stale) does not refuse the next burst; other buckets and
// later runs are measured as before.
func TestEstimatesRestartLow(t *testing.T) {
	t0 := time.Unix(100, 0)
	idle := t0.Add(2 * staleAfter)
	for _, c := range []struct {
		name        string
		before, run time.Duration
		want        time.Duration
	}{
		{"a cold first run after idle", 10 * time.Millisecond, 50 * time.Millisecond, 10 * time.Millisecond},
		{"the outlier that made it stale", 300 * time.Millisecond, 10 * time.Millisecond, 10 * time.Millisecond},
	} {
		t.Run(c.name, func(t *testing.T) {
			var r runTimes
			r.measured(4, c.before, t0)
			if d := r.fresh(4, idle); d != 0 {
				t.Fatalf("stale estimate used: %v", d)
			}
			r.measured(4, c.run, idle)
			if d := r.fresh(4, idle); d != c.want {
				t.Errorf("after the first run: %v, want %v", d, c.want)
			}
			// The second run is averaged in as usual.
			r.measured(4, c.run, idle)
			if want := c.want + time.Duration(ewmaWeight*float64(c.run-c.want)); r.fresh(4, idle) != want {
				t.Errorf("after the second run: %v, want %v", r.fresh(4, idle), want)
			}
		})
	}
	// A bucket with no stale estimate starts from its run.
	var r runTimes
	r.measured(4, 10*time.Millisecond, t0)
	r.measured(64, 40*time.Millisecond, idle)
	if d := r.fresh(64, idle); d != 40*time.Millisecond {
		t.Errorf("new bucket: %v, want 40ms", d)
	}
	if d := r.fresh(4, idle); d != 0 {
		t.Errorf("bucket 4 not run since it went stale: %v, want 0 (64's is larger)", d)
	}
}
