package router

import (
	"context"
	"encoding/binary"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/prism-serve/prism/api/prismv1"
)

// The follower's floor, case by case: the quorum-th highest number the
// live workers hold, kept while some worker holds it.
func TestNextFloor(t *testing.T) {
	for _, c := range []struct {
		name  string
		floor int64
		held  []int64
		q     Quorum
		want  int64
	}{
		{"no workers keep the floor", 5, nil, QuorumMajority, 5},
		{"all up to date", 0, []int64{4, 4, 4}, QuorumMajority, 4},
		{"one behind does not lower it", 0, []int64{4, 4, 1}, QuorumMajority, 4},
		{"one liar cannot raise it under a majority", 0, []int64{1 << 40, 4, 4}, QuorumMajority, 4},
		{"under quorum one the highest counts", 0, []int64{7, 4, 4}, QuorumOne, 7},
		{"under quorum all the lowest", 0, []int64{7, 4, 2}, QuorumAll, 2},
		{"it never goes down while someone holds it", 6, []int64{6, 2, 2}, QuorumMajority, 6},
		{"a newer majority raises it", 6, []int64{8, 8, 2}, QuorumMajority, 8},
		{"nobody holds it any more: follow the workers down", 6, []int64{3, 3, 1}, QuorumMajority, 3},
		{"a lone worker", 0, []int64{9}, QuorumMajority, 9},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := nextFloor(c.floor, c.held, c.q); got != c.want {
				t.Fatalf("nextFloor(%d, %v, %v) = %d, want %d", c.floor, c.held, c.q, got, c.want)
			}
		})
	}
}

// A follower judges each shard's sequence from that shard's workers
// alone: shard 1's quorum holding its update 5 keeps shard 1's replica
// lacking it out, whatever the numbers of shard 0's sequence; a worker
// holding the whole model is out once the shards have had updates.
func TestFollowerShardSequences(t *testing.T) {
	now := time.Now()
	f := newFollower("seq:1", nil, QuorumMajority, func() time.Time { return now }, time.Second)
	f.started = now.Add(-time.Hour)
	shard := func(id string, k int32, held int64) *prismv1.WorkerInfo {
		w := &prismv1.WorkerInfo{Id: id, Role: prismv1.Role_ROLE_EMBEDDING, Models: []string{"m"}, UpdateSeq: map[string]int64{"m": held}}
		if k >= 0 {
			w.Shards = map[string]*prismv1.ShardRef{"m": {Shard: k, Shards: 2}}
		}
		return w
	}
	ws := []*prismv1.WorkerInfo{shard("a1", 0, 2), shard("b1", 1, 5), shard("b2", 1, 5), shard("b3", 1, 3), shard("whole", -1, 0)}
	for _, w := range ws {
		f.announced(w)
	}
	want := map[string]bool{"a1": true, "b1": true, "b2": true, "b3": false, "whole": false}
	for _, w := range ws {
		if got := f.inSync(w, "m"); got != want[w.GetId()] {
			t.Errorf("inSync(%s) = %v, want %v (floors %v)", w.GetId(), got, want[w.GetId()], f.floor)
		}
	}
	// The sequencer's view, by sequence, sets each shard's bar.
	f.view = map[string]*prismv1.ModelUpdates{"m#shard0": {Acknowledged: 3, Numbered: 3}, "m#shard1": {Acknowledged: 3, Numbered: 5}}
	f.viewWorkers = map[string]bool{"a1": true, "b1": true, "b2": true, "b3": true, "whole": true}
	f.viewFrom = "seq:1"
	f.rejudge()
	want = map[string]bool{"a1": false, "b1": true, "b2": true, "b3": false, "whole": false}
	for _, w := range ws {
		if got := f.inSync(w, "m"); got != want[w.GetId()] {
			t.Errorf("with the view: inSync(%s) = %v, want %v (floors %v)", w.GetId(), got, want[w.GetId()], f.floor)
		}
	}
	// Workers of two shardings (a reshard): the sequencer leaves the
	// new sharding's out (its view's LeftOut, describe.go), and the
	// follower does too, even once the old sharding's workers are gone.
	g := newFollower("seq:1", nil, QuorumMajority, func() time.Time { return now }, time.Second)
	g.started = now.Add(-time.Hour)
	of := func(id, sharding string, held int64) *prismv1.WorkerInfo {
		w := shard(id, 0, held)
		w.Shards["m"].Sharding = sharding
		return w
	}
	old, fresh := of("old", "aa", 4), of("new", "bb", 0)
	g.announced(old)
	g.announced(fresh)
	g.view = map[string]*prismv1.ModelUpdates{"m#shard0": {Acknowledged: 4, Numbered: 4, LeftOut: []string{"new"}, InSync: []string{"old"}}}
	g.viewWorkers = map[string]bool{"old": true, "new": true}
	g.viewFrom = "seq:1"
	g.rejudge()
	if !g.inSync(old, "m") || g.inSync(fresh, "m") {
		t.Errorf("reshard: old serves %v (want true), new serves %v (want false)", g.inSync(old, "m"), g.inSync(fresh, "m"))
	}
	g.gone("old")
	if g.inSync(fresh, "m") {
		t.Error("reshard: the new sharding's worker serves once the old one is gone")
	}
}

