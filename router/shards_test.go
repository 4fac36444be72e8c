package router

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"unicode/utf8"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
)

// shardCN is an embedding worker double holding one shard: it records
// the lookups it gets and answers as fakeCN does.
type shardCN struct {
	fakeCN
	times *prismv1.StageTimes // set on every answer when not nil
	mu    sync.Mutex
	reqs  []*prismv1.LookupRequest
}

func (f *shardCN) Lookup(ctx context.Context, req *prismv1.LookupRequest) (*prismv1.LookupResponse, error) {
	f.mu.Lock()
	f.reqs = append(f.reqs, req)
	f.mu.Unlock()
	resp, err := f.fakeCN.Lookup(ctx, req)
	if err == nil && f.times != nil {
		resp.Times = f.times
	}
	return resp, err
}

func (f *shardCN) got() []*prismv1.LookupRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*prismv1.LookupRequest(nil), f.reqs...)
}

// announceShard registers f as holding shard k of n of model "m".
func announceShard(t *testing.T, r *Router, id string, f *shardCN, k, n int, outstanding int64) {
	t.Helper()
	addr := startCN(t, f)
	_, err := r.Reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: &prismv1.WorkerInfo{
		Id: id, Role: prismv1.Role_ROLE_EMBEDDING, Addr: addr, Models: []string{"m"}, Healthy: true, Outstanding: outstanding,
		Shards: map[string]*prismv1.ShardRef{"m": {Shard: int32(k), Shards: int32(n)}},
	}})
	if err != nil {
		t.Fatal(err)
	}
}

// Every micro-batch of a sharded model goes to one replica of every
// shard (the least loaded), each with the same ids, dense worker and
// fan-out key and its own shard index; the scores are shard 0's.
func TestShardedFanOut(t *testing.T) {
	r := testRouter(Options{MicroBatch: 10})
	r.Reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: &prismv1.WorkerInfo{Id: "gpu", Role: prismv1.Role_ROLE_DENSE, Addr: "dense:a", Models: []string{"m"}, Healthy: true}})
	s0, s1busy, s1, s2 := &shardCN{}, &shardCN{}, &shardCN{}, &shardCN{fakeCN: fakeCN{tag: 1000}}
	announceShard(t, r, "s0", s0, 0, 3, 0)
	announceShard(t, r, "s1-busy", s1busy, 1, 3, 500)
	announceShard(t, r, "s1", s1, 1, 3, 0)
	announceShard(t, r, "s2", s2, 2, 3, 0)
	resp, err := r.Recommend(context.Background(), request(25))
	if err != nil {
		t.Fatal(err)
	}
	for i, s := range resp.GetScores() {
		if s != float32(i) {
			t.Fatalf("score %d = %v: not shard 0's", i, s)
		}
	}
	if n := len(s1busy.got()); n != 0 {
		t.Errorf("the busier replica of shard 1 got %d lookups", n)
	}
	keys := map[string]int{}
	for k, f := range []*shardCN{s0, s1, s2} {
		reqs := f.got()
		if len(reqs) != 3 {
			t.Fatalf("shard %d: %d lookups, want 3 (one per micro-batch)", k, len(reqs))
		}
		for _, q := range reqs {
			if int(q.GetShard()) != k || q.GetShards() != 3 || q.GetDenseAddr() != "dense:a" || q.GetFanoutKey() == "" {
				t.Errorf("shard %d got shard %d of %d, dense %q, key %q", k, q.GetShard(), q.GetShards(), q.GetDenseAddr(), q.GetFanoutKey())
			}
			keys[q.GetFanoutKey()+"|"+strings.Repeat("x", int(q.GetNumSamples()))]++
		}
	}
	if len(keys) != 3 {
		t.Errorf("%d distinct fan-outs, want 3", len(keys))
	}
	for k, n := range keys {
		if n != 3 {
			t.Errorf("fan-out %q reached %d shards, want 3", k, n)
		}
	}
}

