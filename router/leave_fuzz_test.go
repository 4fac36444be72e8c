package router_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/router"
)

// FuzzLeaveList sends Registry.Leave and Registry.List requests built
// from arbitrary bytes (a Leave when they decode as one, then a List
// from the same bytes) to a registry holding workers of three
// identities, as each caller in turn: a documented status, never a
// panic, and a worker is removed only by the identity that announced
// it (or by anyone, for the worker bound to none).
func FuzzLeaveList(f *testing.F) {
	r := router.New(router.Options{Logger: slog.New(slog.DiscardHandler), Heartbeat: time.Hour}, nil)
	f.Cleanup(r.Close)
	r.Reg.Peer = func(ctx context.Context) (string, string, bool) {
		c, ok := ctx.Value(fuzzCaller{}).([2]string)
		return c[0], c[1], ok && c[0] != ""
	}
	owners := map[string][2]string{"e-a": fuzzCallers[1], "e-b": fuzzCallers[2], "d-a": fuzzCallers[3], "anon": fuzzCallers[0]}
	announce := func() {
		for id, c := range owners {
			role := prismv1.Role_ROLE_EMBEDDING
			if c[0] == "dense" {
				role = prismv1.Role_ROLE_DENSE
			}
			ctx := context.WithValue(context.Background(), fuzzCaller{}, c)
			if _, err := r.Reg.Announce(ctx, &prismv1.AnnounceRequest{Worker: &prismv1.WorkerInfo{Id: id, Role: role, Addr: "127.0.0.1:1" + id, Models: []string{"m"}, Healthy: true}}); err != nil {
				f.Fatalf("announce %s: %v", id, err)
			}
		}
	}
	for id := range owners {
		b, err := proto.Marshal(&prismv1.LeaveRequest{Id: id})
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
		f.Add(append(b, 0x18, 0x01)) // an unknown field: another length, another caller
	}
	f.Add([]byte{})
	f.Add([]byte{0x0a, 0xff, 0xff, 0x03}) // a string longer than the input
	f.Fuzz(func(t *testing.T, b []byte) {
		announce()
		caller := fuzzCallers[len(b)%len(fuzzCallers)]
		ctx := context.WithValue(context.Background(), fuzzCaller{}, caller)
		var req prismv1.LeaveRequest
		if proto.Unmarshal(b, &req) == nil {
			_, err := r.Reg.Leave(ctx, &req)
			switch status.Code(err) {
			case codes.OK, codes.PermissionDenied, codes.InvalidArgument:
			default:
				t.Fatalf("leave %q: %v", req.GetId(), err)
			}
		}
		var lreq prismv1.ListRequest
		if proto.Unmarshal(b, &lreq) != nil {
			return
		}
		lr, err := r.Reg.List(ctx, &lreq)
		if err != nil {
			t.Fatalf("list: %v", err)
		}
		live := map[string]bool{}
		for _, w := range lr.GetWorkers() {
			live[w.GetId()] = true
		}
		for id, owner := range owners {
			if !live[id] && owner[1] != "" && owner != caller {
				t.Fatalf("worker %q of %q removed by %q", id, owner[1], caller[1])
			}
		}
	})
}
