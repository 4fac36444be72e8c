package gpuserve

import (
	"context"
	"errors"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/internal/ort"
	"github.com/prism-serve/prism/plan"
)

// tagRunner records the first value of each run's first input (req(n, v)
// puts v there: a request's tag) and can block on gate or take a fixed
// time per run.
type tagRunner struct {
	mu   sync.Mutex
	tags []float32
	gate chan struct{}
	took time.Duration
}

func (r *tagRunner) Run(in []ort.Input) ([][]float32, error) {
	if r.gate != nil {
		<-r.gate
	}
	if r.took > 0 {
		time.Sleep(r.took)
	}
	r.mu.Lock()
	r.tags = append(r.tags, in[0].Float32[0])
	r.mu.Unlock()
	return [][]float32{make([]float32, in[0].Shape[0])}, nil
}

func (r *tagRunner) runs() []float32 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]float32(nil), r.tags...)
}

func waitDepth(t *testing.T, b *Batcher, want int) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); b.QueueDepth() != want; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("queue depth %d, want %d", b.QueueDepth(), want)
		}
	}
}

// TestBatcherEDFAcrossInterleavedSubmissions: requests submitted
// concurrently, deadlines interleaved with arrival, run by earliest
// deadline (one request per batch), the one without a deadline last.
//
// It runs in a synctest bubble: the first request, queued, is not yet in
// the runner, and a loaded machine let later requests arrive before the
// batcher had taken it (2 of 200 runs, 4 copies at once: "run order
// [5 1 2 3 4 6 100 0]"). synctest.Wait waits until it is. The deadlines
// are fake time, which passes only while everything waits.
func TestBatcherEDFAcrossInterleavedSubmissions(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := &tagRunner{gate: make(chan struct{})}
		// A MaxDelay no request reaches: batches go because they are full,
		// so the anti-starvation rule does not reorder them.
		b := NewBatcher(spec, []Runner{r}, BatchOptions{MaxBatch: 4, MaxDelay: time.Minute})
		defer b.Close()
		var wg sync.WaitGroup
		wg.Go(func() { b.Submit(context.Background(), req(4, 100)) }) // holds the runner
		waitDepth(t, b, 4)
		synctest.Wait() // its run has begun: it is in the runner, not queued
		// tag: seconds to its deadline (0: none).
		tags := []float32{5, 1, 0, 4, 2, 6, 3}
		for i, tag := range tags {
			wg.Go(func() {
				ctx := context.Background()
				if tag > 0 {
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(ctx, time.Duration(tag)*10*time.Second)
					defer cancel()
				}
				if _, err := b.Submit(ctx, req(4, tag)); err != nil {
					t.Error(err)
				}
			})
			waitDepth(t, b, 4*(i+2)) // arrival in the order of tags
		}
		close(r.gate)
		wg.Wait()
		want := []float32{100, 1, 2, 3, 4, 5, 6, 0}
		if got := r.runs(); !equalF(got, want) {
			t.Errorf("run order %v, want %v", got, want)
		}
	})
}

func equalF(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestBatcherExpiredNotRun: a request whose deadline passes in the queue
// is answered DeadlineExceeded when it passes (not when the runner frees
// up), releases its depth at once, and never runs.
func TestBatcherExpiredNotRun(t *testing.T) {
	r := &tagRunner{gate: make(chan struct{})}
	b := NewBatcher(spec, []Runner{r}, BatchOptions{MaxBatch: 4, MaxDelay: time.Millisecond})
	defer b.Close()
	first := make(chan error, 1)
	go func() { _, err := b.Submit(context.Background(), req(4, 1)); first <- err }()
	waitDepth(t, b, 4)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	_, err := b.Submit(ctx, req(2, 2))
	var de *DeadlineError
	if !errors.As(err, &de) || !errors.Is(err, context.DeadlineExceeded) || de.Miss != 0 || !strings.Contains(err.Error(), "expired in queue") {
		t.Fatalf("err = %v, want expired in queue", err)
	}
	if d := b.QueueDepth(); d != 4 {
		t.Errorf("depth %d right after the expiry, want 4 (the running request's)", d)
	}
	close(r.gate)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if got := r.runs(); !equalF(got, []float32{1}) {
		t.Errorf("runs %v: the expired request ran", got)
	}
	if d := b.QueueDepth(); d != 0 {
		t.Errorf("depth %d at the end", d)
	}
	b.stats.mu.Lock()
	expired := b.stats.Expired
	b.stats.mu.Unlock()
	if expired != 1 {
		t.Errorf("expired count %d", expired)
	}
}

// TestBatcherPredictedMiss: with runs measured at 40 ms, a request due in
// 15 ms is refused when its batch forms, without running, with how much
// it would have missed by; one due in a second runs.
//
// It runs in a synctest bubble: the runs' 40 ms and the 15 ms deadline
// are fake time, so the predicted miss is exactly 40 - 15 ms. On the
// wall clock a loaded machine stretched the measured run (miss 119 ms,
// 57 ms; 3 of 15 runs failed, 3 copies at once).
func TestBatcherPredictedMiss(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := &tagRunner{took: 40 * time.Millisecond}
		b := NewBatcher(spec, []Runner{r}, BatchOptions{MaxBatch: 64, MaxDelay: time.Millisecond})
		defer b.Close()
		if _, err := b.Submit(context.Background(), req(4, 1)); err != nil { // measures bucket 4
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Millisecond)
		defer cancel()
		start := time.Now()
		_, err := b.Submit(ctx, req(3, 2))
		var de *DeadlineError
		if !errors.As(err, &de) || de.Miss <= 0 || !strings.Contains(err.Error(), "predicted to miss by") {
			t.Fatalf("err = %v, want predicted to miss", err)
		}
		// 40 ms of run against the 15 ms left: its latest start has
		// passed, so its batch forms at once, and it is refused then.
		if de.Miss != 25*time.Millisecond {
			t.Errorf("miss %v, want 25ms", de.Miss)
		}
		if el := time.Since(start); el != 0 {
			t.Errorf("answered after %v, want at once", el)
		}
		if d := b.QueueDepth(); d != 0 {
			t.Errorf("depth %d after the refusal", d)
		}
		ctx2, cancel2 := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel2()
		if _, err := b.Submit(ctx2, req(3, 3)); err != nil {
			t.Fatal(err)
		}
		if got := r.runs(); !equalF(got, []float32{1, 3}) {
			t.Errorf("runs %v, want [1 3]", got)
		}
	})
}