// followRig: a sequencing router (an updateRig with its workers) and a
// second router that follows it, reaching the first's Embeddings
// service in process. The follower hears the same announcements.
type followRig struct {
	*updateRig
	fol     *Router
	seqAddr string
	stop    func()
	folSkew atomic.Int64
}

func newFollowRig(t *testing.T, cns ...*seqCN) *followRig {
	return newFollowRigOf(t, nil, cns...)
}

// newFollowRigOf is newFollowRig whose sequencer's Embeddings service
// is wrap's (nil: as it is), a sequencer of another release, say.
func newFollowRigOf(t *testing.T, wrap func(prismv1.EmbeddingsServer) prismv1.EmbeddingsServer, cns ...*seqCN) *followRig {
	return followRigOn(t, newUpdateRig(t, Options{}, cns...), wrap)
}

// followRigOn is a follower of base's router (past its start-up wait,
// or not).
func followRigOn(t *testing.T, base *updateRig, wrap func(prismv1.EmbeddingsServer) prismv1.EmbeddingsServer) *followRig {
	rig := &followRig{updateRig: base}
	addr, lis := listen(t)
	s := grpc.NewServer()
	var emb prismv1.EmbeddingsServer = rig.r.Updater()
	if wrap != nil {
		emb = wrap(emb)
	}
	prismv1.RegisterEmbeddingsServer(s, emb)
	prismv1.RegisterRegistryServer(s, rig.r.Reg)
	go s.Serve(lis)
	rig.stop = s.Stop
	t.Cleanup(s.Stop)
	rig.seqAddr = addr
	rig.fol = testRouter(Options{Sequencer: addr, now: func() time.Time { return time.Now().Add(time.Duration(rig.folSkew.Load())) }})
	rig.fol.opts.SequencerDialOptions = []grpc.DialOption{grpc.WithContextDialer(dialInproc)}
	rig.fol.fol.started = time.Now().Add(-time.Hour) // past its start-up wait (tested below)
	rig.fol.Reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: &prismv1.WorkerInfo{Id: "gpu", Role: prismv1.Role_ROLE_DENSE, Addr: "dense:a", Models: []string{"m"}, Healthy: true}})
	rig.announceBoth()
	return rig
}

// announceBoth: every worker announces to both routers.
func (rig *followRig) announceBoth() {
	rig.announce()
	for i, f := range rig.cns {
		rig.fol.Reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: &prismv1.WorkerInfo{
			Id: "cpu" + rig.addr[i], Role: prismv1.Role_ROLE_EMBEDDING, Addr: rig.addr[i], Models: []string{"m"}, Healthy: true,
			UpdateSeq: map[string]int64{"m": f.held()},
		}})
	}
}

// followerServes: which workers the follower would send a lookup to.
func (rig *followRig) followerServes() map[int]bool {
	got := map[int]bool{}
	for i := range rig.cns {
		var others []string
		for j := range rig.cns {
			if j != i {
				others = append(others, "cpu"+rig.addr[j])
			}
		}
		if _, release, err := rig.fol.Reg.Pick(prismv1.Role_ROLE_EMBEDDING, "m", 1, others); err == nil {
			release()
			got[i] = true
		}
	}
	return got
}

func (rig *followRig) updateVia(r *Router, ctx context.Context, id int64, v float32) (*prismv1.UpdateResponse, error) {
	rows := binary.LittleEndian.AppendUint32(nil, math.Float32bits(v))
	return r.Updater().Update(ctx, &prismv1.UpdateRequest{Model: "m", Table: "t", Ids: []int64{id}, Rows: rows})
}

// An update sent to the follower is sequenced by the other router and
// lands on every worker in the one order; the follower then leaves a
// worker that lacks it out of lookups, as the sequencer does.
func TestFollowerForwardsUpdates(t *testing.T) {
	rig := newFollowRig(t, &seqCN{}, &seqCN{}, &seqCN{})
	for i := range 5 {
		r := rig.fol
		if i%2 == 1 {
			r = rig.r // both routers take updates of the same model
		}
		if _, err := rig.updateVia(r, context.Background(), int64(i), float32(i+1)); err != nil {
			t.Fatalf("update %d: %v", i, err)
		}
	}
	for i, f := range rig.cns {
		if f.held() != 5 || !slices.Equal(f.order, []int64{1, 2, 3, 4, 5}) {
			t.Fatalf("worker %d holds %d in order %v", i, f.held(), f.order)
		}
	}
	rig.announceBoth()
	if got := rig.followerServes(); len(got) != 3 {
		t.Fatalf("all up to date: follower serves from %v", got)
	}
	// Worker 2 goes down for an update and comes back behind.
	rig.cns[2].setDown(true)
	if _, err := rig.updateVia(rig.fol, context.Background(), 9, 9); err != nil {
		t.Fatalf("update with one worker down (a majority holds it): %v", err)
	}
	rig.cns[2].setDown(false)
	rig.announceBoth()
	if got := rig.followerServes(); got[2] || !got[0] || !got[1] {
		t.Fatalf("worker 2 lacks update 6: follower serves from %v", got)
	}
	// The sequencer catches it up; once it announces, it serves again.
	rig.tick()
	rig.announceBoth()
	if got := rig.followerServes(); !got[2] {
		t.Fatalf("worker 2 caught up (holds %d): follower serves from %v", rig.cns[2].held(), got)
	}
}

