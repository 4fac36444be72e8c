package router

import (
	"sync"
	"time"
)

// limiter adapts a limit on the samples in flight to the latencies the
// requests admitted under it get (issue 18), as a congestion window
// adapts to round-trip times: the limit grows while it binds (requests
// were refused by it) and the window's high quantile of latency, as a
// share of each request's time to its deadline, stays well inside it;
// it shrinks when that quantile nears the deadline or deadlines are
// missed.
//
// Why a limit and not a prediction per request: under overload the
// tiers share their cores among every request in them, so a request's
// latency depends on the work in flight during its whole life, the work
// admitted after it included, not only on what was ahead of it at
// admission (a latency table by work ahead, tried first, read requests
// admitted with little ahead as slow whenever many were admitted after
// them, and refused everything above such a bucket). With arrivals
// above capacity the limit is always full, and the system runs as a
// closed loop of that many samples; the limit finds the largest such
// loop whose latencies meet the deadlines.
//
// Its clock is the caller's (record takes now) and it holds no
// goroutine: tests drive it with a logical clock.
type limiter struct {
	mu sync.Mutex
	// limit in samples; 0 until the first window closes (the caller
	// admits by the rate rule until then, and the first limit is the
	// most that rule had in flight).
	limit float64
	// The current window (its answers' latency shares), the most
	// samples in flight seen in it, whether the limit refused a request.
	win   latencyWindow
	peak  int64
	bound bool
}

const (
	// A window closes after limitWindowN answers and limitWindowT.
	limitWindowN = 16
	limitWindowT = 50 * time.Millisecond
	// limitQuantile of a window's latency shares is compared with
	// limitGrowBelow (the limit grows by limitGrow when it bound) and
	// limitShrinkAbove (it shrinks to limitShrink of the samples in
	// flight at the window's peak, or of the limit if that is lower;
	// limitCollapse when more than limitMissShare of the window missed
	// its deadline: a limit far above the work that meets deadlines,
	// such as one learned under a closed loop with long deadlines, must
	// come down within a few windows, not a few seconds).
	limitQuantile    = 0.9
	limitGrowBelow   = 0.65
	limitShrinkAbove = 0.75
	limitGrow        = 1.06
	limitShrink      = 0.9
	limitCollapse    = 0.6
	limitMissShare   = 0.1
	// limitMin samples: the limit's floor (a request with nothing ahead
	// of it is admitted whatever the limit, so the system never stops).
	limitMin = 64
)

// allow says whether a request of n samples, with cur samples in flight
// counting its own, fits the limit; known is false before the first
// window has set one. A request with nothing ahead of it is always
// allowed (refusing it frees nothing). A refusal marks the limit bound.
func (l *limiter) allow(cur, n int64) (ok, known bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.peak = max(l.peak, cur)
	if l.limit == 0 {
		return true, false
	}
	if float64(cur) <= l.limit || cur == n {
		return true, true
	}
	l.bound = true
	return false, true
}

// seen notes cur samples in flight at an answer (its own still
// counted): a window's peak is the most in flight during it, arrivals
// or not. From arrivals alone, a window of answers after the arrivals
// stopped (a burst's tail, clients backing off) had a peak of 0, and
// its slow answers shrank the limit to limitMin instead of to
// limitShrink of the work in flight that was slow.
func (l *limiter) seen(cur int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.peak = max(l.peak, cur)
}

// limitNow is the current limit in samples (0: none yet).
func (l *limiter) limitNow() float64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.limit
}

// record notes a request answered (or missed, missed true) at now,
// having taken latency of budget (its time to the deadline at
// admission), and closes the window when it is full.
func (l *limiter) record(now time.Time, latency, budget time.Duration, missed bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.win.add(now, latency, budget, missed, limitWindowN, limitWindowT) {
		return
	}
	q, misses, n := l.win.summary(limitQuantile)
	base := min(l.limit, float64(l.peak))
	switch {
	case l.limit == 0:
		l.limit = max(float64(l.peak), limitMin)
	case float64(misses) > limitMissShare*float64(n):
		l.limit = max(base*limitCollapse, limitMin)
	case q > limitShrinkAbove:
		l.limit = max(base*limitShrink, limitMin)
	case q < limitGrowBelow && l.bound:
		l.limit *= limitGrow
	}
	l.win.reset(now)
	l.peak, l.bound = 0, false
}
