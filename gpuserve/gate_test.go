package gpuserve

import (
	"context"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/prism-serve/prism/plan"
)

// waitingNow is how many batches wait at g for a slot.
func (g *RunGate) waitingNow() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.waiting)
}

func waitGate(t *testing.T, g *RunGate, want int) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); g.waitingNow() != want; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d batches wait at the gate, want %d", g.waitingNow(), want)
		}
	}
}

// TestRunGateOrder: at most slots hold the gate; a freed slot goes to the
// waiter due first, arrival order among equal due times.
func TestRunGateOrder(t *testing.T) {
	g := NewRunGate(2)
	r1, r2 := g.Acquire(time.Time{}), g.Acquire(time.Time{}) // both slots, no wait
	base := time.Unix(1000, 0)
	var mu sync.Mutex
	var order []string
	var wg sync.WaitGroup
	for i, w := range []struct {
		name string
		due  time.Duration
	}{{"c", 3}, {"a", 1}, {"b1", 2}, {"b2", 2}, {"d", 4}} {
		wg.Go(func() {
			release := g.Acquire(base.Add(w.due * time.Second))
			mu.Lock()
			order = append(order, w.name)
			mu.Unlock()
			release()
		})
		waitGate(t, g, i+1)
	}
	// One slot frees: the waiters pass it on one at a time, due first.
	r1()
	wg.Wait()
	want := []string{"a", "b1", "b2", "c", "d"}
	if len(order) != len(want) {
		t.Fatalf("order %v, want %v", order, want)
	}
	for i := range want {
		if order[i] != want[i] {
			t.Fatalf("order %v, want %v", order, want)
		}
	}
	r2()
	// Both slots free again: two acquire at once without waiting.
	done := make(chan struct{})
	go func() { g.Acquire(time.Time{})(); g.Acquire(time.Time{}); g.Acquire(time.Time{}); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("two slots free, and a second Acquire waited")
	}
}

// TestRunGateAcrossModels: two models' batchers sharing one run slot run
// their formed batches by deadline across the models: model a's batch
// due in 300 ms, formed after model b's due in 900 ms, runs before it.
// Without the gate both would start as soon as formed.
func TestRunGateAcrossModels(t *testing.T) {
	r := &tagRunner{gate: make(chan struct{})}
	g := NewRunGate(1)
	o := BatchOptions{MaxBatch: 4, MaxDelay: time.Minute, Gate: g}
	a := NewBatcher(spec, []Runner{r, r}, o) // two sessions: one runs, one forms the next batch
	defer a.Close()
	b := NewBatcher(spec, []Runner{r}, o)
	defer b.Close()
	var wg sync.WaitGroup
	submit := func(bt *Batcher, tag float32, in time.Duration) {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), in)
			defer cancel()
			if _, err := bt.Submit(ctx, req(4, tag)); err != nil {
				t.Error(err)
			}
		})
	}
	submit(a, 100, time.Minute) // takes the slot and holds it in the runner
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		g.mu.Lock()
		taken := g.free == 0
		g.mu.Unlock()
		if taken {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the first batch never took the slot")
		}
	}
	submit(b, 30, 900*time.Millisecond)
	waitGate(t, g, 1)
	submit(a, 10, 300*time.Millisecond)
	waitGate(t, g, 2)
	close(r.gate)
	wg.Wait()
	if got, want := r.runs(), []float32{100, 10, 30}; !equalF(got, want) {
		t.Errorf("run order %v, want %v", got, want)
	}
}

// TestDueAtGate: a batch is due at its earliest deadline; a request
// counts as due at most gateHorizon after it arrived.
func TestDueAtGate(t *testing.T) {
	t0 := time.Unix(1000, 0)
	p := func(arrived, deadline time.Time) *pending {
		return &pending{item: item{arrived: arrived, deadline: deadline}, ctx: context.Background()}
	}
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	gone := p(t0, t0.Add(100*time.Millisecond))
	gone.ctx = cancelled
	for _, tc := range []struct {
		name  string
		batch []*pending
		now   time.Time
		want  time.Time
	}{
		{"earliest deadline", []*pending{p(t0, t0.Add(300*time.Millisecond)), p(t0, t0.Add(200*time.Millisecond))}, time.Time{}, t0.Add(200 * time.Millisecond)},
		{"no deadline: horizon", []*pending{p(t0, time.Time{})}, time.Time{}, t0.Add(gateHorizon)},
		{"a far deadline: the horizon", []*pending{p(t0, t0.Add(time.Hour))}, time.Time{}, t0.Add(gateHorizon)},
		{"the earliest of capped deadlines", []*pending{p(t0, t0.Add(time.Hour)), p(t0.Add(-time.Second), time.Time{})}, time.Time{}, t0.Add(gateHorizon - time.Second)},
		{"expired left out", []*pending{p(t0, t0.Add(10*time.Millisecond)), p(t0, t0.Add(300*time.Millisecond))}, t0.Add(10 * time.Millisecond), t0.Add(300 * time.Millisecond)},
		{"cancelled left out", []*pending{gone, p(t0, t0.Add(300*time.Millisecond))}, t0, t0.Add(300 * time.Millisecond)},
		{"none left: at once", []*pending{p(t0, t0.Add(10*time.Millisecond)), gone}, t0.Add(time.Second), time.Time{}},
	} {
		if got := dueAt(tc.batch, tc.now); !got.Equal(tc.want) {
			t.Errorf("%s: due %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestServerSharesRunGate: a dense worker serving two models gives their
// batchers one gate of Sessions slots; asked not to (AcrossModels
// "off"), or serving one model, none.
func TestServerSharesRunGate(t *testing.T) {
	dir := tinyPlan(t)
	other := t.TempDir()
	if err := os.CopyFS(other, os.DirFS(dir)); err != nil {
		t.Fatal(err)
	}
	p, err := plan.Read(other)
	if err != nil {
		t.Fatal(err)
	}
	p.Model.Name += "-b"
	if err := plan.Write(other, p); err != nil {
		t.Fatal(err)
	}
	quiet := slog.New(slog.DiscardHandler)
	off, err := New(Options{Plans: []string{dir, other}, AcrossModels: "off", Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range off.models {
		if m.batcher.opts.Gate != nil {
			t.Fatal("two models, across models off: a gate")
		}
	}
	off.Close()
	two, err := New(Options{Plans: []string{dir, other}, Sessions: 2, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer two.Close()
	var gates []*RunGate
	for _, m := range two.models {
		gates = append(gates, m.batcher.opts.Gate)
	}
	if len(gates) != 2 || gates[0] == nil || gates[0] != gates[1] || gates[0].free != 2 {
		t.Fatalf("two models: gates %v, want one shared gate of 2 slots", gates)
	}
	one, err := New(Options{Plans: []string{dir}, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer one.Close()
	for _, m := range one.models {
		if m.batcher.opts.Gate != nil {
			t.Fatal("one model: a gate")
		}
	}
}