// A follower that cannot reach the sequencer answers Unavailable naming
// it, and nothing is applied anywhere; the sequencer's own answers
// (bad input, unknown model) pass through as they are.
func TestFollowerWithoutSequencer(t *testing.T) {
	rig := newFollowRig(t, &seqCN{}, &seqCN{})
	if _, err := rig.fol.Updater().Update(context.Background(), &prismv1.UpdateRequest{Model: "nope", Table: "t", Ids: []int64{1}, Rows: []byte{0, 0, 0, 0}}); status.Code(err) != codes.NotFound {
		t.Fatalf("unknown model through the follower: %v, want NotFound", err)
	}
	rig.stop()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, err := rig.updateVia(rig.fol, ctx, 1, 1)
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), rig.seqAddr) {
		t.Fatalf("sequencer down: %v, want Unavailable naming %s", err, rig.seqAddr)
	}
	for i, f := range rig.cns {
		if f.held() != 0 {
			t.Fatalf("worker %d applied %d with the sequencer down", i, f.held())
		}
	}
}

// A forwarded update reaching a router that itself follows is refused:
// two routers naming each other would pass it around for ever.
func TestFollowerRefusesForwarded(t *testing.T) {
	rig := newFollowRig(t, &seqCN{})
	ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs(forwardedKey, "router"))
	if _, err := rig.updateVia(rig.fol, ctx, 1, 1); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("forwarded to a follower: %v, want FailedPrecondition", err)
	}
	// The sequencer takes forwarded updates as any other.
	if _, err := rig.updateVia(rig.r, ctx, 1, 1); err != nil {
		t.Fatalf("forwarded to the sequencer: %v", err)
	}
}

// Just after it starts, a follower serves no lookups of a model with
// updates until three heartbeats have passed (the workers are still
// announcing); a model without updates is served at once.
func TestFollowerStartupWait(t *testing.T) {
	rig := newFollowRig(t, &seqCN{}, &seqCN{})
	if got := rig.followerServes(); len(got) != 2 {
		t.Fatalf("no updates yet: follower serves from %v", got)
	}
	if _, err := rig.updateVia(rig.r, context.Background(), 1, 1); err != nil {
		t.Fatal(err)
	}
	rig.fol.fol.started = rig.fol.Reg.now()
	rig.announceBoth()
	if got := rig.followerServes(); len(got) != 0 {
		t.Fatalf("just started, model updated: follower serves from %v", got)
	}
	rig.folSkew.Add(int64(3*rig.fol.opts.Heartbeat) + 1)
	rig.announceBoth()
	if got := rig.followerServes(); len(got) != 2 {
		t.Fatalf("three heartbeats later: follower serves from %v", got)
	}
}

// A follower keeps no update log: asking for one is an error at start.
func TestFollowerKeepsNoLog(t *testing.T) {
	if _, err := Open(Options{Sequencer: "other:1", UpdateLogDir: t.TempDir()}, nil); err == nil || !strings.Contains(err.Error(), "other:1") {
		t.Fatalf("follower with an update log: %v", err)
	}
}

// poll has the follower ask the sequencer for its view, as its
// heartbeat does.
func (rig *followRig) poll() {
	rig.t.Helper()
	if err := rig.fol.fol.poll(context.Background(), rig.seqAddr, time.Second); err != nil {
		rig.t.Fatal(err)
	}
}

// The review's cases: a worker whose store claims updates the sequencer
// never numbered is left out by the sequencer, and the follower follows
// that judgment instead of believing the claim; under quorum one a
// single worker's claim stops ruling the honest ones once the follower
// has the sequencer's view; a claim past any sequence is never taken.
func TestFollowerTakesTheSequencersJudgment(t *testing.T) {
	for _, q := range []Quorum{QuorumMajority, QuorumOne} {
		t.Run(q.String(), func(t *testing.T) {
			rig := newFollowRig(t, &seqCN{}, &seqCN{})
			rig.fol.fol.quorum = q // the follower's rule under test
			for i := range 10 {
				if _, err := rig.updateVia(rig.r, context.Background(), int64(i), 1); err != nil {
					t.Fatal(err)
				}
			}
			rig.announceBoth()
			rig.poll()
			// A third worker joins with a store from another history.
			liar := &seqCN{}
			liar.seq = 500
			rig.add(liar)
			rig.announceBoth()
			if got := rig.followerServes(); got[2] || !got[0] || !got[1] {
				t.Fatalf("before the sequencer judged it: follower serves from %v (worker 2 claims 500 of 10 numbered)", got)
			}
			rig.poll()
			if got := rig.followerServes(); got[2] || !got[0] || !got[1] {
				t.Fatalf("after the sequencer left it out: follower serves from %v", got)
			}
			if got := rig.servers(); got[2] {
				t.Fatalf("the sequencer serves from the liar: %v", got)
			}
		})
	}
	// A claim past any sequence never sets the floor, view or not.
	rig := newFollowRig(t, &seqCN{}, &seqCN{})
	rig.fol.fol.quorum = QuorumOne
	if _, err := rig.updateVia(rig.r, context.Background(), 1, 1); err != nil {
		t.Fatal(err)
	}
	liar := &seqCN{}
	liar.seq = 1 << 62
	rig.add(liar)
	rig.announceBoth()
	if got := rig.followerServes(); !got[0] || !got[1] || got[2] {
		t.Fatalf("a claim of 2^62 under quorum one: follower serves from %v", got)
	}
}

