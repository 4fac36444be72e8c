package serve

import (
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/internal/auth"
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
	s, bn, creds, ctx := tlsRouter(t, &slowRegistry{})
	admin := bn.Dial(t, s.Addr(), creds(auth.Admin))
	garbage := []byte{0xff, 0xff, 0xff, 0xff, 0x0f, 0x01}
	var out []byte
	err := admin.Invoke(ctx, prismv1.Registry_Announce_FullMethodName, &garbage, &out, grpc.ForceCodec(rawCodec{}))
	if status.Code(err) != codes.PermissionDenied {
		t.Fatalf("admin announcing undecodable bytes: %v, want PermissionDenied before decoding", err)
	}
}
