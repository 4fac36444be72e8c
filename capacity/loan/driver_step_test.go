package loan

import (
	"testing"
	"time"

	"github.com/prism-serve/prism/capacity"
	"github.com/prism-serve/prism/internal/clockstep"
)

// TestPromotionAfterAClockStep: a loan started while the host's clock
// was an hour behind (a VM resumed from a snapshot), which NTP then
// steps right, borrows ahead of a promotion as the calendar (wall time)
// places it. The calendar was placed once, from the start's wall clock:
// every promotion came an hour late.
func TestPromotionAfterAClockStep(t *testing.T) {
	r := newRig(t, capacity.Options{Policy: capacity.Predictive, StartupEstimate: 5 * time.Second, MinLease: time.Minute, CoolDown: time.Second, MaxBorrowed: 2}, true)
	base := time.Now()
	behind, ok := clockstep.Step(base, -time.Hour)
	if !ok {
		t.Skip("no stepped clock readings on this runtime")
	}
	r.now, r.d.start = behind, behind
	r.d.o.Promotions = []Promotion{{Start: base.Round(0).Add(30 * time.Second), Duration: time.Hour, Factor: 3}}
	for i := range 40 {
		if i == 1 {
			r.now = base.Add(r.now.Sub(behind)) // NTP steps the clock an hour forward
		}
		rate := 50.0 // half an owned worker: nothing to borrow for
		if r.now.Add(time.Second).Sub(base) > 30*time.Second {
			rate = 150 // the promotion: three times the baseline
		}
		r.step(rate, false)
		if len(r.lender.log) > 0 {
			if at := r.now.Sub(base); at < 20*time.Second || at >= 30*time.Second {
				t.Errorf("borrowed at %v, want ahead of the promotion at 30s by about the start-up time (5s) and a tick", at)
			}
			return
		}
	}
	t.Fatal("nothing borrowed in 40 s")
}
