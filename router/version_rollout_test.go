package router

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/prism-serve/prism/api/prismv1"
)

// versionCN serves one active version of its model, as cpuserve does: a
// request pinned to another is NotFound; a score is 1000*version + id.
type versionCN struct {
	prismv1.UnimplementedEmbeddingTierServer
	v int64
}

func (f *versionCN) Lookup(ctx context.Context, req *prismv1.LookupRequest) (*prismv1.LookupResponse, error) {
	if v := req.GetVersion(); v != 0 && v != f.v {
		return nil, status.Errorf(codes.NotFound, "model %q version %d is not served (serving version %d; 0 asks for it)", req.GetModel(), v, f.v)
	}
	ids := req.GetCandidates().GetInputs()[0].GetIds()
	out := make([]float32, req.GetNumSamples())
	for i := range out {
		out[i] = float32(1000*f.v + ids[i])
	}
	return &prismv1.LookupResponse{Scores: out, Version: f.v}, nil
}

// TestVersionRollout: while the replicas of a model switch from
// version 1 to 2, one request is scored by one version, the one its
// response names, and a request pinned to a version is served by the
// replicas that serve it.
func TestVersionRollout(t *testing.T) {
	r := testRouter(Options{MicroBatch: 2})
	for i, v := range []int64{1, 2} {
		addr := startCN(t, &versionCN{v: v})
		r.Reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: &prismv1.WorkerInfo{Id: "cpu" + addr, Role: prismv1.Role_ROLE_EMBEDDING, Addr: addr, Models: []string{"m"}, Healthy: true}})
		r.Reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: &prismv1.WorkerInfo{Id: "gpu" + string(rune('a'+i)), Role: prismv1.Role_ROLE_DENSE, Addr: "dense:" + string(rune('a'+i)), Models: []string{"m"}, Healthy: true}})
	}
	t.Run("unpinned", func(t *testing.T) {
		for range 20 {
			resp, err := r.Recommend(context.Background(), request(8))
			if err != nil {
				t.Fatal(err)
			}
			for i, s := range resp.GetScores() {
				if want := float32(1000*resp.GetVersion() + int64(i)); s != want {
					t.Fatalf("version %d answered, but candidate %d scored %v (want %v): scores of two versions in one response %v", resp.GetVersion(), i, s, want, resp.GetScores())
				}
			}
		}
	})
	t.Run("pinned", func(t *testing.T) {
		for _, v := range []int64{1, 2} {
			for range 20 {
				req := request(8)
				req.Version = v
				resp, err := r.Recommend(context.Background(), req)
				if err != nil {
					t.Fatalf("pinned to version %d, which a replica serves: %v", v, err)
				}
				if resp.GetVersion() != v {
					t.Fatalf("pinned to %d, answered %d", v, resp.GetVersion())
				}
			}
		}
	})
}

// TestSplitVersions: one version answers alone (no micro-batch to score
// again, unknowns aside); of two, the one that scored more candidates
// wins (the higher number on a tie), and the other's micro-batches are
// scored again. Where the workers announce content, the content tells
// versions apart, not the numbers: stores number apart.
func TestSplitVersions(t *testing.T) {
	parts := [][2]int{{0, 2}, {2, 4}, {4, 5}}
	n := func(vs ...int64) []answer {
		var out []answer
		for _, v := range vs {
			out = append(out, answer{version: v})
		}
		return out
	}
	for _, c := range []struct {
		answers []answer
		want    answer
		others  []int
	}{
		{n(3, 3, 3), answer{version: 3}, nil},
		{n(0, 3, 0), answer{version: 3}, nil},
		{n(0, 0, 0), answer{}, nil},
		{n(1, 2, 2), answer{version: 2}, []int{0}},
		{n(1, 1, 2), answer{version: 1}, []int{2}},
		{n(2, 1, 0), answer{version: 2}, []int{1}},
		// One content numbered 2 by two stores, 1 by a replica
		// ingested after the update: one version, nothing scored
		// again, answered under the higher number.
		{[]answer{{version: 2, content: "aa"}, {version: 1, content: "aa"}, {version: 2, content: "aa"}}, answer{version: 2, content: "aa"}, nil},
		// Two contents both numbered 1 (two stores ingested apart):
		// two versions; the one with more candidates wins.
		{[]answer{{version: 1, content: "aa"}, {version: 1, content: "bb"}, {version: 1, content: "bb"}}, answer{version: 1, content: "bb"}, []int{0}},
		{[]answer{{version: 1, content: "aa"}, {version: 1, content: "aa"}, {version: 1, content: "bb"}}, answer{version: 1, content: "aa"}, []int{2}},
		// A tie on candidates: the higher number, then the lower content.
		{[]answer{{version: 1, content: "bb"}, {version: 2, content: "aa"}}, answer{version: 2, content: "aa"}, []int{0}},
		{[]answer{{version: 1, content: "bb"}, {version: 1, content: "aa"}}, answer{version: 1, content: "aa"}, []int{0}},
		// An unknown answer counts for none.
		{[]answer{{}, {version: 3, content: "aa"}, {}}, answer{version: 3, content: "aa"}, nil},
	} {
		got, others := splitVersions(parts, c.answers)
		if got != c.want || !slices.Equal(others, c.others) {
			t.Errorf("splitVersions(%v) = %v, %v; want %v, %v", c.answers, got, others, c.want, c.others)
		}
	}
}