// The follower serves from exactly the workers the sequencer serves from,
// also right after an update, before the workers' next announcement has
// reached the follower (its copy of what they hold lags the sequencer's
// acknowledgement: the sequencer's in_sync list vouches for them).
func TestFollowerAgreesWithTheSequencer(t *testing.T) {
	rig := newFollowRig(t, &seqCN{}, &seqCN{}, &seqCN{})
	for i := range 5 {
		if _, err := rig.updateVia(rig.r, context.Background(), int64(i), 1); err != nil {
			t.Fatal(err)
		}
	}
	rig.announceBoth()
	rig.poll()
	if got, want := rig.followerServes(), rig.servers(); len(got) != 3 || !maps.Equal(got, want) {
		t.Fatalf("follower serves from %v, the sequencer from %v", got, want)
	}
	// One more update, announced to the sequencer only: the follower's
	// copy of what the workers hold is one update behind.
	if _, err := rig.updateVia(rig.r, context.Background(), 9, 1); err != nil {
		t.Fatal(err)
	}
	rig.announce()
	rig.poll()
	if got, want := rig.followerServes(), rig.servers(); len(got) != 3 || !maps.Equal(got, want) {
		t.Fatalf("after an update not yet announced to the follower: follower serves from %v, the sequencer from %v", got, want)
	}
}

// earlierSequencer answers updates as a sequencer of a release before
// UpdateResponse.held: without it.
type earlierSequencer struct {
	prismv1.EmbeddingsServer
}

func (e earlierSequencer) Update(ctx context.Context, req *prismv1.UpdateRequest) (*prismv1.UpdateResponse, error) {
	resp, err := e.EmbeddingsServer.Update(ctx, req)
	if resp != nil {
		resp = &prismv1.UpdateResponse{Workers: resp.GetWorkers(), Refused: resp.GetRefused(), Shards: resp.GetShards()}
	}
	return resp, err
}

// Read-your-writes through a forwarding router: once an update it
// forwarded is acknowledged, a lookup through it goes only to workers
// holding the update, before the workers announce it and before its
// next poll of the sequencer (found by review: until that poll, a
// heartbeat later, it still sent lookups to a worker that missed the
// update, which the sequencer's last view named in sync). The
// sequencer's answer names the workers holding it (UpdateResponse.held);
// a sequencer of an earlier release names none, and the follower
// judges as before, from its next poll.
func TestFollowerReadsItsOwnWrites(t *testing.T) {
	for _, tc := range []struct {
		name    string
		polled  bool // the follower has the sequencer's view from before the update
		earlier bool // the sequencer is of a release before UpdateResponse.held
	}{
		{name: "view", polled: true},
		{name: "no view", polled: false},
		{name: "earlier sequencer", polled: true, earlier: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var wrap func(prismv1.EmbeddingsServer) prismv1.EmbeddingsServer
			if tc.earlier {
				wrap = func(s prismv1.EmbeddingsServer) prismv1.EmbeddingsServer { return earlierSequencer{s} }
			}
			rig := newFollowRigOf(t, wrap, &seqCN{}, &seqCN{}, &seqCN{})
			for i := range 2 {
				if _, err := rig.updateVia(rig.fol, context.Background(), int64(i), 1); err != nil {
					t.Fatal(err)
				}
			}
			rig.announceBoth()
			if tc.polled {
				rig.poll()
			}
			if got := rig.followerServes(); len(got) != 3 {
				t.Fatalf("all up to date: follower serves from %v", got)
			}
			// Worker 2 misses update 3, which a majority holds.
			rig.cns[2].setDown(true)
			resp, err := rig.updateVia(rig.fol, context.Background(), 7, 7)
			if err != nil {
				t.Fatalf("update with one worker down: %v", err)
			}
			rig.cns[2].setDown(false)
			held := resp.GetHeld()["m"]
			if tc.earlier {
				if len(resp.GetHeld()) != 0 {
					t.Fatalf("a sequencer of an earlier release answered held %v", resp.GetHeld())
				}
				// As before: the follower learns of it at its next poll.
				if got := rig.followerServes(); len(got) != 3 {
					t.Fatalf("earlier sequencer, before the poll: follower serves from %v, want all three as before", got)
				}
			} else {
				// At once: no announcement, no poll since the answer.
				if got := rig.followerServes(); got[2] || !got[0] || !got[1] {
					t.Fatalf("right after the acknowledged update: follower serves from %v, want workers 0 and 1 (worker 2 lacks update 3)", got)
				}
				if want := slices.Sorted(slices.Values([]string{"cpu" + rig.addr[0], "cpu" + rig.addr[1]})); held.GetSeq() != 3 || !slices.Equal(held.GetWorkers(), want) {
					t.Fatalf("answer's held = %v, want seq 3 on %v", resp.GetHeld(), want)
				}
			}
			// The poll and the announcements agree.
			rig.announceBoth()
			rig.poll()
			if got := rig.followerServes(); got[2] || !got[0] || !got[1] {
				t.Fatalf("after the poll: follower serves from %v, want workers 0 and 1", got)
			}
			if n := len(rig.fol.fol.acked); n != 0 {
				t.Fatalf("after the poll the follower still keeps %d forwarded updates: the view answers for them", n)
			}
			// Caught up, worker 2 serves again.
			rig.tick()
			rig.announceBoth()
			rig.poll()
			if got := rig.followerServes(); len(got) != 3 {
				t.Fatalf("worker 2 caught up (holds %d): follower serves from %v", rig.cns[2].held(), got)
			}
		})
	}
}

