package serve

import (
	"context"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/internal/auth"
	"github.com/prism-serve/prism/internal/grpctest"
)

// rawCodec sends bytes as they are: a request no protobuf decoder takes.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) { return *(v.(*[]byte)), nil }
func (rawCodec) Unmarshal(b []byte, v any) error {
	*(v.(*[]byte)) = append([]byte(nil), b...)
	return nil
}
func (rawCodec) Name() string { return "proto" }

// TestRefusedBeforeTheBodyIsRead: a caller without the right role is
// refused before the server reads its request. A body that does not
// decode gets PermissionDenied, not the Internal of a failed decode,
// which is what the interceptors alone (they run after decoding) give.
func TestRefusedBeforeTheBodyIsRead(t *testing.T) {
	dir := t.TempDir()
	if err := auth.InitCerts(dir, auth.CertOptions{}); err != nil {
		t.Fatal(err)
	}
	conf, err := auth.ServerTLS(auth.FilesFor(dir, auth.Router), auth.ServerTLSOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var bn grpctest.Net
	s, err := New("router", Options{Listener: bn.MustListen(t, "router"), MetricsAddr: "off", TLS: conf, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	prismv1.RegisterRegistryServer(s.GRPC, &slowRegistry{})
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- s.Serve(ctx) }()
	defer func() { cancel(); <-served }()
	c, err := auth.ClientTLS(auth.FilesFor(dir, auth.Admin), auth.Router)
	if err != nil {
		t.Fatal(err)
	}
	c.ServerName = "localhost"
	admin := bn.Dial(t, s.Addr(), grpc.WithTransportCredentials(credentials.NewTLS(c)))
	garbage := []byte{0xff, 0xff, 0xff, 0xff, 0x0f, 0x01}
	var out []byte
	err = admin.Invoke(ctx, prismv1.Registry_Announce_FullMethodName, &garbage, &out, grpc.ForceCodec(rawCodec{}))
	if status.Code(err) != codes.PermissionDenied {
		t.Fatalf("admin announcing undecodable bytes: %v, want PermissionDenied before decoding", err)
	}
}