// contentCN serves one content of its model, numbered v by its store, as
// cpuserve does: a request pinned to another content is NotFound, one
// pinned to a number only (no content) is checked against v; a score is
// 1000*tag + id, tag telling the contents apart. It counts its lookups.
type contentCN struct {
	prismv1.UnimplementedEmbeddingTierServer
	v       int64
	content string
	tag     int64
	calls   atomic.Int64
}

func (f *contentCN) Lookup(ctx context.Context, req *prismv1.LookupRequest) (*prismv1.LookupResponse, error) {
	f.calls.Add(1)
	if c := req.GetContent(); c != "" && c != f.content {
		return nil, status.Errorf(codes.NotFound, "content %q is not served (serving %q)", c, f.content)
	}
	if v := req.GetVersion(); req.GetContent() == "" && v != 0 && v != f.v {
		return nil, status.Errorf(codes.NotFound, "version %d is not served (serving version %d)", v, f.v)
	}
	ids := req.GetCandidates().GetInputs()[0].GetIds()
	out := make([]float32, req.GetNumSamples())
	for i := range out {
		out[i] = float32(1000*f.tag + ids[i])
	}
	return &prismv1.LookupResponse{Scores: out, Version: f.v, Content: f.content}, nil
}

// contentRouter is a router whose model m is served by an embedding
// worker per cns entry and a dense worker per dense content.
func contentRouter(t *testing.T, cns []*contentCN, dense []string) *Router {
	t.Helper()
	r := testRouter(Options{MicroBatch: 2})
	for i, cn := range cns {
		addr := startCN(t, cn)
		w := &prismv1.WorkerInfo{Id: fmt.Sprintf("cpu%d", i), Role: prismv1.Role_ROLE_EMBEDDING, Addr: addr, Models: []string{"m"}, Healthy: true,
			Version: map[string]int64{"m": cn.v}}
		if cn.content != "" {
			w.Content = map[string]string{"m": cn.content}
		}
		if _, err := r.Reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: w}); err != nil {
			t.Fatal(err)
		}
	}
	for i, c := range dense {
		w := &prismv1.WorkerInfo{Id: fmt.Sprintf("gpu%d", i), Role: prismv1.Role_ROLE_DENSE, Addr: fmt.Sprintf("dense:%d", i), Models: []string{"m"}, Healthy: true}
		if c != "" {
			w.Content = map[string]string{"m": c}
		}
		if _, err := r.Reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: w}); err != nil {
			t.Fatal(err)
		}
	}
	return r
}

