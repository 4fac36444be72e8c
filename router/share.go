package router

import (
	"sync"
	"time"
)

// shareCtl adapts the share of a request's time to its deadline that
// admission by predicted time may fill (issue 18) to the deadlines the
// admitted requests miss. Options.AdmitShare is its ceiling and where it
// starts. The busy-time rate predicts a request's finish as if the queue
// drained evenly; near saturation the queue does not (micro-batches
// wait for a dense worker, batches differ in size, the machine's other
// work takes its turn), and a request admitted to finish just inside its
// deadline misses it, after both tiers did its work: on a 16-core host
// the default admitted 14% of the offered load that then missed
// (BENCHMARKS.md). Where more than shareMissHigh of a window's answers
// missed, the share shrinks by shareDown, so requests are admitted only
// with headroom; each window without a miss grows it back by shareUp,
// and one in which nine answers in ten took less than shareSlack of
// their time to the deadline puts it back at the ceiling at once: load
// has fallen, and a share learned under overload would otherwise refuse
// a light load until enough answers had grown it back (seen: a 2-client
// closed loop after a 16-client warm-up had 1,500-2,900 of 3,700-4,600
// requests refused). Windows are latencyWindow's, as the limiter's. Under light load nothing misses and the share stays at its
// ceiling: admission refuses no more than the prediction alone does.
//
// Its clock is the caller's (record takes now): tests drive it with a
// logical clock.
type shareCtl struct {
	mu      sync.Mutex
	share   float64
	ceiling float64
	win     latencyWindow
}

const (
	// A window closes after shareWindowN answers and shareWindowT.
	shareWindowN = 32
	shareWindowT = 50 * time.Millisecond
	// shareMissHigh is the share of a window's answers that may miss
	// their deadline before the admission share shrinks.
	shareMissHigh = 0.02
	shareDown     = 0.85
	shareUp       = 1.05
	// shareSlack: a window whose answers took less than this share of
	// their time to the deadline at its 90th percentile resets the
	// share to its ceiling.
	shareSlack = 0.5
	// shareMin is the least share: below it admission would refuse
	// requests the system can still serve in time.
	shareMin = 0.3
)

func newShareCtl(ceiling float64) *shareCtl {
	return &shareCtl{share: ceiling, ceiling: ceiling}
}

// get is the share now.
func (c *shareCtl) get() float64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.share
}

// record notes an admitted request answered (missed false) or past its
// deadline (missed true) at now, having taken latency of budget (its
// time to the deadline at admission), and acts when the window is full.
func (c *shareCtl) record(now time.Time, latency, budget time.Duration, missed bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.win.add(now, latency, budget, missed, shareWindowN, shareWindowT) {
		return
	}
	q, misses, n := c.win.summary(0.9)
	switch {
	case float64(misses) > shareMissHigh*float64(n):
		c.share = max(c.share*shareDown, min(shareMin, c.ceiling))
	case q < shareSlack:
		c.share = c.ceiling
	case misses == 0:
		c.share = min(c.share*shareUp, c.ceiling)
	}
	c.win.reset(now)
}
