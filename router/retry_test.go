package router

import (
	"context"
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
)

// codeCN is an embedding worker double that fails every Lookup with
// code, or with dense[the dense worker it names] as if passing that
// one's failure through (OK: answers as fakeCN does), and records them.
type codeCN struct {
	shardCN
	code  codes.Code
	dense map[string]codes.Code
}

func (f *codeCN) Lookup(ctx context.Context, req *prismv1.LookupRequest) (*prismv1.LookupResponse, error) {
	code := f.code
	if c := f.dense[req.GetDenseAddr()]; c != codes.OK {
		code = c
	}
	if code == codes.OK {
		return f.shardCN.Lookup(ctx, req)
	}
	f.shardCN.mu.Lock()
	f.shardCN.reqs = append(f.shardCN.reqs, req)
	f.shardCN.mu.Unlock()
	return nil, status.Errorf(code, "fails with %v", code)
}

// TestShardRetryAvoidsDeadReplica: a sharded micro-batch is tried up to
// shardAttempts times, and a retry never goes back to a replica whose
// attempt failed as if it was down (Unavailable) while the shard has
// another, even one that refused for overload (ResourceExhausted)
// already: the exclusion spans every attempt. Under overload with a
// replica killed, the third attempt went back to the dead replica (the
// least loaded of two avoided ones), and the request failed Unavailable
// instead of with the overload's refusal.
func TestShardRetryAvoidsDeadReplica(t *testing.T) {
	type replica struct {
		id   string
		code codes.Code
		load int64
	}
	down, busy, ok := codes.Unavailable, codes.ResourceExhausted, codes.OK
	for _, tc := range []struct {
		name     string
		shard1   []replica // shard 0 has one replica that answers
		wantCode codes.Code
		calls    map[string]int // Lookups each replica of shard 1 got
	}{
		{"dead, then overloaded: the overloaded one again", []replica{{"a", down, 0}, {"b", busy, 5}}, busy, map[string]int{"a": 1, "b": 2}},
		{"dead, overloaded, then a third", []replica{{"a", down, 0}, {"b", busy, 5}, {"c", ok, 9}}, ok, map[string]int{"a": 1, "b": 1, "c": 1}},
		{"overloaded, then dead: the overloaded one again", []replica{{"a", busy, 0}, {"b", down, 5}}, busy, map[string]int{"a": 2, "b": 1}},
		{"two dead: back to the first only when no other is left", []replica{{"a", down, 0}, {"b", down, 5}}, down, map[string]int{"a": 2, "b": 1}},
		{"one replica, dead: tried again, there is no other", []replica{{"a", down, 0}}, down, map[string]int{"a": 3}},
		{"dead, then one that answers", []replica{{"a", down, 0}, {"b", ok, 5}}, ok, map[string]int{"a": 1, "b": 1}},
		// A worker whose layout the registry has stale (restarted in
		// place with another plan, a reshard rolling): another replica
		// serves. FailedPrecondition was not retried, and the request
		// failed.
		{"another layout than announced, then one that answers", []replica{{"a", codes.FailedPrecondition, 0}, {"b", ok, 5}}, ok, map[string]int{"a": 1, "b": 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := testRouter(Options{MicroBatch: 10})
			if _, err := r.Reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: &prismv1.WorkerInfo{Id: "gpu", Role: prismv1.Role_ROLE_DENSE, Addr: "dense:a", Models: []string{"m"}, Healthy: true}}); err != nil {
				t.Fatal(err)
			}
			announceShard(t, r, "s0", &shardCN{}, 0, 2, 0)
			fakes := map[string]*codeCN{}
			for _, x := range tc.shard1 {
				fakes[x.id] = &codeCN{code: x.code}
				if _, err := r.Reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: &prismv1.WorkerInfo{
					Id: x.id, Role: prismv1.Role_ROLE_EMBEDDING, Addr: startCN(t, fakes[x.id]), Models: []string{"m"}, Healthy: true, Outstanding: x.load,
					Shards: map[string]*prismv1.ShardRef{"m": {Shard: 1, Shards: 2}},
				}}); err != nil {
					t.Fatal(err)
				}
			}
			_, err := r.Recommend(context.Background(), request(4))
			if status.Code(err) != tc.wantCode {
				t.Errorf("request: %v, want %v", err, tc.wantCode)
			}
			for id, want := range tc.calls {
				if got := len(fakes[id].got()); got != want {
					t.Errorf("replica %s got %d lookups, want %d", id, got, want)
				}
			}
		})
	}
}

