package gpuserve

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/internal/arrowframe"
	"github.com/prism-serve/prism/internal/ort"
	"github.com/prism-serve/prism/internal/serve"
	"github.com/prism-serve/prism/plan"
)

// trackPool stands in for serve.Pool: it counts the buffers handed out
// and not yet back, notes a buffer put back twice or never handed out,
// and poisons (all bits set: NaN) every buffer put back, so a reader
// still holding one sees NaN instead of the request's numbers.
type trackPool struct {
	inner mem.BufferPool
	mu    sync.Mutex
	out   map[*[]byte]bool
	gets  int
	bad   int // Puts of a buffer not out (twice, or never handed out)
}

func (p *trackPool) Get(n int) *[]byte {
	b := p.inner.Get(n)
	p.mu.Lock()
	p.out[b] = true
	p.gets++
	p.mu.Unlock()
	return b
}

func (p *trackPool) Put(b *[]byte) {
	p.mu.Lock()
	if !p.out[b] {
		p.bad++
	}
	delete(p.out, b)
	p.mu.Unlock()
	for i := range *b {
		(*b)[i] = 0xff
	}
	// Not handed on to inner: a poisoned buffer must not serve anyone.
}

func (p *trackPool) state() (out, gets, bad int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.out), p.gets, p.bad
}

// usePool installs p as serve.Pool until the test ends. The test calls
// Score directly (no gRPC), so only decode's expansions use it.
func usePool(t *testing.T) *trackPool {
	p := &trackPool{inner: serve.Pool, out: map[*[]byte]bool{}}
	old := serve.Pool
	serve.Pool = p
	t.Cleanup(func() { serve.Pool = old })
	return p
}

// poisonRunner blocks each run until release (nil: never blocks), then
// checks its inputs for the pool's poison and answers zeros (or fail).
type poisonRunner struct {
	started  chan struct{}
	release  chan struct{}
	fail     error
	poisoned atomic.Int32
}

func (r *poisonRunner) Run(in []ort.Input) ([][]float32, error) {
	select {
	case r.started <- struct{}{}:
	default:
	}
	if r.release != nil {
		<-r.release
	}
	for _, x := range in {
		for _, v := range x.Float32 {
			if math.IsNaN(float64(v)) {
				r.poisoned.Add(1)
				break
			}
		}
	}
	if r.fail != nil {
		return nil, r.fail
	}
	return [][]float32{make([]float32, in[0].Shape[0])}, nil
}

// dictRequest is a Score request of n samples whose first cut tensor is
// dictionary-encoded: decode expands it into a buffer of serve.Pool.
func dictRequest(t *testing.T, p *plan.Plan, n int, seed uint64) *prismv1.ScoreRequest {
	t.Helper()
	ts := cutTensors(p, n, rand.New(rand.NewPCG(seed, seed+1)))
	d := &ts[0]
	d.Data = d.Data[:2*d.Width]
	d.Index = make([]int32, n)
	for i := range d.Index {
		d.Index[i] = int32(i % 2)
	}
	return &prismv1.ScoreRequest{Model: p.Model.Name, Tensors: encode(t, n, ts), NumSamples: int32(n)}
}

