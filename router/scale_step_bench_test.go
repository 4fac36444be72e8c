package router

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// BenchmarkScaleDriverStep is one event of the update driver (an
// apply's answer, an announcement) with c update clients waiting. A
// step asked each waiting client's context whether it ended (O(c) under
// the driver's lock, each of thousands of steps a second in a flood of
// updates); now the sequencer asks only the callers of the updates it
// numbers, so the cost does not grow with c.
func BenchmarkScaleDriverStep(b *testing.B) {
	for _, c := range []int{0, 10, 100, 1000} {
		b.Run(fmt.Sprintf("clients=%d", c), func(b *testing.B) {
			r, _ := scaleFleet(b, 10, false)
			d := r.upd
			d.mu.Lock()
			for i := range c {
				ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
				defer cancel()
				d.clients[uint64(1<<40+i)] = &updateClient{ctx: ctx, answer: make(chan updateAnswer, 1)}
			}
			d.mu.Unlock()
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				d.step(func(time.Time) {})
			}
		})
	}
}