// TestShardRetryAvoidsDeadDense: the same for the dense worker a
// fan-out names (an embedding worker passes its failures through): with
// one dense worker down and the other overloaded, the third attempt
// names the overloaded one again, not the one that was down.
func TestShardRetryAvoidsDeadDense(t *testing.T) {
	r := testRouter(Options{MicroBatch: 10})
	for _, d := range []struct {
		id, addr string
		load     int64
	}{{"gpu-down", "dense:down", 0}, {"gpu-busy", "dense:busy", 5}} {
		if _, err := r.Reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: &prismv1.WorkerInfo{Id: d.id, Role: prismv1.Role_ROLE_DENSE, Addr: d.addr, Models: []string{"m"}, Healthy: true, Outstanding: d.load}}); err != nil {
			t.Fatal(err)
		}
	}
	dense := map[string]codes.Code{"dense:down": codes.Unavailable, "dense:busy": codes.ResourceExhausted}
	var cns []*codeCN
	for k := range 2 {
		f := &codeCN{dense: dense}
		cns = append(cns, f)
		if _, err := r.Reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: &prismv1.WorkerInfo{
			Id: fmt.Sprintf("s%d", k), Role: prismv1.Role_ROLE_EMBEDDING, Addr: startCN(t, f), Models: []string{"m"}, Healthy: true,
			Shards: map[string]*prismv1.ShardRef{"m": {Shard: int32(k), Shards: 2}},
		}}); err != nil {
			t.Fatal(err)
		}
	}
	_, err := r.Recommend(context.Background(), request(4))
	if status.Code(err) != codes.ResourceExhausted {
		t.Errorf("request: %v, want the overload's ResourceExhausted", err)
	}
	// An attempt is a fan-out key; a sibling cancelled by the first
	// failure may not have seen it, so the shards' lookups are merged.
	attempts := map[string]map[string]bool{}
	for _, f := range cns {
		for _, q := range f.got() {
			if attempts[q.GetDenseAddr()] == nil {
				attempts[q.GetDenseAddr()] = map[string]bool{}
			}
			attempts[q.GetDenseAddr()][q.GetFanoutKey()] = true
		}
	}
	if n, m := len(attempts["dense:down"]), len(attempts["dense:busy"]); n != 1 || m != 2 {
		t.Errorf("attempts naming the dense worker down: %d, the overloaded one: %d; want 1 and 2", n, m)
	}
}

// untoldCN refuses every Lookup's dense worker as not told of yet
// (PermissionDenied), and first runs gone (the dense worker leaving
// meanwhile, say).
type untoldCN struct {
	prismv1.UnimplementedEmbeddingTierServer
	gone func()
}

func (f *untoldCN) Lookup(ctx context.Context, req *prismv1.LookupRequest) (*prismv1.LookupResponse, error) {
	f.gone()
	return nil, prismv1.UntoldDenseError(req.GetDenseAddr(), 0)
}

// TestUntoldRefusalRetryable: a micro-batch refused for a dense worker
// its embedding worker was not told of yet (PermissionDenied, which
// passes with its next announcement) reaches the client as Unavailable,
// retry, also when the retry found no worker left to try: the
// PermissionDenied came back as it was, telling the client its
// credentials were refused.
func TestUntoldRefusalRetryable(t *testing.T) {
	for _, sharded := range []bool{false, true} {
		t.Run(fmt.Sprint("sharded ", sharded), func(t *testing.T) {
			r := testRouter(Options{MicroBatch: 10})
			if _, err := r.Reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: &prismv1.WorkerInfo{Id: "gpu", Role: prismv1.Role_ROLE_DENSE, Addr: "dense:a", Models: []string{"m"}, Healthy: true}}); err != nil {
				t.Fatal(err)
			}
			f := &untoldCN{gone: func() { r.Reg.Remove("gpu") }}
			w := &prismv1.WorkerInfo{Id: "cpu", Role: prismv1.Role_ROLE_EMBEDDING, Addr: startCN(t, f), Models: []string{"m"}, Healthy: true}
			if sharded {
				w.Shards = map[string]*prismv1.ShardRef{"m": {Shard: 0, Shards: 1}}
			}
			if _, err := r.Reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: w}); err != nil {
				t.Fatal(err)
			}
			_, err := r.Recommend(context.Background(), request(4))
			if status.Code(err) != codes.Unavailable {
				t.Fatalf("refused for an untold dense worker, then none left: %v, want Unavailable (retry)", err)
			}
		})
	}
}

// roleCN refuses every Lookup as a tier refusing another's certificate
// (PermissionDenied of the auth interceptor: a role it does not take).
type roleCN struct {
	prismv1.UnimplementedEmbeddingTierServer
}

func (roleCN) Lookup(context.Context, *prismv1.LookupRequest) (*prismv1.LookupResponse, error) {
	return nil, status.Error(codes.PermissionDenied, `role "dense" may not call /prism.v1.EmbeddingTier/Lookup`)
}

// TestTierPermissionDeniedIsInternal: a tier refusing another's
// certificate is the servers' configuration: the client is answered
// Internal, neither PermissionDenied (its own credentials refused) nor
// Unavailable, retry (every PermissionDenied read as the untold dense
// worker's, which passes by itself).
func TestTierPermissionDeniedIsInternal(t *testing.T) {
	r := testRouter(Options{MicroBatch: 10})
	if _, err := r.Reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: &prismv1.WorkerInfo{Id: "gpu", Role: prismv1.Role_ROLE_DENSE, Addr: "dense:a", Models: []string{"m"}, Healthy: true}}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: &prismv1.WorkerInfo{Id: "cpu", Role: prismv1.Role_ROLE_EMBEDDING, Addr: startCN(t, roleCN{}), Models: []string{"m"}, Healthy: true}}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Recommend(context.Background(), request(4)); status.Code(err) != codes.Internal {
		t.Fatalf("a tier refusing another's certificate: %v, want Internal", err)
	}
}
