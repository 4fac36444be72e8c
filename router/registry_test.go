package router

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
)

func announceW(r *Registry, ctx context.Context, w *prismv1.WorkerInfo) error {
	_, err := r.Announce(ctx, &prismv1.AnnounceRequest{Worker: w})
	return err
}

// A worker announcing a hugely negative (or overflowing) outstanding
// figure must not win every pick.
func TestRegistryOutstandingClamped(t *testing.T) {
	for _, lie := range []int64{math.MinInt64, -1 << 40, math.MaxInt64} {
		r := NewRegistry(time.Second, nil)
		honest := &prismv1.WorkerInfo{Id: "honest", Role: prismv1.Role_ROLE_EMBEDDING, Addr: "a:1", Models: []string{"m"}, Healthy: true, Outstanding: 5}
		liar := &prismv1.WorkerInfo{Id: "liar", Role: prismv1.Role_ROLE_EMBEDDING, Addr: "z:9", Models: []string{"m"}, Healthy: true, Outstanding: lie}
		for _, w := range []*prismv1.WorkerInfo{honest, liar} {
			if err := announceW(r, context.Background(), w); err != nil {
				t.Fatal(err)
			}
		}
		// honest carries 5; the liar counts for at most [0, bound]: with
		// 64 in flight to honest, picks must alternate, never all go to
		// the liar.
		picks := map[string]int{}
		for range 10 {
			w, _, err := r.Pick(prismv1.Role_ROLE_EMBEDDING, "m", 64, nil)
			if err != nil {
				t.Fatal(err)
			}
			picks[w.GetId()]++
		}
		if lie < 0 && picks["honest"] == 0 {
			t.Errorf("outstanding %d: every pick went to the liar: %v", lie, picks)
		}
		if lie > 0 && picks["liar"] != 0 {
			t.Errorf("outstanding %d (overflowing with load): the liar won picks: %v", lie, picks)
		}
	}
}