// TestReplicaNumbersApart: a replica whose store was ingested after a
// model update numbers the same content 1 where the others number it 2.
// Its micro-batches are not scored again (the numbers differ, the model
// does not), nothing is retried, and every response names version 2 and
// the content, whichever replicas answered; pinned to 2, it serves too.
// (Compared by number, its micro-batches were scored again pinned to 2,
// which it refused: a retry for every request it took part in.)
func TestReplicaNumbersApart(t *testing.T) {
	cns := []*contentCN{{v: 2, content: "aa", tag: 1}, {v: 2, content: "aa", tag: 1}, {v: 1, content: "aa", tag: 1}}
	r := contentRouter(t, cns, []string{"aa"})
	const reqs, cands = 30, 8 // 4 micro-batches each
	for _, pin := range []int64{0, 2} {
		for _, cn := range cns {
			cn.calls.Store(0)
		}
		for range reqs {
			req := request(cands)
			req.Version = pin
			resp, err := r.Recommend(context.Background(), req)
			if err != nil {
				t.Fatalf("pinned %d: %v", pin, err)
			}
			if resp.GetVersion() != 2 || resp.GetContent() != "aa" {
				t.Fatalf("pinned %d: answered version %d content %q, want 2 and aa", pin, resp.GetVersion(), resp.GetContent())
			}
		}
		var calls int64
		for _, cn := range cns {
			calls += cn.calls.Load()
		}
		if want := int64(reqs * cands / 2); calls != want {
			t.Errorf("pinned %d: %d lookups for %d micro-batches: micro-batches scored again or retried", pin, calls, want)
		}
		if cns[2].calls.Load() == 0 {
			t.Errorf("pinned %d: the replica numbering the content 1 served nothing", pin)
		}
	}
}

// TestContentsOneNumber: two stores ingested apart each number their own
// content 1 (two plans of model m, say a retrain rolled out to one
// replica). One response holds one content's scores only (compared by
// number, one request mixed the two models), and a request pinned to a
// content is served by it alone.
func TestContentsOneNumber(t *testing.T) {
	cns := []*contentCN{{v: 1, content: "aa", tag: 1}, {v: 1, content: "bb", tag: 2}}
	r := contentRouter(t, cns, []string{"aa", "bb"})
	for range 30 {
		resp, err := r.Recommend(context.Background(), request(8))
		if err != nil {
			t.Fatal(err)
		}
		tag := map[string]int64{"aa": 1, "bb": 2}[resp.GetContent()]
		for i, s := range resp.GetScores() {
			if want := float32(1000*tag + int64(i)); s != want {
				t.Fatalf("content %q answered, but candidate %d scored %v (want %v): scores of two models in one response %v", resp.GetContent(), i, s, want, resp.GetScores())
			}
		}
	}
	for _, c := range []string{"aa", "bb"} {
		req := request(8)
		req.Content = c
		resp, err := r.Recommend(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		if resp.GetContent() != c {
			t.Fatalf("pinned to content %s, answered %s", c, resp.GetContent())
		}
	}
	req := request(8)
	req.Content = "cc"
	if _, err := r.Recommend(context.Background(), req); status.Code(err) != codes.NotFound || !strings.Contains(err.Error(), `content "cc"`) {
		t.Fatalf("pinned to a content no worker serves: %v, want NotFound naming it", err)
	}
}

// TestContentPairsTiers: while a retrained model rolls out, the embedding
// workers of the new plan are picked only while a dense worker of the new
// plan is live, and each is paired with a dense worker of its content:
// never the new rows through the old dense.onnx. With no pair at all the
// request fails, saying why.
func TestContentPairsTiers(t *testing.T) {
	// The new plan's embedding worker is the idle one: by load alone it
	// would take every micro-batch.
	cns := []*contentCN{{v: 1, content: "aa", tag: 1}, {v: 2, content: "bb", tag: 2}}
	r := contentRouter(t, cns, []string{"aa"})
	for range 20 {
		resp, err := r.Recommend(context.Background(), request(8))
		if err != nil {
			t.Fatal(err)
		}
		if resp.GetContent() != "aa" {
			t.Fatalf("answered by content %q, which no dense worker serves", resp.GetContent())
		}
	}
	if n := cns[1].calls.Load(); n != 0 {
		t.Fatalf("the embedding worker of content bb took %d lookups with no dense worker of its content", n)
	}
	// The new dense worker joins: pairs of each content serve.
	w := &prismv1.WorkerInfo{Id: "gpu-new", Role: prismv1.Role_ROLE_DENSE, Addr: "dense:new", Models: []string{"m"}, Healthy: true, Content: map[string]string{"m": "bb"}}
	if _, err := r.Reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: w}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ cn, want string }{{"cpu0", "dense:0"}, {"cpu1", "dense:new"}} {
		cn := r.Reg.workers[c.cn].info
		hn, release, err := r.pickWith(prismv1.Role_ROLE_DENSE, "m", 1, retry{}, cn.GetId(), pickWant{dense: DenseWant{Content: cn.GetContent()["m"]}})
		if err != nil {
			t.Fatal(err)
		}
		release()
		if hn.GetAddr() != c.want {
			t.Errorf("embedding worker of content %s paired with %s, want %s", cn.GetContent()["m"], hn.GetAddr(), c.want)
		}
	}
	// The new dense worker leaves: the new plan's embedding worker is
	// out of the picks again.
	if _, err := r.Reg.Leave(context.Background(), &prismv1.LeaveRequest{Id: "gpu-new"}); err != nil {
		t.Fatal(err)
	}
	cns[1].calls.Store(0)
	for range 10 {
		if resp, err := r.Recommend(context.Background(), request(8)); err != nil || resp.GetContent() != "aa" {
			t.Fatalf("after the new dense worker left: content %q, %v", resp.GetContent(), err)
		}
	}
	if n := cns[1].calls.Load(); n != 0 {
		t.Fatalf("the embedding worker of content bb took %d lookups after its dense worker left", n)
	}
	// Only the new plan's embedding worker and the old plan's dense one.
	r = contentRouter(t, []*contentCN{{v: 2, content: "bb", tag: 2}}, []string{"aa"})
	_, err := r.Recommend(context.Background(), request(8))
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "no dense worker serves the content") {
		t.Fatalf("no pair of one content: %v, want Unavailable saying so", err)
	}
	// A dense worker of unknown content (an earlier release) pairs with any.
	r = contentRouter(t, []*contentCN{{v: 2, content: "bb", tag: 2}}, []string{""})
	if _, err := r.Recommend(context.Background(), request(8)); err != nil {
		t.Fatalf("a dense worker of unknown content: %v", err)
	}
}

