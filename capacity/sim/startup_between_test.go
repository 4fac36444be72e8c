package sim

import (
	"math"
	"testing"
	"time"

	"github.com/prism-serve/prism/capacity"
)

// TestStartupBetweenTicks: a worker serves its Startup after the
// borrow, between two ticks when the tick does not divide the start.
// By hand: 2 owned workers of 100/s; 100, 3 x 300, 4 x 100 samples/s a
// minute each; the 1m tick sees 300 and borrows 3 at 1m, serving from
// 2m30s. Served: 6000 + 12000 + 6000 ([2m,2m30s) on 2 workers) + 9000
// + 18000 + 24000 = 75000 of 84000 samples; in the SLO [0,1m) and
// [2m30s,8m), 6.5 of 8 minutes. Stepped to the next tick, the borrowed
// workers served from 3m: 72000 (85.7%) and 6 of 8 minutes.
func TestStartupBetweenTicks(t *testing.T) {
	c := Config{
		Step: time.Minute, Rates: []float64{100, 300, 300, 300, 100, 100, 100, 100},
		CapacityPerWorker: 100, Owned: 2, Tick: time.Minute, Startup: 90 * time.Second,
		Drain: time.Second, Grace: 30 * time.Second, LenderIdle: 100, Exact: true,
		Controller: capacity.Options{Policy: capacity.Reactive, MinLease: time.Minute, CoolDown: time.Minute},
	}
	r, err := Run(c)
	if err != nil {
		t.Fatal(err)
	}
	rep := r.Report
	if rep.PeakBorrowed != 3 {
		t.Fatalf("peak borrowed %d, want 3 (ceil(300/70) - 2)", rep.PeakBorrowed)
	}
	if got, want := rep.SLOAttainmentPct, 100*75000.0/84000; math.Abs(got-want) > 1e-9 {
		t.Errorf("SLO attainment %.4f%%, want %.4f%%", got, want)
	}
	if got, want := rep.TicksInSLOPct, 100*6.5/8; math.Abs(got-want) > 1e-9 {
		t.Errorf("in the SLO %.4f%% of the time, want %.4f%%", got, want)
	}
}