// A shard without a live worker fails the request at once with
// Unavailable naming it, and no shard is sent anything; it serves again
// once the shard is back.
func TestShardMissingFailsFast(t *testing.T) {
	r := testRouter(Options{})
	r.Reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: &prismv1.WorkerInfo{Id: "gpu", Role: prismv1.Role_ROLE_DENSE, Addr: "dense:a", Models: []string{"m"}, Healthy: true}})
	s0, s2 := &shardCN{}, &shardCN{}
	announceShard(t, r, "s0", s0, 0, 3, 0)
	announceShard(t, r, "s2", s2, 2, 3, 0)
	_, err := r.Recommend(context.Background(), request(4))
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "shard(s) [1] of 3") {
		t.Fatalf("%v, want Unavailable naming shard 1", err)
	}
	if len(s0.got())+len(s2.got()) != 0 {
		t.Errorf("lookups sent with a shard missing")
	}
	s1 := &shardCN{}
	announceShard(t, r, "s1", s1, 1, 3, 0)
	if _, err := r.Recommend(context.Background(), request(4)); err != nil {
		t.Fatalf("with every shard back: %v", err)
	}
	// A shard that fails fails the request (after the retry finds no
	// other replica), never a partial score.
	s1.fail = true
	if _, err := r.Recommend(context.Background(), request(4)); status.Code(err) != codes.Unavailable {
		t.Fatalf("a failing shard: %v, want Unavailable", err)
	}
}

// A worker cannot announce a shard that does not exist.
func TestAnnounceBadShard(t *testing.T) {
	r := testRouter(Options{})
	for _, ref := range []*prismv1.ShardRef{{Shard: 3, Shards: 3}, {Shard: -1, Shards: 3}, {Shard: 0, Shards: 0}, {Shard: 0, Shards: 1 << 20}} {
		_, err := r.Reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: &prismv1.WorkerInfo{
			Id: "x", Role: prismv1.Role_ROLE_EMBEDDING, Addr: "a", Models: []string{"m"}, Healthy: true,
			Shards: map[string]*prismv1.ShardRef{"m": ref},
		}})
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("shard %d of %d: %v", ref.Shard, ref.Shards, err)
		}
	}
}

// TestPickShardsOneSharding: a fan-out's workers hold one sharding.
// While workers of two shardings with one shard count are live (a
// reshard rolling out before the model's first update binds its
// layout), the complete sharding at the least load is taken, never a
// mix: its parts would combine one layout's rows with another's. A
// worker that names no sharding (an earlier release) joins any.
func TestPickShardsOneSharding(t *testing.T) {
	type w struct {
		id    string
		shard int
		fp    string
		load  int64
	}
	for _, tc := range []struct {
		name    string
		workers []w
		avoid   []string
		want    []string // the ids picked, by shard; nil: ShardMissingError
		missing []int
	}{
		{name: "one sharding", workers: []w{{"a0", 0, "aa", 3}, {"a0b", 0, "aa", 1}, {"a1", 1, "aa", 0}}, want: []string{"a0b", "a1"}},
		{name: "least loaded of two complete", workers: []w{{"a0", 0, "aa", 0}, {"a1", 1, "aa", 9}, {"b0", 0, "bb", 5}, {"b1", 1, "bb", 0}}, want: []string{"b0", "b1"}},
		{name: "a tie goes to the least fingerprint", workers: []w{{"a0", 0, "aa", 0}, {"a1", 1, "aa", 9}, {"b0", 0, "bb", 9}, {"b1", 1, "bb", 0}}, want: []string{"a0", "a1"}},
		{name: "the complete one over a lighter incomplete one", workers: []w{{"a0", 0, "aa", 7}, {"a1", 1, "aa", 7}, {"b0", 0, "bb", 0}}, want: []string{"a0", "a1"}},
		{name: "no sharding complete", workers: []w{{"a0", 0, "aa", 0}, {"b1", 1, "bb", 0}}, missing: []int{1}},
		{name: "an earlier release's worker joins", workers: []w{{"old0", 0, "", 0}, {"a1", 1, "aa", 0}}, want: []string{"old0", "a1"}},
		{name: "an earlier release's worker joins either", workers: []w{{"old0", 0, "", 0}, {"a1", 1, "aa", 4}, {"b1", 1, "bb", 2}}, want: []string{"old0", "b1"}},
		// A retry avoids the worker that failed: the other sharding, not
		// the lighter one that has only it for shard 0.
		{name: "a retry goes to the sharding without the failed worker", workers: []w{{"a0", 0, "aa", 0}, {"a1", 1, "aa", 0}, {"b0", 0, "bb", 5}, {"b1", 1, "bb", 5}}, avoid: []string{"a0"}, want: []string{"b0", "b1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := testRouter(Options{MicroBatch: 10})
			for _, x := range tc.workers {
				_, err := r.Reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: &prismv1.WorkerInfo{
					Id: x.id, Role: prismv1.Role_ROLE_EMBEDDING, Addr: x.id + ":1", Models: []string{"m"}, Healthy: true, Outstanding: x.load,
					Shards: map[string]*prismv1.ShardRef{"m": {Shard: int32(x.shard), Shards: 2, Sharding: x.fp}}}})
				if err != nil {
					t.Fatal(err)
				}
			}
			ws, release, err := r.Reg.PickShards("m", 2, 1, tc.avoid)
			if tc.want == nil {
				var miss *ShardMissingError
				if !errors.As(err, &miss) || !slices.Equal(miss.Missing, tc.missing) {
					t.Fatalf("picked %v (%v), want shards %v missing", ws, err, tc.missing)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer release()
			var got []string
			for _, x := range ws {
				got = append(got, x.GetId())
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("picked %v, want %v", got, tc.want)
			}
		})
	}
}

