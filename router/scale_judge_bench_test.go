package router

import (
	"fmt"
	"testing"
)

// BenchmarkScaleFollowerJudge is what a following router's floor of one
// model costs after one worker's announcement, among n workers of it:
// judged anew over every worker ("anew", judge: what every
// announcement cost each of its models before), and by the worker's own
// claim alone ("worker", judgeWorker: what it costs now). Same run, same
// follower.
func BenchmarkScaleFollowerJudge(b *testing.B) {
	for _, n := range scaleSizes {
		for _, how := range []string{"anew", "worker"} {
			b.Run(fmt.Sprintf("%s/workers=%d", how, n), func(b *testing.B) {
				r, _ := scaleFleet(b, n, true)
				f := r.fol
				f.mu.Lock()
				defer f.mu.Unlock()
				b.ReportAllocs()
				b.ResetTimer()
				for i := range b.N {
					id := scaleWorker(i % n).GetId()
					w := f.workers[id]
					w.held = map[string]int64{"model-0": 5 + int64(i/n)}
					f.workers[id] = w
					if how == "anew" {
						f.judge("model-0")
					} else {
						f.judgeWorker("model-0", id)
					}
				}
			})
		}
	}
}
