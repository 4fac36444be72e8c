package serve

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/binary"
	"io"
	"net/http"
	"testing"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/proto"
)

// TestServeGzipRequests: a call whose message is gzip-compressed, as
// grpc-js sends with grpc.default_compression_algorithm 2 and Java and
// C++ clients with gzip enabled, is answered, and compressed back when
// the client accepts gzip. The call is made on the wire (net/http's
// HTTP/2 client), not with a grpc-go client: registering gzip for the
// client would register it for the server in the same process too.
func TestServeGzipRequests(t *testing.T) {
	s, err := New("test", Options{MetricsAddr: "off", Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	msg, err := proto.Marshal(&healthpb.HealthCheckRequest{Service: ""})
	if err != nil {
		t.Fatal(err)
	}
	var z bytes.Buffer
	zw := gzip.NewWriter(&z)
	zw.Write(msg)
	zw.Close()
	// One length-prefixed message: flag 1 (compressed), then its length.
	body := append([]byte{1, 0, 0, 0, 0}, z.Bytes()...)
	binary.BigEndian.PutUint32(body[1:5], uint32(z.Len()))

	var protos http.Protocols
	protos.SetUnencryptedHTTP2(true)
	client := &http.Client{Transport: &http.Transport{Protocols: &protos}}
	req, err := http.NewRequest(http.MethodPost, "http://"+s.Addr()+"/grpc.health.v1.Health/Check", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	// As grpc-js sends them.
	req.Header.Set("content-type", "application/grpc")
	req.Header.Set("te", "trailers")
	req.Header.Set("grpc-encoding", "gzip")
	req.Header.Set("grpc-accept-encoding", "identity,deflate,gzip")
	req.Header.Set("user-agent", "grpc-node-js/1.14.7")
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	code := resp.Trailer.Get("grpc-status")
	if code == "" { // a trailers-only answer: the status is in the headers
		code = resp.Header.Get("grpc-status")
	}
	if code != "0" {
		t.Fatalf("gzip-compressed Health/Check: grpc-status %q (%s), want 0 (OK)", code, resp.Header.Get("grpc-message")+resp.Trailer.Get("grpc-message"))
	}
	if enc := resp.Header.Get("grpc-encoding"); enc != "gzip" || len(out) < 5 || out[0] != 1 {
		t.Fatalf("answer grpc-encoding %q, first byte %v: want gzip, compressed", enc, out[:min(len(out), 1)])
	}
	zr, err := gzip.NewReader(bytes.NewReader(out[5:]))
	if err != nil {
		t.Fatal(err)
	}
	plain, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	var h healthpb.HealthCheckResponse
	if err := proto.Unmarshal(plain, &h); err != nil || h.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("answer %v (%v), want SERVING", h.GetStatus(), err)
	}
}