// TestPickShardsOneContent: a fan-out's workers serve one version's
// tables (ShardRef.content): while a new version rolls out shard by
// shard, a micro-batch goes to the shards of one version, the complete
// one at the least load, never a mix, which would score a sample with
// one version's rows and another's. A worker naming no content (an
// earlier release) joins any.
func TestPickShardsOneContent(t *testing.T) {
	type w struct {
		id      string
		shard   int
		content string
		load    int64
	}
	for _, tc := range []struct {
		name    string
		workers []w
		want    []string // the ids picked, by shard; nil: ShardMissingError
		missing []int
	}{
		{name: "one version", workers: []w{{"v1a", 0, "c1", 3}, {"v1b", 0, "c1", 1}, {"v1c", 1, "c1", 0}}, want: []string{"v1b", "v1c"}},
		{name: "shard 0 rolled out, shard 1 not: the old version", workers: []w{{"new0", 0, "c2", 0}, {"old0", 0, "c1", 5}, {"old1", 1, "c1", 0}}, want: []string{"old0", "old1"}},
		{name: "both complete: the least loaded", workers: []w{{"old0", 0, "c1", 5}, {"old1", 1, "c1", 5}, {"new0", 0, "c2", 1}, {"new1", 1, "c2", 1}}, want: []string{"new0", "new1"}},
		// Neither complete: the error names what the first (by content)
		// lacks.
		{name: "no version complete", workers: []w{{"new0", 0, "c2", 0}, {"old1", 1, "c1", 0}}, missing: []int{0}},
		{name: "an earlier release's worker joins", workers: []w{{"old0", 0, "", 0}, {"v1", 1, "c2", 0}}, want: []string{"old0", "v1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := testRouter(Options{MicroBatch: 10})
			for _, x := range tc.workers {
				_, err := r.Reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: &prismv1.WorkerInfo{
					Id: x.id, Role: prismv1.Role_ROLE_EMBEDDING, Addr: x.id + ":1", Models: []string{"m"}, Healthy: true, Outstanding: x.load,
					Shards: map[string]*prismv1.ShardRef{"m": {Shard: int32(x.shard), Shards: 2, Sharding: "aa", Content: x.content}}}})
				if err != nil {
					t.Fatal(err)
				}
			}
			ws, release, err := r.Reg.PickShards("m", 2, 1, nil)
			if tc.want == nil {
				var miss *ShardMissingError
				if !errors.As(err, &miss) || !slices.Equal(miss.Missing, tc.missing) {
					t.Fatalf("picked %v (%v), want shards %v missing", ws, err, tc.missing)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer release()
			var got []string
			for _, x := range ws {
				got = append(got, x.GetId())
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("picked %v, want %v", got, tc.want)
			}
		})
	}
}

