package router_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/router"
)

// fuzzCallers are the callers of FuzzAnnounce: the input's length picks
// one (the first: no identity, as over plaintext).
var fuzzCallers = [][2]string{{}, {"embedding", "emb-a"}, {"embedding", "emb-b"}, {"dense", "dense-a"}, {"router", "r"}}

type fuzzCaller struct{}

// FuzzAnnounce sends Registry.Announce requests built from arbitrary
// bytes to a router's registry (with its update sequencer attached, as
// in prism serve router), as certificate identities too, each followed
// by List and, for every other one, Leave: a documented status, never a
// panic, the registry still answers, and a worker id announced by one
// identity is never taken over by another while it is registered (List
// says which are).
func FuzzAnnounce(f *testing.F) {
	// A heartbeat no fuzz run outlasts: no worker expires, so a binding
	// ends only with a Leave.
	r := router.New(router.Options{Logger: slog.New(slog.DiscardHandler), Heartbeat: time.Hour}, nil)
	f.Cleanup(r.Close)
	r.Reg.Peer = func(ctx context.Context) (string, string, bool) {
		c, ok := ctx.Value(fuzzCaller{}).([2]string)
		return c[0], c[1], ok && c[0] != ""
	}
	for _, w := range []*prismv1.WorkerInfo{
		{Id: "e1", Role: prismv1.Role_ROLE_EMBEDDING, Addr: "127.0.0.1:1", Models: []string{"m"}, Healthy: true, UpdateSeq: map[string]int64{"m": 3}},
		{Id: "d1", Role: prismv1.Role_ROLE_DENSE, Addr: "127.0.0.1:2", Models: []string{"m", "n"}, Healthy: true, Outstanding: -1 << 62},
		{Id: "e2", Role: prismv1.Role_ROLE_EMBEDDING, Addr: "127.0.0.1:3", Models: []string{"m"}, UpdateSeq: map[string]int64{"m": 1<<63 - 1, "n": -5}},
		{Id: "", Role: prismv1.Role_ROLE_DENSE, Addr: "x"},
		{Id: "x", Role: prismv1.Role(99), Addr: "x"},
	} {
		b, err := proto.Marshal(&prismv1.AnnounceRequest{Worker: w})
		if err != nil {
			f.Fatal(err)
		}
		// The same request from every caller: an unknown field of three
		// bytes appended k times moves the length through every residue.
		for k := range len(fuzzCallers) {
			seed := b
			for range k {
				seed = protowire.AppendVarint(protowire.AppendTag(seed, 100, protowire.VarintType), 0)
			}
			f.Add(seed)
		}
	}
	f.Add([]byte{})
	ctx := context.Background()
	n := 0
	bound := map[string]string{} // worker id -> the identity that announced it, while registered
	f.Fuzz(func(t *testing.T, b []byte) {
		var req prismv1.AnnounceRequest
		if err := proto.Unmarshal(b, &req); err != nil {
			t.Skip()
		}
		caller := fuzzCallers[len(b)%len(fuzzCallers)]
		ctx := context.WithValue(ctx, fuzzCaller{}, caller)
		id := req.GetWorker().GetId()
		_, err := r.Reg.Announce(ctx, &req)
		switch status.Code(err) {
		case codes.OK:
			if owner, ok := bound[id]; ok && owner != caller[1] {
				t.Fatalf("worker id %q, announced by %q, taken over by %q", id, owner, caller[1])
			}
			if _, ok := bound[id]; !ok && caller[1] != "" {
				bound[id] = caller[1]
			}
		case codes.InvalidArgument, codes.ResourceExhausted, codes.PermissionDenied, codes.FailedPrecondition:
		default:
			t.Fatalf("announce %v: status %v: %v", &req, status.Code(err), err)
		}
		lr, err := r.Reg.List(ctx, &prismv1.ListRequest{})
		if err != nil {
			t.Fatalf("list after announce: %v", err)
		}
		// A binding ends with its worker's entry, by Leave or, for an
		// embedding worker, by its identity announcing a new id at its
		// address (Registry.replaced: a worker restarted in place).
		live := map[string]bool{}
		for _, w := range lr.GetWorkers() {
			live[w.GetId()] = true
		}
		for id := range bound {
			if !live[id] {
				delete(bound, id)
			}
		}
		if n++; n%2 == 0 {
			_, err := r.Reg.Leave(ctx, &prismv1.LeaveRequest{Id: id})
			switch status.Code(err) {
			case codes.OK:
				delete(bound, id)
			case codes.PermissionDenied, codes.InvalidArgument:
			default:
				t.Fatalf("leave: %v", err)
			}
		}
	})
}
