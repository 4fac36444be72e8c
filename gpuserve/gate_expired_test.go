package gpuserve

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// TestGateDueFollowsLiveRequests: a batch waiting at the gate whose most
// urgent request expires meanwhile is due, when a slot frees, by the
// requests it still holds, not by the expired one. In simulated time,
// runs of 30 ms, one slot: model x's first batch runs from 2 to 32 ms;
// meanwhile x forms a batch of a request due at 8 ms and one due in a
// second, and y a batch of one request due at 73 ms. At 32 ms the first
// has expired: y's batch must run first (32-62 ms, in time), then x's
// (its request due in a second). Ranked by the expired request, x's ran
// first and y's request missed its deadline for work due much later.
func TestGateDueFollowsLiveRequests(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := &tagRunner{took: 30 * time.Millisecond}
		g := NewRunGate(1)
		o := BatchOptions{MaxBatch: 8, MaxDelay: 2 * time.Millisecond, Gate: g}
		x := NewBatcher(spec, []Runner{r, r}, o) // two sessions: one runs, one forms the next batch
		defer x.Close()
		y := NewBatcher(spec, []Runner{r}, o)
		defer y.Close()
		var wg sync.WaitGroup
		var mu sync.Mutex
		errs := map[float32]error{}
		submit := func(b *Batcher, tag float32, in time.Duration) {
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(context.Background(), in)
				defer cancel()
				_, err := b.Submit(ctx, req(1, tag))
				mu.Lock()
				errs[tag] = err
				mu.Unlock()
			})
		}
		submit(x, 100, time.Minute)
		time.Sleep(3 * time.Millisecond) // its batch runs from 2 ms
		submit(x, 1, 5*time.Millisecond)
		submit(x, 2, time.Second)
		submit(y, 3, 70*time.Millisecond)
		wg.Wait()
		if errs[100] != nil || errs[2] != nil {
			t.Errorf("requests due in a minute and a second: %v, %v", errs[100], errs[2])
		}
		if errs[1] == nil {
			t.Error("the request due at 8 ms was scored at 32 ms or later")
		}
		if errs[3] != nil {
			t.Errorf("y's request due at 73 ms: %v (runs %v; want y's batch before x's second)", errs[3], r.runs())
		}
		if got, want := r.runs(), []float32{100, 3, 2}; !equalF(got, want) {
			t.Errorf("run order %v, want %v", got, want)
		}
	})
}
