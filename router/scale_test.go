package router

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/prism-serve/prism/api/prismv1"
)

// TestFollowerScalesWithWorkers: a router following another for
// embedding updates judges a worker as before now that its pick reads
// the sequencer's in-sync list as a set and an announcement updates
// only its own claim: a worker announcing less than the acknowledged
// update is left out, and taken again once it announces it, however
// often it announced alike in between. The costs (a pick among 500
// embedding workers was 413 µs against 32 µs on the sequencing router,
// an announcement 154 µs each: 77 ms of every 100 ms heartbeat under
// the registry's lock) are BenchmarkScalePick's and
// BenchmarkScaleAnnounce's, not this test's: timings are the
// benchmarks' (go test -run '^$' -bench Scale ./router/).
func TestFollowerScalesWithWorkers(t *testing.T) {
	// The judgment stays what it was: a worker announcing less than
	// the acknowledged update is left out, and taken again once it
	// announces it, however often it announced alike in between.
	r, announce := scaleFleet(t, 20, true)
	picked := func() map[string]bool {
		seen := map[string]bool{}
		var releases []func()
		for range 200 {
			w, release, err := r.Reg.PickEmbedding("model-0", 1, nil, EmbeddingWant{})
			if err != nil {
				t.Fatal(err)
			}
			seen[w.GetId()] = true
			releases = append(releases, release)
		}
		for _, release := range releases {
			release()
		}
		return seen
	}
	lagging := scaleWorker(3)
	f := r.fol
	f.mu.Lock()
	u := proto.Clone(f.view["model-0"]).(*prismv1.ModelUpdates)
	u.InSync = slices.DeleteFunc(u.InSync, func(id string) bool { return id == lagging.GetId() })
	f.view["model-0"] = u // judged by what it announces
	f.mu.Unlock()
	lagging.UpdateSeq["model-0"] = 4
	for range 3 {
		if _, err := r.Reg.Announce(t.Context(), &prismv1.AnnounceRequest{Worker: proto.Clone(lagging).(*prismv1.WorkerInfo)}); err != nil {
			t.Fatal(err)
		}
		if seen := picked(); seen[lagging.GetId()] || len(seen) != 19 {
			t.Fatalf("picked %d workers, the lagging one %v: want the 19 others", len(seen), seen[lagging.GetId()])
		}
	}
	announce(3)
	if seen := picked(); len(seen) != 20 {
		t.Fatalf("picked %d workers once the lagging one holds the update, want 20", len(seen))
	}
}

// TestFollowerPollsLargeFleet: the sequencer's view of a large fleet
// (Registry.List: every worker, and per model the workers in sync) is
// over gRPC's default 4 MiB receive limit at 2,000 embedding workers
// of 16 models, well within the registry's limits (4096 workers, 256
// models each); the sequencer sends it (its server's limit is
// Options.MaxMessageBytes), and the following router's poll must take
// it. Its connection to the sequencer had the default limit: every
// poll failed ResourceExhausted, the follower judged by the workers'
// claims alone (the highest, once cut off) and warned every minute.
func TestFollowerPollsLargeFleet(t *testing.T) {
	reg := &viewRegistry{}
	addr := serveInproc(t, func(s *grpc.Server) { prismv1.RegisterRegistryServer(s, reg) })
	var ws []*prismv1.WorkerInfo
	view := map[string]*prismv1.ModelUpdates{}
	for i := range 2000 {
		w := &prismv1.WorkerInfo{Id: fmt.Sprintf("cpu-%04d-7f9c2d1e", i), Addr: fmt.Sprintf("10.1.%d.%d:7001", i/250, i%250), Role: prismv1.Role_ROLE_EMBEDDING,
			Healthy: true, UpdateSeq: map[string]int64{}, Content: map[string]string{}, Version: map[string]int64{}}
		for m := range 16 {
			name := fmt.Sprintf("ctr-model-%02d-eu-west", m)
			w.Models = append(w.Models, name)
			w.UpdateSeq[name], w.Content[name], w.Version[name] = 12345, "0123456789abcdef", 7
			if view[name] == nil {
				view[name] = &prismv1.ModelUpdates{Acknowledged: 12345, Numbered: 12345}
			}
			view[name].InSync = append(view[name].InSync, w.GetId())
		}
		ws = append(ws, w)
	}
	reg.set(view, ws)
	size := proto.Size(&prismv1.ListResponse{Updates: view, Workers: ws})
	if size <= 4<<20 {
		t.Fatalf("the view is %d bytes, want one over 4 MiB", size)
	}
	r := testRouter(Options{Sequencer: addr})
	defer r.Close()
	r.opts.SequencerDialOptions = []grpc.DialOption{grpc.WithContextDialer(dialInproc)}
	if err := r.fol.poll(t.Context(), addr, 10*time.Second); err != nil {
		t.Fatalf("poll of a view of %d bytes: %v", size, err)
	}
	r.fol.mu.Lock()
	defer r.fol.mu.Unlock()
	if got := len(r.fol.view); got != 16 || len(r.fol.viewWorkers) != 2000 {
		t.Fatalf("the follower holds a view of %d models and %d workers, want 16 and 2000", got, len(r.fol.viewWorkers))
	}
}

