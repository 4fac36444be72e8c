package router

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/prism-serve/prism/api/prismv1"
)

// scaleModels is how many models every worker of a scale fleet serves.
const scaleModels = 4

// scaleWorker is embedding worker i of a scale fleet: it serves every
// model and holds update 5 of each.
func scaleWorker(i int) *prismv1.WorkerInfo {
	w := &prismv1.WorkerInfo{Id: fmt.Sprintf("cpu-%04d-7f9c2d", i), Addr: fmt.Sprintf("10.1.%d.%d:7001", i/250, i%250),
		Role: prismv1.Role_ROLE_EMBEDDING, Healthy: true, Outstanding: int64(i % 7), UpdateSeq: map[string]int64{}}
	for m := range scaleModels {
		name := fmt.Sprintf("model-%d", m)
		w.Models = append(w.Models, name)
		w.UpdateSeq[name] = 5
	}
	return w
}

// scaleFleet is a router (sequencing, or following another: follow)
// with n embedding workers and n/4 dense ones (at least one), every one
// serving every model, on a fake clock past every start-up window; some
// model has had updates, so every pick asks the sequencer (or the
// follower) whether each worker is in sync. For a follower, the
// sequencer's view (as its poll takes it) names every embedding worker
// in sync.
func scaleFleet(tb testing.TB, n int, follow bool) (*Router, func(i int)) {
	return scaleFleetDense(tb, n, max(n/4, 1), follow)
}

// scaleFleetDense is scaleFleet with d dense workers.
func scaleFleetDense(tb testing.TB, n, d int, follow bool) (*Router, func(i int)) {
	var clock atomic.Int64
	t0 := time.Unix(1_700_000_000, 0)
	now := func() time.Time { return t0.Add(time.Duration(clock.Load())) }
	o := Options{Heartbeat: 100 * time.Millisecond, now: now, Logger: slog.New(slog.DiscardHandler)}
	if follow {
		o.Sequencer = "sequencer.invalid:1"
	}
	r := New(o, nil)
	tb.Cleanup(r.Close)
	announce := func(i int) {
		if _, err := r.Reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: scaleWorker(i)}); err != nil {
			tb.Fatal(err)
		}
	}
	dense := func(i int) {
		w := &prismv1.WorkerInfo{Id: fmt.Sprintf("gpu-%04d", i), Addr: fmt.Sprintf("10.2.%d.%d:7002", i/250, i%250), Role: prismv1.Role_ROLE_DENSE, Healthy: true}
		for m := range scaleModels {
			w.Models = append(w.Models, fmt.Sprintf("model-%d", m))
		}
		if _, err := r.Reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: w}); err != nil {
			tb.Fatal(err)
		}
	}
	for i := range n {
		announce(i)
	}
	clock.Store(int64(time.Hour)) // past the start-up windows
	for i := range n {
		announce(i)
	}
	for i := range d {
		dense(i)
	}
	if follow {
		f := r.fol
		f.mu.Lock()
		f.started = t0
		view := map[string]*prismv1.ModelUpdates{}
		var ids []string
		f.viewWorkers = map[string]bool{}
		for i := range n {
			id := scaleWorker(i).GetId()
			ids = append(ids, id)
			f.viewWorkers[id] = true
		}
		for m := range scaleModels {
			view[fmt.Sprintf("model-%d", m)] = &prismv1.ModelUpdates{Acknowledged: 5, Numbered: 5, InSync: ids}
		}
		f.view, f.viewFrom = view, o.Sequencer
		f.rejudge()
		f.mu.Unlock()
	}
	return r, announce
}

var scaleSizes = []int{10, 100, 500}