func TestRegistryBounds(t *testing.T) {
	r := NewRegistry(time.Second, nil)
	r.Limits = RegistryLimits{MaxWorkers: 2, MaxModels: 3, MaxNameBytes: 16}
	w := func(id string, models ...string) *prismv1.WorkerInfo {
		return &prismv1.WorkerInfo{Id: id, Role: prismv1.Role_ROLE_DENSE, Addr: "h:1", Models: models, Healthy: true}
	}
	for _, c := range []struct {
		w    *prismv1.WorkerInfo
		code codes.Code
		msg  string
	}{
		{w("a", "m"), codes.OK, ""},
		{w("b", "m1", "m2", "m3", "m4"), codes.ResourceExhausted, "names 4 models, the limit is 3"},
		{w(strings.Repeat("x", 17), "m"), codes.InvalidArgument, "worker id of 17 bytes, the limit is 16"},
		{w("b", strings.Repeat("m", 17)), codes.InvalidArgument, "model name of 17 bytes"},
		{w("b", ""), codes.InvalidArgument, "model name of 0 bytes"},
		{&prismv1.WorkerInfo{Id: "b", Role: prismv1.Role_ROLE_DENSE, Addr: strings.Repeat("h", 17)}, codes.InvalidArgument, "worker addr of 17 bytes"},
		{&prismv1.WorkerInfo{Id: "b", Role: prismv1.Role_ROLE_EMBEDDING, Addr: "h:2", UpdateSeq: map[string]int64{"1": 1, "2": 1, "3": 1, "4": 1}}, codes.ResourceExhausted, "names 4 models"},
		{w("b", "m#shard1"), codes.InvalidArgument, "reserved for a shard's update sequence"},
		{&prismv1.WorkerInfo{Id: "b", Role: prismv1.Role_ROLE_EMBEDDING, Addr: "h:2", Models: []string{"m"}, Shards: map[string]*prismv1.ShardRef{"m": {Shard: 0, Shards: 2, RowSplits: []*prismv1.RowSplit{{Table: "t", Shards: []int32{0, 2}, Rows: 10}}}}}, codes.InvalidArgument, "row split of table"},
		{&prismv1.WorkerInfo{Id: "b", Role: prismv1.Role_ROLE_EMBEDDING, Addr: "h:2", Models: []string{"m"}, Shards: map[string]*prismv1.ShardRef{"m": {Shard: 0, Shards: 2, RowSplits: []*prismv1.RowSplit{{Table: "t", Shards: []int32{0, 1}}}}}}, codes.InvalidArgument, "row split of table"},
		{&prismv1.WorkerInfo{Id: "b", Role: prismv1.Role_ROLE_EMBEDDING, Addr: "h:2", Models: []string{"m"}, Shards: map[string]*prismv1.ShardRef{"m": {Shard: 0, Shards: 2, Tables: []string{strings.Repeat("t", 17)}}}}, codes.InvalidArgument, "shard table name of 17 bytes"},
		{&prismv1.WorkerInfo{Id: "b", Role: prismv1.Role_ROLE_DENSE, Addr: "h:2", Models: []string{"m"}, Sharding: map[string]string{"m": "NOT-HEX"}}, codes.InvalidArgument, "sharding of model"},
		{&prismv1.WorkerInfo{Id: "b", Role: prismv1.Role_ROLE_DENSE, Addr: "h:2", Models: []string{"m"}, Sharding: map[string]string{"1": "aa", "2": "aa", "3": "aa", "4": "aa"}}, codes.ResourceExhausted, "names 4 models"},
		{w("b", "m"), codes.OK, ""},
		{w("c", "m"), codes.ResourceExhausted, "2 workers registered, the limit is 2"},
		{w("a", "m2"), codes.OK, ""}, // a known worker still refreshes
	} {
		err := announceW(r, context.Background(), c.w)
		if status.Code(err) != c.code || !strings.Contains(status.Convert(err).Message(), c.msg) {
			t.Errorf("announce %.20q: %v; want %s %q", c.w.GetId(), err, c.code, c.msg)
		}
	}
	if _, _, err := r.Pick(prismv1.Role_ROLE_DENSE, "m", 1, nil); err != nil {
		t.Fatalf("b serves m: %v", err)
	}
	if w, _, err := r.Pick(prismv1.Role_ROLE_DENSE, "m2", 1, nil); err != nil || w.GetId() != "a" {
		t.Fatalf("a moved to m2: %v %v", w, err)
	}
	if cpu, gpu := r.Models(); len(cpu) != 0 || strings.Join(gpu, ",") != "m,m2" {
		t.Fatalf("models %v %v", cpu, gpu)
	}
}

type peerKey struct{}

type fakePeer struct{ role, name string }

func withPeer(role, name string) context.Context {
	return context.WithValue(context.Background(), peerKey{}, fakePeer{role, name})
}

func fakePeerFunc(ctx context.Context) (string, string, bool) {
	p, ok := ctx.Value(peerKey{}).(fakePeer)
	return p.role, p.name, ok
}

// A worker id is bound to the identity that first announced it; a
// worker's role must be its certificate's.
func TestRegistryPeerBinding(t *testing.T) {
	r := NewRegistry(time.Second, nil)
	r.Peer = fakePeerFunc
	emb := &prismv1.WorkerInfo{Id: "e1", Role: prismv1.Role_ROLE_EMBEDDING, Addr: "e:1", Models: []string{"m"}, Healthy: true}
	if err := announceW(r, withPeer("embedding", "emb-a"), emb); err != nil {
		t.Fatal(err)
	}
	// Another embedding certificate cannot take over or remove the id.
	if err := announceW(r, withPeer("embedding", "emb-b"), emb); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("announce of a bound id by another name: %v", err)
	}
	if _, err := r.Leave(withPeer("embedding", "emb-b"), &prismv1.LeaveRequest{Id: "e1"}); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("leave of a bound id by another name: %v", err)
	}
	// Nor can a plaintext caller (no identity).
	if _, err := r.Leave(context.Background(), &prismv1.LeaveRequest{Id: "e1"}); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("leave of a bound id without identity: %v", err)
	}
	// An embedding certificate cannot announce a dense worker.
	dense := &prismv1.WorkerInfo{Id: "d1", Role: prismv1.Role_ROLE_DENSE, Addr: "d:1", Models: []string{"m"}, Healthy: true}
	if err := announceW(r, withPeer("embedding", "emb-a"), dense); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("dense worker announced by an embedding identity: %v", err)
	}
	if err := announceW(r, withPeer("admin", "ops"), emb); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("admin identity announcing a worker: %v", err)
	}
	if err := announceW(r, withPeer("dense", "dense-a"), dense); err != nil {
		t.Fatal(err)
	}
	if got := r.DenseAddrs(); len(got) != 1 || got[0] != "d:1" {
		t.Fatalf("dense addrs %v", got)
	}
	// The owner refreshes and leaves.
	if err := announceW(r, withPeer("embedding", "emb-a"), emb); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Leave(withPeer("embedding", "emb-a"), &prismv1.LeaveRequest{Id: "e1"}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := r.Pick(prismv1.Role_ROLE_EMBEDDING, "m", 1, nil); err == nil {
		t.Fatal("e1 still registered after leaving")
	}
}