// TestFanoutKeyBytes: a fan-out key keeps at most 64 bytes of the
// request id, cut at a character's start, so it stays valid UTF-8 and
// within the dense worker's 256 bytes whatever the id's characters
// (64 four-byte characters made a 277-byte key, refused).
func TestFanoutKeyBytes(t *testing.T) {
	for _, id := range []string{"", "req-1", strings.Repeat("x", 300), strings.Repeat("😀", 64), "a" + strings.Repeat("😀", 64), strings.Repeat("ü", 100)} {
		k := fanoutKey(id, 1<<30)
		if len(k) > 256 || !utf8.ValidString(k) {
			t.Errorf("id of %d bytes: key of %d bytes, valid UTF-8 %v", len(id), len(k), utf8.ValidString(k))
		}
		kept, _, _ := strings.Cut(k, "/")
		if !strings.HasPrefix(id, kept) || len(kept) > 64 || len(id) > 64 && len(kept) < 61 {
			t.Errorf("id %q kept as %q", id, kept)
		}
	}
}

// shardingCN is an embedding worker double of one sharding whose dense
// workers (by address) hold shardings as in dense: it refuses a
// fan-out paired with a dense worker of another, as a dense worker
// refuses its row-wise parts (gpuserve scorePart).
type shardingCN struct {
	shardCN
	fp    string
	dense map[string]string
}

func (f *shardingCN) Lookup(ctx context.Context, req *prismv1.LookupRequest) (*prismv1.LookupResponse, error) {
	if d := f.dense[req.GetDenseAddr()]; d != "" && d != f.fp {
		return nil, status.Errorf(codes.FailedPrecondition, "shard %d's embedding worker holds sharding %s, this dense worker's plan sharding %s", req.GetShard(), f.fp, d)
	}
	return f.shardCN.Lookup(ctx, req)
}

// TestShardedDenseOfItsSharding: while a reshard rolls out, a fan-out
// goes to a dense worker of its embedding workers' sharding
// (WorkerInfo.sharding), not the least loaded one of another, which
// would refuse its row-wise parts; and a retry after a failed worker
// goes to the other sharding when the failed one's has no other
// replica. Found by review: both failed the request.
func TestShardedDenseOfItsSharding(t *testing.T) {
	for _, failA0 := range []bool{false, true} {
		r := testRouter(Options{MicroBatch: 10})
		dense := map[string]string{"dense:old": "aa", "dense:new": "bb"}
		for _, d := range []struct {
			id, addr string
			load     int64
		}{{"gpu-old", "dense:old", 50}, {"gpu-new", "dense:new", 0}} {
			if _, err := r.Reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: &prismv1.WorkerInfo{Id: d.id, Role: prismv1.Role_ROLE_DENSE, Addr: d.addr, Models: []string{"m"}, Healthy: true,
				Outstanding: d.load, Sharding: map[string]string{"m": dense[d.addr]}}}); err != nil {
				t.Fatal(err)
			}
		}
		workers := map[string]*shardingCN{}
		ann := func(id string, k int, fp string, load int64) {
			f := &shardingCN{fp: fp, dense: dense}
			f.fail = failA0 && id == "a0"
			workers[id] = f
			addr := startCN(t, f)
			if _, err := r.Reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: &prismv1.WorkerInfo{Id: id, Role: prismv1.Role_ROLE_EMBEDDING, Addr: addr, Models: []string{"m"}, Healthy: true, Outstanding: load,
				Shards: map[string]*prismv1.ShardRef{"m": {Shard: int32(k), Shards: 2, Sharding: fp}}}}); err != nil {
				t.Fatal(err)
			}
		}
		ann("a0", 0, "aa", 0)
		ann("a1", 1, "aa", 0)
		ann("b0", 0, "bb", 5)
		ann("b1", 1, "bb", 5)
		// aa's workers are the lighter; bb's dense worker too. With aa's
		// shard 0 failing, the retry goes to bb's workers.
		for range 4 {
			if _, err := r.Recommend(context.Background(), request(4)); err != nil {
				t.Fatalf("a0 failing %v: %v", failA0, err)
			}
		}
		if got := len(workers["b0"].got()); failA0 && got == 0 {
			t.Fatal("with a0 failing, no retry reached the other sharding")
		}
	}
}

// reshardCN is an embedding worker double of sharding fp for a
// reshard's tests: it refuses a dense worker of another sharding (as
// gpuserve refuses row-wise parts) when rowWise, fails the first
// failFirst Lookups with Unavailable, and fails any Lookup sent to a
// dense worker in dead (down, not yet expired).
type reshardCN struct {
	shardCN
	fp        string
	dense     map[string]string // dense address -> its sharding
	rowWise   bool
	failFirst int64
	n         atomic.Int64
	dead      map[string]bool
	// known, when set, are the dense workers it has been told of: it
	// refuses the others (PermissionDenied), as a worker does until its
	// next heartbeat.
	known map[string]bool
}