// TestFollowerJudgesIncrementally: the floors a follower keeps as each
// worker announces or leaves (judgeWorker, each worker's own claim
// replaced) are those judging every worker anew finds (rejudge), over
// a seeded run of announcements (models, shards, numbers held, copies
// diverged), departures, views of the sequencer and failed polls.
func TestFollowerJudgesIncrementally(t *testing.T) {
	for _, q := range []Quorum{QuorumMajority, QuorumOne, QuorumAll} {
		t.Run(q.String(), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(1, uint64(q)))
			f := newFollower("seq:1", nil, q, time.Now, time.Second)
			for step := range 4000 {
				id := fmt.Sprintf("w%d", rng.IntN(30))
				switch op := rng.IntN(20); {
				case op < 14:
					w := &prismv1.WorkerInfo{Id: id, Role: prismv1.Role_ROLE_EMBEDDING, UpdateSeq: map[string]int64{}, Diverged: map[string]int64{}}
					for _, m := range []string{"a", "b"} {
						if rng.IntN(4) == 0 {
							continue
						}
						w.Models = append(w.Models, m)
						w.UpdateSeq[m] = rng.Int64N(20)
						if rng.IntN(30) == 0 {
							w.Diverged[m] = 1
						}
					}
					if rng.IntN(2) == 0 {
						w.Shards = map[string]*prismv1.ShardRef{"b": {Shards: 2, Shard: rng.Int32N(2)}}
					}
					f.mu.Lock()
					f.any.Store(true)
					f.mu.Unlock()
					f.announced(w)
				case op < 16:
					f.gone(id)
				case op < 19:
					// A poll's answer (poll: a new view, judged anew).
					f.mu.Lock()
					view := map[string]*prismv1.ModelUpdates{}
					for _, key := range []string{"a", "b", "b#shard0", "b#shard1"} {
						if rng.IntN(3) == 0 {
							continue
						}
						u := &prismv1.ModelUpdates{Acknowledged: rng.Int64N(20), Numbered: rng.Int64N(25)}
						for i := range 30 {
							switch rng.IntN(8) {
							case 0:
								u.LeftOut = append(u.LeftOut, fmt.Sprintf("w%d", i))
							case 1, 2:
								u.InSync = append(u.InSync, fmt.Sprintf("w%d", i))
							}
						}
						view[key] = u
					}
					f.view, f.viewWorkers, f.failures = view, map[string]bool{}, 0
					for i := range 30 {
						if rng.IntN(3) > 0 {
							f.viewWorkers[fmt.Sprintf("w%d", i)] = true
						}
					}
					f.rejudge()
					f.mu.Unlock()
				default:
					// Polls failing: cut off from the second (poll).
					f.mu.Lock()
					f.failures++
					if f.failures == cutOffPolls {
						f.rejudge()
					}
					f.mu.Unlock()
				}
				f.mu.Lock()
				kept := maps.Clone(f.floor)
				f.rejudge()
				if !maps.Equal(kept, f.floor) {
					f.mu.Unlock()
					t.Fatalf("step %d: floors kept %v, judged anew %v", step, kept, f.floor)
				}
				f.mu.Unlock()
			}
		})
	}
}

// TestSequencerWorkerIDs: the sorted ids the sequencer keeps between
// updates (workerIDs, the order of every fan-out) stay those of its live
// workers over a seeded run of announcements, departures and workers
// turning dense.
func TestSequencerWorkerIDs(t *testing.T) {
	rng := rand.New(rand.NewPCG(2, 3))
	t0 := time.Unix(1_700_000_000, 0)
	s := newSequencer(t0, time.Second, 1<<20, 0, QuorumMajority)
	for step := range 2000 {
		id := fmt.Sprintf("w%02d", rng.IntN(40))
		switch op := rng.IntN(10); {
		case op < 6:
			s.announced(t0, &prismv1.WorkerInfo{Id: id, Role: prismv1.Role_ROLE_EMBEDDING, Models: []string{"m"}, UpdateSeq: map[string]int64{"m": 0}})
		case op < 8:
			s.gone(t0, id)
		default:
			s.announced(t0, &prismv1.WorkerInfo{Id: id, Role: prismv1.Role_ROLE_DENSE, Models: []string{"m"}})
		}
		if got, want := s.workerIDs(), slices.Sorted(maps.Keys(s.workers)); !slices.Equal(got, want) {
			t.Fatalf("step %d: workerIDs %v, live workers %v", step, got, want)
		}
	}
}
