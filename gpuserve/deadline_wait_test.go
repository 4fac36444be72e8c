package gpuserve

import (
	"context"
	"slices"
	"testing"
	"time"
)

// TestFormBatchDeadlineBeforeMaxDelay: a request whose deadline comes
// before its batch's MaxDelay mark is not held for the batch to fill
// until it can no longer make it. With a run-time estimate the batch
// goes by its latest start (deadline less the estimate of the batch
// queued so far); without one, it goes at once. MaxBatch 8, MaxDelay
// 2 ms, on the fake clock of TestFormBatch.
func TestFormBatchDeadlineBeforeMaxDelay(t *testing.T) {
	cases := []struct {
		name  string
		queue []q
		now   float64
		est   estimator
		batch []int
		wake  float64 // ms; when batch is empty
	}{
		{name: "no estimate: goes at once", queue: []q{{2, 0, 1.5}}, now: 0.1, est: linear(0, 0), batch: []int{1}},
		{name: "no estimate, a far deadline: waits for MaxDelay", queue: []q{{2, 0, 50}}, now: 0.1, est: linear(0, 0), wake: 2},
		{name: "estimate: waits until its latest start", queue: []q{{2, 0, 1.5}}, now: 0.1, est: linear(0.5, 0), wake: 1},
		{name: "estimate: goes at its latest start", queue: []q{{2, 0, 1.5}}, now: 1, est: linear(0.5, 0), batch: []int{1}},
		{name: "estimate of the whole queue, tightest deadline", queue: []q{{1, 0, 40}, {3, 0.2, 1.8}}, now: 0.3, est: linear(0.5, 0.1),
			// 4 samples take 0.9 ms: request 2 must start by 0.9.
			wake: 0.9},
		{name: "estimate: a deadline after MaxDelay plus the run waits", queue: []q{{2, 0, 3}}, now: 0.1, est: linear(0.5, 0), wake: 2},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			o := BatchOptions{MaxBatch: 8, MaxDelay: 2 * time.Millisecond}
			o.EnsureDefaults()
			d := formBatch(queueOf(c.queue), at(c.now), o, c.est, false)
			if got := seqs(d.batch); !slices.Equal(got, c.batch) {
				t.Errorf("batch %v, want %v", got, c.batch)
			}
			if len(d.late) > 0 {
				t.Errorf("%d refused", len(d.late))
			}
			var want time.Time
			if len(c.batch) == 0 {
				want = at(c.wake)
			}
			if !d.wake.Equal(want) {
				t.Errorf("wake %s, want %s", msOf(d.wake), msOf(want))
			}
		})
	}
}

// TestBatcherTightDeadlineNotHeld: an idle batcher with a long MaxDelay
// scores a lone request due well before that delay is over, instead of
// holding it until it expires in the queue.
func TestBatcherTightDeadlineNotHeld(t *testing.T) {
	r := &sumRunner{}
	b := NewBatcher(spec, []Runner{r}, BatchOptions{MaxBatch: 64, MaxDelay: 2 * time.Second})
	defer b.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	out, err := b.Submit(ctx, req(2, 5))
	if err != nil {
		t.Fatalf("Submit: %v", err)
	}
	if got := out[0]; len(got) != 2 || got[0] != 5 || got[1] != 6 {
		t.Errorf("scores %v, want [5 6]", got)
	}
}

// msOf shows a wake time on the fake clock ("none" for zero).
func msOf(w time.Time) string {
	if w.IsZero() {
		return "none"
	}
	return w.Sub(t0).String()
}

// TestFormBatchShedsNotRefuses: a request that would make its deadline
// in a batch without the batch's last requests (later deadlines, or
// none) is not refused for their sake: they wait for a later batch
// instead. Where shedding cannot save it (the overdue oldest must go;
// the last request would miss too), it is refused as before. MaxBatch
// 8, MaxDelay 2 ms, runs of 1 ms plus 1 ms per sample.
func TestFormBatchShedsNotRefuses(t *testing.T) {
	cases := []struct {
		name  string
		queue []q
		now   float64
		batch []int
		late  []int
	}{
		{name: "a request without a deadline waits", queue: []q{{1, 0, 5}, {7, 0.1, 0}}, now: 2, batch: []int{1}},
		{name: "a far deadline waits", queue: []q{{1, 0, 5}, {7, 0.1, 50}}, now: 2, batch: []int{1}},
		{name: "shed from the end only as far as needed", queue: []q{{1, 0, 5.5}, {1, 0.1, 40}, {6, 0.2, 50}}, now: 2,
			// 1 and 2 take 3 ms: done at 5, in time for 1.
			batch: []int{1, 2}},
		{name: "the overdue oldest is not shed", queue: []q{{7, 0, 0}, {1, 1, 5}}, now: 2, batch: []int{1}, late: []int{2}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			o := BatchOptions{MaxBatch: 8, MaxDelay: 2 * time.Millisecond}
			o.EnsureDefaults()
			d := formBatch(queueOf(c.queue), at(c.now), o, linear(1, 1), false)
			var late []int
			for _, l := range d.late {
				late = append(late, int(l.p.seq))
			}
			if got := seqs(d.batch); !slices.Equal(got, c.batch) || !slices.Equal(late, c.late) {
				t.Errorf("batch %v late %v, want batch %v late %v", got, late, c.batch, c.late)
			}
		})
	}
}