func (f *reshardCN) Lookup(ctx context.Context, req *prismv1.LookupRequest) (*prismv1.LookupResponse, error) {
	switch {
	case f.known != nil && !f.known[req.GetDenseAddr()]:
		return nil, prismv1.UntoldDenseError(req.GetDenseAddr(), len(f.known))
	case f.n.Add(1) <= f.failFirst:
		return nil, status.Error(codes.Unavailable, "blip")
	case f.dead[req.GetDenseAddr()]:
		return nil, status.Errorf(codes.Unavailable, "dense worker %s down", req.GetDenseAddr())
	case f.rowWise && f.dense[req.GetDenseAddr()] != "" && f.dense[req.GetDenseAddr()] != f.fp:
		return nil, status.Errorf(codes.FailedPrecondition, "sharding %s, dense worker's %s", f.fp, f.dense[req.GetDenseAddr()])
	}
	return f.shardCN.Lookup(ctx, req)
}

// TestReshardPairing: while a reshard rolls out, a request is served by
// a sharding that has a dense worker of its own, and its retries find
// one (each case failed before, found by review).
func TestReshardPairing(t *testing.T) {
	type dense struct {
		addr, fp string
		load     int64
		late     bool // announced after the embedding workers: not told of yet
	}
	type emb struct {
		id        string
		shard     int
		fp        string
		load      int64
		failFirst int64
	}
	for _, tc := range []struct {
		name    string
		dense   []dense
		emb     []emb
		rowWise bool
		dead    map[string]bool
	}{
		{name: "the lighter sharding has no dense worker of its own", rowWise: true,
			dense: []dense{{"dense:old", "aa", 0, false}},
			emb:   []emb{{"a0", 0, "aa", 5, 0}, {"a1", 1, "aa", 5, 0}, {"b0", 0, "bb", 0, 0}, {"b1", 1, "bb", 0, 0}}},
		{name: "a retry stays with the sharding of the only dense worker", rowWise: true,
			dense: []dense{{"dense:old", "aa", 0, false}},
			emb:   []emb{{"a0", 0, "aa", 0, 1}, {"a1", 1, "aa", 0, 0}, {"b0", 0, "bb", 5, 0}, {"b1", 1, "bb", 5, 0}}},
		{name: "table-wise: a retry leaves a dead dense worker of the sharding for another", rowWise: false,
			dense: []dense{{"dense:a", "aa", 0, false}, {"dense:dead", "bb", 0, false}}, dead: map[string]bool{"dense:dead": true},
			emb: []emb{{"a0", 0, "aa", 5, 0}, {"a1", 1, "aa", 5, 0}, {"b0", 0, "bb", 0, 0}, {"b1", 1, "bb", 0, 0}, {"b0x", 0, "bb", 0, 0}, {"b1x", 1, "bb", 0, 0}}},
		{name: "row-wise: a retry leaves a sharding whose own dense worker failed", rowWise: true,
			dense: []dense{{"dense:a", "aa", 0, false}, {"dense:b", "bb", 0, false}}, dead: map[string]bool{"dense:a": true},
			emb: []emb{{"a0", 0, "aa", 0, 0}, {"a0x", 0, "aa", 0, 0}, {"a1", 1, "aa", 0, 0}, {"a1x", 1, "aa", 0, 0}, {"b0", 0, "bb", 5, 0}, {"b1", 1, "bb", 5, 0}}},
		{name: "table-wise: a sharding without a dense worker of its own serves while the other's shard is down", rowWise: false,
			dense: []dense{{"dense:a", "aa", 0, false}},
			emb:   []emb{{"a0", 0, "aa", 0, 100}, {"a1", 1, "aa", 0, 0}, {"b0", 0, "bb", 0, 0}, {"b1", 1, "bb", 0, 0}}},
		// A reshard's new dense workers join at once: the embedding
		// workers refuse them until told; a told one serves first.
		{name: "row-wise: untold dense workers of the sharding, a told one naming none", rowWise: true,
			dense: []dense{{"dense:a1", "aa", 0, true}, {"dense:a2", "aa", 0, true}, {"dense:a3", "aa", 0, true}, {"dense:old", "", 9, false}},
			emb:   []emb{{"a0", 0, "aa", 0, 0}, {"a1", 1, "aa", 0, 0}}},
		{name: "row-wise: the lighter sharding's only dense worker untold, the other's shard failing once", rowWise: true,
			dense: []dense{{"dense:a", "aa", 0, true}, {"dense:b", "bb", 9, false}},
			emb:   []emb{{"a0", 0, "aa", 0, 0}, {"a1", 1, "aa", 0, 0}, {"b0", 0, "bb", 5, 1}, {"b1", 1, "bb", 5, 0}}},
		{name: "table-wise: untold dense workers of the sharding, a told one of another", rowWise: false,
			dense: []dense{{"dense:a1", "aa", 0, true}, {"dense:a2", "aa", 0, true}, {"dense:a3", "aa", 0, true}, {"dense:b", "bb", 9, false}},
			emb:   []emb{{"a0", 0, "aa", 0, 0}, {"a1", 1, "aa", 0, 0}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := testRouter(Options{MicroBatch: 10})
			fps := map[string]string{}
			var known map[string]bool
			announce := func(d dense) {
				fps[d.addr] = d.fp
				info := &prismv1.WorkerInfo{Id: "gpu-" + d.addr, Role: prismv1.Role_ROLE_DENSE, Addr: d.addr, Models: []string{"m"}, Healthy: true, Outstanding: d.load}
				if d.fp != "" {
					info.Sharding = map[string]string{"m": d.fp}
				}
				if _, err := r.Reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: info}); err != nil {
					t.Fatal(err)
				}
			}
			for _, d := range tc.dense {
				if d.late {
					known = map[string]bool{}
				}
			}
			for _, d := range tc.dense {
				if !d.late {
					announce(d)
					if known != nil {
						known[d.addr] = true
					}
				}
			}
			for _, e := range tc.emb {
				f := &reshardCN{fp: e.fp, dense: fps, rowWise: tc.rowWise, failFirst: e.failFirst, dead: tc.dead, known: known}
				ref := &prismv1.ShardRef{Shard: int32(e.shard), Shards: 2, Sharding: e.fp, RowSplitsComplete: true}
				if tc.rowWise {
					ref.RowSplits = []*prismv1.RowSplit{{Table: "t", Shards: []int32{0, 1}, Rows: 10}}
				}
				info := &prismv1.WorkerInfo{Id: e.id, Role: prismv1.Role_ROLE_EMBEDDING, Addr: startCN(t, f), Models: []string{"m"}, Healthy: true,
					Outstanding: e.load, Shards: map[string]*prismv1.ShardRef{"m": ref}}
				// Twice: the second heartbeat says the first's answer
				// (the dense workers in known) was applied.
				for range 2 {
					if _, err := r.Reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: info}); err != nil {
						t.Fatal(err)
					}
				}
			}
			for _, d := range tc.dense {
				if d.late {
					announce(d)
				}
			}
			if _, err := r.Recommend(context.Background(), request(4)); err != nil {
				t.Fatal(err)
			}
		})
	}
	// A dense worker naming the fan-out's sharding before a lighter one
	// naming none (an earlier release's, whose plan may be another's).
	r := testRouter(Options{MicroBatch: 10})
	for _, d := range []struct {
		addr, fp string
		load     int64
	}{{"dense:new", "aa", 10}, {"dense:old", "", 0}} {
		info := &prismv1.WorkerInfo{Id: "gpu-" + d.addr, Role: prismv1.Role_ROLE_DENSE, Addr: d.addr, Models: []string{"m"}, Healthy: true, Outstanding: d.load}
		if d.fp != "" {
			info.Sharding = map[string]string{"m": d.fp}
		}
		if _, err := r.Reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: info}); err != nil {
			t.Fatal(err)
		}
	}
	hn, release, err := r.pickDense("m", 1, retry{}, "", "aa", true, "")
	if err != nil {
		t.Fatal(err)
	}
	release()
	if hn.GetAddr() != "dense:new" {
		t.Fatalf("a fan-out of sharding aa paired with %s, not dense:new of its sharding", hn.GetAddr())
	}
	// A dense worker whose plan has no sharding (prismv1.NoSharding)
	// refuses row-wise parts: a row-wise fan-out's retry goes back to
	// its sharding's dense worker that failed rather than to it; a
	// table-wise one takes it.
	r = testRouter(Options{MicroBatch: 10})
	for _, d := range []struct {
		addr, fp string
		load     int64
	}{{"dense:new", "aa", 10}, {"dense:plain", prismv1.NoSharding, 0}} {
		info := &prismv1.WorkerInfo{Id: "gpu-" + d.addr, Role: prismv1.Role_ROLE_DENSE, Addr: d.addr, Models: []string{"m"}, Healthy: true, Outstanding: d.load,
			Sharding: map[string]string{"m": d.fp}}
		if _, err := r.Reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: info}); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		rowWise bool
		want    string
	}{{true, "dense:new"}, {false, "dense:plain"}} {
		tried := retry{avoid: []string{"gpu-dense:new"}, dead: []string{"gpu-dense:new"}}
		hn, release, err := r.pickDense("m", 1, tried, "", "aa", tc.rowWise, "")
		if err != nil {
			t.Fatal(err)
		}
		release()
		if hn.GetAddr() != tc.want {
			t.Errorf("row-wise %v: a retry avoiding dense:new paired with %s, want %s", tc.rowWise, hn.GetAddr(), tc.want)
		}
	}
}