// Read-your-writes through a forwarding router for a sharded model: an
// update of a row-wise table is numbered in each shard's sequence, and
// the answer names per shard the workers holding its part, so the
// follower at once leaves out of each shard the worker that missed it,
// and the other shards' workers keep serving.
func TestFollowerReadsItsOwnWritesSharded(t *testing.T) {
	cns := make([]*seqCN, 6)
	for i := range cns {
		cns[i] = &seqCN{}
	}
	rig := newFollowRig(t, cns...)
	infos := make([]*prismv1.WorkerInfo, len(cns))
	announce := func() {
		rows := []*prismv1.RowSplit{{Table: "t", Shards: []int32{0, 1}, Rows: 100}}
		for i, f := range rig.cns {
			infos[i] = &prismv1.WorkerInfo{Id: "cpu" + rig.addr[i], Role: prismv1.Role_ROLE_EMBEDDING, Addr: rig.addr[i], Models: []string{"m"}, Healthy: true,
				UpdateSeq: map[string]int64{"m": f.held()},
				Shards:    map[string]*prismv1.ShardRef{"m": {Shard: int32(i % 2), Shards: 2, Tables: []string{"t"}, RowSplits: rows, RowSplitsComplete: true}}}
			for _, r := range []*Router{rig.r, rig.fol} {
				if _, err := r.Reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: infos[i]}); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	serves := func() map[int]bool {
		got := map[int]bool{}
		for i, w := range infos {
			if rig.fol.fol.inSync(w, "m") {
				got[i] = true
			}
		}
		return got
	}
	update := func(ids ...int64) (*prismv1.UpdateResponse, error) {
		return rig.fol.Updater().Update(context.Background(), &prismv1.UpdateRequest{Model: "m", Table: "t", Ids: ids, Rows: make([]byte, 4*len(ids))})
	}
	announce()
	rig.settle()                            // past the shards' sequences' start-up window
	if _, err := update(0, 1); err != nil { // one part per shard
		t.Fatal(err)
	}
	announce()
	rig.poll()
	if got := serves(); len(got) != 6 {
		t.Fatalf("all up to date: follower serves from %v", got)
	}
	// Worker 4 (shard 0) and worker 5 (shard 1) miss an update of both
	// shards; worker 2 (shard 0) then misses one of shard 0 alone.
	rig.cns[4].setDown(true)
	rig.cns[5].setDown(true)
	resp, err := update(2, 3)
	if err != nil {
		t.Fatal(err)
	}
	rig.cns[4].setDown(false)
	rig.cns[5].setDown(false)
	if got, want := serves(), map[int]bool{0: true, 1: true, 2: true, 3: true}; !maps.Equal(got, want) {
		t.Fatalf("right after the update of both shards: follower serves from %v, want %v", got, want)
	}
	if h0, h1 := resp.GetHeld()["m#shard0"], resp.GetHeld()["m#shard1"]; h0.GetSeq() != 2 || len(h0.GetWorkers()) != 2 || h1.GetSeq() != 2 || len(h1.GetWorkers()) != 2 {
		t.Fatalf("answer's held = %v, want seq 2 on two workers of each shard", resp.GetHeld())
	}
	// The sequencer catches workers 4 and 5 up; they announce it.
	announce()
	rig.r.upd.tick(context.Background())
	rig.r.upd.wait()
	announce()
	if got := serves(); len(got) != 6 {
		t.Fatalf("workers 4 and 5 caught up (hold %d, %d): follower serves from %v", rig.cns[4].held(), rig.cns[5].held(), got)
	}
	rig.cns[2].setDown(true)
	if resp, err = update(4); err != nil {
		t.Fatal(err)
	}
	rig.cns[2].setDown(false)
	want := map[int]bool{0: true, 1: true, 3: true, 4: true, 5: true}
	if got := serves(); !maps.Equal(got, want) {
		t.Fatalf("right after the update of shard 0: follower serves from %v, want %v", got, want)
	}
	h := resp.GetHeld()
	if holders := slices.Sorted(slices.Values([]string{"cpu" + rig.addr[0], "cpu" + rig.addr[4]})); len(h) != 1 || h["m#shard0"].GetSeq() != 3 || !slices.Equal(h["m#shard0"].GetWorkers(), holders) {
		t.Fatalf("answer's held = %v, want shard 0's seq 3 on workers 0 and 4", h)
	}
	announce()
	rig.poll()
	if got := serves(); !maps.Equal(got, want) {
		t.Fatalf("after the poll: follower serves from %v, want %v", got, want)
	}
}

// settlingRegistry answers List as a router elected moments ago does:
// its view of model m settling (learning what the workers hold).
type settlingRegistry struct {
	prismv1.UnimplementedRegistryServer
	updates map[string]*prismv1.ModelUpdates
	workers []*prismv1.WorkerInfo
}

func (s settlingRegistry) List(context.Context, *prismv1.ListRequest) (*prismv1.ListResponse, error) {
	return &prismv1.ListResponse{Updates: s.updates, Workers: s.workers}, nil
}

// An update this router forwarded to the elected sequencer, acknowledged
// with the workers holding it named, still bars the worker lacking it
// when the election moves before the holders announce it: whether the
// new holder cannot be reached yet, or answers settling (found by
// review: its number was moved into the floor, which the claims lowered
// at once, no worker having announced it yet, and the worker lacking it
// served lookups right after the answer).
func TestFollowerKeepsForwardedAcrossMove(t *testing.T) {
	for _, tc := range []struct {
		name     string
		settling bool // the new holder answers, settling; else it cannot be reached
	}{
		{name: "new holder unreachable"},
		{name: "new holder settling", settling: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var ws []*prismv1.WorkerInfo
			for _, id := range []string{"w0", "w1", "w2"} {
				ws = append(ws, &prismv1.WorkerInfo{Id: id, Role: prismv1.Role_ROLE_EMBEDDING, Models: []string{"m"}, UpdateSeq: map[string]int64{"m": 2}})
			}
			addrB := "router-b"
			if tc.settling {
				addrB = serveInproc(t, func(s *grpc.Server) {
					prismv1.RegisterRegistryServer(s, settlingRegistry{
						updates: map[string]*prismv1.ModelUpdates{"m": {Acknowledged: 2, Numbered: 2, Settling: true}},
						workers: ws,
					})
				})
			}
			conn := func(addr string) (*grpc.ClientConn, error) {
				if addr != addrB || !tc.settling {
					return nil, fmt.Errorf("dial %s: connection refused", addr)
				}
				return grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithContextDialer(dialInproc))
			}
			now := time.Now()
			f := newFollower("", conn, QuorumMajority, func() time.Time { return now }, time.Second)
			f.started = now.Add(-time.Hour)
			f.elected = true
			for _, w := range ws {
				f.announced(w)
			}
			// The view of router A, the holder: update 2 acknowledged.
			f.view = map[string]*prismv1.ModelUpdates{"m": {Acknowledged: 2, Numbered: 2, InSync: []string{"w0", "w1", "w2"}}}
			f.viewWorkers = map[string]bool{"w0": true, "w1": true, "w2": true}
			f.viewFrom = "router-a"
			f.rejudge()
			// Update 3, forwarded to A, acknowledged by w0 and w1; w2 missed it.
			f.took("router-a", "m", &prismv1.UpdateResponse{Workers: 2, Held: map[string]*prismv1.UpdateHeld{"m": {Seq: 3, Workers: []string{"w0", "w1"}}}})
			serves := func() map[string]bool {
				got := map[string]bool{}
				for _, w := range ws {
					if f.inSync(w, "m") {
						got[w.GetId()] = true
					}
				}
				return got
			}
			want := map[string]bool{"w0": true, "w1": true}
			if got := serves(); !maps.Equal(got, want) {
				t.Fatalf("right after the answer: serves %v, want %v", got, want)
			}
			// The election moves to B before the workers' next heartbeat.
			f.poll(context.Background(), addrB, time.Second)
			if got := serves(); !maps.Equal(got, want) {
				t.Fatalf("after polling the new holder: serves %v, want %v (w2 lacks acknowledged update 3)", got, want)
			}
			// The holders announce it; w2 stays out until it holds it.
			for _, w := range ws[:2] {
				w.UpdateSeq["m"] = 3
				f.announced(w)
			}
			f.poll(context.Background(), addrB, time.Second)
			if got := serves(); !maps.Equal(got, want) {
				t.Fatalf("holders announced: serves %v, want %v", got, want)
			}
			ws[2].UpdateSeq["m"] = 3
			f.announced(ws[2])
			if got := serves(); len(got) != 3 {
				t.Fatalf("w2 caught up: serves %v", got)
			}
		})
	}
}