// TestBatcherNoStarvation: a request without a deadline, submitted while
// closed-loop clients keep the queue full of requests with deadlines
// (which EDF puts ahead of it), still goes once it is the oldest past its
// MaxDelay, long before the stream stops.
func TestBatcherNoStarvation(t *testing.T) {
	r := &tagRunner{took: time.Millisecond}
	b := NewBatcher(spec, []Runner{r}, BatchOptions{MaxBatch: 4, MaxDelay: 2 * time.Millisecond})
	defer b.Close()
	var stop atomic.Bool
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for !stop.Load() {
				ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
				b.Submit(ctx, req(4, 1))
				cancel()
			}
		})
	}
	defer func() { stop.Store(true); wg.Wait() }()
	for b.QueueDepth() < 8 {
		time.Sleep(time.Millisecond)
	}
	start := time.Now()
	done := make(chan error, 1)
	go func() { _, err := b.Submit(context.Background(), req(4, 7)); done <- err }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("went after %v", time.Since(start))
	case <-time.After(3 * time.Second):
		t.Fatal("a request without a deadline starved behind a stream with deadlines")
	}
}

// TestScoreDeadlineStatus: a batcher's deadline refusal reaches the
// caller as DeadlineExceeded saying why, counted under reason deadline.
func TestScoreDeadlineStatus(t *testing.T) {
	ts := startServer(t, Options{Threads: 1})
	m := ts.dense.models["dlrm-tiny"]
	for _, c := range []struct {
		err error
		msg string
	}{
		{&DeadlineError{Miss: 3 * time.Millisecond, Waited: time.Millisecond}, "predicted to miss by 3.0 ms"},
		{&DeadlineError{Waited: 60 * time.Millisecond}, "deadline expired in queue (waited 60.0 ms)"},
	} {
		st := status.Convert(ts.dense.submitError(m, c.err))
		if st.Code() != codes.DeadlineExceeded || !strings.Contains(st.Message(), c.msg) || !strings.Contains(st.Message(), `"dlrm-tiny"`) {
			t.Errorf("got %v %q, want DeadlineExceeded with %q", st.Code(), st.Message(), c.msg)
		}
	}
	// Through gRPC: the caller's deadline reaches the batcher (grpc-timeout),
	// which refuses a request its measured runs say cannot make it.
	m.batcher.mu.Lock()
	m.batcher.times.observe(4, time.Second)
	m.batcher.times.last = time.Now()
	m.batcher.mu.Unlock()
	p, err := plan.Read(tinyPlan(t))
	if err != nil {
		t.Fatal(err)
	}
	frame := encode(t, 4, cutTensors(p, 4, rand.New(rand.NewPCG(9, 9))))
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err = ts.client.Score(ctx, &prismv1.ScoreRequest{Model: "dlrm-tiny", Tensors: frame, NumSamples: 4})
	if st := status.Convert(err); st.Code() != codes.DeadlineExceeded || !strings.Contains(st.Message(), "predicted to miss by") {
		t.Errorf("over gRPC: got %v %q, want DeadlineExceeded predicted to miss", st.Code(), st.Message())
	}
	got := gather(t, ts.srv)
	if v := got["prism_dense_rejected_total{deadline}"]; v != 3 {
		t.Errorf("rejected{deadline} = %v, want 3", v)
	}
	// The batcher's own refusal is told apart: predicted to miss.
	if p, e := got["prism_dense_batcher_deadline_refused_total{predicted}"], got["prism_dense_batcher_deadline_refused_total{expired}"]; p != 1 || e != 0 {
		t.Errorf("batcher_deadline_refused_total predicted %v expired %v, want 1 and 0", p, e)
	}
	if d := m.batcher.QueueDepth(); d != 0 {
		t.Errorf("depth %d after the refusal", d)
	}
}