// TestReshardUntoldOverNone: a row-wise fan-out's sharding whose own
// dense worker shard 0's worker was not told of yet ranks above one
// with no dense worker of its own, whose parts the other's dense worker
// refuses unretried: the untold one's refusal is retried, on a told
// replica. (Ranked alike, the request failed; found by review.)
func TestReshardUntoldOverNone(t *testing.T) {
	r := testRouter(Options{MicroBatch: 10})
	fps := map[string]string{"dense:a": "aa"}
	all := map[string]bool{"dense:a": true}
	heartbeat := map[string]func(){}
	emb := func(id string, shard int, fp string, load int64, known map[string]bool) {
		f := &reshardCN{fp: fp, dense: fps, rowWise: true, known: known}
		ref := &prismv1.ShardRef{Shard: int32(shard), Shards: 2, Sharding: fp, RowSplitsComplete: true,
			RowSplits: []*prismv1.RowSplit{{Table: "t", Shards: []int32{0, 1}, Rows: 10}}}
		addr := startCN(t, f)
		heartbeat[id] = func() {
			if _, err := r.Reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: &prismv1.WorkerInfo{Id: id, Role: prismv1.Role_ROLE_EMBEDDING, Addr: addr, Models: []string{"m"}, Healthy: true,
				Outstanding: load, Shards: map[string]*prismv1.ShardRef{"m": ref}}}); err != nil {
				t.Fatal(err)
			}
		}
		heartbeat[id]()
	}
	emb("a0", 0, "aa", 1, map[string]bool{}) // not told of dense:a yet
	emb("a1", 1, "aa", 0, all)
	emb("b0", 0, "bb", 0, all) // bb: lighter, no dense worker of its own
	emb("b1", 1, "bb", 0, all)
	if _, err := r.Reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: &prismv1.WorkerInfo{Id: "gpu-dense:a", Role: prismv1.Role_ROLE_DENSE, Addr: "dense:a", Models: []string{"m"}, Healthy: true,
		Sharding: map[string]string{"m": "aa"}}}); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"a1", "b0", "b1"} {
		heartbeat[id]() // told of dense:a
		heartbeat[id]() // and has applied it
	}
	emb("a0x", 0, "aa", 2, all) // aa's second replica of shard 0, told
	heartbeat["a0x"]()          // and has applied it
	if _, err := r.Recommend(context.Background(), request(4)); err != nil {
		t.Fatal(err)
	}
}

