package gpuserve

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prism-serve/prism/internal/ort"
)

// sumRunner is a test double for ONNX Runtime: output = sum of each
// sample's inputs; it records batch sizes and can block.
type sumRunner struct {
	mu    sync.Mutex
	sizes []int
	gate  chan struct{}
	fail  error
}

func (r *sumRunner) Run(in []ort.Input) ([][]float32, error) {
	if r.gate != nil {
		<-r.gate
	}
	n := int(in[0].Shape[0])
	r.mu.Lock()
	r.sizes = append(r.sizes, n)
	r.mu.Unlock()
	if r.fail != nil {
		return nil, r.fail
	}
	out := make([]float32, n)
	for _, x := range in {
		w := len(x.Float32) / n
		for s := range n {
			for j := range w {
				out[s] += x.Float32[s*w+j]
			}
		}
	}
	return [][]float32{out}, nil
}

var spec = []InputSpec{{Name: "a", Width: 2, Shape: []int64{2}}, {Name: "b", Width: 1, Shape: []int64{1}}}

func req(n int, v float32) Request {
	a := make([]float32, 2*n)
	b := make([]float32, n)
	for i := range n {
		a[2*i], a[2*i+1], b[i] = v, float32(i), 0
	}
	return Request{N: n, Inputs: [][]float32{a, b}}
}

func TestBatcherMergesAndSplits(t *testing.T) {
	r := &sumRunner{}
	b := NewBatcher(spec, []Runner{r}, BatchOptions{MaxBatch: 64, MaxDelay: 50 * time.Millisecond})
	defer b.Close()
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for k := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out, err := b.Submit(context.Background(), req(8, float32(100*k)))
			if err != nil {
				errs <- err
				return
			}
			for i, v := range out[0] {
				if v != float32(100*k+i) {
					errs <- errors.New("request got another request's rows")
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	total := 0
	for _, s := range r.sizes {
		total += s
	}
	if total != 64 || len(r.sizes) > 3 {
		t.Errorf("batch sizes %v: 8 concurrent requests of 8 should share a few runs", r.sizes)
	}
}

func TestBatcherDelayFlushes(t *testing.T) {
	r := &sumRunner{}
	b := NewBatcher(spec, []Runner{r}, BatchOptions{MaxBatch: 1024, MaxDelay: time.Millisecond})
	defer b.Close()
	start := time.Now()
	if _, err := b.Submit(context.Background(), req(3, 1)); err != nil {
		t.Fatal(err)
	}
	if el := time.Since(start); el > 2*time.Second {
		t.Fatalf("a lone request waited %s", el)
	}
}

func TestBatcherOverload(t *testing.T) {
	r := &sumRunner{gate: make(chan struct{})}
	b := NewBatcher(spec, []Runner{r}, BatchOptions{MaxBatch: 4, MaxDelay: time.Millisecond, MaxQueue: 8})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() { defer wg.Done(); b.Submit(ctx, req(4, 0)) }()
	}
	for b.QueueDepth() < 8 {
		time.Sleep(time.Millisecond)
	}
	if _, err := b.Submit(ctx, req(1, 0)); !errors.Is(err, ErrOverloaded) {
		t.Fatalf("err = %v, want ErrOverloaded", err)
	}
	close(r.gate)
	wg.Wait()
	cancel()
	b.Close()
	if _, err := b.Submit(context.Background(), req(1, 0)); !errors.Is(err, ErrClosed) {
		t.Fatalf("after Close: %v", err)
	}
}

func TestBatcherErrorsAndBadInput(t *testing.T) {
	r := &sumRunner{fail: errors.New("boom")}
	b := NewBatcher(spec, []Runner{r}, BatchOptions{})
	defer b.Close()
	if _, err := b.Submit(context.Background(), req(2, 0)); err == nil || err.Error() != "boom" {
		t.Fatalf("err = %v", err)
	}
	bad := req(2, 0)
	bad.Inputs[0] = bad.Inputs[0][:3]
	if _, err := b.Submit(context.Background(), bad); err == nil {
		t.Fatal("short input accepted")
	}
	if _, err := b.Submit(context.Background(), Request{}); err == nil {
		t.Fatal("empty request accepted")
	}
}

// TestCancelledRequestsLeaveNoDebt: requests cancelled while queued are
// dropped, and the queue count returns to zero (it used to drift upwards
// with every cancellation until the batcher refused everything).
//
// It runs in a synctest bubble, so the first run does hold the runner
// after the 30 ms pause (fake time, past the 20 ms delay), as the test
// means, however loaded the machine.
func TestCancelledRequestsLeaveNoDebt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := &sumRunner{gate: make(chan struct{})}
		b := NewBatcher(spec, []Runner{r}, BatchOptions{MaxBatch: 64, MaxDelay: 20 * time.Millisecond})
		defer b.Close()
		blocker := make(chan error)
		go func() { _, err := b.Submit(context.Background(), req(1, 0)); blocker <- err }()
		for b.QueueDepth() == 0 {
			time.Sleep(time.Millisecond)
		}
		time.Sleep(30 * time.Millisecond) // the first run is now blocked in the runner
		ctx, cancel := context.WithCancel(context.Background())
		cancelled := make(chan error)
		go func() { _, err := b.Submit(ctx, req(10, 0)); cancelled <- err }()
		live := make(chan error)
		go func() { _, err := b.Submit(context.Background(), req(5, 0)); live <- err }()
		for b.QueueDepth() < 16 {
			time.Sleep(time.Millisecond)
		}
		cancel()
		if err := <-cancelled; !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled: %v", err)
		}
		close(r.gate)
		if err := <-blocker; err != nil {
			t.Fatal(err)
		}
		if err := <-live; err != nil {
			t.Fatal(err)
		}
		// Both were queued before the runner was let go, so they share the
		// last run (or the cancelled one ran first): with every answer in,
		// nothing is left counted. No waiting: see TestDepthSettledOnAnswer.
		if d := b.QueueDepth(); d != 0 {
			t.Fatalf("queue depth %d after everything finished", d)
		}
	})
}