// BenchmarkScaleAnnounce is one worker's heartbeat announcement to a
// router of n embedding workers (every one serving 4 models), by a
// router that sequences updates and by one that follows another: a
// fleet's announcements cost the router n of these a heartbeat, under
// the registry's lock.
//
//	go test -run '^$' -bench ScaleAnnounce ./router/
func BenchmarkScaleAnnounce(b *testing.B) {
	for _, follow := range []bool{false, true} {
		for _, n := range scaleSizes {
			b.Run(fmt.Sprintf("follow=%v/workers=%d", follow, n), func(b *testing.B) {
				_, announce := scaleFleet(b, n, follow)
				b.ReportAllocs()
				b.ResetTimer()
				for i := range b.N {
					announce(i % n)
				}
			})
			// Updates flowing: each announcement holds one more of every
			// model than the worker's last.
			b.Run(fmt.Sprintf("follow=%v/updating/workers=%d", follow, n), func(b *testing.B) {
				r, _ := scaleFleet(b, n, follow)
				b.ReportAllocs()
				b.ResetTimer()
				for i := range b.N {
					w := scaleWorker(i % n)
					for m := range w.UpdateSeq {
						w.UpdateSeq[m] += int64(1 + i/n)
					}
					if _, err := r.Reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: w}); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// BenchmarkScalePick is one embedding pick (as an unsharded micro-batch
// makes it) and its release among n embedding workers of the model, by
// a sequencing and a following router.
//
//	go test -run '^$' -bench ScalePick ./router/
func BenchmarkScalePick(b *testing.B) {
	for _, follow := range []bool{false, true} {
		for _, n := range scaleSizes {
			b.Run(fmt.Sprintf("follow=%v/workers=%d", follow, n), func(b *testing.B) {
				r, _ := scaleFleet(b, n, follow)
				b.ReportAllocs()
				b.ResetTimer()
				for range b.N {
					_, release, err := r.Reg.PickEmbedding("model-0", 1, nil, EmbeddingWant{Paired: true})
					if err != nil {
						b.Fatal(err)
					}
					release()
				}
			})
		}
	}
}

// BenchmarkScalePickWhileAnnouncing is BenchmarkScalePick while every
// worker announces once a 100 ms heartbeat (n/0.1 s announcements a
// second, from 4 goroutines): how much the announcements, under the
// registry's lock, hold up the picks of requests.
func BenchmarkScalePickWhileAnnouncing(b *testing.B) {
	for _, follow := range []bool{false, true} {
		for _, n := range scaleSizes {
			b.Run(fmt.Sprintf("follow=%v/workers=%d", follow, n), func(b *testing.B) {
				r, announce := scaleFleet(b, n, follow)
				ctx, stop := context.WithCancel(context.Background())
				var wg sync.WaitGroup
				for g := range 4 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						t := time.NewTicker(100 * time.Millisecond)
						defer t.Stop()
						for {
							for i := g; i < n; i += 4 {
								announce(i)
							}
							select {
							case <-ctx.Done():
								return
							case <-t.C:
							}
						}
					}()
				}
				b.ReportAllocs()
				b.ResetTimer()
				var worst time.Duration
				for range b.N {
					start := time.Now()
					_, release, err := r.Reg.PickEmbedding("model-0", 1, nil, EmbeddingWant{Paired: true})
					if err != nil {
						b.Fatal(err)
					}
					release()
					worst = max(worst, time.Since(start))
				}
				b.StopTimer()
				stop()
				wg.Wait()
				b.ReportMetric(float64(worst.Microseconds()), "worst-µs")
			})
		}
	}
}

// BenchmarkScaleTick is one heartbeat of the sequencer (every model,
// every worker) with n embedding workers of 4 models, all in sync.
func BenchmarkScaleTick(b *testing.B) {
	for _, n := range scaleSizes {
		b.Run(fmt.Sprintf("workers=%d", n), func(b *testing.B) {
			r, _ := scaleFleet(b, n, false)
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				r.upd.tick(context.Background())
			}
		})
	}
}

// BenchmarkScaleList is one Registry.List (what a following router
// polls every heartbeat) with n embedding workers of 4 models; its
// size in bytes is reported.
func BenchmarkScaleList(b *testing.B) {
	for _, n := range scaleSizes {
		b.Run(fmt.Sprintf("workers=%d", n), func(b *testing.B) {
			r, _ := scaleFleet(b, n, false)
			b.ReportAllocs()
			b.ResetTimer()
			var size int
			for range b.N {
				resp, err := r.Reg.List(context.Background(), &prismv1.ListRequest{})
				if err != nil {
					b.Fatal(err)
				}
				size = proto.Size(resp)
			}
			b.ReportMetric(float64(size), "bytes")
			resp, _ := r.Reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: scaleWorker(0)})
			b.ReportMetric(float64(proto.Size(resp)), "announce-bytes")
		})
	}
}

// BenchmarkScaleUpdateFanOut is one update of one model through the
// sequencer's core, numbered and fanned out to n embedding workers
// (each serving 4 models) and every worker's answer taken: the
// sequencer's own cost per update, without the calls.
func BenchmarkScaleUpdateFanOut(b *testing.B) {
	for _, n := range scaleSizes {
		b.Run(fmt.Sprintf("workers=%d", n), func(b *testing.B) {
			t0 := time.Unix(1_700_000_000, 0)
			s := newSequencer(t0, 100*time.Millisecond, 64<<20, 0, QuorumMajority)
			for i := range n {
				s.announced(t0, scaleWorker(i))
			}
			now := t0.Add(time.Hour)
			s.ready()
			req := &prismv1.UpdateRequest{Model: "model-0", Table: "t", Ids: []int64{1}, Rows: make([]byte, 256)}
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				client := uint64(i + 1)
				s.propose(now, client, req, now.Add(time.Minute))
				applies := 0
				for _, m := range s.ready() {
					if m.Type == msgApply {
						s.applied(now, m.Client, m.Model, m.Worker, m.Apply.GetSeq(), nil)
						applies++
					}
				}
				if applies != n {
					b.Fatalf("%d applies, want %d", applies, n)
				}
				s.ready()
			}
		})
	}
}

// BenchmarkScaleUpdateServed is the check every Embeddings.Update makes
// before its turn, that a live embedding worker serves its model, with
// n embedding workers of 4 models.
func BenchmarkScaleUpdateServed(b *testing.B) {
	for _, n := range scaleSizes {
		b.Run(fmt.Sprintf("workers=%d", n), func(b *testing.B) {
			r, _ := scaleFleet(b, n, false)
			u := r.Updater()
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				if !u.served("model-1") {
					b.Fatal("model-1 not served")
				}
			}
		})
	}
}