// TestFollowerSequencerUnreachable: the sequencer's last view listed
// every worker in sync at update 1; then its polls fail (cut off) while
// w0 and w1 announce update 2, which the sequencer acknowledged without
// w2 (a majority). w2, announcing 1, lacks an acknowledged update: the
// claims say so (the quorum-th highest is 2), and it must not serve
// because a view no poll has renewed since listed it in sync. While the
// polls succeed, the list is taken (an announcement may lag it).
func TestFollowerSequencerUnreachable(t *testing.T) {
	now := time.Now()
	conn := func(addr string) (*grpc.ClientConn, error) {
		return nil, fmt.Errorf("dial %s: no route to host", addr)
	}
	f := newFollower("seq:1", conn, QuorumMajority, func() time.Time { return now }, time.Second)
	f.started = now.Add(-time.Hour)
	var ws []*prismv1.WorkerInfo
	for _, id := range []string{"w0", "w1", "w2"} {
		w := &prismv1.WorkerInfo{Id: id, Role: prismv1.Role_ROLE_EMBEDDING, Models: []string{"m"}, UpdateSeq: map[string]int64{"m": 1}}
		ws = append(ws, w)
		f.announced(w)
	}
	f.view = map[string]*prismv1.ModelUpdates{"m": {Acknowledged: 1, Numbered: 1, InSync: []string{"w0", "w1", "w2"}}}
	f.viewWorkers = map[string]bool{"w0": true, "w1": true, "w2": true}
	f.viewFrom = "seq:1"
	f.rejudge()
	serves := func() map[string]bool {
		got := map[string]bool{}
		for _, w := range ws {
			if f.inSync(w, "m") {
				got[w.GetId()] = true
			}
		}
		return got
	}
	// The view is current: w0 announced 2 (acknowledged after the view).
	ws[0].UpdateSeq["m"] = 2
	f.announced(ws[0])
	if got, want := serves(), map[string]bool{"w0": true, "w1": true, "w2": true}; !maps.Equal(got, want) {
		t.Fatalf("with the view current: serves %v, want %v", got, want)
	}
	// The sequencer cut off: the polls fail. One failure alone (a
	// sequencer busy for a heartbeat) keeps the view's judgment
	// (cutOffPolls); the next takes it for cut off.
	if err := f.poll(context.Background(), "seq:1", time.Second); err == nil {
		t.Fatal("the poll of an unreachable sequencer succeeded")
	}
	if got, want := serves(), map[string]bool{"w0": true, "w1": true, "w2": true}; !maps.Equal(got, want) {
		t.Fatalf("after one failed poll: serves %v, want %v", got, want)
	}
	if err := f.poll(context.Background(), "seq:1", time.Second); err == nil {
		t.Fatal("the poll of an unreachable sequencer succeeded")
	}
	// w1 announces 2 as well.
	ws[1].UpdateSeq["m"] = 2
	f.announced(ws[1])
	if got, want := serves(), map[string]bool{"w0": true, "w1": true}; !maps.Equal(got, want) {
		t.Fatalf("sequencer unreachable, w0 and w1 announce update 2: serves %v, want %v (w2 lacks it)", got, want)
	}
	ws[2].UpdateSeq["m"] = 2
	f.announced(ws[2])
	if got := serves(); len(got) != 3 {
		t.Fatalf("w2 caught up: serves %v", got)
	}
	// Update 3, acknowledged by w2 alone: the sequencer reaches only w2
	// (w0 and w1 cut off from it: its live workers, whose majority is
	// one). Only w2 holds it, whatever the quorum among the three.
	ws[2].UpdateSeq["m"] = 3
	f.announced(ws[2])
	if got, want := serves(), map[string]bool{"w2": true}; !maps.Equal(got, want) {
		t.Fatalf("sequencer unreachable, w2 alone announces update 3: serves %v, want %v", got, want)
	}
	// The sequencer answers again: w0 and w1 back in its reach and
	// being caught up, update 3 acknowledged and w2 alone in sync. Its
	// view judges again (the quorum-th highest claim raises it between
	// answers): w0 and w1 serve once they announce update 3.
	addr := serveInproc(t, func(s *grpc.Server) {
		prismv1.RegisterRegistryServer(s, settlingRegistry{
			updates: map[string]*prismv1.ModelUpdates{"m": {Acknowledged: 3, Numbered: 3, InSync: []string{"w2"}}},
			workers: ws,
		})
	})
	f.conn = func(string) (*grpc.ClientConn, error) {
		return grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithContextDialer(dialInproc))
	}
	if err := f.poll(context.Background(), "seq:1", time.Second); err != nil {
		t.Fatal(err)
	}
	ws[0].UpdateSeq["m"] = 3
	f.announced(ws[0])
	if got, want := serves(), map[string]bool{"w0": true, "w2": true}; !maps.Equal(got, want) {
		t.Fatalf("sequencer back, w0 caught up: serves %v, want %v", got, want)
	}
}

