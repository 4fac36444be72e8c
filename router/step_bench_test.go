package router

import (
	"fmt"
	"testing"
	"time"
)

// BenchmarkDriverStep: one step of the update driver (every apply
// answer is one, under its lock), with fleets of embedding workers and
// nothing stranded: what the step publishes (log bytes, diverged and
// stranded counts) must not cost a walk of every worker.
//
//	go test -run '^$' -bench DriverStep -count 3 ./router/
func BenchmarkDriverStep(b *testing.B) {
	for _, n := range []int{10, 1000} {
		b.Run(fmt.Sprintf("workers=%d", n), func(b *testing.B) {
			r, _ := scaleFleet(b, n, false)
			d := r.upd
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				d.step(func(time.Time) {})
			}
		})
	}
}
