package router

import (
	"context"
	"fmt"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/prism-serve/prism/api/prismv1"
)

// BenchmarkScaleAnnounceAnswers is one heartbeat of a fleet of n
// embedding and n dense workers as the router answers it: every
// embedding worker announces once, its answer is marshalled (the bytes
// the router sends) and unmarshalled (what the worker parses). Workers
// of the previous release ("old", no dense_held) get the dense workers'
// list in every answer; workers of this release ("held") echo the
// version they hold and get the list only after it changed: "churn=K"
// has one dense worker leave or come back every K heartbeats. The
// answers' bytes a second are reported at a 100 ms and at the default
// 1 s heartbeat (answer-MB/s@100ms, answer-MB/s@1s); ns/op is the
// router's Announce, the marshalling and the parsing, for the whole
// heartbeat.
//
//	go test -run '^$' -bench ScaleAnnounceAnswers ./router/
func BenchmarkScaleAnnounceAnswers(b *testing.B) {
	for _, n := range []int{100, 500} {
		for _, mode := range []struct {
			name  string
			held  bool
			churn int // heartbeats between changes of the dense list; 0 none
		}{{"old", false, 0}, {"held", true, 0}, {"held/churn=10", true, 10}, {"held/churn=1", true, 1}} {
			b.Run(fmt.Sprintf("workers=%dx%d/%s", n, n, mode.name), func(b *testing.B) {
				r, _ := scaleFleetDense(b, n, n, false)
				held := make([]*prismv1.ListVersion, n)
				// gone is the dense worker churn took out (-1: none), back
				// at the next change.
				gone := -1
				var bytes int64
				// heartbeat is one round of the fleet's announcements, the
				// round'th.
				heartbeat := func(round int) {
					if mode.churn > 0 && round%mode.churn == mode.churn-1 {
						if gone < 0 {
							gone = round % n
							r.Reg.Remove(fmt.Sprintf("gpu-%04d", gone))
						} else {
							w := &prismv1.WorkerInfo{Id: fmt.Sprintf("gpu-%04d", gone), Addr: fmt.Sprintf("10.2.%d.%d:7002", gone/250, gone%250), Role: prismv1.Role_ROLE_DENSE, Healthy: true}
							for m := range scaleModels {
								w.Models = append(w.Models, fmt.Sprintf("model-%d", m))
							}
							if _, err := r.Reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: w}); err != nil {
								b.Fatal(err)
							}
							gone = -1
						}
					}
					for i := range n {
						req := &prismv1.AnnounceRequest{Worker: scaleWorker(i)}
						if mode.held {
							req.DenseHeld = held[i]
						}
						resp, err := r.Reg.Announce(context.Background(), req)
						if err != nil {
							b.Fatal(err)
						}
						wire, err := proto.Marshal(resp)
						if err != nil {
							b.Fatal(err)
						}
						bytes += int64(len(wire))
						var got prismv1.AnnounceResponse
						if err := proto.Unmarshal(wire, &got); err != nil {
							b.Fatal(err)
						}
						if !got.GetDenseUnchanged() {
							held[i] = got.GetDenseVersion()
						}
					}
				}
				// The workers' first heartbeat (each takes the list) is
				// not the steady state measured.
				heartbeat(-1)
				bytes = 0
				b.ReportAllocs()
				b.ResetTimer()
				for round := range b.N {
					heartbeat(round)
				}
				b.StopTimer()
				perRound := float64(bytes) / float64(b.N)
				b.ReportMetric(perRound, "answer-B/heartbeat")
				b.ReportMetric(perRound/(100*time.Millisecond).Seconds()/1e6, "answer-MB/s@100ms")
				b.ReportMetric(perRound/time.Second.Seconds()/1e6, "answer-MB/s@1s")
			})
		}
	}
}
