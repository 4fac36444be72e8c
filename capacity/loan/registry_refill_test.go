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

// TestRouterRestartRegistryRefills: a router restarts at a steady 100
// requests/s on two owned workers of 100 (50%: nothing to borrow). Its
// registry starts empty and the workers announce again over the next
// ticks. Read as two owned workers gone, the demand that stands was
// uncovered and the controller borrowed two workers, held for the
// minimum lease. An owned worker that does not come back (it died) stops
// counting once the registry has had time to refill.
func TestRouterRestartRegistryRefills(t *testing.T) {
	var mu sync.Mutex
	total := 0.0
	listed := []string{"o1", "o2"}
	metrics := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(w, "prism_rpc_requests_total{code=\"OK\",method=%q} %g\n", recommendMethod, total)
	}))
	defer metrics.Close()
	now := time.Unix(1000, 0)
	lender := &fakeLender{max: 4, workers: map[string]*capacity.LentWorker{}, reclaims: make(chan capacity.ProviderReclaim, 4)}
	d, err := New(Options{
		Provider: lender, Model: "m", CapacityPerWorker: 100, Controller: capacity.Options{MaxBorrowed: 4},
		Registry: func(context.Context) ([]*prismv1.WorkerInfo, error) {
			mu.Lock()
			defer mu.Unlock()
			var ws []*prismv1.WorkerInfo
			for _, id := range listed {
				ws = append(ws, &prismv1.WorkerInfo{Id: id, Role: prismv1.Role_ROLE_DENSE, Addr: "addr-" + id})
			}
			return ws, nil
		},
		RouterMetrics: func() string { return metrics.URL },
		Now:           func() time.Time { return now },
	})
	if err != nil {
		t.Fatal(err)
	}
	step := func(restart bool, ids ...string) {
		t.Helper()
		mu.Lock()
		if restart {
			total = 0
		}
		total += 100
		listed = ids
		mu.Unlock()
		now = now.Add(time.Second)
		if err := d.Step(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	for range 5 {
		step(false, "o1", "o2")
	}
	step(true)        // restarted: nothing announced yet
	step(false)       // still nothing
	step(false, "o2") // o2 is back
	for range 5 {
		step(false, "o1", "o2")
	}
	if len(lender.log) > 0 {
		t.Fatalf("a router restart at 50%% of two owned workers: the lender saw %v", lender.log)
	}
	// o1 died with the restart and never announces again: one worker of
	// 100 at 100 requests/s, over high water once the registry settled.
	for range 40 {
		step(false, "o2")
	}
	if len(lender.log) == 0 {
		t.Fatalf("an owned worker gone for good is still counted 40s after the restart")
	}
}
