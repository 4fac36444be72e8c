package router

import (
	"math"
	"slices"
	"sort"
	"time"
)

// latencyWindow collects the answers of admitted requests for the
// admission controllers that act once per window (limiter, shareCtl):
// each answer's latency as a share of its time to the deadline at
// admission, +Inf for a miss (or an answer admitted with no time left).
// Its clock is the caller's.
type latencyWindow struct {
	shares   []float64
	openedAt time.Time
}

// add notes an answer at now, having taken latency of budget, and
// reports whether the window holds at least minN answers over minT.
func (w *latencyWindow) add(now time.Time, latency, budget time.Duration, missed bool, minN int, minT time.Duration) (full bool) {
	if w.openedAt.IsZero() {
		w.openedAt = now
	}
	share := math.Inf(1)
	if !missed && budget > 0 {
		share = float64(latency) / float64(budget)
	}
	w.shares = append(w.shares, share)
	return len(w.shares) >= minN && now.Sub(w.openedAt) >= minT
}

// summary is the window's q-quantile share, its misses and its answers
// (it sorts the shares).
func (w *latencyWindow) summary(q float64) (quantile float64, misses, n int) {
	slices.Sort(w.shares)
	n = len(w.shares)
	return w.shares[int(math.Ceil(q*float64(n)))-1], n - sort.SearchFloat64s(w.shares, math.Inf(1)), n
}

// reset opens the next window at now.
func (w *latencyWindow) reset(now time.Time) { w.shares, w.openedAt = w.shares[:0], now }
