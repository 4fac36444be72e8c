package router

import (
	"fmt"
	"math"
	"sync"
	"time"
)

// predictor estimates when a newly admitted request would finish, so
// the router can refuse at once what would miss its deadline anyway
// (admission by predicted time; issue 18). Its clock is the caller's:
// every method takes now, so tests drive it with a logical clock.
//
// The estimator is the whole system's service rate in samples per busy
// second: answered micro-batches' samples divided by the time during
// which at least one request was in flight, over windows of at least
// predictWindow of busy time, smoothed by an EWMA (weight predictAlpha
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
	// cal is how far off the predictions were.
	cal calibration
}

// calibration tracks the ratio of a request's real time to its
// predicted time over recent requests, and gives admission its
// calibrateQuantile as a factor: a request is admitted when predicted
// times factor fits before its deadline. The rate model predicts a
// mean; requests queue behind bursts, batches run slower than average,
// and the tiers' queues are not one FIFO, so under overload admitting
// up to the deadline itself fills the system with work that finishes
// just around it, half of it late. Scaling by the measured quantile
// admits what is predicted to finish in time with that probability
// instead, and keeps the queue short enough for it; the throughput
// does not drop because under overload the queue never empties.
//
// The ratios go into a histogram with calibrateSteps buckets per
// doubling from 1/8 to 16; every calibrateHalfLife observations the
// counts halve, so the factor follows the last few hundred requests.
type calibration struct {
	counts [calibrateBuckets]float64
	total  float64
	seen   int
	factor float64 // 0: not known yet (use 1)
}

const (
	calibrateQuantile = 0.95
	calibrateSteps    = 8  // buckets per doubling
	calibrateMinExp   = -3 // the lowest bucket starts at 2^-3
	calibrateBuckets  = (4 - calibrateMinExp) * calibrateSteps
	calibrateHalfLife = 256
	// calibrateMin is how many observations the factor needs before
	// it is used.
	calibrateMin = 32
)

// observe adds one request's real/predicted ratio.
func (c *calibration) observe(ratio float64) {
	if !(ratio > 0) {
		return
	}
	i := int(math.Floor((math.Log2(ratio) - calibrateMinExp) * calibrateSteps))
	i = min(max(i, 0), calibrateBuckets-1)
	c.counts[i]++
	c.total++
	c.seen++
	if c.seen%calibrateHalfLife == 0 {
		for j := range c.counts {
			c.counts[j] /= 2
		}
		c.total /= 2
	}
	if c.seen >= calibrateMin {
		c.factor = c.quantile(calibrateQuantile)
	}
}

// quantile is the upper edge of the bucket holding the q-quantile.
func (c *calibration) quantile(q float64) float64 {
	want := q * c.total
	var sum float64
	for i, n := range c.counts {
		sum += n
		if sum >= want {
			return math.Exp2(float64(i+1)/calibrateSteps + calibrateMinExp)
		}
	}
	return math.Exp2(4)
}

// get is the factor to scale predictions by (1 until enough is seen).
func (c *calibration) get() float64 {
	if c.factor <= 0 {
		return 1
	}
	return c.factor
}

const (
	predictWindow = 50 * time.Millisecond
	predictAlpha  = 0.3
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
	if busy < predictWindow || p.done <= 0 {
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

// serviceRate is the smoothed rate in samples/s (0: no data yet) and
// the calibration factor to scale predictions by.
func (p *predictor) serviceRate() (rate, factor float64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.rate, p.cal.get()
}

// took notes that a request predicted to take predicted (unscaled; 0:
// no prediction) took took.
func (p *predictor) took(predicted, took time.Duration) {
	if predicted <= 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cal.observe(float64(took) / float64(predicted))
}

// predictFinish is the pure admission rule: at rate samples/s, a
// request of n samples behind ahead samples in flight is predicted to
// take (ahead+n)/rate; it is admitted when that times factor (the
// calibration's, 1 when not known) is within remaining (the time to
// its deadline). predicted is unscaled. With no rate yet (cold start) it is
// admitted and predicted is 0. With nothing ahead it is admitted too
// (predicted still says when it should finish): refusing it would free
// nothing, and the rate moves only when requests are answered, so a
// rate measured low once (a slow first window, a stall) would otherwise
// refuse every later request and never be measured again.
func predictFinish(rate, factor float64, ahead, n int64, remaining time.Duration) (predicted time.Duration, ok bool) {
	if rate <= 0 {
		return 0, true
	}
	predicted = time.Duration(float64(ahead+n) / rate * float64(time.Second))
	scaled := time.Duration(float64(predicted) * factor)
	return predicted, scaled <= remaining || (ahead <= 0 && remaining > 0)
}

// lateMessage is the ResourceExhausted message of a request refused by
// predicted time.
func lateMessage(predicted time.Duration, factor float64, remaining time.Duration) string {
	if factor > 1.005 || factor < 0.995 {
		return fmt.Sprintf("predicted to finish in %s ms (%s ms with the recent prediction error, x%.2f), past its deadline in %s ms; back off", ms(predicted), ms(time.Duration(float64(predicted)*factor)), factor, ms(remaining))
	}
	return fmt.Sprintf("predicted to finish in %s ms, past its deadline in %s ms; back off", ms(predicted), ms(remaining))
}

func ms(d time.Duration) string {
	return fmt.Sprintf("%.1f", float64(d)/float64(time.Millisecond))
}
