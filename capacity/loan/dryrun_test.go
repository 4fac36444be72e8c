package loan

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/capacity"
)

// TestDryRunDecidesAndLendsNothing: a dry run measures the demand
// between two scrapes a window apart, ticks the controller with it and
// returns its decision, and the lender sees no borrow; with the routers'
// metrics down it says why and decides from no demand.
func TestDryRunDecidesAndLendsNothing(t *testing.T) {
	for _, tc := range []struct {
		name      string
		perScrape float64 // requests the router counts between scrapes
		down      bool
		want      string // the decisions but shed advice
		measured  bool
	}{
		// 1,000 requests over a 20 ms window: up to 50,000 requests/s (the
		// time between the scrapes is at least the window) against one
		// owned worker of 100: borrow all the lender has.
		{name: "peak", perScrape: 1000, measured: true, want: "[borrow m 2: above high water]"},
		{name: "quiet", perScrape: 0, measured: true},
		{name: "metrics down", down: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			total, scrapes := 0.0, 0
			metrics := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				mu.Lock()
				defer mu.Unlock()
				scrapes++
				if tc.down {
					http.Error(w, "router down", http.StatusServiceUnavailable)
					return
				}
				fmt.Fprintf(w, "prism_rpc_requests_total{code=\"OK\",method=%q} %g\n", recommendMethod, total)
				total += tc.perScrape
			}))
			defer metrics.Close()
			lender := &fakeLender{max: 2, workers: map[string]*capacity.LentWorker{}, reclaims: make(chan capacity.ProviderReclaim, 1)}
			d, err := New(Options{
				Provider: lender, Model: "m", CapacityPerWorker: 100, Tick: 20 * time.Millisecond, Window: 20 * time.Millisecond,
				Registry: func(context.Context) ([]*prismv1.WorkerInfo, error) {
					return []*prismv1.WorkerInfo{{Id: "owned", Role: prismv1.Role_ROLE_DENSE, Addr: "addr-owned"}}, nil
				},
				RouterMetrics: func() string { return metrics.URL },
			})
			if err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			pl, err := d.DryRun(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if took := time.Since(start); took < 20*time.Millisecond {
				t.Errorf("the dry run took %s, less than its window", took)
			}
			// The shed advice follows the rate, which depends on the time
			// between the scrapes: left out.
			var got []capacity.Decision
			for _, dec := range pl.Decisions {
				if dec.Kind != capacity.Shed {
					got = append(got, dec)
				}
			}
			if tc.want == "" {
				tc.want = "[]"
			}
			if fmt.Sprint(got) != tc.want {
				t.Errorf("decisions %v, want %s", pl.Decisions, tc.want)
			}
			if len(lender.log) != 0 || len(lender.Workers()) != 0 {
				t.Errorf("a dry run lent: %v", lender.log)
			}
			if pl.Measured != tc.measured || (pl.ScrapeErr != nil) != tc.down || len(pl.Routers) != 1 || pl.Idle != 2 {
				t.Errorf("plan %+v: want measured %v, a scrape error %v, 1 router, 2 idle", pl, tc.measured, tc.down)
			}
			if len(pl.Obs.Workers) != 1 || pl.Obs.Workers[0].State != capacity.Serving {
				t.Errorf("workers %+v, want the owned one serving", pl.Obs.Workers)
			}
			if scrapes != 2 {
				t.Errorf("%d scrapes, want 2", scrapes)
			}
		})
	}
}