// settleGoroutines waits for the goroutine count to come back to base.
func settleGoroutines(t *testing.T, base int) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second) // a leak stays; a loaded host (CI) only settles late
	for runtime.NumGoroutine() > base {
		if time.Now().After(deadline) {
			t.Errorf("%d goroutines, %d before", runtime.NumGoroutine(), base)
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestScorePathsReleaseOnce drives Score down every path a request of
// dictionary-encoded columns can take (its batch gathered into memory of
// the pool), and checks that afterwards the batcher counts nothing,
// every buffer went back to the pool exactly once, none went back while
// a run still read it, and no goroutine is left behind.
//
// Each case runs in a synctest bubble: the 50 ms deadlines are fake
// time, which passes only once the tested request is queued (or
// running) and everything waits. On the wall clock a loaded machine
// could reach the deadline before the request was queued: waitDepth
// failed the case ("queue depth 1, want 5"), and the deferred Close then
// waited for the blocker's run, never released, until the binary's
// timeout (2 of 10 runs hung so, 3 copies at once). A failed case now
// lets the runs go before Close, and in the bubble a hang would be
// reported at once as a deadlock.
func TestScorePathsReleaseOnce(t *testing.T) {
	dir := tinyPlan(t)
	p, err := plan.Read(dir)
	if err != nil {
		t.Fatal(err)
	}
	// A schema's first frame is read by arrow-go, which does not pool its
	// expansions; the fast path reads the ones after.
	if _, _, err := arrowframe.Decode(dictRequest(t, p, 4, 7).Tensors); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("ort: boom")
	cases := []struct {
		name string
		// block: runs wait for release; blocker: a request (no pooled
		// buffers) holds the runner first, so the one tested queues.
		block, blocker bool
		fail           error
		timeout        time.Duration // the request's deadline (0: none)
		cancelAfter    bool          // cancel once the run (or blocker) started
		closeQueued    bool          // Close the batcher with it queued
		malformed      bool
		want           codes.Code
	}{
		{name: "scored", want: codes.OK},
		{name: "ort error", fail: boom, want: codes.Internal},
		{name: "cancelled while queued", block: true, blocker: true, cancelAfter: true, want: codes.Canceled},
		{name: "deadline while queued", block: true, blocker: true, timeout: 50 * time.Millisecond, want: codes.DeadlineExceeded},
		{name: "cancelled while running", block: true, cancelAfter: true, want: codes.Canceled},
		{name: "deadline while running", block: true, timeout: 50 * time.Millisecond, want: codes.DeadlineExceeded},
		{name: "shutdown with it queued", block: true, blocker: true, closeQueued: true, want: codes.OK},
		{name: "malformed frame", malformed: true, want: codes.InvalidArgument},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s, err := New(Options{Plans: []string{dir}, Threads: 1, Logger: slog.New(slog.DiscardHandler)})
				if err != nil {
					t.Fatal(err)
				}
				defer s.Close()
				m := s.models[p.Model.Name]
				r := &poisonRunner{started: make(chan struct{}, 1), fail: tc.fail}
				if tc.block {
					r.release = make(chan struct{})
				}
				release := sync.OnceFunc(func() {
					if r.release != nil {
						close(r.release)
					}
				})
				defer release() // a failure still lets the runs go
				old := m.batcher
				m.batcher = NewBatcher(m.spec, []Runner{r}, BatchOptions{MaxDelay: time.Microsecond})
				old.Close()
				b := m.batcher
				pool := usePool(t)
				synctest.Wait() // the old batcher's goroutines are gone
				base := runtime.NumGoroutine()

				blocked := make(chan error, 1)
				if tc.blocker {
					go func() { _, err := b.Submit(context.Background(), req1(m.spec)); blocked <- err }()
					<-r.started
				}
				ctx, cancel := context.WithCancel(context.Background())
				if tc.timeout > 0 {
					ctx, cancel = context.WithTimeout(context.Background(), tc.timeout)
				}
				defer cancel()
				sr := dictRequest(t, p, 4, 7)
				if tc.malformed {
					sr.Tensors = sr.Tensors[:len(sr.Tensors)-16]
				}
				got := make(chan error, 1)
				go func() { _, err := s.Score(ctx, sr); got <- err }()
				if tc.block && !tc.blocker {
					<-r.started // the tested request is running
				} else if tc.blocker {
					waitDepth(t, b, 1+4)
				}
				closed := make(chan struct{})
				switch {
				case tc.cancelAfter:
					cancel()
				case tc.closeQueued:
					go func() { b.Close(); close(closed) }()
					time.Sleep(20 * time.Millisecond) // Close has begun, the request still queued
				}
				var scoreErr error
				if tc.block && !tc.closeQueued {
					scoreErr = <-got // answered while the runner still holds its batch
					release()
				} else {
					if tc.block {
						release()
					}
					scoreErr = <-got
				}
				if tc.blocker {
					if err := <-blocked; err != nil {
						t.Errorf("blocker: %v", err)
					}
				}
				if tc.closeQueued {
					<-closed
				}
				if c := status.Code(scoreErr); c != tc.want {
					t.Errorf("Score: %v (%v), want %v", c, scoreErr, tc.want)
				}
				// The runner is done with everything once the batcher closes.
				b.Close()
				if d := b.QueueDepth(); d != 0 {
					t.Errorf("queue depth %d after every answer", d)
				}
				if n := r.poisoned.Load(); n != 0 {
					t.Errorf("%d runs read a buffer already back in the pool", n)
				}
				out, gets, bad := pool.state()
				// The batch's memory comes from the pool when the tested
				// request runs (its dictionary columns gathered into it); a
				// request that never ran took nothing.
				ran := !tc.malformed && !(tc.blocker && !tc.closeQueued)
				if gets == 0 && ran {
					t.Fatal("no buffer taken from the pool: the request tests nothing")
				}
				if gets != 0 && !ran {
					t.Errorf("%d buffers taken for a request that never ran", gets)
				}
				if bad != 0 {
					t.Errorf("%d buffers put back twice (or never taken)", bad)
				}
				if out != 0 && !tc.malformed {
					t.Errorf("%d of %d buffers never put back", out, gets)
				}
				settleGoroutines(t, base)
			})
		})
	}
}