// TestContentPairsHealthyDense: the last dense worker of the old plan
// drains (it announces itself unhealthy before it stops) while the new
// plan's pair is live. The old plan's embedding workers, the least
// loaded, have no dense worker left to score for: the new plan's pair
// serves every request. (Counted by every registered dense worker, the
// draining one kept them in the picks, and each request failed
// Unavailable: no healthy dense worker of their content.)
func TestContentPairsHealthyDense(t *testing.T) {
	cns := []*contentCN{{v: 1, content: "aa", tag: 1}, {v: 2, content: "bb", tag: 2}}
	r := contentRouter(t, cns, []string{"aa", "bb"})
	// The new plan's embedding worker is the busier one.
	busy := proto.Clone(r.Reg.workers["cpu1"].info).(*prismv1.WorkerInfo)
	busy.Outstanding = 50
	drain := &prismv1.WorkerInfo{Id: "gpu0", Role: prismv1.Role_ROLE_DENSE, Addr: "dense:0", Models: []string{"m"}, Healthy: false, Content: map[string]string{"m": "aa"}}
	for _, w := range []*prismv1.WorkerInfo{busy, drain} {
		if _, err := r.Reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: w}); err != nil {
			t.Fatal(err)
		}
	}
	for range 10 {
		resp, err := r.Recommend(context.Background(), request(8))
		if err != nil {
			t.Fatalf("the old plan's dense worker drains, the new plan's pair is live: %v", err)
		}
		if resp.GetContent() != "bb" {
			t.Fatalf("answered by content %q, whose dense worker drains", resp.GetContent())
		}
	}
	if n := cns[0].calls.Load(); n != 0 {
		t.Errorf("the embedding worker of content aa took %d lookups with its dense worker draining", n)
	}
	// It comes back healthy: the old plan's pair serves again.
	back := proto.Clone(drain).(*prismv1.WorkerInfo)
	back.Healthy = true
	if _, err := r.Reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: back}); err != nil {
		t.Fatal(err)
	}
	if resp, err := r.Recommend(context.Background(), request(8)); err != nil || resp.GetContent() != "aa" {
		t.Fatalf("the old plan's dense worker healthy again: content %q, %v; want the idle aa pair", resp.GetContent(), err)
	}
}