// TestDenseJoinedNotYetApplied: two dense workers (borrowed at once)
// join, and the embedding worker announces before it has applied the
// answer naming them (the answer is on its way: it refuses them until
// it is). Taken as told of them at that announce, the router picked
// both new, idle workers, one per attempt, and the request failed
// (Unavailable "... not told; retry") while an older dense worker the
// embedding worker accepts was up. A second announce says the answer
// was applied: then the new workers serve.
func TestDenseJoinedNotYetApplied(t *testing.T) {
	r := testRouter(Options{MicroBatch: 10})
	dense := func(addr string, load int64) {
		if _, err := r.Reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: &prismv1.WorkerInfo{Id: "gpu-" + addr, Role: prismv1.Role_ROLE_DENSE, Addr: addr, Models: []string{"m"}, Healthy: true, Outstanding: load}}); err != nil {
			t.Fatal(err)
		}
	}
	known := map[string]bool{"dense:old": true}
	f := &reshardCN{known: known}
	info := &prismv1.WorkerInfo{Id: "emb", Role: prismv1.Role_ROLE_EMBEDDING, Addr: startCN(t, f), Models: []string{"m"}, Healthy: true}
	heartbeat := func() {
		if _, err := r.Reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: info}); err != nil {
			t.Fatal(err)
		}
	}
	dense("dense:old", 9)
	heartbeat()
	heartbeat() // has applied the answer naming dense:old
	dense("dense:new1", 0)
	dense("dense:new2", 0)
	heartbeat() // its answer names the new ones; not applied yet
	if _, err := r.Recommend(context.Background(), request(4)); err != nil {
		t.Fatalf("with a told dense worker up: %v", err)
	}
	for _, got := range f.got() {
		if a := got.GetDenseAddr(); a != "dense:old" {
			t.Fatalf("lookup sent to %s, which the embedding worker has not applied yet", a)
		}
	}
	known["dense:new1"], known["dense:new2"] = true, true
	heartbeat() // applied
	if _, err := r.Recommend(context.Background(), request(4)); err != nil {
		t.Fatal(err)
	}
	if a := f.got()[len(f.got())-1].GetDenseAddr(); a == "dense:old" {
		t.Fatal("the idle new dense workers are not used once the embedding worker applied them")
	}
}