// req1 is a one-sample request of zeros for spec.
func req1(spec []InputSpec) Request {
	in := make([][]float32, len(spec))
	for i, s := range spec {
		in[i] = make([]float32, s.Width)
	}
	return Request{N: 1, Inputs: in}
}

// TestConcurrentDictRequestsOwnScores: concurrent requests of distinct
// dictionary-encoded inputs through dense.onnx, some cancelled while
// queued or running, each get the scores of their own inputs (a pooled
// buffer reused under another request would give it the wrong numbers).
// Run it with -race.
func TestConcurrentDictRequestsOwnScores(t *testing.T) {
	dir := tinyPlan(t)
	p, err := plan.Read(dir)
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(Options{Plans: []string{dir}, Threads: 1, Batch: BatchOptions{MaxBatch: 16, MaxDelay: 200 * time.Microsecond}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const reqs, n = 24, 4
	want := make([][]float32, reqs)
	frames := make([]*prismv1.ScoreRequest, reqs)
	for i := range reqs {
		frames[i] = dictRequest(t, p, n, uint64(100+i))
		resp, err := s.Score(context.Background(), frames[i])
		if err != nil {
			t.Fatal(err)
		}
		want[i] = resp.Scores
	}
	base := runtime.NumGoroutine()
	var wg sync.WaitGroup
	for round := range 20 {
		for i := range reqs {
			wg.Go(func() {
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				if (i+round)%3 == 0 {
					time.AfterFunc(time.Duration(rand.IntN(300))*time.Microsecond, cancel)
				}
				resp, err := s.Score(ctx, frames[i])
				if err != nil {
					if status.Code(err) != codes.Canceled {
						t.Errorf("request %d: %v", i, err)
					}
					return
				}
				for k, v := range resp.Scores {
					if math.Abs(float64(v-want[i][k])) > 1e-5 {
						t.Errorf("round %d request %d sample %d: %v, want %v", round, i, k, v, want[i][k])
						return
					}
				}
			})
		}
		wg.Wait()
	}
	waitDepth(t, s.models[p.Model.Name].batcher, 0)
	settleGoroutines(t, base)
}

// TestCancelInRunningBatchOthersAnswered: a request cancelled while its
// batch runs returns at once; the batch's other requests still get
// their own rows, and the depth settles to zero.
//
// It runs in a synctest bubble: the 60 ms that let the batcher's 30 ms
// delay pass and its run take both requests are fake time, which passes
// only once the run holds them. On the wall clock a loaded machine had
// not always formed the run by then, and the cancelled request left the
// queue instead (2 of 160 runs, 4 copies at once: "runs [2]").
func TestCancelInRunningBatchOthersAnswered(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := &sumRunner{gate: make(chan struct{})}
		b := NewBatcher(spec, []Runner{r}, BatchOptions{MaxBatch: 64, MaxDelay: 30 * time.Millisecond})
		defer b.Close()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		gone := make(chan error, 1)
		go func() { _, err := b.Submit(ctx, req(3, 10)); gone <- err }()
		type answer struct {
			out [][]float32
			err error
		}
		kept := make(chan answer, 1)
		go func() { out, err := b.Submit(context.Background(), req(2, 20)); kept <- answer{out, err} }()
		waitDepth(t, b, 5)
		time.Sleep(60 * time.Millisecond) // past MaxDelay: both taken into one run, blocked in the runner
		cancel()
		if err := <-gone; !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled: %v", err)
		}
		close(r.gate)
		a := <-kept
		if a.err != nil {
			t.Fatal(a.err)
		}
		// req(2, 20): sample i sums 20 + i.
		if got := a.out[0]; len(got) != 2 || got[0] != 20 || got[1] != 21 {
			t.Errorf("kept request's scores %v, want [20 21]", got)
		}
		if r.sizes[0] != 5 {
			t.Errorf("runs %v: want the two requests in one run of 5", r.sizes)
		}
		waitDepth(t, b, 0)
	})
}
