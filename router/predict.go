package router

import (
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// predictor estimates when a newly admitted request would finish, so
// the router can refuse at once what would miss its deadline anyway
// (admission by predicted time; issue 18). Its clock is the caller's:
// every method takes now, so tests drive it with a logical clock.
//
// The estimator is the whole system's service rate in samples per busy
// second: answered micro-batches' samples divided by the time during
// which at least one request was in flight, over windows of at least
// predictWindow of busy time and minWindowSamples samples, smoothed by an EWMA (weight predictAlpha
// per window). Counting only busy time keeps idle gaps from reading as
// a slow system. A request with ahead samples already in flight and n
// of its own is predicted to take (ahead+n)/rate: with nothing ahead
// that is the latency measured at the concurrency seen, and under a
// backlog it is the time to drain the queue at the measured rate, as in
// a FIFO queue. It errs pessimistic only in a sudden burst after a long
// stretch of low concurrency (the rate measured then is below what more
// concurrency gets), and corrects itself within one window. Before the
// first window closes there is no rate, and admission is by count only.
type predictor struct {
	mu sync.Mutex
	// rate is the smoothed service rate in samples/s; 0: no data yet.
	rate float64
	// active counts the requests in flight; busySince is when the
	// current busy period (or window within it) started.
	active    int64
	busySince time.Time
	// busy and done are the current window's busy time (closed
	// periods) and answered samples.
	busy time.Duration
	done int64
	// floor is the smoothed latency, in seconds, a request admitted with
	// nothing ahead of it took beyond its n/rate: the part of a request's
	// time that pipelining does not hide (its micro-batches' embedding
	// lookup and dense scoring one after the other, the hops between).
	// (ahead+n)/rate alone leaves it out and admitted requests that
	// finished a few milliseconds past their deadline, after both tiers
	// had done their work.
	floor float64
}

const (
	// A window closes once it holds predictWindow of busy time and
	// minWindowSamples answered samples: a window of one small request
	// (the first after a start, whose connections and sessions are
	// cold, at 4 candidates: 64 samples/s) set a rate that refused
	// requests at a hundredth of the capacity until the EWMA forgot it.
	predictWindow    = 50 * time.Millisecond
	minWindowSamples = 256
	predictAlpha     = 0.3
	// floorAlpha is the EWMA weight of each lone request's latency in
	// floor.
	floorAlpha = 0.2
)

// begin notes a request admitted at now.
func (p *predictor) begin(now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.active == 0 {
		p.busySince = now
	}
	p.active++
}

// end notes a request finished (whatever its outcome) at now.
func (p *predictor) end(now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.active--
	if p.active == 0 {
		p.busy += now.Sub(p.busySince)
	}
}

// answered notes a micro-batch of n samples answered at now, and closes
// the window when it holds enough busy time.
func (p *predictor) answered(now time.Time, n int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.done += n
	busy := p.busy
	if p.active > 0 {
		busy += now.Sub(p.busySince)
	}
	if busy < predictWindow || p.done < minWindowSamples {
		return
	}
	sample := float64(p.done) / busy.Seconds()
	if p.rate == 0 {
		p.rate = sample
	} else {
		p.rate = predictAlpha*sample + (1-predictAlpha)*p.rate
	}
	p.busy, p.done = 0, 0
	if p.active > 0 {
		p.busySince = now
	}
}

// alone notes the latency of a request of n samples that was admitted
// with nothing ahead of it and answered: what it took beyond n/rate
// moves floor.
func (p *predictor) alone(latency time.Duration, n int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.rate <= 0 {
		return
	}
	x := max(latency.Seconds()-float64(n)/p.rate, 0)
	p.floor = floorAlpha*x + (1-floorAlpha)*p.floor
}

// estimate is the smoothed service rate in samples/s and the floor (0
// and 0 before any data), read together under one lock: admission reads
// both for every request.
func (p *predictor) estimate() (rate float64, floor time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.rate, time.Duration(p.floor * float64(time.Second))
}

// predictFinish is the pure admission rule: at rate samples/s, a
// request of n samples behind ahead samples in flight is predicted to
// take floor + (ahead+n)/rate; it is admitted when that is within remaining
// (the time to its deadline). With no rate yet (cold start) it is
// admitted and predicted is 0. With nothing ahead it is admitted too
// (predicted still says when it should finish): refusing it would free
// nothing, and the rate moves only when requests are answered, so a
// rate measured low once (a slow first window, a stall) would otherwise
// refuse every later request and never be measured again.
func predictFinish(rate float64, floor time.Duration, ahead, n int64, remaining time.Duration) (predicted time.Duration, ok bool) {
	if rate <= 0 {
		return 0, true
	}
	// A rate near zero or a large backlog makes more seconds than a
	// Duration holds: converted as they are, they wrapped negative and
	// admitted the request. Past it the prediction is the longest
	// Duration, later than any deadline.
	wait := float64(ahead+n) / rate * float64(time.Second)
	if wait+float64(floor) < math.MaxInt64 { // false for NaN too
		predicted = floor + time.Duration(wait)
	} else {
		predicted = math.MaxInt64
	}
	return predicted, predicted <= remaining || (ahead <= 0 && remaining > 0)
}

// lateMessage is the ResourceExhausted message of a request refused by
// predicted time, with share the admission share its budget was of the
// remaining time: below 1 it says so, or a request predicted to finish
// well inside its deadline read as refused for being past it.
func lateMessage(predicted, remaining time.Duration, share float64) string {
	if share < 1 {
		return fmt.Sprintf("predicted to finish in %s ms, past %.0f%% of the %s ms to its deadline, the share admission allows now (prism_router_admit_share); back off", ms(predicted), 100*share, ms(remaining))
	}
	return fmt.Sprintf("predicted to finish in %s ms, past its deadline in %s ms; back off", ms(predicted), ms(remaining))
}

func ms(d time.Duration) string {
	return fmt.Sprintf("%.1f", float64(d)/float64(time.Millisecond))
}

// predictors are admission's predictors, one per model: a request is
// predicted from its model's service rate and the samples of its model
// in flight ahead of it. One predictor for all models mixed them: a
// model a tenth as costly per sample was predicted at the rate of the
// mix, and a request of it behind another model's backlog was predicted
// to wait for samples that do not share its cost. Models come from
// validated requests (served models only).
type predictors struct {
	// m is model name -> *modelPredictor: read on every request and
	// answered micro-batch, written once per model (a sync.Map, no lock
	// shared by the requests).
	m sync.Map
	// active is how many models had a request admitted within
	// activeWindow, counted at activeAt (Unix nanoseconds) and counted
	// again at most every activeRecount.
	active   atomic.Int64
	activeAt atomic.Int64
}

const (
	// activeWindow: a model with a request admitted within it is active.
	// Long against a request's deadline, so a model with a light but
	// steady load stays active between its requests (its share is kept
	// for it), short enough that a model whose traffic stopped gives its
	// share back within a second.
	activeWindow = time.Second
	// activeRecount bounds how often the active models are counted (a
	// walk over every model's predictor).
	activeRecount = 50 * time.Millisecond
)

// activeModels is how many models had a request admitted within
// activeWindow of now, the caller's model (mp) counted whether or not
// it had: a model whose every request was refused (the admission limit
// filled by another model when its first came) was never counted, so
// never given a share.
func (ps *predictors) activeModels(mp *modelPredictor, now time.Time) int64 {
	t := now.UnixNano()
	n := int64(1)
	if active(t, mp.admitted.Load()) {
		n = 0 // counted below
	}
	if at := ps.activeAt.Load(); t-at < int64(activeRecount) && t >= at {
		return max(n+ps.active.Load(), 1)
	}
	var all int64
	ps.m.Range(func(_, p any) bool {
		if active(t, p.(*modelPredictor).admitted.Load()) {
			all++
		}
		return true
	})
	ps.active.Store(all)
	ps.activeAt.Store(t)
	return max(n+all, 1)
}

// active says whether a model last admitted at admitted (Unix
// nanoseconds) is active at t. Wall-clock stamps: one ahead of t by
// more than a window (the clock stepped back since) is not active for
// as long as the step; one a little ahead is a request admitted
// meanwhile.
func active(t, admitted int64) bool {
	d := t - admitted
	return d < int64(activeWindow) && d > -int64(activeWindow)
}

// modelPredictor is one model's predictor and its samples in flight.
type modelPredictor struct {
	predictor
	inflight atomic.Int64
	// samples are its samples in flight as the router counts them (a
	// request's candidates; inflight counts its work, a fixed batch's
	// padding in): its share of the router's (fairShare) is of these.
	samples atomic.Int64
	// admitted is when a request of the model was last admitted (Unix
	// nanoseconds; 0 never): models admitted within activeWindow share
	// the router's admission (fairShare).
	admitted atomic.Int64
}

// get returns model's predictor, made on first use.
func (ps *predictors) get(model string) *modelPredictor {
	if p, ok := ps.m.Load(model); ok {
		return p.(*modelPredictor)
	}
	p, _ := ps.m.LoadOrStore(model, &modelPredictor{})
	return p.(*modelPredictor)
}

var (
	predRateDesc  = prometheus.NewDesc("prism_router_predicted_rate_samples_per_second", "Admission's smoothed service rate of each model (samples per busy second; 0 before the first window).", []string{"model"}, nil)
	predFloorDesc = prometheus.NewDesc("prism_router_predicted_floor_seconds", "Admission's smoothed floor of each model: what a request admitted with nothing of its model ahead took beyond its samples over the rate.", []string{"model"}, nil)
)

// Describe and Collect export each model's rate and floor.
func (ps *predictors) Describe(ch chan<- *prometheus.Desc) {
	ch <- predRateDesc
	ch <- predFloorDesc
}

func (ps *predictors) Collect(ch chan<- prometheus.Metric) {
	ps.m.Range(func(name, p any) bool {
		rate, floor := p.(*modelPredictor).estimate()
		ch <- prometheus.MustNewConstMetric(predRateDesc, prometheus.GaugeValue, rate, name.(string))
		ch <- prometheus.MustNewConstMetric(predFloorDesc, prometheus.GaugeValue, floor.Seconds(), name.(string))
		return true
	})
}
