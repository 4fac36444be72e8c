package sim

import (
	"testing"
	"time"

	"github.com/prism-serve/prism/capacity"
)

// TestPredictiveLeadIsTheStartup: the predictive policy borrows ahead of
// a promotion by the time a borrowed worker needs to serve. Until it has
// measured one it takes its estimate, which the simulation knows: the
// start it simulates (--startup). With the controller's own default (2m)
// instead, a 10m start borrowed 2m10s ahead of the only promotion, whose
// first 8 minutes went unserved: the what-if showed the predictive
// policy missing the SLO where, run with startup=10m, it would not.
func TestPredictiveLeadIsTheStartup(t *testing.T) {
	c := spike(capacity.Predictive)
	c.Startup = 10 * time.Minute
	r, err := Run(c)
	if err != nil {
		t.Fatal(err)
	}
	start := c.Promotions[0].Start
	if at := firstBorrow(r); at < 0 || at > start-c.Startup {
		t.Errorf("first borrowed at %v, want by %v (the promotion at %v less the 10m start)", at, start-c.Startup, start)
	}
	for _, p := range r.Points {
		if p.T >= start && p.T < start+c.Promotions[0].Duration && p.Capacity < p.Demand {
			t.Errorf("at %v in the promotion: capacity %v under demand %v", p.T, p.Capacity, p.Demand)
			break
		}
	}
	// An estimate given is kept.
	c.Controller.StartupEstimate = 3 * time.Minute
	c.EnsureDefaults()
	if c.Controller.StartupEstimate != 3*time.Minute {
		t.Errorf("startup estimate %v, want the 3m given", c.Controller.StartupEstimate)
	}
}