// An embedding worker's announce answer names the dense workers.
func TestRegistryTellsDenseAddrs(t *testing.T) {
	r := NewRegistry(time.Second, nil)
	for _, a := range []string{"d:2", "d:1"} {
		if err := announceW(r, context.Background(), &prismv1.WorkerInfo{Id: "dense" + a, Role: prismv1.Role_ROLE_DENSE, Addr: a, Models: []string{"m"}, Healthy: true}); err != nil {
			t.Fatal(err)
		}
	}
	resp, err := r.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: &prismv1.WorkerInfo{Id: "e", Role: prismv1.Role_ROLE_EMBEDDING, Addr: "e:1", Models: []string{"m"}}})
	if err != nil || strings.Join(resp.GetDenseAddrs(), ",") != "d:1,d:2" {
		t.Fatalf("answer %v, %v; want d:1,d:2", resp, err)
	}
	r.Remove("densed:1")
	resp, _ = r.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: &prismv1.WorkerInfo{Id: "e", Role: prismv1.Role_ROLE_EMBEDDING, Addr: "e:1", Models: []string{"m"}}})
	if strings.Join(resp.GetDenseAddrs(), ",") != "d:2" {
		t.Fatalf("after removal: %v", resp.GetDenseAddrs())
	}
}

// TestRegistryServedBy: the index Embeddings.Update checks its model
// against: a model served only by dense workers has no embedding worker
// to take its updates, and a model whose last worker left has none.
func TestRegistryServedBy(t *testing.T) {
	r := NewRegistry(time.Second, nil)
	ctx := context.Background()
	for _, w := range []*prismv1.WorkerInfo{
		{Id: "e1", Role: prismv1.Role_ROLE_EMBEDDING, Addr: "e:1", Models: []string{"a", "b"}, Healthy: true},
		{Id: "d1", Role: prismv1.Role_ROLE_DENSE, Addr: "d:1", Models: []string{"a", "c"}, Healthy: true},
	} {
		if _, err := r.Announce(ctx, &prismv1.AnnounceRequest{Worker: w}); err != nil {
			t.Fatal(err)
		}
	}
	check := func(when string, want map[string][2]bool) {
		t.Helper()
		for m, w := range want {
			if got := [2]bool{r.ServedBy(prismv1.Role_ROLE_EMBEDDING, m), r.ServedBy(prismv1.Role_ROLE_DENSE, m)}; got != w {
				t.Errorf("%s: model %q served by (embedding, dense) %v, want %v", when, m, got, w)
			}
		}
	}
	check("announced", map[string][2]bool{"a": {true, true}, "b": {true, false}, "c": {false, true}, "x": {false, false}})
	if _, err := r.Leave(ctx, &prismv1.LeaveRequest{Id: "e1"}); err != nil {
		t.Fatal(err)
	}
	check("the embedding worker left", map[string][2]bool{"a": {false, true}, "b": {false, false}, "c": {false, true}})
}