// TestPinnedNumberAnswered: a request pinned to version 2, the number
// responses give content aa, is answered version 2 whichever replica
// serves it: here the replica whose store, ingested after the update,
// numbers aa 1 (the others are busy). (Answered by the number of the
// replicas that happened to serve it, a client pinned to 2 was told 1,
// and pinning that, was served nothing: no worker numbers aa 1 best.)
func TestPinnedNumberAnswered(t *testing.T) {
	cns := []*contentCN{{v: 2, content: "aa", tag: 1}, {v: 1, content: "aa", tag: 1}}
	r := contentRouter(t, cns, []string{"aa"})
	busy := proto.Clone(r.Reg.workers["cpu0"].info).(*prismv1.WorkerInfo)
	busy.Outstanding = 50
	if _, err := r.Reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: busy}); err != nil {
		t.Fatal(err)
	}
	for _, pin := range []int64{0, 2} {
		req := request(8)
		req.Version = pin
		resp, err := r.Recommend(context.Background(), req)
		if err != nil {
			t.Fatalf("pinned %d: %v", pin, err)
		}
		if resp.GetVersion() != 2 || resp.GetContent() != "aa" {
			t.Errorf("pinned %d: answered version %d content %q, want 2 and aa", pin, resp.GetVersion(), resp.GetContent())
		}
	}
	if cns[0].calls.Load() != 0 {
		t.Fatalf("the busy replica served: the test shows nothing")
	}
	// A content pinned with a number beside it: the content decides, and
	// the response names its number, not the one given.
	req := request(8)
	req.Content, req.Version = "aa", 7
	if resp, err := r.Recommend(context.Background(), req); err != nil || resp.GetVersion() != 2 || resp.GetContent() != "aa" {
		t.Errorf("content aa pinned with version 7: version %d content %q, %v; want 2 and aa", resp.GetVersion(), resp.GetContent(), err)
	}
}

// TestShardedContentPairs: a retrained sharded model rolls out tier by
// tier. Its new plan's shard workers are all up (and idle) before any
// dense worker of the new plan: the fan-outs go to the old plan's shard
// workers, which a dense worker scores for, as the whole model's
// workers would. A request pinned to a content goes to the shard
// workers of that content, and one pinned to a content none serves is
// NotFound. (pickShards took the complete layout at the least load
// whatever its content: every micro-batch failed Unavailable, "no
// healthy dense worker serves content", and a pinned one was sent to
// shard workers of another content, which refused it.)
func TestShardedContentPairs(t *testing.T) {
	r := testRouter(Options{MicroBatch: 4})
	type sw struct {
		cn      *contentCN
		shard   int
		content string
		load    int64
	}
	ws := []sw{
		{&contentCN{v: 1, content: "aa", tag: 1}, 0, "aa", 5}, {&contentCN{v: 1, content: "aa", tag: 1}, 1, "aa", 5},
		{&contentCN{v: 2, content: "bb", tag: 2}, 0, "bb", 0}, {&contentCN{v: 2, content: "bb", tag: 2}, 1, "bb", 0},
	}
	for i, x := range ws {
		addr := startCN(t, x.cn)
		if _, err := r.Reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: &prismv1.WorkerInfo{
			Id: fmt.Sprintf("cpu%d", i), Role: prismv1.Role_ROLE_EMBEDDING, Addr: addr, Models: []string{"m"}, Healthy: true, Outstanding: x.load,
			Content: map[string]string{"m": x.content}, Version: map[string]int64{"m": x.cn.v},
			Shards: map[string]*prismv1.ShardRef{"m": {Shard: int32(x.shard), Shards: 2, Sharding: "f1", Content: "t" + x.content}}}}); err != nil {
			t.Fatal(err)
		}
	}
	dense := func(id, content string) {
		t.Helper()
		if _, err := r.Reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: &prismv1.WorkerInfo{
			Id: id, Role: prismv1.Role_ROLE_DENSE, Addr: "dense:" + id, Models: []string{"m"}, Healthy: true, Content: map[string]string{"m": content}}}); err != nil {
			t.Fatal(err)
		}
	}
	dense("old", "aa")
	for range 5 {
		resp, err := r.Recommend(context.Background(), request(8))
		if err != nil {
			t.Fatalf("the old plan's pairs are live: %v", err)
		}
		if resp.GetContent() != "aa" {
			t.Fatalf("answered by content %q, which no dense worker serves", resp.GetContent())
		}
	}
	for _, x := range ws[2:] {
		if n := x.cn.calls.Load(); n != 0 {
			t.Fatalf("a shard worker of content bb took %d lookups with no dense worker of its content", n)
		}
	}
	// The new plan's dense worker is up: pinned to the old content, the
	// old plan's shard workers serve, busier as they are.
	dense("new", "bb")
	for range 5 {
		req := request(8)
		req.Content = "aa"
		resp, err := r.Recommend(context.Background(), req)
		if err != nil {
			t.Fatalf("pinned to content aa: %v", err)
		}
		if resp.GetContent() != "aa" {
			t.Fatalf("pinned to content aa, answered %q", resp.GetContent())
		}
	}
	for _, x := range ws[2:] {
		if n := x.cn.calls.Load(); n != 0 {
			t.Fatalf("a shard worker of content bb took %d lookups pinned to aa", n)
		}
	}
	req := request(8)
	req.Content = "cc"
	if _, err := r.Recommend(context.Background(), req); status.Code(err) != codes.NotFound {
		t.Fatalf("pinned to a content no worker serves: %v, want NotFound", err)
	}
}

