package storebench

import (
	"testing"
	"time"
)

// TestQuantileNearestRank: the p99 of 100 batches is the 99th latency,
// not the slowest.
func TestQuantileNearestRank(t *testing.T) {
	var r Result
	for i := 100; i >= 1; i-- {
		r.Latencies = append(r.Latencies, time.Duration(i))
	}
	for _, tc := range []struct {
		q    float64
		want time.Duration
	}{{0.99, 99}, {0.5, 50}, {1, 100}, {0, 1}} {
		if got := r.Quantile(tc.q); got != tc.want {
			t.Errorf("Quantile(%v) = %v, want %v", tc.q, got, tc.want)
		}
	}
	if got := (Result{}).Quantile(0.99); got != 0 {
		t.Errorf("Quantile of none = %v", got)
	}
}
