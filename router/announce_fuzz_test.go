package router_test

import (
	"context"
	"log/slog"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/router"
)

// FuzzAnnounce sends Registry.Announce requests built from arbitrary
// bytes to a router's registry (with its update sequencer attached, as
// in prism serve router), each followed by List and, for every other
// one, Leave: a documented status, never a panic, and the registry still
// answers.
func FuzzAnnounce(f *testing.F) {
	r := router.New(router.Options{Logger: slog.New(slog.DiscardHandler)}, nil)
	f.Cleanup(r.Close)
	// Callers with certificate identities, so the binding of worker ids
	// to identities is fuzzed too: the input's length picks who calls
	// (the first: no identity, as over plaintext).
	callers := [][2]string{{}, {"embedding", "emb-a"}, {"embedding", "emb-b"}, {"dense", "dense-a"}, {"router", "r"}}
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
		f.Add(b)
	}
	f.Add([]byte{})
	ctx := context.Background()
	n := 0
	f.Fuzz(func(t *testing.T, b []byte) {
		var req prismv1.AnnounceRequest
		if err := proto.Unmarshal(b, &req); err != nil {
			t.Skip()
		}
		ctx := context.WithValue(ctx, fuzzCaller{}, callers[len(b)%len(callers)])
		_, err := r.Reg.Announce(ctx, &req)
		switch status.Code(err) {
		case codes.OK, codes.InvalidArgument, codes.ResourceExhausted, codes.PermissionDenied, codes.FailedPrecondition:
		default:
			t.Fatalf("announce %v: status %v: %v", &req, status.Code(err), err)
		}
		if _, err := r.Reg.List(ctx, &prismv1.ListRequest{}); err != nil {
			t.Fatalf("list after announce: %v", err)
		}
		if n++; n%2 == 0 {
			if _, err := r.Reg.Leave(ctx, &prismv1.LeaveRequest{Id: req.GetWorker().GetId()}); status.Code(err) != codes.OK && status.Code(err) != codes.PermissionDenied && status.Code(err) != codes.InvalidArgument {
				t.Fatalf("leave: %v", err)
			}
		}
	})
}

type fuzzCaller struct{}