// TestDepthSettledOnAnswer: a request's samples leave QueueDepth before
// its caller has the answer, so a caller that holds its scores never
// sees them counted (the queue-depth gauge once read 270 after every
// request of TestScoreMatchesDenseModel had its scores: the run gave the
// answers out, then uncounted). Runs of one request and of several; a
// regression shows as an occasional nonzero depth, more often with
// -cpu 4 or -race, so the loop is long.
func TestDepthSettledOnAnswer(t *testing.T) {
	r := &sumRunner{}
	b := NewBatcher(spec, []Runner{r}, BatchOptions{MaxBatch: 4, MaxDelay: time.Second})
	defer b.Close()
	for i := range 20000 {
		// Alone: a full batch, run at once.
		if _, err := b.Submit(context.Background(), req(4, 0)); err != nil {
			t.Fatal(err)
		}
		if d := b.QueueDepth(); d != 0 {
			t.Fatalf("round %d: depth %d after the only request got its answer", i, d)
		}
	}
	for i := range 500 {
		// Two halves that fill one batch between them.
		var wg sync.WaitGroup
		for range 2 {
			wg.Go(func() {
				if _, err := b.Submit(context.Background(), req(2, 0)); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
		if d := b.QueueDepth(); d != 0 {
			t.Fatalf("round %d: depth %d after both requests got their answers", i, d)
		}
	}
}

// TestFailedRunsNotCountedScored: prism_dense_samples_total ("Samples
// scored by dense.onnx") and the batch counters come from Snapshot; a run
// that ONNX Runtime failed scored nothing and must not count.
func TestFailedRunsNotCountedScored(t *testing.T) {
	r := &sumRunner{fail: errors.New("boom")}
	b := NewBatcher(spec, []Runner{r}, BatchOptions{})
	defer b.Close()
	if _, err := b.Submit(context.Background(), req(3, 0)); err == nil {
		t.Fatal("failed run answered without error")
	}
	if batches, samples, _, _ := b.Snapshot(); batches != 0 || samples != 0 {
		t.Errorf("after one failed run: %d batches, %d samples counted scored; want 0, 0", batches, samples)
	}
}