// TestPickShardsRowWiseDenseOfContent: while a reshard and a retrained
// model roll out at once, the sharding whose row-wise parts have a dense
// worker of their sharding AND of their content is chosen. hasDense
// checked the sharding only: sharding aa's shard workers (content c1)
// ranked as paired through a dense worker of aa serving content c2,
// which the fan-out's dense pick then left out, so every micro-batch
// failed though sharding bb's workers (content c2) had one.
func TestPickShardsRowWiseDenseOfContent(t *testing.T) {
	r := testRouter(Options{MicroBatch: 10})
	for _, d := range []struct{ id, fp, content string }{
		{"gpu-aa-c2", "aa", "c2"}, // aa's sharding, the other content
		{"gpu-bb-c1", "bb", "c1"}, // pairs c1's embedding workers, of bb
		{"gpu-any-c2", "", "c2"},  // any sharding, content c2
	} {
		sharding := map[string]string{}
		if d.fp != "" {
			sharding["m"] = d.fp
		}
		if _, err := r.Reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: &prismv1.WorkerInfo{Id: d.id, Role: prismv1.Role_ROLE_DENSE, Addr: d.id + ":1", Models: []string{"m"}, Healthy: true,
			Sharding: sharding, Content: map[string]string{"m": d.content}}}); err != nil {
			t.Fatal(err)
		}
	}
	for _, e := range []struct {
		id, fp, content string
		shard           int32
	}{{"aa0", "aa", "c1", 0}, {"aa1", "aa", "c1", 1}, {"bb0", "bb", "c2", 0}, {"bb1", "bb", "c2", 1}} {
		if _, err := r.Reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: &prismv1.WorkerInfo{Id: e.id, Role: prismv1.Role_ROLE_EMBEDDING, Addr: e.id + ":1", Models: []string{"m"}, Healthy: true,
			Content: map[string]string{"m": e.content},
			Shards:  map[string]*prismv1.ShardRef{"m": {Shard: e.shard, Shards: 2, Sharding: e.fp}}}}); err != nil {
			t.Fatal(err)
		}
	}
	ws, release, err := r.Reg.pickShards("m", 2, 1, nil, nil, EmbeddingWant{Paired: true})
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	if got := []string{ws[0].GetId(), ws[1].GetId()}; !slices.Equal(got, []string{"bb0", "bb1"}) {
		t.Fatalf("picked %v, want bb's workers: aa's (content c1) have no dense worker of aa and c1", got)
	}
}