// TestShardedContentOneModel: a model retrained in its dense part only
// (its tables, so its shards' ShardRef.content, and its sharding
// unchanged) rolls out while both plans' pairs are live. A fan-out
// takes the shard workers of one plan's content, and the dense worker
// of it: shard workers of two contents in one fan-out meet a dense
// worker that refuses (Aborted) the other content's parts, every try.
func TestShardedContentOneModel(t *testing.T) {
	r := testRouter(Options{MicroBatch: 4})
	for _, w := range []struct {
		id, content string
		shard       int32
		load        int64
	}{{"aa0", "aa", 0, 0}, {"aa1", "aa", 1, 5}, {"bb0", "bb", 0, 5}, {"bb1", "bb", 1, 0}} {
		if _, err := r.Reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: &prismv1.WorkerInfo{
			Id: w.id, Role: prismv1.Role_ROLE_EMBEDDING, Addr: w.id + ":1", Models: []string{"m"}, Healthy: true, Outstanding: w.load,
			Content: map[string]string{"m": w.content}, Version: map[string]int64{"m": 1},
			Shards: map[string]*prismv1.ShardRef{"m": {Shard: w.shard, Shards: 2, Sharding: "f1", Content: "tables"}}}}); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []string{"aa", "bb"} {
		if _, err := r.Reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: &prismv1.WorkerInfo{
			Id: "dense-" + c, Role: prismv1.Role_ROLE_DENSE, Addr: "dense:" + c, Models: []string{"m"}, Healthy: true, Content: map[string]string{"m": c}}}); err != nil {
			t.Fatal(err)
		}
	}
	for _, want := range []EmbeddingWant{{Paired: true}, {Paired: true, Content: "bb"}} {
		cns, release, err := r.Reg.pickShards("m", 2, 1, nil, nil, want)
		if err != nil {
			t.Fatalf("%+v: %v", want, err)
		}
		c := cns[0].GetContent()["m"]
		for _, cn := range cns {
			if cn.GetContent()["m"] != c {
				t.Errorf("%+v: one fan-out to shard workers %s (%s) and %s (%s): two models' parts to one dense worker", want, cns[0].GetId(), c, cn.GetId(), cn.GetContent()["m"])
			}
		}
		if want.Content != "" && c != want.Content {
			t.Errorf("pinned to %s: fan-out to content %s", want.Content, c)
		}
		hn, releaseHN, err := r.pickDense("m", 1, retry{}, cns[0].GetId(), shardingOf(cns, "m"), rowWise(cns, "m"), contentOf(cns, "m"))
		if err != nil {
			t.Fatal(err)
		}
		if hn.GetContent()["m"] != c {
			t.Errorf("%+v: shard workers of content %s paired with dense worker of %s", want, c, hn.GetContent()["m"])
		}
		releaseHN()
		release()
	}
}

