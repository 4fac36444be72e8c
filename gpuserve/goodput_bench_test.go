package gpuserve

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prism-serve/prism/internal/ort"
)

// simRunner stands for ONNX Runtime on a GPU: a run of n samples takes
// base + n*per (sleeping, so it costs no CPU), outputs zeros.
type simRunner struct{ base, per time.Duration }

func (r simRunner) Run(in []ort.Input) ([][]float32, error) {
	n := int(in[0].Shape[0])
	time.Sleep(r.base + time.Duration(n)*r.per)
	return [][]float32{make([]float32, n)}, nil
}

// goodputLoad is the request mix: micro-batches of 32 to 270 samples
// (the router's halves of 270 candidates among them), each due 10 to 60 ms
// after it reaches the dense tier (what is left of a 60 ms SLO after the
// embedding tier, which varies).
type goodputLoad struct {
	sizes          []int
	minDue, maxDue time.Duration
}

var benchLoad = goodputLoad{sizes: []int{32, 64, 135, 135, 270}, minDue: 10 * time.Millisecond, maxDue: 60 * time.Millisecond}

var benchRunner = simRunner{base: time.Millisecond, per: 10 * time.Microsecond} // 256 samples: 3.56 ms

var benchBatch = BatchOptions{MaxBatch: 256, MaxDelay: 2 * time.Millisecond}

// requests builds one request per size, shared by every submission.
func (l goodputLoad) requests() map[int]Request {
	out := map[int]Request{}
	for _, n := range l.sizes {
		out[n] = req(n, 0)
	}
	return out
}

// due draws a request's time to its deadline.
func (l goodputLoad) due(rng *rand.Rand) time.Duration {
	return l.minDue + time.Duration(rng.Int64N(int64(l.maxDue-l.minDue)))
}

// poisson offers rate requests per second, Poisson arrivals from a
// seeded source, for warm+d: at each arrival next draws the request (on
// the caller's goroutine, so the draws repeat) and the send it returns
// runs in a goroutine of its own, told whether it falls in the counted
// window (from warm on). It returns once every send has.
func poisson(rate float64, warm, d time.Duration, next func(rng *rand.Rand) (send func(counted bool))) {
	rng := rand.New(rand.NewPCG(42, 7))
	var wg sync.WaitGroup
	start := time.Now()
	countFrom, end := start.Add(warm), start.Add(warm+d)
	at := start
	for {
		at = at.Add(time.Duration(rng.ExpFloat64() / rate * float64(time.Second)))
		if !at.Before(end) {
			break
		}
		time.Sleep(time.Until(at)) // behind: at once, keeping the mean rate
		send, counted := next(rng), !at.Before(countFrom)
		wg.Go(func() { send(counted) })
	}
	wg.Wait()
}

// capacity is the requests per second the batcher sustains on r with this
// mix: closed-loop clients with no deadline, arrival order, for d.
func capacity(r Runner, l goodputLoad, d time.Duration) float64 {
	b := NewBatcher(spec, []Runner{r}, benchBatch)
	defer b.Close()
	reqs := l.requests()
	var done atomic.Int64
	var wg sync.WaitGroup
	end := time.Now().Add(d)
	for c := range 64 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(c), 1))
			for time.Now().Before(end) {
				if _, err := b.Submit(context.Background(), reqs[l.sizes[rng.IntN(len(l.sizes))]]); err == nil {
					done.Add(1)
				}
			}
		})
	}
	wg.Wait()
	return float64(done.Load()) / d.Seconds()
}

// goodputRun is what an open-loop run counted.
type goodputRun struct {
	offered, good, refused, missed, overloaded int64
	seconds                                    float64
	// batches and samples run over the whole run, warm-up included.
	batches, samples int64
}

func (g goodputRun) goodput() float64 { return float64(g.good) / g.seconds }

// openLoop offers rate requests per second (Poisson arrivals, seeded) to
// a fresh batcher with order o for warm+d, counting from warm on: good is
// answered within its deadline; refused is a deadline refusal by the
// batcher (DeadlineError before running); missed is any other answer
// after the deadline; overloaded is a full queue.
func openLoop(r Runner, l goodputLoad, o Order, rate float64, warm, d time.Duration) goodputRun {
	opts := benchBatch
	opts.Order = o
	b := NewBatcher(spec, []Runner{r}, opts)
	defer b.Close()
	reqs := l.requests()
	var run goodputRun
	var good, refused, missed, overloaded, offered atomic.Int64
	poisson(rate, warm, d, func(rng *rand.Rand) func(bool) {
		n := l.sizes[rng.IntN(len(l.sizes))]
		due := l.due(rng)
		return func(counted bool) {
			sent := time.Now()
			ctx, cancel := context.WithDeadline(context.Background(), sent.Add(due))
			defer cancel()
			_, err := b.Submit(ctx, reqs[n])
			took := time.Since(sent)
			if !counted {
				return
			}
			offered.Add(1)
			var de *DeadlineError
			switch {
			case err == nil && took <= due:
				good.Add(1)
			case errors.As(err, &de):
				refused.Add(1)
			case errors.Is(err, ErrOverloaded):
				overloaded.Add(1)
			default:
				missed.Add(1)
			}
		}
	})
	run.batches, run.samples, _, _ = b.Snapshot()
	run.offered, run.good, run.refused, run.missed, run.overloaded = offered.Load(), good.Load(), refused.Load(), missed.Load(), overloaded.Load()
	run.seconds = d.Seconds()
	return run
}