// viewRegistry answers List with the view set last (set).
type viewRegistry struct {
	prismv1.UnimplementedRegistryServer
	mu      sync.Mutex
	updates map[string]*prismv1.ModelUpdates
	workers []*prismv1.WorkerInfo
}

func (s *viewRegistry) set(u map[string]*prismv1.ModelUpdates, ws []*prismv1.WorkerInfo) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.updates, s.workers = u, ws
}

func (s *viewRegistry) List(context.Context, *prismv1.ListRequest) (*prismv1.ListResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return &prismv1.ListResponse{Updates: s.updates, Workers: s.workers}, nil
}

// TestFollowerOnePollFailure: updates flow (one every 100 ms, each held
// by every worker as it is acknowledged), the three workers announce
// once a heartbeat (1 s) at staggered times, so their claims differ by
// the updates since each last announced, and the follower polls a
// current view (every worker in sync) at each heartbeat. One poll fails
// (a timeout: a sequencer busy for a heartbeat), the next succeeds. The
// workers serving, on average over the heartbeat after the failure,
// must stay all three: judged by the highest claim from that one
// failure, only the worker that announced last served (1 of 3 on
// average; found by review), its peers taken out though they held
// every update: their load on one worker for a heartbeat.
func TestFollowerOnePollFailure(t *testing.T) {
	reg := &viewRegistry{}
	addr := serveInproc(t, func(s *grpc.Server) { prismv1.RegisterRegistryServer(s, reg) })
	var unreachable atomic.Bool
	conn := func(string) (*grpc.ClientConn, error) {
		if unreachable.Load() {
			return nil, fmt.Errorf("dial %s: context deadline exceeded", addr)
		}
		return grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithContextDialer(dialInproc))
	}
	start := time.Now()
	var now time.Time
	f := newFollower("seq:1", conn, QuorumMajority, func() time.Time { return now }, time.Second)
	f.started = start.Add(-time.Hour)
	var ws []*prismv1.WorkerInfo
	for _, id := range []string{"w0", "w1", "w2"} {
		ws = append(ws, &prismv1.WorkerInfo{Id: id, Role: prismv1.Role_ROLE_EMBEDDING, Models: []string{"m"}, UpdateSeq: map[string]int64{"m": 1}})
	}
	for _, w := range ws {
		f.announced(w)
	}
	const failAt = 2500         // ms: the poll that fails
	var serving, samples [3]int // before the failure, in the heartbeat after it, after the next poll
	for ms := 0; ms < 4000; ms += 10 {
		now = start.Add(time.Duration(ms) * time.Millisecond)
		seq := int64(ms/100 + 1) // acknowledged, and held by every worker
		for i, w := range ws {
			if ms%1000 == i*330 {
				w := proto.Clone(w).(*prismv1.WorkerInfo)
				w.UpdateSeq["m"] = seq
				ws[i] = w
				f.announced(w)
			}
		}
		if ms%1000 == 500 {
			reg.set(map[string]*prismv1.ModelUpdates{"m": {Acknowledged: seq, Numbered: seq, InSync: []string{"w0", "w1", "w2"}}}, ws)
			unreachable.Store(ms == failAt)
			err := f.poll(context.Background(), "seq:1", time.Second)
			if (err != nil) != (ms == failAt) {
				t.Fatalf("poll at %d ms: %v", ms, err)
			}
		}
		k := -1
		switch {
		case ms >= 1000 && ms < failAt:
			k = 0
		case ms >= failAt && ms < failAt+1000:
			k = 1
		case ms >= failAt+1000:
			k = 2
		}
		if k < 0 {
			continue
		}
		for _, w := range ws {
			samples[k]++
			if f.inSync(w, "m") {
				serving[k]++
			}
		}
	}
	before := 3 * float64(serving[0]) / float64(samples[0])
	after := 3 * float64(serving[1]) / float64(samples[1])
	again := 3 * float64(serving[2]) / float64(samples[2])
	t.Logf("workers serving on average: %.2f of 3 with every poll answered, %.2f in the heartbeat after one failed poll, %.2f once a poll succeeds again", before, after, again)
	if before < 3 || after < 3 || again < 3 {
		t.Errorf("workers serving on average: %.2f of 3 with every poll answered, %.2f in the heartbeat after one failed poll, %.2f once a poll succeeds again; want 3 (every worker holds every acknowledged update)", before, after, again)
	}
}

