package serve

import (
	"context"
	"fmt"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/internal/grpctest"
)

// bigRegistry answers List with workers past gRPC's default 4 MiB.
type bigRegistry struct {
	prismv1.UnimplementedRegistryServer
	workers []*prismv1.WorkerInfo
}

func (b *bigRegistry) List(context.Context, *prismv1.ListRequest) (*prismv1.ListResponse, error) {
	return &prismv1.ListResponse{Workers: b.workers}, nil
}

// TestListDialOption: a registry of a large fleet (2,000 embedding
// workers of 16 models, each with its content's hash, within the
// registry's bounds) is over gRPC's default 4 MiB receive limit; the loan controller's and prism up's
// List calls failed ResourceExhausted on it. ListDialOption takes it.
func TestListDialOption(t *testing.T) {
	reg := &bigRegistry{}
	for i := range 2000 {
		w := &prismv1.WorkerInfo{Id: fmt.Sprintf("cpu-%04d-7f9c2d1e", i), Addr: fmt.Sprintf("10.1.%d.%d:7001", i/250, i%250), Role: prismv1.Role_ROLE_EMBEDDING, Healthy: true, UpdateSeq: map[string]int64{}, Content: map[string]string{}}
		for m := range 16 {
			name := fmt.Sprintf("ctr-model-%02d-eu-west", m)
			w.Models = append(w.Models, name)
			w.UpdateSeq[name] = int64(1000 + i)
			w.Content[name] = fmt.Sprintf("%064x", i*16+m)
		}
		reg.workers = append(reg.workers, w)
	}
	var bn grpctest.Net
	lis := bn.MustListen(t, "registry")
	s := grpc.NewServer(grpc.MaxSendMsgSize(64 << 20))
	prismv1.RegisterRegistryServer(s, reg)
	go s.Serve(lis)
	t.Cleanup(s.Stop)
	list := func(opts ...grpc.DialOption) error {
		conn := bn.Dial(t, grpctest.Target("registry"), append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)...)
		resp, err := prismv1.NewRegistryClient(conn).List(context.Background(), &prismv1.ListRequest{})
		if err == nil && len(resp.GetWorkers()) != 2000 {
			return fmt.Errorf("%d workers listed, want 2000", len(resp.GetWorkers()))
		}
		return err
	}
	if err := list(); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("the default limit: %v, want ResourceExhausted (the fleet's registry is past 4 MiB)", err)
	}
	if err := list(ListDialOption()); err != nil {
		t.Fatalf("with ListDialOption: %v", err)
	}
}