// BenchmarkGoodputOverload: goodput (requests answered within their
// deadline per second) at 1.2x the load the batcher sustains on a
// simulated runner, arrival order (FIFO, the former batcher) against
// earliest deadline first with work predicted to miss refused (EDF, the
// default), in the same run. One iteration is about 8 s.
//
//	go test -run '^$' -bench GoodputOverload -benchtime 1x ./gpuserve/
func BenchmarkGoodputOverload(b *testing.B) {
	const overload = 1.2
	warm, d := 500*time.Millisecond, 3*time.Second
	for b.Loop() {
		max := capacity(benchRunner, benchLoad, time.Second)
		rate := overload * max
		fifo := openLoop(benchRunner, benchLoad, OrderFIFO, rate, warm, d)
		edf := openLoop(benchRunner, benchLoad, OrderEDF, rate, warm, d)
		for _, x := range []struct {
			name string
			g    goodputRun
		}{{"fifo", fifo}, {"edf", edf}} {
			b.Logf("%s: offered %.0f req/s (max %.0f), goodput %.0f req/s (%.0f%% of max): %d good, %d refused for deadline, %d missed, %d overloaded of %d; %d runs of %.0f samples on average",
				x.name, float64(x.g.offered)/x.g.seconds, max, x.g.goodput(), 100*x.g.goodput()/max, x.g.good, x.g.refused, x.g.missed, x.g.overloaded, x.g.offered, x.g.batches, float64(x.g.samples)/float64(x.g.batches))
		}
		b.ReportMetric(max, "max_req/s")
		b.ReportMetric(fifo.goodput(), "fifo_goodput_req/s")
		b.ReportMetric(edf.goodput(), "edf_goodput_req/s")
		b.ReportMetric(edf.goodput()/fifo.goodput(), "edf/fifo")
		b.ReportMetric(edf.goodput()/max, "edf_goodput/max")
	}
}

// deviceRunner is a model's session on a device shared with other
// models' sessions: a run holds the device (one at a time, in the order
// the mutex grants it) for the simulated run's time.
type deviceRunner struct {
	device *sync.Mutex
	simRunner
}

func (r deviceRunner) Run(in []ort.Input) ([][]float32, error) {
	r.device.Lock()
	defer r.device.Unlock()
	return r.simRunner.Run(in)
}

// twoModels offers rate requests per second in all, Poisson, half to
// each of two models served by one worker on one device, with a shared
// RunGate of one slot or none, for warm+d; good counts, per model, the
// answers within their deadlines.
func twoModels(loads [2]goodputLoad, gate bool, rate float64, warm, d time.Duration) (good [2]int64, offered [2]int64) {
	device := new(sync.Mutex)
	opts := benchBatch
	if gate {
		opts.Gate = NewRunGate(1)
	}
	var bs [2]*Batcher
	var reqs [2]map[int]Request
	for i := range bs {
		bs[i] = NewBatcher(spec, []Runner{deviceRunner{device, benchRunner}}, opts)
		defer bs[i].Close()
		reqs[i] = loads[i].requests()
	}
	var goodN, offeredN [2]atomic.Int64
	poisson(rate, warm, d, func(rng *rand.Rand) func(bool) {
		m := rng.IntN(2)
		l := loads[m]
		n := l.sizes[rng.IntN(len(l.sizes))]
		due := l.due(rng)
		return func(counted bool) {
			sent := time.Now()
			ctx, cancel := context.WithDeadline(context.Background(), sent.Add(due))
			defer cancel()
			_, err := bs[m].Submit(ctx, reqs[m][n])
			if !counted {
				return
			}
			offeredN[m].Add(1)
			if err == nil && time.Since(sent) <= due {
				goodN[m].Add(1)
			}
		}
	})
	for i := range good {
		good[i], offered[i] = goodN[i].Load(), offeredN[i].Load()
	}
	return good, offered
}

// BenchmarkGoodputTwoModels: two models on one worker's device, one due
// 10 to 30 ms after its requests arrive and one 100 to 300 ms, offered
// together at the rate one model's batcher sustains on the device alone:
// each model's share answered within its deadline, with the worker's
// run gate (batches granted the device by deadline across the models)
// against none (each model's batches take the device as formed). One
// iteration is about 8 s.
//
//	go test -run '^$' -bench GoodputTwoModels -benchtime 1x ./gpuserve/
var twoModelsLoad = 0.7

func BenchmarkGoodputTwoModels(b *testing.B) {
	loads := [2]goodputLoad{
		{sizes: benchLoad.sizes, minDue: 6 * time.Millisecond, maxDue: 15 * time.Millisecond},
		{sizes: benchLoad.sizes, minDue: 100 * time.Millisecond, maxDue: 300 * time.Millisecond},
	}
	warm, d := 500*time.Millisecond, 3*time.Second
	for b.Loop() {
		rate := twoModelsLoad * capacity(benchRunner, benchLoad, time.Second)
		var share [2][2]float64 // [gate][model]
		for g, gate := range []bool{false, true} {
			good, offered := twoModels(loads, gate, rate, warm, d)
			for m := range good {
				share[g][m] = float64(good[m]) / float64(max(offered[m], 1))
			}
			b.Logf("gate %v: offered %.0f req/s; within deadline: tight model %d of %d (%.1f%%), loose model %d of %d (%.1f%%)",
				gate, rate, good[0], offered[0], 100*share[g][0], good[1], offered[1], 100*share[g][1])
		}
		b.ReportMetric(100*share[0][0], "tight_%_nogate")
		b.ReportMetric(100*share[1][0], "tight_%_gate")
		b.ReportMetric(100*share[0][1], "loose_%_nogate")
		b.ReportMetric(100*share[1][1], "loose_%_gate")
	}
}
