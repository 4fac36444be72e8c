package loan

import (
	"context"
	"testing"
	"time"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/capacity"
)

// TestMeasuredCapacityNeedsSaturation: with no capacity given, a
// capacity per worker is measured when the workers saturate. A stray
// shed request at low load (one refused in a burst out of 20 a second)
// is not saturation: measured then, the capacity read 10 requests/s
// per worker where the workers took far more, and the controller
// borrowed as if they were that small. A real overload (shedding 1% or
// more, or the p99 over the limit) measures it.
func TestMeasuredCapacityNeedsSaturation(t *testing.T) {
	d, err := New(Options{Provider: &fakeLender{workers: map[string]*capacity.LentWorker{}}, Model: "m",
		Controller:    capacity.Options{P99Limit: 60 * time.Millisecond},
		Registry:      func(context.Context) ([]*prismv1.WorkerInfo, error) { return nil, nil },
		RouterMetrics: func() string { return "http://127.0.0.1:1" }})
	if err != nil {
		t.Fatal(err)
	}
	ws := []*prismv1.WorkerInfo{{Id: "a", Role: prismv1.Role_ROLE_DENSE, Addr: "a"}, {Id: "b", Role: prismv1.Role_ROLE_DENSE, Addr: "b"}}
	now := time.Unix(1000, 0)
	for _, c := range []struct {
		name string
		dem  demand
		want float64
	}{
		{"a stray shed at low load", demand{offered: 20, shed: 0.03, p99: 5 * time.Millisecond}, 0},
		{"no shed", demand{offered: 20, p99: 5 * time.Millisecond}, 0},
		{"overloaded, shedding", demand{offered: 500, shed: 100, p99: 50 * time.Millisecond}, 200},
		{"p99 over the limit", demand{offered: 520, p99: 80 * time.Millisecond}, 260},
	} {
		now = now.Add(time.Second)
		obs, _ := d.observe(now, c.dem, ws, nil, 0)
		if got := obs.Models[0].CapacityPerWorker; got != c.want {
			t.Errorf("%s: capacity per worker %v, want %v", c.name, got, c.want)
		}
	}
}