// TestFollowerSilentPerHolder: a forward is abandoned once silentPolls
// polls of its sequencer failed in a row; the election moving from a
// holder whose polls failed to another starts that run again, so the
// new holder's first failed poll (a router starting to sequence, busy
// for a heartbeat) does not abandon the updates forwarded to it. The
// router has no view all along: cut off (cutOff) counts every failed
// poll, whatever its address.
func TestFollowerSilentPerHolder(t *testing.T) {
	now := time.Now()
	conn := func(addr string) (*grpc.ClientConn, error) {
		return nil, fmt.Errorf("dial %s: no route to host", addr)
	}
	f := newFollower("a:1", conn, QuorumMajority, func() time.Time { return now }, time.Second)
	closed := func(ch chan struct{}) bool {
		select {
		case <-ch:
			return true
		default:
			return false
		}
	}
	for range silentPolls {
		_ = f.poll(context.Background(), "a:1", time.Second)
	}
	if !f.cutOff() {
		t.Fatalf("after %d failed polls of a:1: not cut off", silentPolls)
	}
	// An update forwarded to b:1, the new holder, after a:1's polls failed.
	f.mu.Lock()
	silent := f.silent
	f.mu.Unlock()
	if err := f.poll(context.Background(), "b:1", time.Second); err == nil {
		t.Fatal("the poll of an unreachable sequencer succeeded")
	}
	if closed(silent) {
		t.Fatalf("one failed poll of b:1 (after %d of a:1) abandoned the updates forwarded to b:1", silentPolls)
	}
	if !f.cutOff() {
		t.Fatal("no view for three polls: not cut off")
	}
	for range silentPolls - 1 {
		_ = f.poll(context.Background(), "b:1", time.Second)
	}
	if !closed(silent) {
		t.Fatalf("%d failed polls of b:1 in a row: its forwards not abandoned", silentPolls)
	}
}