// TestNumberPinPicksItsReplicas: where the workers announce no content
// (plans without table hashes), a request pinned to a version number,
// and a rollout's micro-batches scored again pinned to the number that
// won, go to the replicas whose store serves that number (they announce
// it, WorkerInfo.version). Picked by load alone, a pin to the version
// of one replica in three tried the two less loaded others (NotFound
// each) and failed; so did the micro-batches of an unpinned request
// scored again pinned to the number that won (the client, who pinned
// nothing, got NotFound "version 2 is not served").
func TestNumberPinPicksItsReplicas(t *testing.T) {
	for _, tc := range []struct {
		name     string
		versions []int64 // one embedding worker each, in order of load
		pin      int64
	}{
		{"pinned to 2, its lone replica the most loaded", []int64{1, 1, 2}, 2},
		{"pinned to 1, its lone replica the most loaded", []int64{2, 2, 1}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := testRouter(Options{MicroBatch: 4})
			cns := make([]*countedVersionCN, len(tc.versions))
			for i, v := range tc.versions {
				cns[i] = &countedVersionCN{versionCN: versionCN{v: v}}
				addr := startCN(t, cns[i])
				r.Reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: &prismv1.WorkerInfo{Id: fmt.Sprint("cpu", i), Role: prismv1.Role_ROLE_EMBEDDING, Addr: addr, Models: []string{"m"}, Healthy: true,
					Outstanding: int64(100 * i), Version: map[string]int64{"m": v}}})
			}
			r.Reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: &prismv1.WorkerInfo{Id: "gpu", Role: prismv1.Role_ROLE_DENSE, Addr: "dense:a", Models: []string{"m"}, Healthy: true}})
			req := request(12)
			req.Version = tc.pin
			resp, err := r.Recommend(context.Background(), req)
			if err != nil {
				t.Fatalf("a replica serves the version: %v", err)
			}
			if tc.pin != 0 && resp.GetVersion() != tc.pin {
				t.Fatalf("pinned to %d, answered %d", tc.pin, resp.GetVersion())
			}
			for i, s := range resp.GetScores() {
				if want := float32(1000*resp.GetVersion() + int64(i)); s != want {
					t.Fatalf("version %d answered, candidate %d scored %v, want %v", resp.GetVersion(), i, s, want)
				}
			}
			if tc.pin != 0 {
				for i, cn := range cns {
					if n := cn.refused.Load(); n > 0 {
						t.Errorf("replica %d (version %d) was sent %d lookups pinned to %d", i, tc.versions[i], n, tc.pin)
					}
				}
			}
		})
	}
	t.Run("no replica serves the number", func(t *testing.T) {
		r := testRouter(Options{MicroBatch: 4})
		addr := startCN(t, &versionCN{v: 1})
		r.Reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: &prismv1.WorkerInfo{Id: "cpu", Role: prismv1.Role_ROLE_EMBEDDING, Addr: addr, Models: []string{"m"}, Healthy: true, Version: map[string]int64{"m": 1}}})
		r.Reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: &prismv1.WorkerInfo{Id: "gpu", Role: prismv1.Role_ROLE_DENSE, Addr: "dense:a", Models: []string{"m"}, Healthy: true}})
		req := request(4)
		req.Version = 7
		if _, err := r.Recommend(context.Background(), req); status.Code(err) != codes.NotFound || !strings.Contains(err.Error(), "version 7") {
			t.Fatalf("pinned to a number no replica serves: %v, want NotFound naming it", err)
		}
	})
}

// countedVersionCN is versionCN counting the lookups it refused for
// another version.
type countedVersionCN struct {
	versionCN
	refused atomic.Int64
}

func (f *countedVersionCN) Lookup(ctx context.Context, req *prismv1.LookupRequest) (*prismv1.LookupResponse, error) {
	resp, err := f.versionCN.Lookup(ctx, req)
	if status.Code(err) == codes.NotFound {
		f.refused.Add(1)
	}
	return resp, err
}
