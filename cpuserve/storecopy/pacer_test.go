package storecopy

import (
	"context"
	"testing"
	"time"
)

// A copy's reads paced to a rate take at least their bytes over it (a
// lower bound: a busy machine is slower); a cancelled copy stops
// waiting; no rate, no wait.
func TestPacer(t *testing.T) {
	p := NewPacer(10 << 20) // 10 MiB/s
	start := time.Now()
	for range 3 {
		p.Read(context.Background(), 1<<20)
	}
	if took := time.Since(start); took < 290*time.Millisecond {
		t.Fatalf("3 MiB at 10 MiB/s in %v", took)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	start = time.Now()
	p.Read(ctx, 100<<20) // ten seconds due
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("a cancelled copy waited %v", took)
	}
	none := NewPacer(0)
	none.Read(context.Background(), 1<<30)
}
